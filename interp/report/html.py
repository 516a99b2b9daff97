"""The report's self-contained ``index.html``: a summary table, then one section per study with its figures
and a link to its JSON (relative links only; every text escaped)."""
from __future__ import annotations

import html
from pathlib import Path
from typing import Dict, List, Optional, Tuple

import numpy as np

from .._version import __version__
from .summary import SYNTHETIC_NOTE


def _num(value, digits: int = 3) -> str:
    if value is None:
        return "n/a"
    if isinstance(value, bool):
        return "yes" if value else "no"
    if isinstance(value, (int, np.integer)):
        return str(int(value))
    return f"{value:.{digits}g}"


def _neuron_list(entries: List[Dict], limit: int = 12) -> str:
    text = ", ".join(f"{e['layer']}:{e['neuron']}" for e in entries[:limit])
    return text + (f" (+{len(entries) - limit} more)" if len(entries) > limit else "")


SKIPPED_STAGES = ("Skipped: the ablation, the test-time register and the relocation need register neurons, and "
                  "none were ranked (see 2.).")


def _geometry(s: Dict) -> str:
    """'224 x 224 px, 16 px patches -> 14 x 14 grid, 5 prefix tokens (CLS + 4 registers)' ("n/a" when unknown)."""
    if s.get("input_size") is None:
        return "n/a"
    (h, w), (ph, pw), (gh, gw) = s["input_size"], s["patch_size"], s["grid"]
    patch = f"{ph} px" if ph == pw else f"{ph} x {pw} px"
    others = s["n_prefix"] - 1 - s["n_registers"]
    kinds = ["CLS"] + [f"{s['n_registers']} registers"] * bool(s["n_registers"]) + [f"{others} other"] * bool(others)
    return (f"{h} x {w} px, {patch} patches \u2192 {gh} x {gw} grid, {s['n_prefix']} prefix tokens "
            f"({' + '.join(kinds)})")


def summary_rows(s: Dict) -> List[Tuple[str, str]]:
    """(label, value) rows of the summary table at the top of the page."""
    rows = [("model", f"{s['model']} (weights {s['fingerprint']})"),
            ("synthetic", "yes: planted by construction, not a trained network" if s["synthetic"] else "no"),
            ("images", str(s["n_images"])),
            ("input", _geometry(s)),
            ("high-norm tokens found", _num(s["artifacts_found"])),
            ("threshold", f"{_num(s['threshold'])} ({s['threshold_method']}) at block {s['detect_layer']}"),
            ("outlier fraction", f"{100 * s['outlier_fraction']:.2f} % of patch tokens")]
    e = s["emergence"]
    rows.append(("emergence", "none" if not e else f"block {e['layer']}, {e['component']} step"))
    if s.get("no_artifacts_note"):
        rows.append(("register neurons", "none: the model shows no artifacts"
                     + (f" (neurons ranked under the threshold: {_neuron_list(s['neurons'])})" if s["neurons"] else "")))
    else:
        rows.append(("register neurons", _neuron_list(s["neurons"]) if s["neurons"] else "none ranked (see 2.)"))
    a = s["ablation"]
    if a:
        oc = a["effects"].get("outlier_count", {})
        rows.append(("ablation: outlier count", f"baseline {_num(oc.get('baseline'))}, register neurons "
                     f"{_num(oc.get('target'))}, controls {_num(oc.get('control_mean'))} \u00b1 "
                     f"{_num(oc.get('control_std'))}"))
    r = s["test_time_register"]
    if r:
        rows.append(("test-time register", f"outliers {r['outliers_before']} \u2192 {r['outliers_after']}; register "
                     f"norm {_num(r['register_norm_mean'])} (max patch {_num(r['max_patch_norm_after'])})"))
    rl = s["relocation"]
    if rl:
        rows.append(("relocation IoU", f"{_num(rl['mean_iou'])} (on images with outliers: "
                     f"{_num(rl['mean_iou_active'])})"))
    p = s.get("planted")
    if p:
        rows.append(("planted layer recovered", f"{_num(p['layer_recovered'])} (planted {p['layer']}, found "
                     f"{_num(p['emergence_layer'])} {p['emergence_component'] or ''})"))
        rows.append(("planted neurons recovered", f"{len(p['neurons_recovered'])} of {len(p['neurons'])} "
                     f"(planted {', '.join(str(n) for n in p['neurons'])} in block {p['layer']})"))
        rows.append(("outlier map IoU vs planted", _num(p["outlier_iou_mean"])))
    if s["skipped"]:
        rows.append(("stages 3-5", "not run (no register neurons)"))
    return rows


def _section(title: str, sentences: List[str], figures: List[str], json_name: Optional[str]) -> str:
    parts = [f"<section><h2>{html.escape(title)}</h2>"]
    parts += [f"<p>{html.escape(t)}</p>" for t in sentences if t]
    for name in figures:
        parts.append(f'<figure><img src="{html.escape(name)}" alt="{html.escape(name)}"></figure>')
    if json_name:
        parts.append(f'<p class="files">data: <a href="{html.escape(json_name)}">{html.escape(json_name)}</a></p>')
    parts.append("</section>")
    return "\n".join(parts)


def study_explanations(s: Dict) -> Dict[str, List[str]]:
    """One or two sentences per study, in words, from the summary."""
    out: Dict[str, List[str]] = {}
    e = s["emergence"]
    if s["artifacts_found"]:
        out["norms"] = [
            f"At block {s['detect_layer']}, {100 * s['outlier_fraction']:.2f} % of patch tokens have an L2 norm "
            f"above {_num(s['threshold'])} ({s['threshold_method']} threshold on the un-normalised residual stream).",
            "" if not e else f"The max patch norm first jumps in the {e['component']} step of block {e['layer']}; "
                             "the profile draws the attention step and the MLP step of every block apart."]
    else:
        out["norms"] = [
            f"No high-norm tokens found: the patch-norm distribution at block {s['detect_layer']} has no separated "
            "high-norm mode, so no token counts as an outlier.",
            "The profile and histograms still show how the norms evolve through the blocks."]
    if s.get("no_artifacts_note"):
        out["neurons"] = ["No register neurons: the model shows no artifacts (see the note at the top)."] + ([f"Ranked under the threshold (not register neurons): "
                                                      f"{_neuron_list(s['neurons'])}."] if s["neurons"] else [])
    elif s["neurons"]:
        out["neurons"] = [
            f"Register-neuron score = mean |MLP activation| on the outlier tokens, over the images that have "
            f"outliers; blocks up to {s['highest_layer']} scored, top {s['top_k']} kept.",
            f"Ranked: {_neuron_list(s['neurons'])}."]
    else:
        out["neurons"] = [s["neurons_message"] or "No neurons ranked."]
    a = s["ablation"]
    if a:
        oc, mx = a["effects"].get("outlier_count", {}), a["effects"].get("max_norm", {})
        out["ablate"] = [
            f"Setting the register neurons to {a['mode']} takes the outlier count from {_num(oc.get('baseline'))} to "
            f"{_num(oc.get('target'))} and the max patch norm from {_num(mx.get('baseline'))} to "
            f"{_num(mx.get('target'))}; {a['n_controls']} random same-size neuron sets from the same blocks give "
            f"{_num(oc.get('control_mean'))} \u00b1 {_num(oc.get('control_std'))} outliers."]
    r = s["test_time_register"]
    if r:
        out["registers"] = [
            "A test-time register: one extra token (zero, no position embedding) receives the register neurons' "
            "value while those neurons are zeroed on the patches.",
            f"Patch outliers go from {r['outliers_before']} to {r['outliers_after']}; the register token's norm is "
            f"{_num(r['register_norm_mean'])} on average (min {_num(r['register_norm_min'])}) against a max patch "
            f"norm of {_num(r['max_patch_norm_after'])} with the register."]
    rl = s["relocation"]
    if rl:
        out["relocate"] = [
            "The register neurons' maximum is written on the smiley's patches (outlined) and zeroed elsewhere; "
            "the high-norm tokens should then sit exactly on the smiley.",
            f"Mean IoU of the relocated outliers with the smiley: {_num(rl['mean_iou'])} over all images, "
            f"{_num(rl['mean_iou_active'])} over the images that had outliers before (where the neurons fire)."]
    return out


def _probe_sentence(name: str, groups: Dict) -> str:
    cells = [f"{g.replace('_', '-')}: " + (v["note"] or "empty") if v["score"] is None else
             f"{g.replace('_', '-')} {_num(v['score'])} (chance {_num(v['chance'])}, n={v['n']})"
             for g, v in groups.items()]
    return f"{name}: " + "; ".join(cells) + "." if cells else ""


def object_sections(s: Dict, figures: Dict[str, List[str]]) -> List[str]:
    """The probes and LOST sections, when the report ran them (``s["probes"]``, ``s["lost"]``)."""
    parts = []
    p = s.get("probes")
    if p:
        text = [f"Linear probes on {p['hook']}, trained on the training images' tokens and scored per token group "
                "on held-out images (a small seeded token sample). Darcet et al.: high-norm tokens hold little "
                "local information (position, pixels) and much global information (the label).",
                _probe_sentence("Position (top-1)", p["position"]), _probe_sentence("Pixels (R\u00b2)", p["pixels"]),
                _probe_sentence("Label from one token (top-1)", p["label"]), *p["notes"]]
        parts.append(_section("6. Linear probes per token group", text, figures.get("probes", []), "probes.json"))
    lost = s.get("lost")
    if lost:
        text = [f"LOST on the keys {lost['hook']} (k={lost['k']}): the seed (star) is the patch with the fewest "
                "positive key correlations; the box holds the seed's connected part of the mask (cells off it "
                "dimmed). No ground-truth boxes here, so no CorLoc (interp study lost --boxes FILE gives it).",
                f"{lost['tied_seeds']} of {lost['n_images']} images have all degrees equal (a tied seed, not a "
                "discovery)."]
        parts.append(_section("7. LOST object discovery", text, figures.get("lost", []), "lost.json"))
    return parts


def write_html(path: Path, s: Dict, figures: Dict[str, List[str]]) -> None:
    """The self-contained index page: summary table, then one section per study (relative links only)."""
    title = f"interp report: {s['model']}"
    parts = ["<!doctype html>", '<html lang="en"><head><meta charset="utf-8">', f"<title>{html.escape(title)}</title>",
             "<style>body{font-family:sans-serif;max-width:1250px;margin:1.5em auto;padding:0 1em;line-height:1.4}"
             "table{border-collapse:collapse}td,th{border:1px solid #ccc;padding:.25em .6em;text-align:left;"
             "vertical-align:top}th{background:#f3f3f3}img{max-width:100%;border:1px solid #eee}"
             ".warn{background:#fff4d6;border:1px solid #e0b84c;padding:.6em}.note{background:#eef3ff;"
             "border:1px solid #9ab;padding:.6em}.files{font-size:90%;color:#555}figure{margin:1em 0}</style>",
             "</head><body>", f"<h1>{html.escape(title)}</h1>"]
    if s["synthetic"]:
        parts.append(f'<p class="warn"><strong>Synthetic model.</strong> {html.escape(SYNTHETIC_NOTE)}</p>')
    if s.get("no_artifacts_note"):
        parts.append(f'<p class="warn"><strong>No artifacts.</strong> {html.escape(s["no_artifacts_note"])}</p>')
    parts.append("<table><tbody>")
    for label, value in summary_rows(s):
        parts.append(f"<tr><th>{html.escape(label)}</th><td>{html.escape(value)}</td></tr>")
    parts.append("</tbody></table>")
    text = study_explanations(s)
    parts.append(_section("1. High-norm tokens (norms)", text["norms"], figures.get("norms", []), "norms.json"))
    parts.append(_section("2. Register neurons", text["neurons"], figures.get("neurons", []), "neurons.json"))
    if s["skipped"]:
        parts.append(f'<section><h2>3-5. Ablation, test-time register, relocation</h2>'
                     f'<p class="note">{html.escape(SKIPPED_STAGES)}</p></section>')
    else:
        parts.append(_section("3. Ablation against random controls", text.get("ablate", []),
                              figures.get("ablate", []), "ablate.json"))
        parts.append(_section("4. Test-time register", text.get("registers", []), figures.get("registers", []),
                              "registers.json"))
        parts.append(_section("5. Relocation onto a smiley", text.get("relocate", []), figures.get("relocate", []),
                              "relocate.json"))
    parts += object_sections(s, figures)
    parts.append(f'<p class="files">Summary: <a href="report.json">report.json</a>. Written by interp '
                 f'{html.escape(__version__)} in {s["seconds"]:.1f} s.</p></body></html>')
    path.write_text("\n".join(parts), encoding="utf-8")
