"""The report's self-contained ``index.html``: a summary table, then one section per study with its figures
embedded (base64 PNG: the page is one file that can be mailed or moved alone) and the name of its JSON in the
report folder; every text escaped. A section whose figure would say nothing on the data (too few images for
the probes, a degenerate LOST) shows a one-line caveat instead of the figure."""
from __future__ import annotations

import base64
import html
from pathlib import Path
from typing import Dict, List, Optional, Tuple

import numpy as np

from .._version import __version__
from ..plots.common import plural
from ..studies.probes.token_probes import MIN_IMAGES
from .summary import SYNTHETIC_NOTE

PLANTED_PROBES_CAVEAT = ("Caveat: planted_vit's high-norm tokens are ordinary patch tokens with a planted direction "
                         "added, so they keep their local information: high position and pixel scores here show "
                         "that the probes run, not Darcet et al.'s finding on trained ViTs.")


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
    kinds = (["CLS"] + [plural(s["n_registers"], "register")] * bool(s["n_registers"])
             + [f"{others} other"] * bool(others))
    pre = s.get("preprocess") or "model"
    how = "timm's own preprocessing" if pre == "model" else f"eval transform {pre}"
    return (f"{h} x {w} px ({how}), {patch} patches \u2192 {gh} x {gw} grid, "
            f"{plural(s['n_prefix'], 'prefix token')} ({' + '.join(kinds)})")


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
    d = s.get("emergence_detected")
    rows.append(("detected tokens separate", "none" if not d else f"block {d['layer']}, {d['component']} step"))
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
    rows += _behaviour_rows(s.get("behaviour"))
    rl = s["relocation"]
    if rl:
        rows.append(("relocation IoU", f"{_num(rl['mean_iou'])} (on images with outliers: "
                     f"{_num(rl['mean_iou_active'])})"))
    red = s.get("redundancy")
    if red:
        cells = [f"{name} {_num(red[g]['median'])} (n={red[g]['n_tokens']})" if red[g]["median"] is not None else
                 f"{name} - ({red[g]['note']})" for g, name in (("normal", "normal"), ("high_norm", "high-norm"))]
        rows.append(("redundant patches (median cosine to the 4 neighbouring input patches)", "; ".join(cells)))
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


BEHAVIOUR_LABELS = {"accuracy": "top-1 accuracy", "top1_agreement": "top-1 agreement with the unedited model",
                    "pooled_cosine": "cosine of the pooled vector to the unedited one"}


def _behaviour_rows(b) -> list:
    """Rows for the behaviour readout: the metric that exists (never an accuracy without class logits)."""
    if not b:
        return []
    parts = []
    if b["ablation"]:
        a = b["ablation"]
        parts.append(f"ablation: baseline {_num(a['baseline'])}, register neurons {_num(a['target'])}, controls "
                     f"{_num(a['control_mean'])}")
    if b["test_time_register"]:
        r = b["test_time_register"]
        parts.append(f"test-time register: {_num(r['baseline'])} \u2192 {_num(r['with_register'])}")
    clf = b.get("classifier") or {}
    used = (f"{clf.get('kind')} classifier {clf.get('path') or clf.get('source') or ''}".strip()
            if clf.get("kind") not in (None, "model_head") else "the model's head")
    rows = [(f"behaviour ({BEHAVIOUR_LABELS[b['metric']]}, through {used})", "; ".join(parts))]
    return rows + ([("behaviour note", b["note"])] if b.get("note") else [])


def embedded_image(folder: Optional[Path], name: str) -> str:
    """An ``<img>`` holding ``folder/name`` (a PNG) as a base64 data URI; a note when the file is missing."""
    path = None if folder is None else folder / name
    if path is None or not path.is_file():
        return f'<p class="note">figure {html.escape(name)} was not written</p>'
    data = base64.b64encode(path.read_bytes()).decode("ascii")
    return (f'<figure><img src="data:image/png;base64,{data}" alt="{html.escape(name)}" '
            f'data-file="{html.escape(name)}"></figure>')


def _section(title: str, sentences: List[str], figures: List[str], json_name: Optional[str],
             folder: Optional[Path] = None, caveat: Optional[str] = None) -> str:
    """One study's section: its sentences, then the caveat INSTEAD of the figures when there is one."""
    parts = [f"<section><h2>{html.escape(title)}</h2>"]
    parts += [f"<p>{html.escape(t)}</p>" for t in sentences if t]
    if caveat:
        parts.append(f'<p class="caveat">{html.escape(caveat)}</p>')
    else:
        parts += [embedded_image(folder, name) for name in figures]
    if json_name:
        parts.append(f'<p class="files">data: <code>{html.escape(json_name)}</code> in the report folder</p>')
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
        reason = s.get("detection_reason")
        out["norms"] = [
            f"No high-norm tokens found: the patch-norm distribution at block {s['detect_layer']} has no separated "
            "high-norm mode, so no token counts as an outlier." if s["threshold"] is None or not reason else
            f"No artifacts at block {s['detect_layer']}: {reason}.",
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


def _probe_sentence(name: str, groups: Dict, value: str = "score", chance: str = "chance") -> str:
    """One probe's groups in words: ``value`` (chance ``chance``) per group, or why it has none (a group with
    too little data is marked NOT SCORED). A summary without ``value`` (written before pixel groups had an L2
    error) shows its ``score``."""
    def number(v: Dict) -> str:
        key, ref = (value, chance) if v.get(value) is not None else ("score", "chance")
        return f"{_num(v[key])} (chance {_num(v.get(ref))}, n={v['n']})"

    cells = [f"{g.replace('_', '-')}: " + ("NOT SCORED, " if v.get("not_scored") else "") + (v["note"] or "empty")
             if v["score"] is None else f"{g.replace('_', '-')} {number(v)}" for g, v in groups.items()]
    return f"{name}: " + "; ".join(cells) + "." if cells else ""


def object_sections(s: Dict, figures: Dict[str, List[str]], folder: Optional[Path] = None) -> List[str]:
    """The probes and LOST sections, when the report ran them (``s["probes"]``, ``s["lost"]``); each says in
    one line, instead of a figure, when its result means nothing on these data."""
    parts = []
    p = s.get("probes")
    if p:
        text = [f"Linear probes on {p['hook']}, trained on the training images' tokens and scored per token group "
                "on held-out images (a small seeded token sample). Darcet et al.: high-norm tokens hold little "
                "local information (position, pixels) and much global information (the label)."]
        caveat = None
        if p.get("too_few"):
            caveat = (f"Not scored: {p['too_few']} (interp report --images DIR with at least {MIN_IMAGES} images "
                      "gives probe scores).")
        else:
            if s.get("synthetic"):
                text.append(PLANTED_PROBES_CAVEAT)
            text += [_probe_sentence("Position (top-1)", p["position"]),
                     _probe_sentence("Pixels (mean L2 error per token, normalised input; lower is better)",
                                     p["pixels"], "l2_error", "chance_l2_error"),
                     _probe_sentence("Label from one token (top-1)", p["label"])]
        parts.append(_section("6. Linear probes per token group", text + list(p["notes"]), figures.get("probes", []),
                              "probes.json", folder, caveat))
    lost = s.get("lost")
    if lost:
        text = [f"LOST on the keys {lost['hook']} (k={lost['k']}): the seed (star) is the patch with the fewest "
                "positive key correlations; the box holds the seed's connected part of the mask (cells off it "
                "dimmed). No ground-truth boxes here, so no CorLoc (interp study lost --boxes FILE gives it)."]
        caveat = (f"Degenerate result, not drawn: {lost['note'].removeprefix('degenerate: ')}"
                  if lost.get("degenerate") else None)
        if not caveat:
            text.append(lost.get("note") or f"{lost['tied_seeds']} of {lost['n_images']} images have all degrees "
                                            "equal (a tied seed, not a discovery).")
        parts.append(_section("7. LOST object discovery", text, figures.get("lost", []), "lost.json", folder, caveat))
    return parts


def _telling_norm_figures(s: Dict, figures: Dict[str, List[str]]) -> List[str]:
    """The norms figures that show something: no outlier map when no patch is above the threshold (the
    section's sentence says there are none)."""
    none_above = not s.get("outlier_fraction")
    return [f for f in figures.get("norms", []) if not (none_above and f.startswith("outlier_maps"))]


def write_html(path: Path, s: Dict, figures: Dict[str, List[str]]) -> None:
    """The self-contained index page: summary table, then one section per study, each figure (a PNG next to
    ``path``, named in ``figures``) embedded; no link to another file."""
    title = f"interp report: {s['model']}"
    parts = ["<!doctype html>", '<html lang="en"><head><meta charset="utf-8">', f"<title>{html.escape(title)}</title>",
             "<style>body{font-family:sans-serif;max-width:1250px;margin:1.5em auto;padding:0 1em;line-height:1.4}"
             "table{border-collapse:collapse}td,th{border:1px solid #ccc;padding:.25em .6em;text-align:left;"
             "vertical-align:top}th{background:#f3f3f3}img{max-width:100%;border:1px solid #eee}"
             ".warn{background:#fff4d6;border:1px solid #e0b84c;padding:.6em}.note{background:#eef3ff;"
             "border:1px solid #9ab;padding:.6em}.caveat{background:#fff4d6;border-left:4px solid #e0b84c;"
             "padding:.4em .6em}.files{font-size:90%;color:#555}figure{margin:1em 0}</style>",
             "</head><body>", f"<h1>{html.escape(title)}</h1>"]
    if s["synthetic"]:
        parts.append(f'<p class="warn"><strong>Synthetic model.</strong> {html.escape(SYNTHETIC_NOTE)}</p>')
    if s.get("no_artifacts_note"):
        parts.append(f'<p class="warn"><strong>No artifacts.</strong> {html.escape(s["no_artifacts_note"])}</p>')
    parts.append("<table><tbody>")
    for label, value in summary_rows(s):
        parts.append(f"<tr><th>{html.escape(label)}</th><td>{html.escape(value)}</td></tr>")
    parts.append("</tbody></table>")
    text, folder = study_explanations(s), path.parent
    parts.append(_section("1. High-norm tokens (norms)", text["norms"], _telling_norm_figures(s, figures),
                          "norms.json", folder))
    # without ranked neurons the score chart is an empty message: the sentence says it in one line
    parts.append(_section("2. Register neurons", text["neurons"], figures.get("neurons", []) if s["neurons"] else [],
                          "neurons.json", folder))
    if s["skipped"]:
        parts.append(f'<section><h2>3-5. Ablation, test-time register, relocation</h2>'
                     f'<p class="note">{html.escape(SKIPPED_STAGES)}</p></section>')
    else:
        parts.append(_section("3. Ablation against random controls", text.get("ablate", []),
                              figures.get("ablate", []), "ablate.json", folder))
        parts.append(_section("4. Test-time register", text.get("registers", []), figures.get("registers", []),
                              "registers.json", folder))
        parts.append(_section("5. Relocation onto a smiley", text.get("relocate", []), figures.get("relocate", []),
                              "relocate.json", folder))
    parts += object_sections(s, figures, folder)
    parts.append(f'<p class="files">Summary: <code>report.json</code>, the figures as PNG files and each study\'s '
                 f'JSON are in the report folder. Written by interp {html.escape(__version__)} in '
                 f'{s["seconds"]:.1f} s.</p></body></html>')
    path.write_text("\n".join(parts), encoding="utf-8")
