"""Causal relocation (docs/methods.md section 2): write the register neurons' maximum at chosen patches and
zero them elsewhere; the high-norm tokens (and attention sinks) should appear exactly on the target mask.

Reports, per image, the IoU between the outlier map after relocation and the mask, and where CLS attends
before and after (share of the last block's CLS->patch attention on the mask, head mean), and the behaviour
metrics of :mod:`interp.studies.core.behaviour` for the unedited ("baseline") and relocated ("relocated") runs.

>>> result = relocate_study(source, neurons="2:17,2:101,2:402,2:655", target="box:2,3,2,4", progress=False)
>>> max(result.iou)                                   # planted_vit: the outliers are exactly the 2 x 4 box
1.0
"""
from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Any, Dict, List, Optional, Sequence, Tuple

import numpy as np
import torch

from ...errors import InterpError
from ...interventions import Relocation, masks
from ...interventions.neuron_sets import ranked_neurons
from ..core.options import required_neurons
from ...detection.detection import DetectionLike, detect, detection_header, detection_params
from ..core.behaviour import BehaviourMeter, behaviour_readout
from ...runtime.forward import Baseline
from ...runtime.paired import Condition, paired_pass
from ..core.stats import iou
from ...detection.detection import Detection
from ..core.result import OutlierStudyResult, behaviour_lines, skipped_records
from ...runtime.live_source import LiveSource
from ..declaration import study
from .configs import RelocateConfig
from ...hooks.names import resolve_block
from ...runtime.source import require_live


def relocation_target(target: Any, grid: Sequence[int]) -> torch.Tensor:
    """A relocation target -> Bool[h, w] on the patch ``grid``: None or ``"smiley"`` (a smiley on the grid), text
    in the one target grammar (:func:`interp.interventions.masks.parse_target`: ``box:TOP,LEFT,HEIGHT,WIDTH``,
    ``indices:I,J,...``, ...) or a mask (tensor, 0/1 grid). Raises InterpError for a bad form, a mask of another
    shape than ``grid`` or one without a cell."""
    grid = tuple(grid)
    try:
        mask = masks.parse_target(target.strip() if isinstance(target, str) else target, grid)
    except ValueError as e:
        raise InterpError(f"--target {target!r}: {e}" if isinstance(target, str) else f"target: {e}") from None
    if tuple(mask.shape) != grid:
        raise InterpError(f"target mask has shape {tuple(mask.shape)}, the model's patch grid is {grid}")
    if not mask.any():
        raise InterpError("the target mask has no cell: there is nothing to relocate onto (give a target with "
                          "at least one patch, e.g. --target smiley)")
    return mask


@dataclass
class RelocateResult(OutlierStudyResult):
    """Result of :func:`relocate_study`.

    Attributes:
        target: the mask [h][w] (0/1).
        iou: per image IoU of the relocated outlier map with the target; ``mean_iou`` their mean;
            ``mean_iou_active`` the mean over images that had outliers before (where the neurons fire: on
            the others the per-image maximum written is near zero, so nothing can move).
        outlier_maps_before / outlier_maps_after: [N][h][w] 0/1 at the detection layer.
        cls_attention_on_target_before / _after: per image share of CLS->patch attention on the target
            (last block, head mean); ``cls_attention_argmax_on_target``: share of images whose most-attended
            patch lies on the target after relocation.
        counting_threshold: the norm the outlier maps use: the unedited model's ``threshold``, or the 99th
            percentile of its norms when "auto" finds no separated mode.
        conditions: {"baseline", "relocated"} -> behaviour metrics (``interp.studies.core.behaviour.METRICS``);
        classifier: which classifier they used; behaviour_note: why there is no agreement or accuracy.
    """

    study = "relocate"
    neurons: Dict = field(default_factory=dict)
    value: str = "neuron_max"
    counting_threshold: Optional[float] = None
    grid: List[int] = field(default_factory=list)
    target: List = field(default_factory=list)
    iou: List[float] = field(default_factory=list)
    mean_iou: float = 0.0
    mean_iou_active: Optional[float] = None
    outlier_maps_before: List = field(default_factory=list)
    outlier_maps_after: List = field(default_factory=list)
    cls_attention_on_target_before: List[float] = field(default_factory=list)
    cls_attention_on_target_after: List[float] = field(default_factory=list)
    cls_attention_argmax_on_target: Optional[float] = None
    conditions: Dict[str, Dict] = field(default_factory=dict)
    classifier: Optional[Dict] = None
    behaviour_note: Optional[str] = None

    def console_lines(self, config=None) -> List[str]:
        """The mean IoU with the target, then the behaviour line."""
        return [f"mean IoU with the target: {self.mean_iou:.3f}", *behaviour_lines(self)]


def relocation_grid(source, neurons) -> Tuple[int, int]:
    """The patch grid of the blocks the relocated neurons are in (one grid: a pyramid stage's, or the ViT's)."""
    grids = {tuple(source.layout.for_block(l).grid) for l in neurons}
    if len(grids) != 1:
        raise InterpError(f"the neurons lie in blocks on different grids {sorted(grids)}: a relocation target is "
                          "one mask, so relocate neurons of one stage at a time")
    return grids.pop()


@study(RelocateConfig)
def relocate_study(source: LiveSource, config: RelocateConfig, *, detection: DetectionLike,
                   baseline: Optional[Baseline] = None, progress: bool = True) -> RelocateResult:
    """Relocate the register neurons onto the target (default: a smiley on the patch grid) and measure the
    outliers.

    Args:
        source: a live source (relocation re-runs the model; its ``batch_size`` images per forward).
        config: the options (:class:`~interp.studies.artifacts.configs.RelocateConfig`; or pass them as
            keywords): ``neurons`` the neurons to move (``{layer: [neuron, ...]}``, ``"2:17,2:101"``, a
            neurons.json path or a neurons result; one ranked on other weights is refused unless ``force``);
            ``target`` where to (:func:`relocation_target`: ``"smiley"``, ``"box:2,2,3,3"``, ... read on the
            source's patch grid, or a Bool[h, w] mask); ``value`` what is written there ("neuron_max": each
            neuron's per-image maximum, or "layer_max"); ``classifier`` a classifier file whose class logits give
            top-1 agreement and accuracy.
        detection: the outliers counted: a Detection of the unedited model made on this source by
            :func:`~interp.detection.detection.detect`, or a DetectionSpec (default the config's: "auto" at the
            last block), resolved on the unedited runs' norms at its block (no detection pass of its own).
        baseline: the unedited forwards (:func:`~interp.runtime.passes.baseline_pass`), when already made,
            with the same ``classifier``.
        progress: show progress bars.

    Outliers before and after are counted with the unedited model's detection: its threshold, or the 99th
    percentile of its
    norms when "auto" finds no separated mode, so a model without artifacts of its own still gets maps.
    Without artifacts the result carries ``artifacts_found=False`` and a ``warning`` (also ``warnings.warn``).
    """
    require_live(source, "relocation study")
    readout = behaviour_readout(source, config.classifier)  # a classifier that does not fit fails before any forward
    neurons = ranked_neurons(required_neurons(config.name, config.neurons), source, force=config.force, label="--neurons",
                             flag="--force")
    grid = tuple(relocation_grid(source, neurons))
    target = relocation_target(config.target, grid)
    value = config.value
    if isinstance(detection, Detection):
        found = detect(source, detection)
        spec, block = None, found.layer
    else:  # the detection comes from the unedited runs of the loop below: no pass of its own
        block = resolve_block(detection.resolved().detect_layer, source.n_layers)
        spec = replace(detection.resolved(), detect_layer=block)
    if tuple(source.layout.for_block(block).grid) != grid:
        raise InterpError(f"the relocation target lies on the grid of the neurons' blocks {grid}, the detection "
                          f"block ({source.blocks.label(block)}) on {tuple(source.layout.for_block(block).grid)}: "
                          "detect on a block of the neurons' stage (--detect-layer)")
    last = source.n_layers - 1
    clf = readout.classifier
    meter = BehaviourMeter(readout)
    reloc = Relocation(neurons, target=target, value=value)
    before, after, att_before, att_after = [], [], [], []
    edited = {"relocated": Condition([reloc], attention_layers=[last])}
    for pair in paired_pass(source, edited, detect_layer=block, classifier=clf, baseline=baseline or True,
                            progress=progress, desc="relocation"):
        b, a = pair.baseline, pair.edited["relocated"]
        meter.add("baseline", pair.start, b.logits, b.pooled, b.logits, b.pooled)
        meter.add("relocated", pair.start, a.logits, a.pooled, b.logits, b.pooled)
        before.append(b.patch_norms)
        after.append(a.patch_norms)
        if last in b.cls_attention:
            att_before.append(b.cls_attention[last])
            att_after.append(a.cls_attention[last])
    before, after = torch.cat(before), torch.cat(after)  # [N, P]
    if spec is not None:
        found = detect(source, spec, norms={source.blocks.resid_post(block): before})
    header = detection_header(found, "relocate")
    thr_value = found.counting_threshold()
    maps_before = (before > thr_value).reshape(-1, *grid)
    maps_after = (after > thr_value).reshape(-1, *grid)
    ious = [iou(m, target) for m in maps_after]
    active = [v for v, m in zip(ious, maps_before) if m.any()]
    flat_target = target.reshape(-1)
    share_before = share_after = []
    argmax_on = None
    if att_before:
        ab, aa = torch.cat(att_before), torch.cat(att_after)  # [N, P]
        share_before = ((ab * flat_target).sum(1) / ab.sum(1)).tolist()
        share_after = ((aa * flat_target).sum(1) / aa.sum(1)).tolist()
        argmax_on = float(flat_target[aa.argmax(1)].float().mean())
    params = {"neurons": {str(k): list(v) for k, v in neurons.items()}, "value": value,
              **detection_params(found), "batch_size": source.batch_size}
    return RelocateResult(
        model=source.model_name, fingerprint=source.fingerprint, params=params, seed=None,
        neurons=params["neurons"], value=value, **header, counting_threshold=float(thr_value),
        ids=list(source.ids), skipped=skipped_records(source), grid=list(grid),
        target=target.int().tolist(), iou=ious, mean_iou=float(np.mean(ious)) if ious else 0.0,
        mean_iou_active=float(np.mean(active)) if active else None,
        outlier_maps_before=maps_before.int().tolist(), outlier_maps_after=maps_after.int().tolist(),
        cls_attention_on_target_before=share_before, cls_attention_on_target_after=share_after,
        cls_attention_argmax_on_target=argmax_on,
        conditions=meter.conditions(), classifier=readout.record(), behaviour_note=readout.note,
    )
