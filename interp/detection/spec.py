"""What counts as a high-norm token, said once: :class:`DetectionSpec`, a threshold at a block, filled in by a
published preset where not given. It is the option group of every study and command that detects
(``--threshold``, ``--preset``, ``--detect-layer``) and what the one detection function resolves on a source
(:func:`interp.detection.detection.detect`). Torch-free: ``interp --help`` reads it.

>>> DetectionSpec(threshold="3.5").threshold            # a number given as text becomes a norm
3.5
>>> DetectionSpec(preset="darcet").resolved()           # the preset fills in what is not given
DetectionSpec(threshold=150.0, preset='darcet', detect_layer=-1)
"""
from __future__ import annotations

from dataclasses import dataclass, fields
from typing import Iterable, List, Optional, Union

from ..errors import InterpError
from ..hooks.names import BlockNames, resolve_block
from ..options import Options, option
from ..values import threshold_arg, threshold_value
from .presets import PRESETS, resolve_preset


@dataclass(frozen=True, kw_only=True)
class DetectionSpec(Options):
    """What counts as a high-norm token.

    Attributes:
        threshold: a norm value, ``"pNN"`` (per-model percentile of the detection block's patch norms) or
            ``"auto"`` (two-mode split of the log norms); None: the preset's, else ``"auto"``.
        preset: a name of :mod:`interp.detection.presets` (published settings); explicit values win over it.
        detect_layer: the block whose output decides (negative counts from the end); None: the preset's, else
            every block is judged and the stage with artifacts decides (:mod:`interp.detection.survey`).
    """

    threshold: Union[float, str, None] = option(
        None, "outlier norm threshold: a norm value > 0, pNN (e.g. p98) or auto (default, or the preset's)",
        parse=threshold_arg)
    preset: Optional[str] = option(None, f"published settings: {', '.join(PRESETS)} (explicit flags win)")
    detect_layer: Optional[int] = option(
        None, "block whose output decides outliers (default: the stage with artifacts, else the last; negative "
              "counts from the end)")

    def __post_init__(self) -> None:
        object.__setattr__(self, "threshold", threshold_value(self.threshold))
        super().__post_init__()

    def resolved(self) -> "DetectionSpec":
        """This spec with the preset applied: threshold and block filled in (``"auto"`` when neither gives a
        threshold), the preset's canonical name."""
        r = resolve_preset(self.preset, threshold=self.threshold, detect_layer=self.detect_layer)
        return DetectionSpec(threshold=r.get("threshold", "auto"), preset=r["preset"],
                             detect_layer=r.get("detect_layer"))

    def detect_block(self, n_layers: int) -> int:
        """The detection block (0-based) on an ``n_layers``-block model when one is named (the last otherwise)."""
        return resolve_block(self.resolved().detect_layer, n_layers, -1)

    def hooks(self, blocks: BlockNames) -> List[str]:
        """What a detection of this spec reads on a model with these blocks: the named block's output (every
        block's when none is named) and the input of block 0 (``blocks.0.hook_resid_pre``, the input the
        formed-inside rule compares with); a pass that reads their token norms lets
        :func:`~interp.detection.detection.detect` run on them (``norms=``)."""
        layer = self.resolved().detect_layer
        layers = range(len(blocks)) if layer is None else [resolve_block(layer, len(blocks))]
        return [blocks.resid_post(i) for i in layers] + [blocks.resid_pre(0)]


def refuse_loose_fields(where: str, keywords: Iterable[str]) -> None:
    """Refuse ``threshold=``, ``preset=`` or ``detect_layer=`` given to ``where`` (an engine that takes
    ``detection=``) beside the spec: a one-line InterpError naming ``detection=DetectionSpec(...)``."""
    names = {f.name for f in fields(DetectionSpec)}
    loose = [k for k in keywords if k in names]
    if loose:
        raise InterpError(f"{where}: {loose[0]}= belongs to the detection; pass "
                          f"detection=DetectionSpec({loose[0]}=...) or a Detection made by detect()")
