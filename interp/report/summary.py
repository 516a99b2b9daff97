"""The ``report.json`` summary of the artifact battery's results, and the comparison of a planted model's
findings with its ground truth (``interp.models.planted_truth(model)``)."""
from __future__ import annotations

import re
from typing import Dict, Optional

import numpy as np
import torch

from ..models.planted import planted_truth
from ..studies.artifacts.emergence import largest_step

SYNTHETIC_NOTE = ("This is a synthetic planted model: its register neurons were planted by construction in random "
                  "weights; it is not a trained network. Its findings show that the studies recover a known ground "
                  "truth, not how a real trained model behaves.")
NO_ARTIFACTS_NOTE = ("This model shows no artifacts: at block {block}, {reason}. Neurons ranked under a fixed or "
                     "percentile threshold describe ordinary high-norm tokens; they are not register neurons.")


def synthetic_note(model) -> str:
    """The note a planted model's report carries: :data:`SYNTHETIC_NOTE`, naming what the model is (from its
    planted truth's description: a ViT, a DINOv3-architecture Eva, a PVTv2-b0), said once."""
    truth = planted_truth(model)
    return synthetic_note_for(truth.description if truth is not None else None)


def synthetic_note_for(description: Optional[str]) -> str:
    """:data:`SYNTHETIC_NOTE` with the architecture of ``description`` ("synthetic X with planted register neurons
    (random weights; ...)" -> X), so that neither "synthetic" nor "random weights" is said twice.

    >>> synthetic_note_for("synthetic PVTv2-b0 with planted register neurons (random weights; not a trained model)")[:44]
    'This is a synthetic planted PVTv2-b0: its re'
    """
    if not description:
        return SYNTHETIC_NOTE
    found = re.match(r"synthetic (.+?) with planted register neurons", description)
    what = found.group(1) if found else f"model ({description})"
    return SYNTHETIC_NOTE.replace("synthetic planted model", f"synthetic planted {what}", 1)


def planted_comparison(model, source, norms, neurons) -> Dict:
    """What the studies found against the planted truth: layer, neurons and outlier positions recovered.

    ``source`` is the live source the studies ran on (its images are compared with the planted mask).
    """
    from ..studies.core.stats import iou

    truth = planted_truth(model)
    planted = {(truth.layer, int(n)) for n in truth.neurons}
    found = [(int(e["layer"]), int(e["neuron"])) for e in neurons.neurons]
    # the max-norm jump (averaged over images) misses a plant that only some images trigger; then the detected one
    emergence = norms.emergence or norms.emergence_detected or {}
    masks = [truth.artifact_mask(model, x).cpu() for _, x in source.image_batches()]
    expected = torch.cat(masks) if masks else torch.zeros(0, *norms.grid, dtype=torch.bool)
    ious = [iou(a, b) for a, b in zip(norms.outlier_map_tensor(), expected)]  # None: no outlier found or planted
    scored = [v for v in ious if v is not None]
    return {
        "layer": truth.layer,
        "neurons": list(truth.neurons),
        "emergence_layer": emergence.get("layer"),
        "emergence_component": emergence.get("component"),
        "layer_recovered": emergence.get("layer") == truth.layer and emergence.get("component") == "mlp",
        "neurons_recovered": sorted(n for l, n in planted & set(found)),
        "neurons_missed": sorted(n for l, n in planted - set(found)),
        "extra_neurons": [{"layer": l, "neuron": n} for l, n in found if (l, n) not in planted],
        "all_neurons_recovered": planted <= set(found),
        "outlier_iou_mean": float(np.mean(scored)) if scored else None,
        "outlier_iou_per_image": ious,
    }


def _condition_summary(ablation) -> Dict:
    return {metric: values for metric, values in ablation.summary.items() if values.get("baseline") is not None}


def behaviour_summary(ablation, register) -> Optional[Dict]:
    """The behaviour readout of the causal stages: which classifier, why there is no accuracy (``note``), and the
    metric that exists (accuracy, else top-1 agreement, else the pooled vector's cosine to the unedited one) for
    the ablation (baseline / register neurons / controls) and the test-time register (without / with)."""
    first = ablation or register
    if first is None:
        return None
    record = (register.with_register if register is not None else ablation.conditions.get("target", {}))
    metric = ("pooled_cosine" if record.get("top1_agreement") is None else
              "top1_agreement" if record.get("accuracy") is None else "accuracy")
    out = {"classifier": first.classifier, "note": first.behaviour_note, "metric": metric, "ablation": None,
           "test_time_register": None}
    if ablation is not None:
        s = ablation.summary.get(metric, {})
        out["ablation"] = {k: s.get(k) for k in ("baseline", "target", "control_mean", "control_std")}
    if register is not None:
        out["test_time_register"] = {"baseline": register.baseline.get(metric),
                                     "with_register": register.with_register.get(metric)}
    return out


def input_geometry(source) -> Dict:
    """What the model saw: input size [h, w] in pixels, patch size [h, w], patch grid [h, w] (the last stage's
    of a pyramid, whose ``stage_grids`` are listed; empty otherwise), prefix tokens, and the preprocessing (``"model"``: timm's own, or an eval transform's name)."""
    layout = source.layout
    return {"input_size": [int(v) for v in source.image_size], "patch_size": [int(v) for v in source.patch_size],
            "preprocess": source.preprocess,
            "grid": [int(v) for v in layout.grid], "n_prefix": int(layout.n_prefix),
            "n_registers": int(layout.n_registers), "stage_grids": [list(g) for g in layout.stage_grids]}


def build_summary(model, source, results) -> Dict:
    """The report.json summary of the stage results (a :class:`~interp.report.battery.BatteryResults`)."""
    norms, neurons, skipped = results.norms, results.neurons, results.skipped
    ablation, register, relocation = results.ablation, results.register, results.relocation
    emergence = norms.emergence
    synthetic = planted_truth(model) is not None
    summary = {
        "model": norms.model,
        "fingerprint": norms.fingerprint,
        "synthetic": synthetic,
        "synthetic_note": synthetic_note(model) if synthetic else None,
        "random_weights": synthetic or getattr(model, "init_seed", None) is not None,
        "n_images": len(source),
        **input_geometry(source),
        "image_ids": list(source.ids),
        "artifacts_found": norms.artifacts_found,
        "detect_layer": norms.detect_layer,
        "threshold": norms.threshold,
        "threshold_method": norms.threshold_method,
        "detection_reason": norms.detection.get("reason"),
        "outlier_fraction": norms.outlier_fraction,
        "outlier_counts": norms.outlier_counts,
        "emergence": None if not emergence else {"layer": emergence["layer"], "component": emergence["component"]},
        "largest_step": largest_step(norms.emergence_curves) if norms.emergence_curves else None,
        "emergence_factor": norms.params.get("emergence_factor", 2.0),
        "emergence_detected": {k: v for k, v in (getattr(norms, "emergence_detected", None) or {}).items()
                               if k in ("layer", "component")} or None,
        "neurons": neurons.neurons,
        "neurons_message": neurons.message or None,
        "no_artifacts_note": None if norms.artifacts_found else NO_ARTIFACTS_NOTE.format(
            block=norms.detect_layer, reason=norms.detection.get("reason", "the patch-token norms have no separated "
                                                                           "high-norm mode")),
        "preset": neurons.preset,
        "highest_layer": neurons.highest_layer,
        "top_k": neurons.top_k,
        "skipped": skipped,
        "ablation": None,
        "test_time_register": None,
        "relocation": None,
    }
    if ablation is not None:
        summary["ablation"] = {"mode": ablation.mode, "n_controls": len(ablation.controls),
                               "effects": _condition_summary(ablation),
                               "replacements": {r: (v.get("comparison") or {}).get("removed")
                                                for r, v in (ablation.replacements or {}).items()}}
    if register is not None:
        norms_reg = [v for v in register.register_norm if v is not None]
        summary["test_time_register"] = {
            "outliers_before": register.baseline["outlier_count"],
            "outliers_after": register.with_register["outlier_count"],
            "max_patch_norm_before": register.baseline["max_patch_norm"],
            "max_patch_norm_after": register.with_register["max_patch_norm"],
            "register_norm_mean": float(np.mean(norms_reg)) if norms_reg else None,
            "register_norm_min": float(np.min(norms_reg)) if norms_reg else None,
            "top1_agreement": register.with_register["top1_agreement"],
            "pooled_cosine": register.with_register.get("pooled_cosine"),
        }
    summary["behaviour"] = behaviour_summary(ablation, register)
    if relocation is not None:
        summary["relocation"] = {"mean_iou": relocation.mean_iou, "mean_iou_active": relocation.mean_iou_active,
                                 "n_images": len(relocation.iou),
                                 "n_images_active": sum(1 for m in relocation.outlier_maps_before
                                                        if any(map(any, m))),
                                 "cls_attention_argmax_on_target": relocation.cls_attention_argmax_on_target}
    return summary


def probes_summary(probes) -> Optional[Dict]:
    """{probe: {group: {"n", "score", "chance", "note", "not_scored"}}} of a ProbesResult (None when it did not
    run); pixel groups add ``l2_error``, ``chance_l2_error`` and ``mse`` (the normalised input space of
    ``pixel_space``). ``not_scored`` marks a group with data but too little for a score (its ``note`` says
    why); ``unscored`` lists them, ``too_few`` says why nothing was scored."""
    if probes is None:
        return None

    def entry(probe, g) -> Dict:
        out = {"n": g.n, "score": g.score, "chance": g.chance, "note": g.note, "not_scored": g.too_few}
        if probe == "pixels":
            out.update(l2_error=g.l2_error, chance_l2_error=g.chance_l2_error, mse=g.mse)
        return out

    return {probe: {group: entry(probe, g) for group, g in getattr(probes, probe).items()}
            for probe in ("position", "pixels", "label")} | {
        "hook": probes.hook, "outliers_from": probes.outliers_from, "pixel_space": probes.pixel_space,
        "n_train_images": probes.n_train_images, "n_test_images": probes.n_test_images, "split": probes.split,
        "notes": list(probes.notes), "unscored": list(probes.unscored), "too_few": probes.too_few}


def lost_summary(lost) -> Optional[Dict]:
    """Images, tied seeds, CorLoc (None without ground truth) and the degenerate-case note of a LostResult (None
    when it did not run)."""
    if lost is None:
        return None
    return {"hook": lost.hook, "k": lost.k, "n_images": len(lost.ids), "tied_seeds": int(sum(lost.degenerate)),
            "corloc": lost.corloc, "degenerate": lost.all_degenerate, "note": lost.note}


def redundancy_summary(redundancy) -> Optional[Dict]:
    """{group: {"n_tokens", "mean", "median", "note"}} and the hook of a RedundancyResult (None when it did not
    run)."""
    if redundancy is None:
        return None
    return {"hook": redundancy.hook, **{group: {k: g[k] for k in ("n_tokens", "mean", "median", "note")}
                                        for group, g in redundancy.groups.items()}}


def sae_features_summary(result) -> Optional[Dict]:
    """The appendix's numbers from a SaeFeaturesResult (None when the report ran without ``--sae``): the SAE,
    its hook, features alive, the detection's verdict at the hook and each artifact feature's rates and
    cosines."""
    if result is None:
        return None
    return {"sae": result.sae, "hook": result.hook, "n_features": result.n_features, "n_alive": result.n_alive,
            "artifacts_found": result.artifacts_found, "message": result.message, "neurons": result.neurons,
            "isolated": (result.artifact_subspace or {}).get("isolated"),
            "artifact_features": [{"feature": f["feature"], "rate_high_norm": f["rates"]["high_norm"],
                                   "rate_normal_patch": f["rates"]["normal_patch"],
                                   "cos_mean_high_norm": f["cos_mean_high_norm"],
                                   "cos_register_neurons_max": f["cos_register_neurons"].get("max")}
                                  for f in result.artifact_features]}
