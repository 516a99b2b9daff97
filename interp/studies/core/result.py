"""The base of every study result: a dataclass that serialises to JSON with its parameters,
the model's name and weights fingerprint, and the seed."""
from __future__ import annotations

import dataclasses
import json
import math
from pathlib import Path
from typing import Any, Callable, ClassVar, Dict, List, Optional, Tuple, Type, TypeVar, Union

import numpy as np
import torch

R = TypeVar("R", bound="StudyResult")
FIGURE_IMAGES = 8  # images drawn by the map figures of a study run


def jsonable(obj: Any) -> Any:
    """Tensors/arrays -> nested lists, dataclasses -> dicts, NaN/inf -> None, recursively."""
    if dataclasses.is_dataclass(obj) and not isinstance(obj, type):
        return {f.name: jsonable(getattr(obj, f.name)) for f in dataclasses.fields(obj)}
    if isinstance(obj, torch.Tensor):
        return jsonable(obj.detach().cpu().numpy())
    if isinstance(obj, np.ndarray):
        return jsonable(obj.tolist())
    if isinstance(obj, (np.floating, float)):
        return None if not math.isfinite(float(obj)) else float(obj)
    if isinstance(obj, (np.integer,)):
        return int(obj)
    if isinstance(obj, (np.bool_,)):
        return bool(obj)
    if isinstance(obj, dict):
        return {str(k): jsonable(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [jsonable(v) for v in obj]
    if isinstance(obj, Path):
        return str(obj)
    return obj


# How a result shown in a notebook draws its figures: (result) -> [(name, Figure)]. The plots layer sits above the
# studies, so ``interp.plots`` registers its drawer here when imported (:func:`register_figure_drawer`).
FIGURE_DRAWER: List[Callable[["StudyResult"], List[Tuple[str, Any]]]] = []


def register_figure_drawer(draw: Callable[["StudyResult"], List[Tuple[str, Any]]]) -> None:
    """Make ``draw`` the way a result displayed in a notebook draws its figures (``interp.plots`` calls it)."""
    FIGURE_DRAWER[:] = [draw]


@dataclasses.dataclass
class StudyResult:
    """Common header of all study results.

    Attributes:
        model: model name.
        fingerprint: weights fingerprint of the model (or of the cache's model).
        params: the study's parameters, as passed (JSON-safe).
        seed: random seed used (None when the study draws nothing at random).
        ids: the image ids the result describes, in order.
        skipped: ``{"image", "reason"}`` of each unreadable image left out of ``ids``.
    """

    study: ClassVar[str] = "study"
    model: str
    fingerprint: str
    params: Dict[str, Any]
    seed: Optional[int]
    ids: List[str] = dataclasses.field(default_factory=list)
    skipped: List[Dict[str, str]] = dataclasses.field(default_factory=list)

    def to_dict(self) -> dict:
        return {"study": self.study, **jsonable(self)}

    def to_json(self, path: Union[str, Path, None] = None) -> str:
        text = json.dumps(self.to_dict(), indent=1)
        if path is not None:
            Path(path).parent.mkdir(parents=True, exist_ok=True)
            Path(path).write_text(text)
        return text

    @classmethod
    def from_dict(cls: Type[R], data: dict) -> R:
        """The result ``data`` describes (``to_dict``'s output). Keys this class does not know are left out;
        renamed keys are read through ``_aliases``.

        Raises:
            InterpError: ``data`` is another study's result (its ``"study"`` is not this class's).
        """
        from ...errors import InterpError

        kind = data.get("study")
        if kind is not None and cls.study != "study" and kind != cls.study:
            raise InterpError(f"this is a {kind!r} result, not a {cls.study!r} one: load it with the "
                              f"{kind} study's result class")
        data = cls._aliases(dict(data))
        names = {f.name for f in dataclasses.fields(cls)}
        return cls(**{k: v for k, v in data.items() if k in names})

    @classmethod
    def _aliases(cls, data: dict) -> dict:
        """Older key names mapped to the current ones (a result class overrides this when it renames)."""
        return data

    @classmethod
    def from_json(cls: Type[R], path: Union[str, Path]) -> R:
        return cls.from_dict(json.loads(Path(path).read_text()))

    def console_lines(self, config: Any = None) -> List[str]:
        """What ``interp study`` prints once the study is done (a line or a few: the headline figures), given the
        study's ``config`` (what was asked for)."""
        summary = getattr(self, "summary", None)
        return [str(summary())] if callable(summary) else []

    def figure_images(self, source) -> Any:
        """The images the map figures are drawn over (``Tensor[n, 3, H, W]`` in 0..1; None without images):
        the first of a live source's images (or of a cache's, decoded again from their files), as the model saw
        them."""
        return source.display_images(FIGURE_IMAGES) if source.shows_images else None

    def _repr_html_(self) -> str:
        """Jupyter display: summary table and figures (see :func:`result_html`)."""
        return result_html(self)


def skipped_records(source) -> List[Dict[str, str]]:
    """``StudyResult.skipped`` of a source: one ``{"image", "reason"}`` per unreadable image it left out."""
    return [{"image": str(image), "reason": str(reason)} for image, reason in source.skipped]


def behaviour_lines(result: Any) -> List[str]:
    """The console line of a study with behaviour metrics (its ``classifier`` record and ``behaviour_note``): why
    there is no agreement or accuracy, or the classifier file the metrics went through; none for the model's
    own classification head."""
    clf = result.classifier or {}
    if result.behaviour_note:
        return [f"note: {result.behaviour_note}"]
    if clf.get("kind") not in (None, "model_head"):
        return [f"behaviour through the {clf['kind']} classifier {clf.get('path') or clf.get('source') or ''} "
                f"({clf['n_classes']} classes)"]
    return []


@dataclasses.dataclass
class OutlierStudyResult(StudyResult):
    """A study built on high-norm tokens: the one detection header
    (:func:`~interp.detection.detection.detection_header`).

    Attributes:
        detect_layer: the detection block (resolved, >= 0).
        threshold: the resolved norm threshold; None when "auto" finds no separated high-norm mode.
        threshold_method: "fixed", "percentile" or "auto".
        artifacts_found: the threshold's verdict (:class:`~interp.detection.thresholds.Threshold`): "auto" and
            percentiles need a separated minority high-norm mode; a fixed value needs a minority of tokens above it.
        warning: why the study's outliers are not register artifacts; when artifacts were found, the
            threshold's own caveat (it lies inside the bulk) or None.
        preset: the published settings the detection came from (canonical name), or None.
        high_norm_from_input: tokens above the threshold that were already high-norm at the input of block 0
            (not formed by the blocks, :mod:`interp.detection.formation`): not counted as artifacts.
        artifact_blocks: where the artifacts are when the detection block was chosen, not given
            (:meth:`~interp.detection.survey.Survey.describe`: "stage 2: artifacts, 2.62x, blocks 4-5; stage 3:
            none"), else None.
    """

    detect_layer: int = -1
    threshold: Optional[float] = None
    threshold_method: str = "auto"
    artifacts_found: bool = False
    warning: Optional[str] = None
    preset: Optional[str] = None
    high_norm_from_input: int = 0
    artifact_blocks: Optional[str] = None


# ------------------------------------------------------------------------------ Jupyter rendering
_HTML_LIST_ITEMS = 8   # lists/dicts up to this many scalar items are shown in full, longer ones summarised
_HTML_TEXT_CHARS = 300


def _html_scalar(value: Any) -> str:
    if isinstance(value, (float, np.floating)):
        return "nan" if not math.isfinite(float(value)) else f"{float(value):.4g}"
    text = str(value)
    return text if len(text) <= _HTML_TEXT_CHARS else text[:_HTML_TEXT_CHARS] + "..."


def _is_scalar(value: Any) -> bool:
    return value is None or isinstance(value, (str, bool, int, float, np.generic))


def _html_value(value: Any) -> str:
    """One summary cell (plain text, not yet escaped) for a result field of any type."""
    if _is_scalar(value):
        return _html_scalar(value)
    if isinstance(value, (torch.Tensor, np.ndarray)):
        return f"array {tuple(value.shape)} {str(value.dtype).replace('torch.', '')}"
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return type(value).__name__ + "(" + _html_value(jsonable(value)) + ")"
    if isinstance(value, dict):
        if len(value) <= _HTML_LIST_ITEMS and all(_is_scalar(v) for v in value.values()):
            return ", ".join(f"{k}: {_html_scalar(v)}" for k, v in value.items()) or "{}"
        keys = ", ".join(str(k) for k in list(value)[:_HTML_LIST_ITEMS])
        return f"{len(value)} entries ({keys}{', ...' if len(value) > _HTML_LIST_ITEMS else ''})"
    if isinstance(value, (list, tuple)):
        if len(value) <= _HTML_LIST_ITEMS and all(_is_scalar(v) for v in value):
            return "[" + ", ".join(_html_scalar(v) for v in value) + "]"
        return f"list of {len(value)}"
    return _html_scalar(value)


def _figure_png_base64(fig: Any, dpi: int = 80) -> str:
    import base64
    import io

    buffer = io.BytesIO()
    fig.savefig(buffer, format="png", dpi=dpi, bbox_inches="tight")
    return base64.b64encode(buffer.getvalue()).decode("ascii")


def result_html(result: "StudyResult") -> str:
    """HTML for a notebook: a title, a table of every field (long ones summarised), the result's own text
    summary/table when it has one, and its figures as inline base64 PNGs. A figure that cannot be drawn
    (a result without the data it needs) becomes one line saying why; rendering itself never raises."""
    from html import escape

    rows = [f"<tr><th style='text-align:left'>{escape(f.name)}</th>"
            f"<td style='text-align:left'>{escape(_html_value(getattr(result, f.name)))}</td></tr>"
            for f in dataclasses.fields(result)]
    parts = [f"<div class='interp-result'><h4>{escape(result.study)} study: {escape(str(result.model))}</h4>",
             "<table>" + "".join(rows) + "</table>"]
    for method in ("summary", "table"):
        text_fn = getattr(result, method, None)
        if callable(text_fn):
            try:
                parts.append(f"<pre>{escape(str(text_fn()))}</pre>")
            except Exception as e:  # a partial result: show what is there
                parts.append(f"<p>({method} unavailable: {escape(type(e).__name__)}: {escape(str(e))})</p>")
    drawer = FIGURE_DRAWER[0] if FIGURE_DRAWER else None
    if drawer is None:
        parts.append("<p>(figures: <code>import interp.plots</code> to draw them here)</p>")
    try:
        figures = drawer(result) if drawer is not None else []
    except Exception as e:
        figures = []
        parts.append(f"<p>(figures unavailable: {escape(type(e).__name__)}: {escape(str(e))})</p>")
    for name, fig in figures:
        try:
            parts.append(f"<figure><img alt='{escape(name)}' src='data:image/png;base64,"
                         f"{_figure_png_base64(fig)}'/><figcaption>{escape(name)}</figcaption></figure>")
        except Exception as e:
            parts.append(f"<p>(figure {escape(name)} unavailable: {escape(type(e).__name__)}: {escape(str(e))})</p>")
    return "\n".join(parts) + "</div>"
