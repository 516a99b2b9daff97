"""Which figures each study result gets: a figure maker registers itself for a result class where it is defined.

    @figure(NormsResult, "norm_profile")
    def norm_profile(result) -> Figure: ...

    @figure(NormsResult, "outlier_maps", images=True)     # drawn over the images the study ran on
    def outlier_maps(result, images=None) -> Figure: ...

A maker returns a Figure, or None when the result has nothing to draw. ``interp.plots`` imports every figure
module, so ``import interp.plots`` registers them all; importing it also lets a study result draw its figures
when a notebook displays it (:func:`~interp.studies.core.result.register_figure_drawer`).

>>> import interp.plots
>>> from interp.studies.artifacts.norms import norms_study
>>> norms_result = norms_study(source, progress=False)
>>> [stem for stem, fig in study_figures(norms_result, images)]    # (file stem, Figure) pairs
['norm_profile', 'norm_histograms', 'outlier_maps']
"""
from __future__ import annotations

from typing import Callable, Dict, List, NamedTuple, Optional, Tuple

from matplotlib.figure import Figure

from ..studies.core.result import StudyResult, register_figure_drawer


class FigureSpec(NamedTuple):
    """One figure of a result class: its file stem, its maker, whether the maker takes the images (overlays), and
    the keyword options it takes from the caller (e.g. ``n_maps``: how many images a map figure draws)."""

    stem: str
    make: Callable[..., Optional[Figure]]
    takes_images: bool = False
    options: Tuple[str, ...] = ()


FIGURES: Dict[type, List[FigureSpec]] = {}


def figure(result_class: type, stem: str, *, images: bool = False, options: Tuple[str, ...] = ()) -> Callable:
    """Decorator: the maker is one figure (file ``<stem>.png``) of every ``result_class`` result, in the order the
    makers are defined. Re-defining a stem replaces it."""
    def register(make: Callable[..., Optional[Figure]]) -> Callable[..., Optional[Figure]]:
        specs = [s for s in FIGURES.setdefault(result_class, []) if s.stem != stem]
        FIGURES[result_class] = specs + [FigureSpec(stem, make, images, tuple(options))]
        return make

    return register


def figure_specs(result: object) -> List[FigureSpec]:
    """The figures registered for ``result``'s class (or the nearest base class that has some)."""
    for cls in type(result).__mro__:
        if cls in FIGURES:
            return FIGURES[cls]
    return []


def has_figures(result: object) -> bool:
    """Whether ``result`` (a study result) has registered figures."""
    return bool(figure_specs(result))


def study_figures(result: StudyResult, images=None, **options) -> List[Tuple[str, Figure]]:
    """Every figure of one study result as (file stem, Figure) pairs, e.g. for ``save_result``.

    Args:
        images: for the map figures, the images the study ran on (Tensor[N, 3, H, W] in 0..1 or PIL list).
        options: figure options (``n_maps=``); each maker gets those its :class:`FigureSpec` names.

    Raises:
        ValueError: ``result`` is not a study result, or its class has no figures.
    """
    specs = figure_specs(result) if isinstance(result, StudyResult) else []
    if not specs:
        known = sorted(cls.__name__ for cls in FIGURES)
        raise ValueError(f"no figures for a {type(result).__name__} (results with figures: {', '.join(known)})")
    figures = []
    for spec in specs:
        args = (result, images) if spec.takes_images else (result,)
        figures.append((spec.stem, spec.make(*args, **{k: options[k] for k in spec.options if k in options})))
    return [(stem, fig) for stem, fig in figures if fig is not None]


def _notebook_figures(result: StudyResult) -> List[Tuple[str, Figure]]:
    return study_figures(result) if has_figures(result) else []


register_figure_drawer(_notebook_figures)  # a result shown in a notebook draws its figures
