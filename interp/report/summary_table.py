"""The report's summary table (the first thing on the page): one (label, value) row per finding, with the
numbers formatted for reading (:func:`summary_rows`)."""
from __future__ import annotations

from typing import Dict, List, Tuple

import numpy as np

from ..plots.common import near_one, plural
from .sections import SMALL_SAMPLE, number_of, outlier_share_remark, small_sample

def number_text(value, digits: int = 3) -> str:
    if value is None:
        return "n/a"
    if isinstance(value, bool):
        return "yes" if value else "no"
    if isinstance(value, (int, np.integer)):
        return str(int(value))
    return f"{value:.{digits}g}"


def neuron_list_text(entries: List[Dict], limit: int = 12) -> str:
    """'block 2: neurons 17, 101; block 5: neuron 40' (not '2:17', which read like an L2 norm)."""
    by_block: Dict[int, List[int]] = {}
    for e in entries[:limit]:
        by_block.setdefault(int(e["layer"]), []).append(int(e["neuron"]))
    text = "; ".join(f"block {b}: neuron{'s' if len(ns) > 1 else ''} {', '.join(map(str, ns))}"
                     for b, ns in by_block.items())
    return text + (f" (+{len(entries) - limit} more)" if len(entries) > limit else "")


def _geometry(s: Dict) -> str:
    """'224 x 224 px, 16 px patches -> 14 x 14 grid, 5 prefix tokens (CLS + 4 registers)' ("n/a" when unknown)."""
    if s.get("input_size") is None:
        return "n/a"
    (h, w), (ph, pw), (gh, gw) = s["input_size"], s["patch_size"], s["grid"]
    patch = f"{ph} px" if ph == pw else f"{ph} x {pw} px"
    others = s["n_prefix"] - 1 - s["n_registers"]
    kinds = (["CLS"] + [plural(s["n_registers"], "register")] * bool(s["n_registers"])
             + [f"{others} other"] * bool(others))
    pre = s.get("preprocess") or "model"
    how = "timm's own preprocessing" if pre == "model" else f"eval transform {pre}"
    if s.get("stage_grids"):  # a pyramid: no prefix tokens, one grid per stage
        grids = ", ".join(f"{a} x {b}" for a, b in s["stage_grids"])
        return f"{h} x {w} px ({how}), {patch} patch embedding \u2192 stage grids {grids}, no prefix tokens"
    return (f"{h} x {w} px ({how}), {patch} patches \u2192 {gh} x {gw} grid, "
            f"{plural(s['n_prefix'], 'prefix token')} ({' + '.join(kinds)})")


def no_emergence_text(s: Dict) -> str:
    """Why the summary names no emergence step, with the profile's largest step beside it (a profile that
    visibly jumps is said, not left to contradict the row)."""
    step = s.get("largest_step")
    seen = "" if not step else (f"; the profile's largest max/median step is {step['jump']:.1f}x at block "
                                f"{step['layer']}'s {step['component']} step")
    if not s["artifacts_found"]:
        return f"none: no artifacts, so no step is their emergence{seen}"
    return f"none: no step raises the max patch norm {s.get('emergence_factor', 2.0):g}x over the median{seen}"


def summary_rows(s: Dict) -> List[Tuple[str, str]]:
    """(label, value) rows of the summary table at the top of the page."""
    small = small_sample(s["n_images"])
    flag = f" (small sample: {s['n_images']} images)" if small else ""  # on every verdict row
    rows = [("model", f"{s['model']} (weights {s['fingerprint']})"),
            ("synthetic", "yes: planted by construction, not a trained network" if s["synthetic"] else "no"),
            ("images", str(s["n_images"]) + (f" (small sample: fewer than {SMALL_SAMPLE}; every verdict below "
                                              "is indicative only)" if small else "")),
            ("input", _geometry(s)),
            ("high-norm tokens found", number_text(s["artifacts_found"]) + flag),
            ("threshold", f"{number_text(s['threshold'])} ({s['threshold_method']}) at block {s['detect_layer']}"),
            ("outlier fraction", f"{100 * s['outlier_fraction']:.2f} % of patch tokens"
             + (f" (far above the papers' few per cent: see {number_of('norms')}.)" if outlier_share_remark(s)
                else ""))]
    e = s["emergence"]
    rows.append(("emergence", f"block {e['layer']}, {e['component']} step" if e else no_emergence_text(s)))
    d = s.get("emergence_detected")
    rows.append(("detected tokens separate", "none" if not d else f"block {d['layer']}, {d['component']} step"))
    if s.get("no_artifacts_note"):
        rows.append(("register neurons", "none: the model shows no artifacts"
                     + (f" (neurons ranked under the threshold: {neuron_list_text(s['neurons'])})" if s["neurons"] else "")))
    else:
        rows.append(("register neurons", (neuron_list_text(s["neurons"]) + flag) if s["neurons"] else
                     f"none ranked (see {number_of('neurons')}.)"))
    a = s["ablation"]
    if a:
        oc = a["effects"].get("outlier_count", {})
        rows.append(("ablation: outlier count", f"baseline {number_text(oc.get('baseline'))}, register neurons "
                     f"{number_text(oc.get('target'))}, controls {number_text(oc.get('control_mean'))} \u00b1 "
                     f"{number_text(oc.get('control_std'))}{flag}"))
    r = s["test_time_register"]
    if r:
        rows.append(("test-time register", f"outliers {r['outliers_before']} \u2192 {r['outliers_after']}; register "
                     f"norm {number_text(r['register_norm_mean'])} (max patch {number_text(r['max_patch_norm_after'])})"))
    rows += _behaviour_rows(s.get("behaviour"))
    rl = s["relocation"]
    if rl:
        active = rl.get("n_images_active")
        rows.append(("relocation: IoU of the outliers with the smiley (0 none, 1 exactly on it)",
                     f"mean IoU {number_text(rl['mean_iou'])} over all {rl.get('n_images', s['n_images'])} images; mean IoU "
                     f"{number_text(rl['mean_iou_active'])} over the "
                     f"{'' if active is None else f'{active} '}images that had outliers before{flag}"))
    red = s.get("redundancy")
    if red:
        cells = [f"{name} {near_one(red[g]['median'])} (n={red[g]['n_tokens']})"
                 if red[g]["median"] is not None else
                 f"{name} - ({red[g]['note']})" for g, name in (("normal", "normal"), ("high_norm", "high-norm"))]
        rows.append(("redundant patches (median cosine to the 4 neighbouring input patches)", "; ".join(cells)))
    p = s.get("planted")
    if p:
        rows.append(("planted layer recovered", f"{number_text(p['layer_recovered'])} (planted {p['layer']}, found "
                     f"{number_text(p['emergence_layer'])} {p['emergence_component'] or ''}){flag}"))
        rows.append(("planted neurons recovered", f"{len(p['neurons_recovered'])} of {len(p['neurons'])} "
                     f"(planted {', '.join(str(n) for n in p['neurons'])} in block {p['layer']}){flag}"))
        rows.append(("outlier map IoU vs planted", number_text(p["outlier_iou_mean"])))
    if s["skipped"]:
        first, last = number_of("ablate"), number_of("relocate")
        rows.append((f"sections {first}-{last}", "not run (no register neurons)"))
    return rows


BEHAVIOUR_LABELS = {"accuracy": "top-1 accuracy", "top1_agreement": "top-1 agreement with the unedited model",
                    "pooled_cosine": "cosine of the pooled vector to the unedited one"}


def _behaviour_rows(b) -> list:
    """Rows for the behaviour readout: the metric that exists (never an accuracy without class logits)."""
    if not b:
        return []
    parts = []
    num = near_one if b["metric"] == "pooled_cosine" else number_text  # a cosine of 0.99997 is not "1"
    if b["ablation"]:
        a = b["ablation"]
        parts.append(f"ablation: baseline {num(a['baseline'])}, register neurons {num(a['target'])}, controls "
                     f"{num(a['control_mean'])}")
    if b["test_time_register"]:
        r = b["test_time_register"]
        parts.append(f"test-time register: {num(r['baseline'])} \u2192 {num(r['with_register'])}")
    clf = b.get("classifier") or {}
    used = (f"{clf.get('kind')} classifier {clf.get('path') or clf.get('source') or ''}".strip()
            if clf.get("kind") not in (None, "model_head") else "the model's head")
    rows = [(f"behaviour ({BEHAVIOUR_LABELS[b['metric']]}, through {used})", "; ".join(parts))]
    return rows + ([("behaviour note", b["note"])] if b.get("note") else [])
