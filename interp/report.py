"""``interp report``: the whole artifact battery on one model, written as JSON, PNGs and one HTML page.

Stages (SCIENCE.md sections 1-2): high-norm tokens (norms) -> register neurons -> ablation against random
controls -> test-time register -> relocation onto a smiley. The causal stages use the neurons the neuron
study ranked; when it ranks none (no high-norm tokens), they are skipped with a note, never invented.

>>> summary = run_report()                      # the planted synthetic model on the bundled photos
>>> summary["planted"]["all_neurons_recovered"]
True
>>> run_report(interp.load("vit_small_patch14_reg4_dinov2"), images="photos/", out_dir="report_dinov2")
"""
from __future__ import annotations

import html
import json
import sys
import time
from pathlib import Path
from typing import Dict, List, Optional, Tuple, Union

import numpy as np
import torch

from .studies.outliers import ThresholdSpec
from .studies.result import jsonable
from .studies.source import ImagesSpec, LiveSource, open_source

N_STAGES = 5
DISPLAY_LIMIT = 8  # images un-normalised for the map figures (the figures draw at most this many)

SYNTHETIC_NOTE = ("planted_vit is a synthetic model: its register neurons were planted by construction in "
                  "random weights; it is not a trained network. Its findings show that the studies recover a "
                  "known ground truth, not how a real ViT behaves.")


# ----------------------------------------------------------------------------------------- inputs
def display_images(source: LiveSource, limit: int = DISPLAY_LIMIT) -> torch.Tensor:
    """The first ``limit`` images of a live source as the model saw them (resized, cropped), in 0..1:
    Tensor[n, 3, H, W] for the overlay figures (the model's normalisation undone)."""
    from .models.preprocessing import data_config

    cfg = data_config(source.model)
    mean = torch.tensor(cfg["mean"], dtype=torch.float32).view(1, 3, 1, 1)
    std = torch.tensor(cfg["std"], dtype=torch.float32).view(1, 3, 1, 1)
    _, x = next(source.image_batches(limit))
    return (x.detach().float().cpu() * std + mean).clamp(0, 1)


def planted_comparison(model, source: LiveSource, norms, neurons) -> Dict:
    """What the studies found against ``model.planted``: layer, neurons and outlier positions recovered."""
    from .studies.relocate import iou

    truth = model.planted
    planted = {(truth.layer, int(n)) for n in truth.neurons}
    found = [(int(e["layer"]), int(e["neuron"])) for e in neurons.neurons]
    emergence = norms.emergence or {}
    masks = [truth.artifact_mask(model.timm_model, x).cpu() for _, x in source.image_batches()]
    expected = torch.cat(masks) if masks else torch.zeros(0, *norms.grid, dtype=torch.bool)
    ious = [iou(a, b) for a, b in zip(norms.outlier_map_tensor(), expected)]
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
        "outlier_iou_mean": float(np.mean(ious)) if ious else None,
        "outlier_iou_per_image": ious,
    }


# ----------------------------------------------------------------------------------------- summary
def _condition_summary(ablation) -> Dict:
    return {metric: values for metric, values in ablation.summary.items() if values.get("baseline") is not None}


def build_summary(model, source, norms, neurons, ablation, register, relocation, skipped: Optional[str]) -> Dict:
    """The report.json summary of the stage results."""
    emergence = norms.emergence
    summary = {
        "model": norms.model,
        "fingerprint": norms.fingerprint,
        "synthetic": model.planted is not None,
        "synthetic_note": SYNTHETIC_NOTE if model.planted is not None else None,
        "n_images": len(source),
        "image_ids": list(source.ids),
        "artifacts_found": norms.artifacts_found,
        "detect_layer": norms.detect_layer,
        "threshold": norms.threshold,
        "threshold_method": norms.threshold_method,
        "outlier_fraction": norms.outlier_fraction,
        "outlier_counts": norms.outlier_counts,
        "emergence": None if not emergence else {"layer": emergence["layer"], "component": emergence["component"]},
        "neurons": neurons.neurons,
        "neurons_message": neurons.message or None,
        "highest_layer": neurons.highest_layer,
        "top_k": neurons.top_k,
        "skipped": skipped,
        "ablation": None,
        "test_time_register": None,
        "relocation": None,
    }
    if ablation is not None:
        summary["ablation"] = {"mode": ablation.mode, "n_controls": len(ablation.controls),
                               "effects": _condition_summary(ablation)}
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
        }
    if relocation is not None:
        summary["relocation"] = {"mean_iou": relocation.mean_iou, "mean_iou_active": relocation.mean_iou_active,
                                 "cls_attention_argmax_on_target": relocation.cls_attention_argmax_on_target}
    return summary


# ----------------------------------------------------------------------------------------- html
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


def summary_rows(s: Dict) -> List[Tuple[str, str]]:
    """(label, value) rows of the summary table at the top of the page."""
    rows = [("model", f"{s['model']} (weights {s['fingerprint']})"),
            ("synthetic", "yes: planted by construction, not a trained network" if s["synthetic"] else "no"),
            ("images", str(s["n_images"])),
            ("high-norm tokens found", _num(s["artifacts_found"])),
            ("threshold", f"{_num(s['threshold'])} ({s['threshold_method']}) at block {s['detect_layer']}"),
            ("outlier fraction", f"{100 * s['outlier_fraction']:.2f} % of patch tokens")]
    e = s["emergence"]
    rows.append(("emergence", "none" if not e else f"block {e['layer']}, {e['component']} step"))
    rows.append(("register neurons", _neuron_list(s["neurons"]) if s["neurons"] else
                 (s["neurons_message"] or "none")))
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
        rows.append(("skipped", s["skipped"]))
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
    if s["neurons"]:
        out["neurons"] = [
            f"Register-neuron score = mean |MLP activation| on the outlier patches, over the images that have "
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
    parts.append("<table><tbody>")
    for label, value in summary_rows(s):
        parts.append(f"<tr><th>{html.escape(label)}</th><td>{html.escape(value)}</td></tr>")
    parts.append("</tbody></table>")
    text = study_explanations(s)
    parts.append(_section("1. High-norm tokens (norms)", text["norms"], figures.get("norms", []), "norms.json"))
    parts.append(_section("2. Register neurons", text["neurons"], figures.get("neurons", []), "neurons.json"))
    if s["skipped"]:
        parts.append(f'<section><h2>3-5. Ablation, test-time register, relocation</h2>'
                     f'<p class="note">Skipped: {html.escape(s["skipped"])}</p></section>')
    else:
        parts.append(_section("3. Ablation against random controls", text.get("ablate", []),
                              figures.get("ablate", []), "ablate.json"))
        parts.append(_section("4. Test-time register", text.get("registers", []), figures.get("registers", []),
                              "registers.json"))
        parts.append(_section("5. Relocation onto a smiley", text.get("relocate", []), figures.get("relocate", []),
                              "relocate.json"))
    from . import __version__

    parts.append(f'<p class="files">Summary: <a href="report.json">report.json</a>. Written by interp '
                 f'{html.escape(__version__)} in {s["seconds"]:.1f} s.</p></body></html>')
    path.write_text("\n".join(parts), encoding="utf-8")


# ----------------------------------------------------------------------------------------- run
def _say(progress: bool, text: str) -> None:
    if progress:
        print(text, file=sys.stderr, flush=True)


def run_report(
    model=None,
    images: Optional[ImagesSpec] = None,
    out_dir: Union[str, Path] = "report",
    *,
    threshold: ThresholdSpec = "auto",
    detect_layer: Optional[int] = None,
    highest_layer: Optional[int] = None,
    top_k: Optional[int] = None,
    n_controls: int = 5,
    seed: int = 0,
    batch_size: int = 16,
    progress: bool = True,
) -> Dict:
    """Run norms -> neurons -> ablation -> test-time register -> relocation and write the report.

    Args:
        model: a HookedViT or a model name for ``interp.load``; None: the synthetic ``planted_vit``.
        images: what ``open_source`` takes (directory, list file, paths, or a preprocessed Tensor); None: the
            bundled sample photos.
        out_dir: directory for ``index.html``, ``report.json``, each study's JSON and the PNGs.
        threshold, detect_layer: the outlier threshold and detection block for every stage.
        highest_layer: last block scored for register neurons (default: the detection block).
        top_k: neurons kept (default: the number of planted neurons for the planted model, else 10).
        n_controls, seed: random control neuron sets of the ablation.
        progress: one line per stage on stderr, and the studies' progress bars.

    Returns:
        The report.json summary (a dict), with ``"planted"`` holding the ground-truth comparison for a
        planted model and ``"files"`` the written files (relative to ``out_dir``).
    """
    from .api import load
    from .models import sample_image_paths
    from .plots.artifacts import study_figures
    from .studies.ablate import ablation_study
    from .studies.neurons import neurons_study
    from .studies.norms import norms_study
    from .studies.registers import register_study
    from .studies.relocate import relocation_study

    started = time.monotonic()
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    if model is None or isinstance(model, str):
        model = load(model or "planted_vit")
    truth = getattr(model, "planted", None)
    if images is None:
        images = sample_image_paths()
    if truth is not None:
        _say(progress, f"interp report: note: {SYNTHETIC_NOTE}")
    if top_k is None:
        top_k = len(truth.neurons) if truth is not None else 10
    source = open_source(model=model, images=images, batch_size=batch_size)
    common = dict(threshold=threshold, batch_size=batch_size, progress=progress)

    _say(progress, f"interp report [1/{N_STAGES}] norms: per-block patch norms of {model.model_name} "
                   f"over {len(source)} images")
    norms = norms_study(source, detect_layer=detect_layer, **common)
    detect = norms.detect_layer
    highest = detect if highest_layer is None else highest_layer
    _say(progress, f"interp report [2/{N_STAGES}] neurons: ranking register neurons in blocks <= {highest}")
    neurons = neurons_study(source, detect_layer=detect, highest_layer=highest, top_k=top_k, seed=seed, **common)
    ablation = register = relocation = None
    skipped = None
    if neurons.neurons:
        chosen = neurons.neuron_dict()
        _say(progress, f"interp report [3/{N_STAGES}] ablate: {len(neurons.neurons)} neurons vs {n_controls} "
                       "random controls")
        ablation = ablation_study(source, chosen, n_controls=n_controls, seed=seed, detect_layer=detect, **common)
        _say(progress, f"interp report [4/{N_STAGES}] registers: test-time register with these neurons")
        register = register_study(source, chosen, detect_layer=detect, **common)
        _say(progress, f"interp report [5/{N_STAGES}] relocate: moving the high norm onto a smiley")
        relocation = relocation_study(source, chosen, detect_layer=detect, **common)
    else:
        skipped = (f"no register neurons to test ({neurons.message or 'nothing ranked'}); the ablation, "
                   "test-time register and relocation studies need neurons and were not run")
        _say(progress, f"interp report [3-5/{N_STAGES}] skipped: {skipped}")

    pictures = display_images(source)
    results = [r for r in (norms, neurons, ablation, register, relocation) if r is not None]
    figures: Dict[str, List[str]] = {}
    written: List[str] = []
    for result in results:
        result.to_json(out / f"{result.study}.json")
        written.append(f"{result.study}.json")
        for name, fig in study_figures(result, pictures):
            fig.savefig(out / f"{name}.png", dpi=110, bbox_inches="tight")
            figures.setdefault(result.study, []).append(f"{name}.png")

    summary = build_summary(model, source, norms, neurons, ablation, register, relocation, skipped)
    summary["planted"] = planted_comparison(model, source, norms, neurons) if truth is not None else None
    summary["files"] = {"index": "index.html", "results": written,
                        "figures": [f for names in figures.values() for f in names]}
    summary["seconds"] = round(time.monotonic() - started, 2)
    (out / "report.json").write_text(json.dumps(jsonable(summary), indent=1))
    write_html(out / "index.html", summary, figures)
    return summary
