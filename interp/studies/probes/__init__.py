"""Linear probes (docs/methods.md section 4): ``token_probes`` (the probes study: position, pixels, label per
token group) and ``linear_probe`` (the probe kernel it fits).

``interp.studies.probes`` is also the study's module of earlier versions: its public names are here.
"""
from .token_probes import (GroupScore, ProbesResult, high_norm_mask, patch_pixels, probes_study,  # noqa: F401
                           too_few_images)
