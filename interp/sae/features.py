"""Which SAE features are the artifacts: firing rates per token kind, the artifact subspace (the features that
together reconstruct the high-norm tokens' excess, with its coverage) and the register and CLS features, with
their directions compared with the register neurons' writes (LayerScale included).

The rule (:mod:`.artifact_rule`, docs/methods.md "Sparse autoencoders"): with high-norm tokens found by the
detection (patch-token norms at the SAE's hook, :func:`~interp.detection.thresholds.detect_norms`), a feature is
a candidate when it fires on at least ``MIN_COUNT`` high-norm tokens with a precision of at least
``MIN_PRECISION`` that beats the base rate (binomial test, Bonferroni), or when at least ``MIN_PRECISION`` of its
code mass is on the high-norm tokens (``artifact_rule.mass_enriched``); the artifact features are the shortest
start of a greedy search over the candidates that reaches ``COVER_SHARE`` of the coverage of the high-norm tokens'
excess the search reaches (however many features an objective splits the artifact over), and the headline names
them only when removing them at the hook takes the high-norm tokens away beyond random matched features (else:
"artifact not isolated"). Without artifacts (the detection's verdict) there are none. An SAE is read only on the token kinds it was trained on.

Example (not run as a doctest: it needs a trained SAE)::

    report = sae_features(sae, model, cache="acts.h5", neurons={2: [17, 101]},
                          detection=DetectionSpec(threshold="p99"))
    [(f["feature"], round(f["cos_register_neurons"]["max"], 2)) for f in report["artifact_features"]]

"""
from __future__ import annotations

from typing import Any, Dict, Iterable, List, Optional, Tuple

import random

import numpy as np
import torch

from ..detection.spec import DetectionSpec
from ..errors import InterpError, UsageError
from ..hooks.names import block_of, resolve_block
from ..interventions.neuron_sets import neuron_set
from ..models.layout import TOKEN_SELECTIONS
from .._progress import tqdm
from ..runtime.open import open_source
from ..runtime.source import n_batches, token_norms
from .controls import KINDS, matched_controls
from .data import CLS, PATCH, REGISTER, token_kinds
from .norm_cuts import detection_sample, fit_detection
from . import artifact_rule as rule
from .setup import describe_detection



def write_directions(model, neurons) -> Dict[str, torch.Tensor]:
    """{"L:n": unit write direction [d]} of the given register neurons (none without ``neurons``): what the
    neuron adds to the residual stream, ``fc2[:, n]`` times the block's LayerScale where it has one
    (``neuron_writes`` of a ``HookedViT`` or of an activation source: DINOv2, DeiT-III); through a norm (EVA02's
    ``scale_mlp``, Swin-v2's post-norm) linearised at the source's operating point (a source is then needed)."""
    if neurons is None:
        return {}
    if model is None:
        raise InterpError("comparing with register neurons needs the model (their write directions)")
    out = {}
    for layer, idx in neuron_set(neurons).neurons.items():
        writes = model.neuron_writes(int(layer))  # [d, d_mlp], LayerScale included
        for n in idx:
            col = writes[:, int(n)]
            out[f"{int(layer)}:{int(n)}"] = col / col.norm().clamp_min(1e-12)
    return out


def _rate(count: np.ndarray, total: int):
    return (count / total) if total else None


class _TopCodes:
    """The ``n`` largest codes of every feature over the patch tokens seen so far: (code, image, patch)."""

    def __init__(self, n_features: int, n: int):
        self.n = n
        self.values = torch.full((0, n_features), -1.0)
        self.where = torch.zeros((0, n_features, 2), dtype=torch.long)

    def add(self, codes: torch.Tensor, start: int) -> None:
        """codes [c, P, n_features] of images ``start ..``."""
        c, p, n = codes.shape
        flat = codes.reshape(c * p, n)
        k = min(self.n, c * p)
        top, index = flat.topk(k, dim=0)  # [k, n]
        where = torch.stack([index // p + start, index % p], -1)
        values, where = torch.cat([self.values, top]), torch.cat([self.where, where])
        keep = values.topk(min(self.n, len(values)), dim=0).indices  # [m, n]
        self.values = values.gather(0, keep)
        self.where = where.gather(0, keep[..., None].expand(-1, -1, 2))

    def of(self, feature: int) -> List[Dict[str, Any]]:
        return [{"image": int(i), "patch": int(j), "code": float(v)} for v, (i, j)
                in zip(self.values[:, feature].tolist(), self.where[:, feature].tolist()) if v > 0]


_KIND_OF = {"normal_patch": "patches", "high_norm": "patches", "cls": "cls", "register": "registers"}


def analysed_kinds(tokens: str) -> tuple:
    """The report's kinds an SAE trained on the token selection ``tokens`` is analysed on (it is not read on
    tokens it never saw): those of :data:`~interp.models.layout.TOKEN_SELECTIONS`."""
    return tuple(k for k in KINDS if _KIND_OF[k] in TOKEN_SELECTIONS[tokens])


def _unit(v: torch.Tensor) -> torch.Tensor:
    return v / v.norm().clamp_min(1e-12)


def _prefix_features(kind: str, counts, totals, n: int) -> List[Dict[str, Any]]:
    """The features enriched on ``kind`` (cls or register) among all tokens (artifact_rule.enrichment)."""
    everything = sum(counts[k] for k in KINDS)
    n_all = sum(totals[k] for k in KINDS)
    if not totals[kind] or not n_all:
        return []
    test = rule.enrichment(counts[kind], everything, totals[kind] / n_all, n)
    found = np.flatnonzero(test["enriched"])
    found = found[np.argsort(-test["precision"][found], kind="stable")]
    return [{"feature": int(f), "kind": kind, "rate": float(counts[kind][f] / totals[kind]),
             "precision": float(test["precision"][f]), "p_value": float(test["p_value"][f])} for f in found]


def _isolation(excess: rule.ExcessSample, chosen: List[int], directions: torch.Tensor,
               report: Dict[str, Any]) -> Dict[str, Any]:
    """The artifact rule's isolation check (artifact_rule.isolation) of the subspace ``chosen`` against
    ``N_ISOLATION_CONTROLS`` matched control sets drawn from ``report`` (the features so far); untested (None)
    without a subspace or with too few live features outside it for controls (``isolation_note`` says which)."""
    if not chosen:
        return {"removed": None, "controls_removed": [], "control_features": [], "isolated": None,
                "isolation_note": "no feature covers the high-norm tokens' excess"}
    try:
        controls, note = matched_controls(report, chosen, rule.N_ISOLATION_CONTROLS, seed=0)[0], None
    except InterpError:  # too few matched features: random live ones outside the subspace, aligned ones included
        pool = [f["feature"] for f in report["features"] if f["alive"] and f["feature"] not in set(chosen)]
        size = min(len(chosen), len(pool))
        controls = [sorted(random.Random(i).sample(pool, size)) for i in range(rule.N_ISOLATION_CONTROLS)] if size else []
        note = (f"too few live features off the artifact component for matched controls: {size} random live "
                f"feature(s) outside the subspace per control, those writing along the artifact included"
                if size else "untested: no live feature outside the subspace for controls")
    checked = rule.isolation(excess, chosen, controls, directions)
    return {"removed": checked["removed"], "controls_removed": checked["controls_removed"],
            "control_features": controls, "isolated": checked["isolated"], "isolation_note": note}


def _headline(subspace: Dict[str, Any], n: int) -> str:
    """The report's message with artifacts: the artifact features when their removal is beyond the controls,
    else "artifact not isolated" with what was tried."""
    k, cover = len(subspace["features"]), subspace["coverage"]
    removed, controls = subspace["removed"], subspace["controls_removed"]
    if not k:
        return (f"artifact not isolated: no feature covers the high-norm tokens' excess ({subspace['n_enriched']} "
                f"enriched on them; the SAE's reconstruction holds {subspace['reconstruction_coverage'] or 0:.0%})")
    removal = "" if removed is None else (f"; removing them at the hook removes {removed:.0%} of the high-norm "
                                          f"tokens" + (f", controls at most {max(controls):.0%}" if controls else ""))
    if subspace["isolated"] is False:
        return (f"artifact not isolated: the {k} feature(s) covering {cover:.0%} of the high-norm tokens' excess "
                f"do not remove them beyond random matched features{removal}")
    untested = " (isolation untested: no live feature for controls)" if subspace["isolated"] is None else ""
    return (f"{k} artifact feature(s) of {n}, covering {cover:.0%} of the high-norm tokens' excess "
            f"({subspace['n_enriched']} enriched on them){removal}{untested}")


@torch.no_grad()
def feature_report(sae, chunks: Iterable[Tuple[int, np.ndarray]], kinds: np.ndarray, detection, *,
                   writes: Optional[Dict[str, torch.Tensor]] = None, n_top: int = 0,
                   n_maps: int = 0, targets: Optional[List[int]] = None) -> Dict[str, Any]:
    """The firing rates, artifact subspace and register/CLS features of ``sae`` over activations given chunk by
    chunk (the rule: :mod:`.artifact_rule`). The SAE is read only on the token kinds it was trained on
    (:func:`analysed_kinds`; the other kinds' rates are None).

    Args:
        chunks: ``(first image index, float32 [c, T, d])`` in image order, every image once.
        kinds: int8 [T] token kinds of the rows (``data.token_kinds``).
        detection: decides the high-norm patch tokens of each chunk from their norms
            (:class:`~interp.sae.norm_cuts.SampledDetection`) or None.
        writes: unit write directions to compare with (:func:`write_directions`).
        n_top: keep each artifact feature's ``n_top`` strongest patch tokens (``top_patches``).
        n_maps: keep each artifact feature's code on every patch of the first ``n_maps`` images (``maps``).
        targets: features whose coverage of the high-norm tokens' excess to report (``target_coverage``; an
            ablation's chosen features).

    Returns:
        the dict :func:`sae_features` documents, plus ``top_patches`` / ``maps`` in each artifact feature and
        ``target_coverage`` (None without targets or high-norm tokens).
    """
    writes = writes or {}
    trained = sae.tokens
    analysed = analysed_kinds(trained)
    patch = kinds == PATCH
    found = bool(detection is not None and detection.artifacts_found)
    n = sae.n_features
    counts = {k: np.zeros(n) for k in KINDS}
    masses = {k: np.zeros(n) for k in KINDS}  # summed codes: the magnitude-weighted firing
    totals = {k: 0 for k in KINDS}
    high_sum = torch.zeros(sae.d, dtype=torch.float64)
    normal_sum = torch.zeros(sae.d, dtype=torch.float64)
    excess = rule.ExcessSample()
    top = _TopCodes(n, n_top) if n_top else None
    maps: List[torch.Tensor] = []
    n_images = 0
    for start, x in chunks:
        x = torch.from_numpy(np.ascontiguousarray(x, dtype=np.float32))  # [c, T, d]
        sae.check_hook(sae.hook, int(x.shape[-1]))
        codes = sae.encode(x)  # [c, T, n]
        fired = (codes > 0).numpy()
        high = np.zeros(fired.shape[:2], bool)
        cuts = np.zeros(len(x))
        if found:  # from the chunk's own norms, as the detection's norm pass computes them
            norms = token_norms(x)[:, torch.from_numpy(patch)].double().numpy()
            cuts = detection.cuts(norms)
            high[:, patch] = norms > cuts[:, None]
        masks = {"normal_patch": patch[None] & ~high, "high_norm": high,
                 "cls": np.broadcast_to(kinds == CLS, high.shape), "register": np.broadcast_to(kinds == REGISTER, high.shape)}
        for kind in analysed:
            counts[kind] += fired[masks[kind]].sum(0)
            masses[kind] += codes[torch.from_numpy(np.ascontiguousarray(masks[kind]))].double().sum(0).numpy()
            totals[kind] += int(masks[kind].sum())
        if "high_norm" in analysed and high.any():
            h = torch.from_numpy(high)
            high_sum += (x[h].double() - sae.mean.double()).sum(0)
            excess.add(x[h], codes[h], sae.decode(codes[h]), np.broadcast_to(cuts[:, None], high.shape)[high])
        if "normal_patch" in analysed:
            normal_sum += x[torch.from_numpy(np.ascontiguousarray(masks["normal_patch"]))].double().sum(0)
        if top is not None and patch.any() and "normal_patch" in analysed:
            top.add(codes[:, torch.from_numpy(patch)], start)
        if start < n_maps and patch.any() and "normal_patch" in analysed:
            maps.append(codes[:n_maps - start, torch.from_numpy(patch)])
        n_images += len(x)
    rates = {k: _rate(counts[k], totals[k]) if k in analysed else None for k in KINDS}
    alive = sum(counts[k] for k in KINDS) > 0
    features = [{"feature": f, "alive": bool(alive[f]),
                 "rates": {k: None if rates[k] is None else float(rates[k][f]) for k in KINDS}} for f in range(n)]
    artifact, enriched, subspace = [], [], None
    directions = sae.directions
    if found and totals["high_norm"] and "high_norm" in analysed:
        test = rule.enrichment(counts["high_norm"], counts["high_norm"] + counts["normal_patch"],
                               totals["high_norm"] / (totals["high_norm"] + totals["normal_patch"]), n)
        heavy = rule.mass_enriched(masses["high_norm"], masses["high_norm"] + masses["normal_patch"],
                                   counts["high_norm"], totals["high_norm"] / (totals["high_norm"] + totals["normal_patch"]))
        candidates = np.flatnonzero(test["enriched"] | heavy["enriched"])
        mean_normal = normal_sum / max(1, totals["normal_patch"])
        grown = rule.artifact_subspace(excess, mean_normal, candidates, directions)
        mean_high = (high_sum / totals["high_norm"]).float()
        unit_high = _unit(mean_high)
        # the artifact direction: the high-norm tokens' mean excess over the mean normal patch (coverage's excess)
        unit_excess = _unit((mean_high.double() + sae.mean.double() - mean_normal).float())
        cos_excess = (directions / directions.norm(dim=1, keepdim=True).clamp_min(1e-12)) @ unit_excess  # [n]
        for f in features:
            f["cos_excess"] = float(cos_excess[f["feature"]])
        codes_maps = torch.cat(maps) if maps else None  # [n_maps, P, n]
        for f, gain in zip(grown["features"], grown["gains"]):
            unit = _unit(directions[f])
            cos = {name: float(unit @ w) for name, w in writes.items()}
            if cos:
                cos["max"] = max(cos.values())
            entry = {"feature": int(f), "direction": [float(v) for v in unit], "rates": features[f]["rates"],
                     "precision": float(test["precision"][f]), "p_value": float(test["p_value"][f]),
                     "mass_precision": float(heavy["precision"][f]),
                     "coverage": grown["single_coverage"][int(f)], "coverage_gain": gain,
                     "cos_register_neurons": cos, "cos_mean_high_norm": float(unit @ unit_high)}
            if top is not None:
                entry["top_patches"] = top.of(int(f))
            if codes_maps is not None:
                entry["maps"] = codes_maps[..., f].tolist()
            artifact.append(entry)
        chosen = set(grown["features"])
        enriched = [{"feature": int(f), "precision": float(test["precision"][f]),
                     "mass_precision": float(heavy["precision"][f]),
                     "rate_high_norm": float(rates["high_norm"][f]), "coverage": grown["single_coverage"][int(f)]}
                    for f in candidates if int(f) not in chosen]
        span = directions[grown["features"]] if grown["features"] else directions[:0]
        span_cos = {name: rule.span_cosine(span, w) for name, w in writes.items()}
        if span_cos and grown["features"]:
            span_cos["max"] = max(span_cos.values())
        checked = _isolation(excess, grown["features"], directions, {
            "features": features, "n_tokens": totals, "analysed_kinds": list(analysed), "n_alive": int(alive.sum()),
            "artifact_subspace": {"features": grown["features"]}})
        subspace = {"features": grown["features"], "coverage": grown["coverage"], "n_tokens": grown["n_tokens"],
                    "path_coverage": grown["path_coverage"], "path_length": grown["path_length"], **checked,
                    "reconstruction_coverage": excess.reconstruction_coverage(mean_normal),
                    "n_enriched": int(len(candidates)), "cos_register_neurons": span_cos if grown["features"] else {},
                    "cos_mean_high_norm": rule.span_cosine(span, unit_high)}
    target_coverage = None
    if targets and excess.x and "high_norm" in analysed:
        chosen_ids = np.asarray(sorted(int(f) for f in targets))
        target_coverage = rule.coverage(torch.stack(excess.x) - (normal_sum / max(1, totals["normal_patch"])),
                                        excess.columns(chosen_ids), directions[torch.as_tensor(chosen_ids)].double())
    prefix = [*(_prefix_features("register", counts, totals, n) if "register" in analysed else []),
              *(_prefix_features("cls", counts, totals, n) if "cls" in analysed else [])] if trained == "all" else []
    det = describe_detection(detection)
    hook = sae.hook
    if "high_norm" not in analysed:
        message = (f"the SAE was trained on {trained} tokens: the artifact rule (high-norm patch tokens) does not "
                   f"apply; {int(alive.sum())} of {n} features fire on them")
    elif found:
        message = _headline(subspace, n)
    else:
        message = f"no artifacts at {hook} ({det['reason'] if det else 'no patch tokens stored'}): no artifact features"
    if prefix:
        message += f"; {sum(p['kind'] == 'register' for p in prefix)} register and " \
                   f"{sum(p['kind'] == 'cls' for p in prefix)} CLS feature(s)"
    return {"artifacts_found": found, "threshold": None if det is None else det["value"],
            "reason": None if det is None else det["reason"], "detection": det, "hook": hook, "tokens": trained,
            "analysed_kinds": list(analysed), "n_images": n_images, "n_features": n, "n_tokens": totals,
            "n_alive": int(alive.sum()), "features": features, "artifact_features": artifact,
            "artifact_subspace": subspace, "enriched_features": enriched, "prefix_features": prefix,
            "target_coverage": target_coverage,
            "message": message, "rule": dict(rule.RULE)}


@torch.no_grad()
def sae_features(sae, model=None, *, cache=None, images=None, detection: DetectionSpec = DetectionSpec(),
                 neurons=None, image_batch: int = 32) -> Dict[str, Any]:
    """Firing rates of every feature of ``sae`` per token kind and its artifact features (JSON-able dict).

    Args:
        sae: ``interp.sae.load(DIR)``.
        model: the model the SAE was trained on (checked); needed for ``images`` and ``neurons``.
        cache / images: activations of the SAE's hook (a cache holding it, or images run live).
        detection: what counts as a high-norm token (:class:`~interp.detection.spec.DetectionSpec`: a threshold
            or a preset), decided on the patch-token norms at the SAE's own hook (:func:`hook_detection`).
        neurons: register neurons whose write directions (``fc2`` columns) to compare with: ``{layer: [n, ...]}``,
            ``"2:17,2:101"``, a neurons.json path or a neurons study result.
        image_batch: images per forward of a live run.

    Returns:
        ``{"artifacts_found", "threshold", "reason", "hook", "tokens" (the kind the SAE was trained on),
        "analysed_kinds", "n_images", "n_tokens": {kind: int}, "features": [{"feature", "alive", "rates": {kind:
        rate or None}, "cos_excess" (with artifacts: cosine of its direction with the high-norm tokens' mean excess
        over the mean normal patch)}], "artifact_features": [{"feature", "direction" (unit, hook units), "rates",
        "precision", "mass_precision" (share of its code mass on the high-norm tokens), "p_value", "coverage" (alone), "coverage_gain" (joining the subspace), "cos_register_neurons": {"L:n": cos,
        "max": cos}, "cos_mean_high_norm"}] (in the order they joined the subspace), "artifact_subspace":
        {"features", "coverage", "path_coverage", "path_length", "n_tokens", "n_enriched", "removed" (share of the
        sampled high-norm tokens under their cut once the features are removed at the hook), "controls_removed",
        "control_features", "isolated" (removed beyond every control by ISOLATION_MARGIN; None: untested),
        "isolation_note", "cos_register_neurons" (span cosines), "cos_mean_high_norm"} or None, "enriched_features" (candidates outside the subspace), "prefix_features"
        ([{"feature", "kind" (register or cls), "rate", "precision", "p_value"}], SAEs on all tokens),
        "rule", "message"}``.
    """
    source = open_source(model=model, images=images, cache=cache, batch_size=image_batch)
    sae.check_source(source)
    return source_feature_report(sae, source, detection=detection, writes=write_directions(source, neurons))


def hook_detection(detection: DetectionSpec, source, hook: str) -> Tuple[DetectionSpec, Optional[int]]:
    """(``detection`` resolved, the block of ``hook``) for a detection at an SAE's hook: its threshold and preset
    apply to the patch-token norms there. A Detection (made at a block's output, not at the hook) and a
    ``detect_layer`` (or a preset's) other than the hook's block are refused in one line."""
    if not isinstance(detection, DetectionSpec):
        raise InterpError("an SAE's features decide the high-norm tokens on the norms at the SAE's own hook; give "
                          "detection=DetectionSpec(...) (a threshold, a preset), not a Detection made elsewhere")
    blocks = getattr(source, "blocks", None)  # its flat index: a pyramid's stage block too
    layer = blocks.block_of(hook) if blocks is not None else block_of(hook)
    spec = detection.resolved()
    if spec.detect_layer is not None and (layer is None or
                                          resolve_block(spec.detect_layer, source.n_layers, -1) != layer):
        raise UsageError(f"--detect-layer {spec.detect_layer}: an SAE's features are decided at the SAE's own hook "
                         f"(block {layer}); leave --detect-layer (and a preset that sets another block) out")
    return spec, layer


@torch.no_grad()
def source_feature_report(sae, source, *, detection: DetectionSpec = DetectionSpec(), writes: Optional[Dict[str, torch.Tensor]] = None,
                          n_top: int = 0, n_maps: int = 0, progress: bool = False,
                          targets: Optional[List[int]] = None) -> Dict[str, Any]:
    """:func:`feature_report` over an activation source (``interp.runtime``; live or a cache holding the SAE's
    hook): one pass for the patch-token norms at the hook (the detection, fitted on the norms of
    :func:`~interp.sae.norm_cuts.detection_sample`'s images), one for the codes. The source's batch size; memory:
    one batch and the sample's norms. ``detection``: its threshold (or its preset's) at the hook
    (:func:`hook_detection`). The caller checks that the SAE fits the source's model."""
    threshold = hook_detection(detection, source, sae.hook)[0].threshold
    hook, bs, layout = sae.hook, source.batch_size, source.layout_of(sae.hook)  # a pyramid stage's own grid
    source.require([hook])
    kinds = token_kinds(layout, 0, layout.n_tokens)
    patch = torch.from_numpy(kinds == PATCH)
    bar = dict(total=n_batches(source, bs), disable=not progress, unit="batch", leave=False)
    fitted = detection_sample(len(source))
    norms = []
    for b in tqdm(source.batches([hook], bs, reduce={hook: token_norms}), desc="SAE hook norms", **bar):
        rows = fitted[(fitted >= b.start) & (fitted < b.start + len(b.acts[hook]))] - b.start
        norms.append(b.acts[hook][torch.from_numpy(rows)][:, patch].double().numpy())
    detection = (fit_detection(np.concatenate(norms), threshold, len(source))
                 if bool(patch.any()) and norms else None)

    def chunks():
        for b in tqdm(source.batches([hook], bs), desc="SAE codes", **bar):
            x = b.acts[hook]
            if x.dim() != 3 or x.shape[1] != len(kinds):
                raise InterpError(f"{hook} gives {tuple(x.shape)} per batch, not token rows [b, {len(kinds)}, d]")
            yield b.start, x.numpy()

    return feature_report(sae, chunks(), kinds, detection, writes=writes, n_top=n_top, n_maps=n_maps,
                          targets=targets)
