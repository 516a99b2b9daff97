"""Causal ablation of register neurons against random controls (docs/methods.md section 2).

>>> result = ablate_study(source, neurons="2:17,2:101,2:402,2:655", controls=2, progress=False)
>>> result.summary["outlier_count"]["target"]          # planted_vit: no high-norm token once they are zeroed
0

The target neuron set is ablated (zero, mean or resample: another image's values); each control ablates as many
random neurons drawn from the same layers (excluding the targets), one draw per seed. Neurons are ablated with every
replacement of ``replacements`` (default zero, mean and resample), each against its own controls (the same random
sets), so a reader sees which replacement a number rests on (``mode``: the headline's) and whether they agree. With ``sae`` and ``features`` the units are SAE
features instead (:class:`~interp.interventions.SAEFeatureAblation`), the controls as many live features of the
SAE that do not fire on the high-norm tokens at its hook (:mod:`interp.sae.ablation`; docs/sae.md). Effects per condition: outlier count and max
patch norm at the detection layer, and the behaviour metrics of :mod:`interp.studies.core.behaviour` (top-1
agreement with the unablated model and accuracy through a real classifier; the pooled vector's cosine to the
unablated one and its norm always).
"""
from __future__ import annotations

import random
import warnings
from dataclasses import dataclass, field
from typing import Dict, List, Mapping, Optional, Union

import numpy as np

from ...interventions import NeuronAblation
from ...interventions.neuron_sets import ranked_neurons
from ..core.behaviour import METRICS, BehaviourMeter, behaviour_readout
from ...runtime.forward import Baseline
from ...runtime.paired import Condition, paired_pass
from ...detection.detection import DetectionLike, RunOptions, detect, detection_header, detection_params
from ..core.result import OutlierStudyResult, behaviour_lines, skipped_records
from ...runtime.live_source import LiveSource
from ...sae.ablation import feature_conditions
from ..declaration import study
from .configs import AblateConfig
from ...runtime.source import require_live
from ...errors import InterpWarning, UsageError

Neurons = Dict[int, List[int]]


def random_controls(neurons: Neurons, d_mlp: Union[int, Mapping[int, int]], n_controls: int,
                    seed: int) -> List[Neurons]:
    """``n_controls`` neuron sets with as many neurons per layer as ``neurons``, drawn from the same layers
    without the targets (``d_mlp``: the MLP width, or each layer's); control i uses ``random.Random(seed + i)``."""
    controls = []
    for layer, idx in sorted(neurons.items()) if n_controls else ():
        width = d_mlp if isinstance(d_mlp, int) else d_mlp[layer]
        if width - len(set(idx)) < len(idx):

            raise UsageError(f"block {layer} has {width} MLP neurons: {len(idx)} ablated leave {width - len(set(idx))}"
                             f" others, too few for controls of {len(idx)}; ablate fewer neurons (--top-k) or use "
                             "--controls 0")
    for i in range(n_controls):
        rng = random.Random(seed + i)
        draw = {}
        for layer, idx in sorted(neurons.items()):
            width = d_mlp if isinstance(d_mlp, int) else d_mlp[layer]
            pool = sorted(set(range(width)) - set(idx))
            draw[layer] = sorted(rng.sample(pool, len(idx)))
        controls.append(draw)
    return controls


@dataclass
class AblateResult(OutlierStudyResult):
    """Result of :func:`ablate_study`.

    Attributes:
        conditions: name -> {"outlier_count", "max_norm", and the behaviour metrics (``METRICS``:
            "top1_agreement", "accuracy", "pooled_cosine", "pooled_cosine_min", "pooled_norm"; agreement and
            accuracy None without a real classifier)}; names are "baseline", "target" and "control_<i>", ablated
            with ``mode``.
        replacements: replacement (``mode`` first, then the others run) -> {"target": its record,
            "control_mean": the controls' mean of each metric, "comparison": as ``comparison``}; neurons only.
        classifier: which classifier the behaviour metrics used; behaviour_note: why there is no agreement or
            accuracy (None when both exist).
        controls: the neuron sets of the controls, as {layer: [neuron, ...]}; with an SAE, ``{"features": [...]}``.
        sae, hook, features: the SAE's folder and hook and the ablated features (None / [] for neurons).
        control_pool: with an SAE, what the controls were drawn from (``n_alive``, ``artifacts_found`` and
            ``n_high_norm_tokens`` at the SAE's hook).
        summary: metric -> {"baseline", "target", "control_mean", "control_std"}.
        comparison: the share of the baseline's outliers each condition removes and whether the target's share
            beats every control's by ``SPECIFIC_MARGIN`` (:func:`outlier_comparison`; None without controls).
        counting_threshold: the norm the outlier counts use: ``threshold``, or the 99th percentile of the
            unablated norms when "auto" finds no separated mode (so counts stay comparable).
    """

    study = "ablate"
    neurons: Dict = field(default_factory=dict)
    mode: str = "zero"
    counting_threshold: Optional[float] = None
    n_images: int = 0
    controls: List[Dict] = field(default_factory=list)
    conditions: Dict[str, Dict] = field(default_factory=dict)
    summary: Dict[str, Dict] = field(default_factory=dict)
    classifier: Optional[Dict] = None
    behaviour_note: Optional[str] = None
    sae: Optional[str] = None
    hook: Optional[str] = None
    features: List[int] = field(default_factory=list)
    control_pool: Optional[Dict] = None
    comparison: Optional[Dict] = None
    notes: List[str] = field(default_factory=list)
    replacements: Dict[str, Dict] = field(default_factory=dict)

    def console_lines(self, config=None) -> List[str]:
        """The outlier counts of the three conditions, each replacement's share removed, then the behaviour line
        (the notes were warned)."""
        oc = self.summary["outlier_count"]
        lines = [f"outliers: baseline {oc['baseline']}, ablated {oc['target']}, controls {oc['control_mean']} "
                 f"(replacement: {self.mode})"]
        shares = [f"{r} {_share(v)}" for r, v in self.replacements.items()]
        if len(shares) > 1:
            lines.append("share of the outliers removed, target (controls at most): " + ", ".join(shares))
        return lines + behaviour_lines(self)


def _share(entry: Dict) -> str:
    comparison = entry.get("comparison")
    if comparison is None:
        return f"{entry['target']['outlier_count']} left"
    r = comparison["removed"]
    return f"{r['target']:.0%} ({max(r['controls']):.0%})"


SPECIFIC_MARGIN = 0.5  # the target must remove this share of the baseline's outliers more than any control


def outlier_comparison(table: Dict[str, Dict], n_controls: int) -> Optional[Dict]:
    """``{"removed": {"target": share, "controls": [share, ...]}, "margin", "target_beyond_controls"}``: the share
    of the baseline's outliers each condition removes, and whether the target removes at least ``SPECIFIC_MARGIN``
    more than every control set (else the chosen units are not special: random matched ones do as much). None
    without controls or without outliers at baseline."""
    base = table["baseline"]["outlier_count"]
    if not n_controls or not base:
        return None

    def removed(name):
        return 1.0 - table[name]["outlier_count"] / base

    controls = [removed(f"control_{i}") for i in range(n_controls)]
    target = removed("target")
    return {"removed": {"target": target, "controls": controls}, "margin": SPECIFIC_MARGIN,
            "target_beyond_controls": bool(target - max(controls) >= SPECIFIC_MARGIN)}


def outlier_change(removed: float) -> str:
    """A share of the outliers an edit removed, said as what happened: a negative share is outliers added.

    >>> outlier_change(0.25), outlier_change(-1.0)
    ('removes 25% of the outliers', 'adds 100% more outliers')
    """
    return f"removes {removed:.0%} of the outliers" if removed >= 0 else f"adds {-removed:.0%} more outliers"


def ablation_notes(controls: List[Dict], silent: List[int]) -> List[str]:
    """What a reader must know about an ablation's conditions: target SAE features that never fire on the images
    (their ablation cannot move anything), and control sets that coincide (fewer distinct controls than asked,
    so the controls' std understates their spread)."""
    notes = []
    if silent:
        notes.append(f"SAE feature(s) {', '.join(map(str, silent))} never fire on these images: ablating them "
                     "changes nothing (target = baseline); choose features from `interp study sae-features`")
    distinct = {repr(sorted((str(k), sorted(v) if isinstance(v, list) else v) for k, v in c.items()))
                for c in controls}
    if len(controls) > 1 and len(distinct) < len(controls):
        notes.append(f"the {len(controls)} control sets are only {len(distinct)} distinct set(s) (the pool to draw "
                     "from is small): their std understates the spread of random controls")
    return notes


def ablations(source, sets: List[Neurons], mode: str, seed: int) -> List[NeuronAblation]:
    """One :class:`NeuronAblation` of each neuron set with replacement ``mode``; the means of ``mean`` come from one
    pass over the source for the union of the sets."""
    if mode != "mean":
        return [NeuronAblation(s, mode=mode, seed=seed) for s in sets]
    union = {layer: sorted(set().union(*(s.get(layer, ()) for s in sets))) for layer in sorted({l for s in sets for l in s})}
    full = source.mean_ablation(union)
    where = {layer: {n: i for i, n in enumerate(idx)} for layer, idx in full.neurons.items()}
    return [NeuronAblation(s, mode="mean", means={layer: full.means[layer][[where[layer][n] for n in idx]]
                                                  for layer, idx in s.items()}) for s in sets]


@study(AblateConfig)
def ablate_study(source: LiveSource, config: AblateConfig, *, detection: DetectionLike,
                 baseline: Optional[Baseline] = None, progress: bool = True) -> AblateResult:
    """Ablate the register neurons and ``controls`` random same-size sets; compare to the unablated model.

    Args:
        source: a live source (ablation re-runs the model; its ``batch_size`` images per forward); labels come
            from an image-folder layout.
        config: the options (:class:`~interp.studies.artifacts.configs.AblateConfig`; or pass them as keywords):
            ``neurons`` the neurons to ablate: ``{layer: [neuron, ...]}`` (e.g. ``NeuronsResult.neuron_dict()``),
            ``"2:17,2:101"``, a neurons.json path or a neurons result (one ranked on other weights is refused
            unless ``force``); ``mode`` "zero", or "mean" (per-neuron means over these images' tokens);
            ``controls`` how many random control sets (control i draws with ``seed + i``); ``classifier`` a classifier
            file (path, dict or :func:`interp.load_classifier`) whose class logits give agreement and accuracy
            (without one they exist only for a head that is a classifier).
        detection: the high-norm tokens: a Detection of the unedited model made on this source by
            :func:`~interp.detection.detection.detect` (saves a pass), or a
            :class:`~interp.detection.spec.DetectionSpec` (default the config's) resolved on the unedited model's
            norms (under "auto" with no bimodal split the 99th percentile of the unedited norms counts outliers, so
            counts stay comparable).
        baseline: the unablated forwards (:func:`~interp.runtime.passes.baseline_pass`), when already made
            (saves one forward per image), made with the same ``classifier``.
        progress: show progress bars.

    Without artifacts (no separated high-norm mode) the study still runs; its result then carries
    ``artifacts_found=False`` and a ``warning`` (also raised with ``warnings.warn``).
    """
    require_live(source, "ablation study")
    readout = behaviour_readout(source, config.classifier)  # a classifier that does not fit fails before any forward
    mode, n_controls, batch_size = config.mode, config.controls, source.batch_size
    if config.sae is not None:  # SAE features: loaded, checked and their controls drawn before the detection pass
        edits = feature_conditions(config.sae, config.features, source, n_controls=n_controls, seed=config.seed,
                                   mode=mode, progress=progress)
        neurons = {}
    else:
        neurons = ranked_neurons(config.required_neurons(), source, force=config.force, label="--neurons",
                                 flag="--force")
        neurons = {int(l): sorted(int(n) for n in idx) for l, idx in neurons.items()}
    found = detect(source, detection, RunOptions(batch_size, progress=progress))
    block = found.layer
    header = detection_header(found, "ablate")
    thr_value = found.counting_threshold()
    clf = readout.classifier

    others = [r for r in config.replacements if r != mode]
    skipped_resample = False
    if len(source) < 2 and mode == "resample":
        raise UsageError("--mode resample takes each image's values from another image: give at least two images")
    if len(source) < 2 and "resample" in others:
        others.remove("resample")
        skipped_resample = True
    if config.sae is not None:
        controls = [{"features": c} for c in edits.control_features]
    else:
        controls = random_controls(neurons, {l: source.d_mlp(l) for l in neurons}, n_controls, config.seed)

    def runs_of(replacement: str) -> list:
        """[target, control 0, ...] ablated with ``replacement``."""
        if config.sae is not None:
            return edits.with_mode(replacement, config.seed)
        return ablations(source, [neurons] + controls, replacement, config.seed)

    conditions: Dict[str, list] = {"baseline": []}
    for r in [mode] + others:
        prefix, runs = ("" if r == mode else f"{r}:"), runs_of(r)
        conditions.update({f"{prefix}target": runs[:1], **{f"{prefix}control_{i}": [a] for i, a in enumerate(runs[1:])}})
    totals = {name: {"outliers": 0, "max_norm": 0.0} for name in conditions}
    meter = BehaviourMeter(readout)
    edited = {name: Condition(ivs) for name, ivs in conditions.items() if name != "baseline"}
    n = 0
    resample = "resample" in [mode] + others  # another image in every batch: >= 2 a batch
    for pair in paired_pass(source, edited, detect_layer=block, classifier=clf, baseline=baseline or True,
                            batch_size=max(2, batch_size) if resample else batch_size, progress=progress,
                            desc="ablation"):
        base = pair.baseline
        for name, out in {"baseline": base, **pair.edited}.items():
            t = totals[name]
            t["outliers"] += int((out.patch_norms > thr_value).sum())
            t["max_norm"] = max(t["max_norm"], float(out.patch_norms.max()))
            meter.add(name, pair.start, out.logits, out.pooled, base.logits, base.pooled)
        n += len(pair)

    table = {name: {"outlier_count": t["outliers"], "max_norm": t["max_norm"], **meter.metrics(name)}
             for name, t in totals.items()}
    summary = {}
    for metric in ("outlier_count", "max_norm") + METRICS:
        ctrl = [table[f"control_{i}"][metric] for i in range(n_controls)]
        ctrl = [v for v in ctrl if v is not None]
        summary[metric] = {"baseline": table["baseline"][metric], "target": table["target"][metric],
                           "control_mean": float(np.mean(ctrl)) if ctrl else None,
                           "control_std": float(np.std(ctrl)) if ctrl else None}
    params = {"neurons": {str(k): v for k, v in neurons.items()}, "mode": mode, "replacements": [mode] + others,
              "n_controls": n_controls,
              **detection_params(found), "batch_size": batch_size}
    sae = {}
    if config.sae is not None:
        params.update(sae=edits.sae, features=edits.features)
        sae = dict(sae=edits.sae, hook=edits.hook, features=edits.features, control_pool=edits.pool)
    notes = ablation_notes(controls, edits.pool.get("silent_features", []) if config.sae is not None else [])
    if skipped_resample:
        notes.append("resample was not run: it takes each image's values from another image, and there is one image")
    if config.sae is not None and edits.pool.get("note"):
        notes.append(edits.pool["note"])  # controls that could not be matched to the targets' firing
    replacements = {}
    for r in [mode] + others:
        prefix = "" if r == mode else f"{r}:"
        sub = {"baseline": table["baseline"], "target": table[f"{prefix}target"],
               **{f"control_{i}": table[f"{prefix}control_{i}"] for i in range(n_controls)}}
        replacements[r] = {"target": sub["target"], "comparison": outlier_comparison(sub, n_controls),
                           "control_mean": {m: _mean_of([sub[f"control_{i}"][m] for i in range(n_controls)])
                                            for m in ("outlier_count", "max_norm") + METRICS}}
    comparison = replacements[mode]["comparison"]
    if comparison is not None and not comparison["target_beyond_controls"]:
        r = comparison["removed"]
        notes.append(f"the target {outlier_change(r['target'])}, its controls at most {outlier_change(max(r['controls']))}"
                     ": the chosen units are not special (random matched ones do about as much)")
    for note in notes:
        warnings.warn(f"ablate: {note}", InterpWarning)
    return AblateResult(model=source.model_name, fingerprint=source.fingerprint, params=params, seed=config.seed,
                        ids=list(source.ids), skipped=skipped_records(source), **header,
                        neurons={str(k): v for k, v in neurons.items()}, mode=mode,
                        counting_threshold=float(thr_value), n_images=n,
                        controls=[{str(k): v for k, v in c.items()} for c in controls],
                        conditions={k: v for k, v in table.items() if ":" not in k}, summary=summary,
                        classifier=readout.record(),
                        behaviour_note=readout.note, notes=notes, comparison=comparison,
                        replacements=replacements, **sae)


def _mean_of(values: List) -> Optional[float]:
    values = [v for v in values if v is not None]
    return float(np.mean(values)) if values else None
