"""Test-time registers (docs/methods.md section 2): apply ``TestTimeRegister`` with the register neurons and
measure whether the high norm leaves the patches for the new register token.

Reports, with and without the register: patch outliers and max patch norm at the detection layer, the
register token's norm, CLS attention share on the register token (last block), the attention map's
cleanliness (:func:`attention_on_artifacts`: the share of the last block's CLS->patch attention on the unedited
model's high-norm patches, without and with the register), and the behaviour metrics of
:mod:`interp.studies.core.behaviour` (top-1 agreement through a real classifier; pooled-vector cosine always).

>>> result = registers_study(source, neurons="2:17,2:101,2:402,2:655", progress=False)
>>> result.with_register["outlier_count"]              # planted_vit: the high norm moved into the register
0
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Dict, List, Optional

import torch

from ...interventions import TestTimeRegister
from ...interventions.neuron_sets import ranked_neurons
from ..core.options import required_neurons
from ..core.behaviour import BehaviourMeter, behaviour_readout
from ..core.stats import attention_on_artifacts
from ...runtime.forward import Baseline
from ...runtime.paired import Condition, paired_pass
from ...detection.detection import DetectionLike, RunOptions, detect, detection_header, detection_params
from ..core.result import OutlierStudyResult, behaviour_lines, skipped_records
from ...runtime.live_source import LiveSource
from ..declaration import study
from .configs import RegistersConfig
from ...runtime.source import require_live


@dataclass
class RegistersResult(OutlierStudyResult):
    """Result of :func:`registers_study`.

    Attributes:
        baseline / with_register: {"outlier_count", "max_patch_norm", and the behaviour metrics
            (``interp.studies.core.behaviour.METRICS``)} over all images; ``conditions`` holds the same two
            records under "baseline" and "with_register" (the shape every behaviour study shares).
        classifier: which classifier the behaviour metrics used; behaviour_note: why there is no agreement or
            accuracy (None when both exist).
        register_norm: per image, the test-time register token's norm at the detection layer.
        cls_attention_on_register: per image, CLS attention (last block, head mean) on the register token.
        attention_on_artifacts: {"baseline", "with_register"}: the share of the last block's CLS->patch attention
            (head mean, over the patch tokens) on the unedited model's outlier patches, mean over the images that
            have any (:func:`attention_on_artifacts`); "patch_share": the share of the patches they are (what
            a uniform map would put there). Empty without a CLS token or without outliers.
        outlier_maps_after: [N][h][w] 0/1 patch outliers with the register.
        counting_threshold: the norm the outlier counts use: ``threshold``, or the 99th percentile of the
            unedited norms when "auto" finds no separated mode.
    """

    study = "registers"
    neurons: Dict = field(default_factory=dict)
    n_registers: int = 1
    value: str = "layer_max"
    counting_threshold: Optional[float] = None
    baseline: Dict = field(default_factory=dict)
    with_register: Dict = field(default_factory=dict)
    register_norm: List[float] = field(default_factory=list)
    cls_attention_on_register: List[float] = field(default_factory=list)
    attention_on_artifacts: Dict[str, float] = field(default_factory=dict)
    outlier_maps_after: List = field(default_factory=list)
    conditions: Dict[str, Dict] = field(default_factory=dict)
    classifier: Optional[Dict] = None
    behaviour_note: Optional[str] = None

    def console_lines(self, config=None) -> List[str]:
        """The patch outliers without and with the register, then the behaviour line."""
        on = self.attention_on_artifacts
        attention = [f"CLS attention on the outlier patches: {on['baseline']:.3f} -> {on['with_register']:.3f} "
                     f"(uniform {on['patch_share']:.3f})"] if on else []
        return [f"patch outliers: {self.baseline['outlier_count']} -> {self.with_register['outlier_count']}",
                *attention, *behaviour_lines(self)]


def _mean(values: List[float]) -> Optional[float]:
    return sum(values) / len(values) if values else None


@study(RegistersConfig)
@torch.no_grad()
def registers_study(source: LiveSource, config: RegistersConfig, *, detection: DetectionLike,
                    baseline: Optional[Baseline] = None, progress: bool = True) -> RegistersResult:
    """Compare the model with and without ``TestTimeRegister(neurons)`` on the source's images.

    Args:
        source: a live source (the study re-runs the model; its ``batch_size`` images per forward).
        config: the options (:class:`~interp.studies.artifacts.configs.RegistersConfig`; or pass them as
            keywords): ``neurons`` the register neurons (``{layer: [neuron, ...]}``, ``"2:17,2:101"``, a
            neurons.json path or a neurons result; one ranked on other weights is refused unless ``force``);
            ``n_registers`` test-time register tokens; ``value`` what is written into them ("layer_max", as the
            reference code, or "neuron_max"); ``classifier`` a classifier file whose class logits
            give top-1 agreement and accuracy (module doc of ``behaviour``).
        detection: the high-norm tokens: a Detection of the unedited model made on this source by
            :func:`~interp.detection.detection.detect` (saves a pass), or a
            :class:`~interp.detection.spec.DetectionSpec` (default the config's) resolved on the unedited model's
            norms (under "auto" with no bimodal split the 99th percentile of the unedited norms counts outliers, so
            counts stay comparable).
        baseline: the unedited forwards (:func:`~interp.runtime.passes.baseline_pass`), when already made,
            with the same ``classifier``.
        progress: show progress bars.

    Without artifacts the result carries ``artifacts_found=False`` and a ``warning`` (also raised with
    ``warnings.warn``).
    """
    require_live(source, "test-time register study")
    readout = behaviour_readout(source, config.classifier)  # a classifier that does not fit fails before any forward
    neurons = ranked_neurons(required_neurons(config.name, config.neurons), source, force=config.force, label="--neurons",
                             flag="--force")
    n_registers, value, batch_size = config.n_registers, config.value, source.batch_size
    found = detect(source, detection, RunOptions(batch_size, progress=progress))
    header = detection_header(found, "registers")
    block = found.layer
    thr_value = found.counting_threshold()
    clf = readout.classifier
    meter = BehaviourMeter(readout)
    ttr = TestTimeRegister(neurons, n_registers=n_registers, value=value)
    last = source.n_layers - 1
    stats = {k: {"outliers": 0, "max": 0.0} for k in ("baseline", "with_register")}
    reg_norm, reg_attn, maps = [], [], []
    on_artifacts: Dict[str, List[float]] = {"baseline": [], "with_register": [], "patch_share": []}
    grid = tuple(source.layout_of(source.blocks.resid_post(block)).grid)
    has_cls = source.layout.cls_index is not None
    edited = {"with_register": Condition([ttr], attention_layers=[last] if has_cls else [])}
    for pair in paired_pass(source, edited, detect_layer=block, classifier=clf, baseline=baseline or True,
                            progress=progress, desc="test-time register"):
        base, run = pair.baseline, pair.edited["with_register"]
        lay = run.layout
        reg_rows = slice(lay.n_prefix - lay.n_extra, lay.n_prefix)
        reg_norm += run.token_norms[:, reg_rows].max(1).values.tolist()
        if lay.cls_index is not None:
            reg_attn += run.cls_rows[last][:, reg_rows].sum(-1).tolist()
        for key, out in (("baseline", base), ("with_register", run)):
            stats[key]["outliers"] += int((out.patch_norms > thr_value).sum())
            stats[key]["max"] = max(stats[key]["max"], float(out.patch_norms.max()))
            meter.add(key, pair.start, out.logits, out.pooled, base.logits, base.pooled)
        maps.append((run.patch_norms > thr_value).reshape(-1, *grid))
        if has_cls:  # the unedited model's outlier patches, read in both maps
            outliers = base.patch_norms > thr_value
            for key, out in (("baseline", base), ("with_register", run)):
                shares, patch_share = attention_on_artifacts(out.cls_attention[last], outliers)
                on_artifacts[key] += shares
            on_artifacts["patch_share"] += patch_share
    table = {k: {"outlier_count": v["outliers"], "max_patch_norm": v["max"], **meter.metrics(k)}
             for k, v in stats.items()}
    params = {"neurons": {str(k): list(v) for k, v in neurons.items()}, "n_registers": n_registers,
              "value": value, **detection_params(found), "batch_size": batch_size}
    return RegistersResult(
        model=source.model_name, fingerprint=source.fingerprint, params=params, seed=None,
        neurons=params["neurons"], n_registers=n_registers, value=value, **header,
        counting_threshold=float(thr_value), ids=list(source.ids), skipped=skipped_records(source),
        baseline=table["baseline"],
        with_register=table["with_register"], register_norm=reg_norm, cls_attention_on_register=reg_attn,
        attention_on_artifacts={k: _mean(v) for k, v in on_artifacts.items() if v},
        outlier_maps_after=torch.cat(maps).int().tolist() if maps else [],
        conditions=table, classifier=readout.record(), behaviour_note=readout.note,
    )
