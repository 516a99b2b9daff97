"""Which figures each study result gets: one explicit table from the result's ``study`` name to its figures.

To give a new study figures, write the figure functions (result -> Figure, or None when the result has
nothing to draw) in a plots module and add the study's row to :data:`FIGURES` here. The figure modules do
not import this one, so the table is complete as soon as this module is imported (no import side effects).
Code outside the package may add rows with :func:`register_figures`.

>>> from interp.studies.artifacts.norms import norms_study
>>> norms_result = norms_study(source, progress=False)
>>> [stem for stem, fig in study_figures(norms_result, images)]    # (file stem, Figure) pairs
['norm_profile', 'norm_histograms', 'outlier_maps']
"""
from __future__ import annotations

from typing import Callable, Dict, List, NamedTuple, Optional, Tuple

from matplotlib.figure import Figure

from ..studies.core.result import StudyResult
from . import aggregation, causal, norms, objects, probes, redundancy


class FigureSpec(NamedTuple):
    """One figure of a study: its file stem, its maker, whether the maker takes the images (overlays), and the
    keyword options it takes from the caller (e.g. ``n_maps``: how many images a map figure draws)."""

    stem: str
    make: Callable[..., Optional[Figure]]
    takes_images: bool = False
    options: Tuple[str, ...] = ()


FIGURES: Dict[str, List[FigureSpec]] = {
    "norms": [FigureSpec("norm_profile", norms.norm_profile), FigureSpec("norm_histograms", norms.norm_histograms),
              FigureSpec("outlier_maps", norms.outlier_maps, True)],
    "neurons": [FigureSpec("neuron_scores", causal.neuron_scores)],
    "ablate": [FigureSpec("ablation_bars", causal.ablation_bars)],
    "relocate": [FigureSpec("relocation_maps", causal.relocation_maps, True)],
    "registers": [FigureSpec("register_summary", causal.register_summary)],
    "redundancy": [FigureSpec("neighbour_similarity", redundancy.neighbour_similarity)],
    "patch_score": [FigureSpec("score_distributions", aggregation.score_distributions),
                    FigureSpec("score_maps", aggregation.score_maps_of_patch_score, options=("n_maps",))],
    "pib": [FigureSpec("pib", aggregation.pib_bars_if_any),
            FigureSpec("score_maps", aggregation.score_maps_if_pib, options=("n_maps",))],
    "masking": [FigureSpec("masking_curves", aggregation.masking_curves)],
    "selective_cls": [FigureSpec("pib", aggregation.pib_bars_if_any),
                      FigureSpec("score_distributions", aggregation.distributions_if_pib)],
    "probes": [FigureSpec("probes", probes.probe_bars)],
    "lost": [FigureSpec("lost_boxes", objects.lost_boxes, True)],
    "segmentation": [FigureSpec("segmentation_overlays", objects.segmentation_overlays, True)],
}


def register_figures(study: str, *makers: Tuple[str, Callable[..., Optional[Figure]], bool]) -> None:
    """Add (or replace) the row of ``study`` in :data:`FIGURES`: (file stem, maker, takes images) each.
    For studies defined outside the package; the package's own rows are written in the table above."""
    FIGURES[study] = [FigureSpec(*m) for m in makers]


def has_figures(study: str) -> bool:
    """Whether results whose ``study`` is ``study`` have figures."""
    return study in FIGURES


def study_figures(result: StudyResult, images=None, **options) -> List[Tuple[str, Figure]]:
    """Every figure of one study result as (file stem, Figure) pairs, e.g. for ``save_result``.

    Args:
        images: for the map figures, the images the study ran on (Tensor[N, 3, H, W] in 0..1 or PIL list).
        options: figure options (``n_maps=``); each maker gets those its :class:`FigureSpec` names.

    Raises:
        ValueError: ``result`` is not a study result, or its study has no figures.
    """
    study = result.study if isinstance(result, StudyResult) else None
    if study not in FIGURES:
        raise ValueError(f"no artifact figures for a {study!r} result (expected one of {sorted(FIGURES)})")
    figures = []
    for spec in FIGURES[study]:
        args = (result, images) if spec.takes_images else (result,)
        figures.append((spec.stem, spec.make(*args, **{k: options[k] for k in spec.options if k in options})))
    return [(stem, fig) for stem, fig in figures if fig is not None]
