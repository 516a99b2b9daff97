"""The report's self-contained ``index.html``: a summary table, a table of contents, then one section per study
(:data:`~interp.report.sections.SECTIONS`, the console's step numbers) with its figures embedded (base64 PNG:
the page is one file that can be mailed or moved alone) and the name of its JSON in the report folder; every
text escaped. A section that can say nothing on the data (too few images for the probes, LOST on random
weights, the causal studies without neurons) is one line saying why
(:func:`~interp.report.sections.one_line_reasons`)."""
from __future__ import annotations

import base64
import html
from pathlib import Path
from typing import Dict, List, Optional

from .._version import __version__
from ..plots.common import near_one
from .sections import (CAUSAL, SECTIONS, SMALL_SAMPLE, number_of, numbered, one_line_reasons,
                       outlier_share_remark, small_sample)
from .reassessment_cells import PARALLEL_COS
from .summary import SYNTHETIC_NOTE
from .summary_table import neuron_list_text, number_text, summary_rows

PLANTED_PROBES_CAVEAT = ("Caveat: the planted model's high-norm tokens are ordinary patch tokens with a planted "
                         "direction added, so they may keep their local information: the position and pixel scores "
                         "here, high or at chance, show that the probes run, not Darcet et al.'s finding on "
                         "trained ViTs.")


def embedded_image(folder: Optional[Path], name: str) -> str:
    """An ``<img>`` holding ``folder/name`` (a PNG) as a base64 data URI; a note when the file is missing."""
    path = None if folder is None else folder / name
    if path is None or not path.is_file():
        return f'<p class="note">figure {html.escape(name)} was not written</p>'
    data = base64.b64encode(path.read_bytes()).decode("ascii")
    # A click shows the figure at its full size (scroll sideways) and back: the page stays one self-contained
    # file, with no link to the PNG beside it (a wide figure shown at the page's width has unreadable titles).
    return (f'<figure><img src="data:image/png;base64,{data}" alt="{html.escape(name)}" '
            f'data-file="{html.escape(name)}" title="click: full size / fit the page" '
            f'onclick="this.classList.toggle(\'full\')">'
            f'<figcaption>{html.escape(Path(name).name)}: click the figure for its full size</figcaption></figure>')


def _heading(key: str) -> str:
    """The section's anchor and numbered heading (the number of its console step)."""
    return (f'<section id="{html.escape(key)}"><h2>{number_of(key)}. '
            f'{html.escape(dict(SECTIONS)[key])}</h2>')


def _section(key: str, sentences: List[str], figures: List[str], json_name: Optional[str],
             folder: Optional[Path] = None) -> str:
    """One study's section: its sentences, then its figures (a section with nothing to show on the data is
    :func:`one_line_section`)."""
    parts = [_heading(key)]
    parts += [f"<p>{html.escape(t)}</p>" for t in sentences if t]
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
            f"above {number_text(s['threshold'])} ({s['threshold_method']} threshold on the un-normalised residual stream).",
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
                                                      f"{neuron_list_text(s['neurons'])}."] if s["neurons"] else [])
    elif s["neurons"]:
        out["neurons"] = [
            f"Register-neuron score = mean |MLP activation| on the outlier tokens, over the images that have "
            f"outliers; blocks up to {s['highest_layer']} scored, top {s['top_k']} kept.",
            f"Ranked: {neuron_list_text(s['neurons'])}."]
    else:
        out["neurons"] = [s["neurons_message"] or "No neurons ranked."]
    a = s["ablation"]
    if a:
        oc, mx = a["effects"].get("outlier_count", {}), a["effects"].get("max_norm", {})
        out["ablate"] = [
            f"Setting the register neurons to {a['mode']} takes the outlier count from {number_text(oc.get('baseline'))} to "
            f"{number_text(oc.get('target'))} and the max patch norm from {number_text(mx.get('baseline'))} to "
            f"{number_text(mx.get('target'))}; {a['n_controls']} random same-size neuron sets from the same blocks give "
            f"{number_text(oc.get('control_mean'))} \u00b1 {number_text(oc.get('control_std'))} outliers."]
        shares = [f"{r}: {v['target']:.0%} (random sets at most {max(v['controls']):.0%})"
                  for r, v in (a.get("replacements") or {}).items() if v]
        if len(shares) > 1:
            out["ablate"].append("Which replacement the number rests on: share of the outliers removed when the "
                                 "neurons are set to zero, to their mean, or to another image's values (resample): "
                                 + "; ".join(shares) + ".")
    r = s["test_time_register"]
    if r:
        out["registers"] = [
            "A test-time register: one extra token (zero, no position embedding) receives the register neurons' "
            "value while those neurons are zeroed on the patches.",
            f"Patch outliers go from {r['outliers_before']} to {r['outliers_after']}; the register token's norm is "
            f"{number_text(r['register_norm_mean'])} on average (min {number_text(r['register_norm_min'])}) against a max patch "
            f"norm of {number_text(r['max_patch_norm_after'])} with the register."]
    rl = s["relocation"]
    if rl:
        out["relocate"] = [
            "The register neurons' maximum is written on the smiley's patches (outlined) and zeroed elsewhere; "
            "the high-norm tokens should then sit exactly on the smiley.",
            f"Mean IoU of the relocated outliers with the smiley: {number_text(rl['mean_iou'])} over all images, "
            f"{number_text(rl['mean_iou_active'])} over the images that had outliers before (where the neurons fire)."]
    remark = outlier_share_remark(s)
    if remark:
        out["norms"].append(remark)
    out["redundancy"] = _redundancy_sentences(s.get("redundancy"))
    return out


def _redundancy_sentences(red: Optional[Dict]) -> List[str]:
    """The redundancy section in words: what is measured, each group's median, and which group is the more
    redundant."""
    if not red:
        return []
    text = [f"Cosine similarity of each patch's input embedding ({red['hook']}) to those of its 4 grid neighbours, "
            "averaged per patch, per token group. Darcet et al. find the high-norm tokens on patches nearly "
            "identical to their neighbours (similarity about 1): redundant patches the model can overwrite."]
    cells = [f"{name} {near_one(red[g]['median'])} (mean {near_one(red[g]['mean'])}, n={red[g]['n_tokens']})"
             if red[g]["median"] is not None else f"{name}: {red[g]['note']}"
             for g, name in (("normal", "normal"), ("high_norm", "high-norm"))]
    text.append("Median similarity: " + "; ".join(cells) + ".")
    hi, lo = red["high_norm"]["median"], red["normal"]["median"]
    if lo is not None and lo >= PARALLEL_COS:  # the reassessment's rule: no contrast to read a difference from
        text.append(f"The normal patches' input embeddings are already nearly parallel to their neighbours (median "
                    f"{lo:.5f} >= {PARALLEL_COS}): a component shared by every patch dominates, so this measure "
                    "cannot tell whether the high-norm tokens sit on more redundant patches (n/a).")
    elif hi is not None and lo is not None:
        text.append(f"The high-norm tokens' patches are {'more' if hi > lo else 'not more'} redundant than the "
                    "normal ones.")
    return text


def _probe_sentence(name: str, groups: Dict, value: str = "score", chance: str = "chance") -> str:
    """One probe's groups in words: ``value`` (chance ``chance``) per group, or why it has none (a group with
    too little data is marked NOT SCORED). A summary without ``value`` (written before pixel groups had an L2
    error) shows its ``score``."""
    def number(v: Dict) -> str:
        key, ref = (value, chance) if v.get(value) is not None else ("score", "chance")
        return f"{number_text(v[key])} (chance {number_text(v.get(ref))}, n={v['n']})"

    cells = [f"{g.replace('_', '-')}: " + ("NOT SCORED, " if v.get("not_scored") else "") + (v["note"] or "empty")
             if v["score"] is None else f"{g.replace('_', '-')} {number(v)}" for g, v in groups.items()]
    return f"{name}: " + "; ".join(cells) + "." if cells else ""


def object_sections(s: Dict, figures: Dict[str, List[str]], folder: Optional[Path] = None) -> Dict[str, str]:
    """The probes and LOST sections (key -> HTML), when the report ran them (``s["probes"]``, ``s["lost"]``);
    a section whose result means nothing on these data is one line (:func:`one_line_reasons`)."""
    parts, why = {}, one_line_reasons(s)
    p = s.get("probes")
    if p and "probes" not in why:
        text = [f"Linear probes on {p['hook']}, trained on the training images' tokens and scored per token group "
                "on held-out images (a small seeded token sample). Darcet et al.: high-norm tokens hold little "
                "local information (position, pixels) and much global information (the label)."]
        if s.get("synthetic"):
            text.append(PLANTED_PROBES_CAVEAT)
        text += [_probe_sentence("Position (top-1)", p["position"]),
                 _probe_sentence("Pixels (mean L2 error per token, normalised input; lower is better)",
                                 p["pixels"], "l2_error", "chance_l2_error"),
                 _probe_sentence("Label from one token (top-1)", p["label"])]
        parts["probes"] = _section("probes", text + list(p["notes"]), figures.get("probes", []), "probes.json",
                                   folder)
    lost = s.get("lost")
    if lost and "lost" not in why:
        text = [f"LOST on the keys {lost['hook']} (k={lost['k']}): the seed (star) is the patch with the fewest "
                "positive key correlations; the box holds the seed's connected part of the mask (cells off it "
                "dimmed). No ground-truth boxes here, so no CorLoc (interp study lost --boxes FILE gives it).",
                lost.get("note") or f"{lost['tied_seeds']} of {lost['n_images']} images have all degrees "
                                     "equal (a tied seed, not a discovery)."]
        parts["lost"] = _section("lost", text, figures.get("lost", []), "lost.json", folder)
    return parts


def one_line_section(key: str, why: str, json_name: Optional[str]) -> str:
    """A section that can say nothing on these data: its heading and one line saying why."""
    files = (f'\n<p class="files">data: <code>{html.escape(json_name)}</code> in the report folder</p>'
             if json_name else "")
    return f'{_heading(key)}\n<p class="caveat">{html.escape(why)}</p>{files}\n</section>'


def table_of_contents(s: Dict, present: List[str]) -> str:
    """The page's table of contents: every section present, numbered as on the console, those reduced to one
    line marked so."""
    why = one_line_reasons(s)
    items = [f'<li><a href="#{html.escape(key)}">{n}. {html.escape(title)}</a>'
             + (' <span class="files">(one line: nothing to show on these data)</span>' if key in why else "")
             + "</li>" for n, key, title in numbered() if key in present]
    return '<nav class="toc"><h2>Contents</h2><ul>' + "".join(items) + "</ul></nav>"


def _telling_norm_figures(s: Dict, figures: Dict[str, List[str]]) -> List[str]:
    """The norms figures that show something: no outlier map when no patch is above the threshold (the
    section's sentence says there are none)."""
    none_above = not s.get("outlier_fraction")
    return [f for f in figures.get("norms", []) if not (none_above and f.startswith("outlier_maps"))]


def _study_sections(s: Dict, figures: Dict[str, List[str]], folder: Path) -> Dict[str, str]:
    """Study key -> its section's HTML, for every study the report ran (a one-line section for one that says
    nothing on these data)."""
    text, why = study_explanations(s), one_line_reasons(s)
    out = {"norms": _section("norms", text["norms"], _telling_norm_figures(s, figures), "norms.json", folder),
           # without ranked neurons the score chart is an empty message: the sentence says it in one line
           "neurons": _section("neurons", text["neurons"], figures.get("neurons", []) if s["neurons"] else [],
                               "neurons.json", folder)}
    if s.get("redundancy"):
        out["redundancy"] = _section("redundancy", text["redundancy"], figures.get("redundancy", []),
                                     "redundancy.json", folder)
    out.update(object_sections(s, figures, folder))
    for key in ("ablate", "registers", "relocate"):
        if key in text:
            out[key] = _section(key, text[key], figures.get(key, []), f"{key}.json", folder)
    for key, reason in why.items():
        present = (s.get(key) is not None or key in (s.get("not_run") or {})
                   if key in ("redundancy", "probes", "lost") else True)
        if present:
            out[key] = one_line_section(key, reason, f"{key}.json" if key not in CAUSAL else None)
    return out


SAE_APPENDIX = ("sae_features", "Appendix: SAE features (sae-features)")


def sae_appendix(s: Dict, figures: Dict[str, List[str]], folder: Optional[Path]) -> Optional[str]:
    """The section of ``interp report --sae DIR`` (after the numbered ones; None without it): which features of
    the SAE are the artifacts and how close they are to the ranked register neurons' write directions."""
    sae = s.get("sae_features")
    if not sae:
        return None
    key, title = SAE_APPENDIX
    text = [f"The sparse autoencoder in {sae['sae']} ({sae['n_features']} features on {sae['hook']}, "
            f"{sae['n_alive']} alive on these images): {sae['message']}."]
    for f in sae["artifact_features"]:
        cos = f["cos_register_neurons_max"]
        text.append(f"Feature {f['feature']} fires on {100 * f['rate_high_norm']:.0f} % of the high-norm tokens and "
                    f"{100 * (f['rate_normal_patch'] or 0):.1f} % of the other patches; its direction has cosine "
                    f"{number_text(f['cos_mean_high_norm'])} with the mean high-norm token"
                    + (f" and up to {number_text(cos)} with the ranked register neurons' write directions." if cos is not None
                       else " (no register neurons ranked to compare with)."))
    parts = [f'<section id="{key}"><h2>{html.escape(title)}</h2>'] + [f"<p>{html.escape(t)}</p>" for t in text]
    parts += [embedded_image(folder, name) for name in figures.get("sae_features", [])]
    parts.append('<p class="files">data: <code>sae_features.json</code> in the report folder</p></section>')
    return "\n".join(parts)


def write_html(path: Path, s: Dict, figures: Dict[str, List[str]]) -> None:
    """The self-contained index page: summary table, then one section per study, each figure (a PNG next to
    ``path``, named in ``figures``) embedded; no link to another file."""
    title = f"interp report: {s['model']}"
    parts = ["<!doctype html>", '<html lang="en"><head><meta charset="utf-8">', f"<title>{html.escape(title)}</title>",
             "<style>body{font-family:sans-serif;max-width:1250px;margin:1.5em auto;padding:0 1em;line-height:1.4}"
             "table{border-collapse:collapse}td,th{border:1px solid #ccc;padding:.25em .6em;text-align:left;"
             "vertical-align:top}th{background:#f3f3f3}img{max-width:100%;border:1px solid #eee;cursor:zoom-in}"
             "img.full{max-width:none;cursor:zoom-out}figure{overflow-x:auto}"
             ".warn{background:#fff4d6;border:1px solid #e0b84c;padding:.6em}.note{background:#eef3ff;"
             "border:1px solid #9ab;padding:.6em}.caveat{background:#fff4d6;border-left:4px solid #e0b84c;"
             "padding:.4em .6em}.files{font-size:90%;color:#555}figure{margin:1em 0}"
             ".toc{background:#f7f7f7;border:1px solid #ddd;padding:.2em 1em;margin:1em 0}.toc h2{margin:.4em 0}"
             ".toc ul{margin:.3em 0 .6em;padding-left:1em;list-style:none}</style>",
             "</head><body>", f"<h1>{html.escape(title)}</h1>"]
    if s["synthetic"]:
        parts.append(f'<p class="warn"><strong>Synthetic model.</strong> {html.escape(s.get("synthetic_note") or SYNTHETIC_NOTE)}</p>')
    if s.get("no_artifacts_note"):
        parts.append(f'<p class="warn"><strong>No artifacts.</strong> {html.escape(s["no_artifacts_note"])}</p>')
    if small_sample(s["n_images"]):
        parts.append(f'<p class="warn"><strong>Small sample.</strong> {s["n_images"]} images: every verdict below '
                     f'rests on fewer than {SMALL_SAMPLE} images and is indicative only (interp report --images DIR '
                     'with more images).</p>')
    parts.append("<table><tbody>")
    for label, value in summary_rows(s):
        parts.append(f"<tr><th>{html.escape(label)}</th><td>{html.escape(value)}</td></tr>")
    parts.append("</tbody></table>")
    sections = _study_sections(s, figures, path.parent)
    parts.append(table_of_contents(s, list(sections)))
    parts += [sections[key] for key, _ in SECTIONS if key in sections]
    appendix = sae_appendix(s, figures, path.parent)
    if appendix is not None:
        parts.append(appendix)
    parts.append(f'<p class="files">Summary: <code>report.json</code>, the figures as PNG files and each study\'s '
                 f'JSON are in the report folder. Written by interp {html.escape(__version__)} in '
                 f'{s["seconds"]:.1f} s.</p></body></html>')
    path.write_text("\n".join(parts), encoding="utf-8")
