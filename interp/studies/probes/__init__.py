"""Linear probes (docs/methods.md section 4): ``token_probes`` (the probes study: position, pixels, label per
token group), ``scores`` (the per-group scores and the minimums), ``tokens`` (high-norm patches and the token
sample), ``image_sets`` (train / test / validation images) and ``linear_probe`` (the probe kernel it fits).

``interp.studies.probes`` is also the study's module of earlier versions: its public names are here.
"""
from .image_sets import read_split  # noqa: F401
from .scores import (MIN_GROUP_TOKENS, MIN_IMAGES, MIN_LABEL_IMAGES, MIN_TEST_IMAGES,  # noqa: F401
                     MIN_TRAIN_IMAGES, PIXEL_SPACE)
from .token_probes import (GroupScore, ProbesResult, high_norm_mask, patch_pixels, probes_study,  # noqa: F401
                           too_few_images)
