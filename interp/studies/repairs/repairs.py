"""Every training-free repair of the high-norm tokens on one table (docs/methods.md section 2, "Every training-free
repair on one table"), and SINDER's singular-defect direction predicted from the weights.

The repairs, each against the intact model on the same images (:mod:`.calibration` builds them):

* ``test_time_register``: :class:`~interp.interventions.TestTimeRegister` (Jiang et al. 2025; needs ``neurons``);
* ``attention_bias``: :class:`~interp.interventions.AttentionBias`, the register as a fixed key/value column,
  calibrated on the study's images (needs ``neurons``);
* ``fix_reg_mean``: Sun et al.'s Fix-Reg-Mean (:func:`~interp.interventions.token_replacement.fix_reg_mean`; models
  with registers only);
* ``mean_replacement``: :class:`~interp.interventions.HighNormReplacement`, the high-norm patch tokens replaced by
  their image's mean normal patch at the output of every block whose norms split (each block's own threshold);
* ``regcache``: :class:`~interp.interventions.RegCache`, the artifact tokens' cached key/value as a prefix from a
  middle block on (interp's reading of Kim et al. 2025: its code was not reachable);
* ``tta``: PH-Reg's test-time-augmentation denoising (:mod:`.tta`): shifted and flipped views, their features put
  back on the grid and averaged (the detection block's tokens, the CLS attention maps and the final features alike;
  the logits and pooled vectors are the views' mean, an interp addition so the row has a behaviour).

Columns: ``outlier_count`` (patch tokens above the detection's counting threshold at the detection block, over all
images); ``cls_attention_on_artifacts`` (the share of the last block's CLS->patch attention on the intact model's
artifact patches, mean over the images that have any; None without CLS); the behaviour metrics
(:mod:`interp.studies.core.behaviour`; ``metric`` names the headline); ``patch_cosine`` (the final normed patch
features' cosine to the intact model's on the intact model's normal patches, mean over images: what the repair
costs the dense features where there was nothing to repair); ``forwards`` per image at inference, what it ``adds``
and its ``calibration``. Mean replacement counts no outlier at the detection block by construction (it replaces
them there): its row's information is the attention, the behaviour and the cosine.

Without artifacts at the detection block the repairs have nothing to repair: none is run, the result says so.

>>> result = repairs_study(source, neurons="2:17,2:101,2:402,2:655", sinder_samples=2000, progress=False)
>>> result.rows["test_time_register"]["outlier_count"], result.rows["intact"]["outlier_count"] > 0
(0, True)
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Dict, List, Optional

import math

import numpy as np
import torch
import torch.nn.functional as F

from ...detection.detection import DetectionLike, RunOptions, detect, detection_header, detection_params
from ...errors import InterpError
from ...interventions.neuron_sets import ranked_neurons
from ...runtime.paired import Condition, paired_pass
from ...runtime.source import require_live
from ..core.behaviour import BehaviourMeter, behaviour_readout, headline_metric
from ..core.options import FINAL
from ..core.result import OutlierStudyResult, behaviour_lines, skipped_records
from ..core.stats import attention_on_artifacts
from ..declaration import study
from .calibration import REPAIRS, block_pass, block_thresholds, build_repairs
from .configs import RepairsConfig
from .sinder import singular_defect_directions
from .tta import recover, tta_views, view_images

LABELS = {"intact": "intact", "test_time_register": "test-time register", "attention_bias": "attention bias",
          "fix_reg_mean": "Fix-Reg-Mean", "mean_replacement": "mean replacement", "regcache": "RegCache",
          "tta": "TTA denoising"}


@dataclass
class RepairsResult(OutlierStudyResult):
    """Result of :func:`repairs_study`.

    Attributes:
        rows: repair name (:data:`~interp.studies.repairs.calibration.REPAIRS`) -> its record (module doc), or
            ``{"status": "n/a", "reason"}``; empty when no artifacts were found.
        metric: the headline behaviour metric (accuracy, top1_agreement or pooled_cosine).
        counting_threshold: the norm outliers are counted above at the detection block.
        block_thresholds: {block: norm} of the blocks whose norms split (mean replacement edits those).
        tta: the views used: ``offsets`` [[row, col], ...] in patches and ``flips``.
        sinder: per block ``cos_measured`` (|cos| of SINDER's direction with the measured artifact direction, None
            without artifacts), ``neuron_cos`` ({neuron: |cos|} with the write direction of each register neuron of
            that block), ``high_norm`` (the block's norms split); ``chance`` (the mean |cos| of two random
            directions); None with ``sinder=False``; ``{"error": why}`` when the blocks are not SINDER's kind.
        message: the headline.
    """

    study = "repairs"
    rows: Dict[str, Dict] = field(default_factory=dict)
    metric: str = ""
    counting_threshold: Optional[float] = None
    block_thresholds: Dict[int, float] = field(default_factory=dict)
    tta: Dict = field(default_factory=dict)
    sinder: Optional[Dict] = None
    message: str = ""
    classifier: Optional[Dict] = None
    behaviour_note: Optional[str] = None

    def console_lines(self, config=None) -> List[str]:
        """The headline, a line per repair, the SINDER line and the behaviour note."""
        lines = [self.message]
        for name, row in self.rows.items():
            lines.append(f"  {LABELS[name]:<18} " + (row["reason"] if row.get("status") == "n/a" else _cells(row, self.metric)))
        if self.sinder and "blocks" in self.sinder:
            cos = [b["cos_measured"] for b in self.sinder["blocks"]]
            shown = ", ".join("-" if c is None else f"{c:.2f}" for c in cos)
            lines.append(f"SINDER direction vs the measured artifact direction, |cos| per block: {shown} "
                         f"(random directions: {self.sinder['chance']:.2f})")
        elif self.sinder:
            lines.append(f"SINDER: {self.sinder['error']}")
        return lines + behaviour_lines(self)


def _cells(row: Dict, metric: str) -> str:
    attn = row["cls_attention_on_artifacts"]
    return (f"outliers {row['outlier_count']:>5}  CLS attention on artifacts "
            f"{'-' if attn is None else f'{attn:.3f}'}  {metric} {row[metric]:.3f}  patch cosine "
            f"{row['patch_cosine']:.3f}  {row['forwards']} forward{'s' if row['forwards'] != 1 else ''}/image")


def _patch_cosine(feats: torch.Tensor, intact: torch.Tensor, normal: torch.Tensor) -> List[float]:
    """Per image with normal patches: mean cosine of ``feats`` [b, P, d] to ``intact`` over ``normal`` Bool[b, P]."""
    cos = F.cosine_similarity(feats.double(), intact.double(), dim=-1)
    keep = normal.any(-1)
    return ((cos * normal).sum(-1) / normal.sum(-1).clamp_min(1))[keep].tolist()


@study(RepairsConfig)
@torch.no_grad()
def repairs_study(source, config: RepairsConfig, *, detection: DetectionLike,
                  progress: bool = True) -> RepairsResult:
    """Run every training-free repair and SINDER's direction on the source's images (module doc).

    Args:
        source: a live source (the study re-runs the model), one token grid (not a pyramid).
        config: the options (:class:`~interp.studies.repairs.configs.RepairsConfig`; or pass them as keywords):
            ``neurons`` (the test-time register and the attention bias), ``tta_views``/``tta_shift``/``seed`` (the
            views), ``regcache_block``, ``sinder``/``sinder_samples``, ``classifier`` and ``detection`` (a
            :class:`~interp.detection.spec.DetectionSpec`).
        detection: the unedited model's detection on this source when already computed, else the config's spec
            (:func:`~interp.detection.detection.detect`).
        progress: show progress bars.
    """
    require_live(source, "repairs study")
    layout = source.layout
    if layout.stage_grids:
        raise InterpError("the repairs study needs one token grid through the blocks; a pyramid's stages change it")
    readout = behaviour_readout(source, config.classifier)
    neurons = None if config.neurons is None else ranked_neurons(config.neurons, source, force=config.force,
                                                                 label="--neurons", flag="--force")
    found = detect(source, detection, RunOptions(source.batch_size, progress=progress))
    header = detection_header(found, "repairs")
    thr = found.counting_threshold()
    measured = block_pass(source, found.outliers)
    sinder = _sinder(source, config, measured.directions, neurons, found) if config.sinder else None
    params = {"neurons": None if neurons is None else {str(k): list(v) for k, v in neurons.items()},
              "tta_views": config.tta_views, "tta_shift": config.tta_shift, "regcache_block": config.regcache_block,
              "sinder": config.sinder, "sinder_samples": config.sinder_samples, "seed": config.seed,
              **detection_params(found), "batch_size": source.batch_size}
    common = dict(model=source.model_name, fingerprint=source.fingerprint, params=params, seed=config.seed,
                  ids=list(source.ids), skipped=skipped_records(source), **header, counting_threshold=float(thr),
                  sinder=sinder, classifier=readout.record(), behaviour_note=readout.note,
                  metric=headline_metric(readout))
    if not found.artifacts_found:
        return RepairsResult(**common, message=f"no artifacts at block {found.layer} ({found.describe()}): the "
                                               "repairs have nothing to repair; none was run")
    thresholds = block_thresholds(measured.norms, found.layer, thr)
    repairs = build_repairs(source, neurons, found.outliers, thresholds, config.tta_views, config.regcache_block)
    views = tta_views(tuple(layout.grid), config.tta_views, config.tta_shift, config.seed)
    rows = _measure(source, repairs, views, found, thr, readout, progress)
    for name in REPAIRS:
        r = repairs[name]
        rows[name] = {"status": "n/a", "reason": r.reason} if r.interventions is None else {
            "status": "ran", **rows[name], "forwards": r.forwards, "adds": r.adds, "calibration": r.calibration,
            **r.params}
    rows = {name: rows[name] for name in REPAIRS}
    return RepairsResult(**common, rows=rows, block_thresholds=thresholds,
                         tta={"offsets": views.offsets.tolist(), "flips": views.flips.tolist()},
                         message=_message(rows, found.layer))


def _measure(source, repairs, views, found, thr: float, readout, progress: bool) -> Dict[str, Dict]:
    """The paired pass: every repair that runs and every TTA view, per batch, against the intact run."""
    layout, last = source.layout, source.n_layers - 1
    det = source.blocks.resid_post(found.layer)
    attn = [last] if layout.cls_index is not None else []
    final = {FINAL: lambda lay: lambda t: t[:, lay.patch_slice]}
    reduce = lambda lay: {FINAL: final[FINAL](lay)}  # noqa: E731 (per layout)
    conditions = {name: Condition(r.interventions, attention_layers=attn, hooks=[FINAL], reduce=reduce)
                  for name, r in repairs.items() if r.interventions is not None and name != "tta"}
    conditions["intact"] = Condition([], attention_layers=attn, hooks=[FINAL, det], reduce=reduce)
    data = source.data_config()
    fill = (1 - torch.tensor(data["mean"])) / torch.tensor(data["std"])
    for k in range(1, len(views)):
        conditions[f"view:{k}"] = Condition([], images=lambda start, x, k=k: view_images(
            x, views, k, source.patch_size, fill), attention_layers=attn, hooks=[FINAL, det], reduce=reduce)
    names = [n for n in conditions if not n.startswith("view:")] + ["tta"]
    meter = BehaviourMeter(readout)
    tally = {n: {"outliers": 0, "attn": [], "cos": []} for n in names}
    for pair in paired_pass(source, conditions, detect_layer=found.layer, classifier=readout.classifier,
                            baseline=False, progress=progress, desc="repairs"):
        intact = pair.edited["intact"]
        mask = found.outliers[pair.start:pair.start + len(pair)]
        views_out = [intact] + [pair.edited[f"view:{k}"] for k in range(1, len(views))]
        for name in names:
            if name == "tta":
                norms = recover([v.acts[det][:, v.layout.patch_slice] for v in views_out], views).norm(dim=-1)
                cls_map = recover([v.cls_attention[last] for v in views_out], views) if attn else None
                feats = recover([v.acts[FINAL] for v in views_out], views)
                logits = torch.stack([v.logits for v in views_out]).mean(0)
                pooled = torch.stack([v.pooled for v in views_out]).mean(0)
            else:
                out = pair.edited[name]
                norms, feats, logits, pooled = out.patch_norms, out.acts[FINAL], out.logits, out.pooled
                cls_map = out.cls_attention[last] if attn else None
            meter.add(name, pair.start, logits, pooled, intact.logits, intact.pooled)
            tally[name]["outliers"] += int((norms > thr).sum())
            if cls_map is not None:
                tally[name]["attn"] += attention_on_artifacts(cls_map, mask)[0]
            tally[name]["cos"] += _patch_cosine(feats, intact.acts[FINAL], ~mask)
    return {n: {"outlier_count": t["outliers"], **meter.metrics(n),
                "cls_attention_on_artifacts": float(np.mean(t["attn"])) if t["attn"] else None,
                "patch_cosine": float(np.mean(t["cos"])) if t["cos"] else None} for n, t in tally.items()}


def _sinder(source, config, directions, neurons, found) -> Dict:
    """SINDER's direction per block against the measured artifact direction and the register neurons' writes."""
    model = source.weights_model
    try:
        predicted = singular_defect_directions(model, config.sinder_samples, config.seed)
    except InterpError as e:
        return {"error": f"n/a: {e}"}
    blocks = []
    for b, u in enumerate(predicted):
        m = directions.get(b) if found.artifacts_found else None
        writes = {}
        for n in (neurons or {}).get(b, []):
            writes[str(n)] = float(abs(F.cosine_similarity(u.double(), source.neuron_writes(b)[:, n].double(), dim=0)))
        blocks.append({"block": b, "cos_measured": None if m is None else float(abs(F.cosine_similarity(
            u.double(), m.double(), dim=0))), "neuron_cos": writes})
    d = int(predicted.shape[1])
    return {"blocks": blocks, "chance": math.sqrt(2 / (math.pi * d)), "samples": config.sinder_samples}


def _message(rows: Dict[str, Dict], layer: int) -> str:
    ran = {n: r for n, r in rows.items() if r["status"] == "ran"}
    before = ran["intact"]["outlier_count"]
    removed = [LABELS[n] for n, r in ran.items() if n != "intact" and r["outlier_count"] <= 0.1 * before]
    kept = [LABELS[n] for n, r in ran.items() if n != "intact" and r["outlier_count"] > 0.1 * before]
    return (f"{before} artifact tokens at block {layer} on the intact model; down by 90% or more: "
            f"{', '.join(removed) or 'none'}; not: {', '.join(kept) or 'none'}")
