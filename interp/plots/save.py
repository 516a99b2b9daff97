"""One way to save a study result: its figures from the plots registry as PNGs, then ``<study>.json`` once, with
``figure_files`` (the PNGs written with it) and ``skipped`` (unreadable images left out, a result field).
Used by ``interp study``, by ``interp report`` and by study scripts.

>>> from interp.studies.artifacts.norms import norms_study
>>> files = save_result(norms_study(source, progress=False), "out", images)
>>> files
['norm_profile.png', 'norm_histograms.png', 'outlier_maps.png']
"""
from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Dict, List, Optional, Sequence, Tuple, Union

from ..studies.core.result import StudyResult
from . import has_figures, study_figures  # the package: every figure module registered

FIGURES_KEY = "figure_files"  # in a saved study JSON: the PNGs written with it
# zlib level 1 instead of PIL's 6: PNG encoding took a sixth of a report figure's time, for files ~10 % larger
PNG_OPTIONS = {"pil_kwargs": {"compress_level": 1}}


def save_result(result: StudyResult, out: Union[str, Path], images=None,
                figures: Optional[Sequence[Tuple[str, Any]]] = None,
                extra: Optional[Dict[str, Any]] = None,
                figure_options: Optional[Dict[str, Any]] = None) -> List[str]:
    """Write ``result``'s figures and JSON into the folder ``out``; returns the figure file names.

    Args:
        images: the images the study ran on (Tensor[N, 3, H, W] in 0..1), for the overlay figures.
        figures: (file stem, Figure) pairs to write instead of the registry's (a command's own options).
        extra: keys added to the JSON (e.g. the seed of random weights).
        figure_options: options of the registry's figures (``n_maps``; :func:`~interp.plots.registry.study_figures`).
    """
    folder = Path(out)
    folder.mkdir(parents=True, exist_ok=True)
    if figures is None:
        figures = study_figures(result, images, **(figure_options or {})) if has_figures(result) else []
    names = []
    for stem, fig in figures:
        fig.savefig(folder / f"{stem}.png", dpi=110, bbox_inches="tight", **PNG_OPTIONS)
        names.append(f"{stem}.png")
    data = {**result.to_dict(), FIGURES_KEY: names, **(extra or {})}
    (folder / f"{result.study}.json").write_text(json.dumps(data, indent=1))
    return names
