"""Which figures each study result gets: a table from the result's ``study`` name to its figure makers.

To give a new study figures, write the figure functions (result -> Figure) in a plots module and add one
:func:`register_figures` call at the bottom of that module (or an entry in :data:`FIGURES`).

>>> from interp.studies.norms import norms_study
>>> norms_result = norms_study(source, progress=False)
>>> for stem, fig in study_figures(norms_result, images):   # (file stem, Figure) pairs
...     fig.savefig(f"{stem}.png", dpi=110)
"""
from __future__ import annotations

from typing import Callable, Dict, List, Tuple

from matplotlib.figure import Figure

# study name -> [(file stem, maker, whether the maker takes the images for overlays)]
FIGURES: Dict[str, List[Tuple[str, Callable[..., Figure], bool]]] = {}


def register_figures(study: str, *makers: Tuple[str, Callable[..., Figure], bool]) -> None:
    """Declare the figures of results whose ``study`` is ``study``: (file stem, maker, takes images) each.
    A maker may return None for a result that has nothing to draw (the figure is then left out)."""
    FIGURES[study] = list(makers)


def _register_all() -> None:
    from . import causal, lazy, norms, objects, probes  # noqa: F401  (importing them registers their figures)


def has_figures(study: str) -> bool:
    """Whether results whose ``study`` is ``study`` have registered figures."""
    _register_all()
    return study in FIGURES


def study_figures(result, images=None) -> List[Tuple[str, Figure]]:
    """Every figure of one study result as (file stem, Figure) pairs, e.g. for ``write_outputs``.

    Args:
        images: for the map figures, the images the study ran on (Tensor[N, 3, H, W] in 0..1 or PIL list).
    """
    _register_all()
    study = getattr(result, "study", None)  # any object may be passed; it need not be a StudyResult
    if study not in FIGURES:
        raise ValueError(f"no artifact figures for a {study!r} result (expected one of {sorted(FIGURES)})")
    figures = [(stem, make(result, images) if takes_images else make(result))
               for stem, make, takes_images in FIGURES[study]]
    return [(stem, fig) for stem, fig in figures if fig is not None]
