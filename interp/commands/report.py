"""``interp report [MODEL]``: run the artifact battery (norms, register neurons, ablation, test-time
register, relocation) and write JSON, PNGs and an ``index.html`` into one folder.

Without MODEL it runs the synthetic ``planted_vit`` on the bundled sample photos: a demo whose ground truth
is known by construction.
"""
from __future__ import annotations

from pathlib import Path

from .common import (add_batch_size_arg, add_classifier_arg, add_model_args, add_output_args, add_overwrite_arg,
                     add_preprocess_args, add_strict_arg, add_detection_args, model_from_args, preprocess_arg)
from ..values import threshold_value
from .saving import REPORT_MARKER, prepare_report_dir
from ..errors import UsageError
from .output import atomic_output_dir
from ..studies.sae.configs import SaeFeaturesConfig, sae_hook
from ..values import existing_path, nonnegative_int, positive_int


def register(sub) -> None:
    p = sub.add_parser(
        "report", help="run the artifact studies end to end and write an HTML report",
        description="Run norms, redundancy, probes, LOST and register neurons (one unedited pass), then ablation "
                    "-> test-time register -> relocation on MODEL over images and write each study's JSON, the "
                    "figures, report.json and index.html. Without MODEL: the synthetic planted_vit (planted by "
                    "construction, not a trained network) on the bundled sample photos (16).")
    add_model_args(p, model_optional=True)
    p.add_argument("--images", default=None, type=existing_path,
                   help="image directory, list file or image (default: the 16 bundled photos)")
    p.add_argument("--out", default="report", help="output directory (default: report/)")
    add_detection_args(p)
    p.add_argument("--highest-layer", type=int, default=None,
                   help="last block scored for register neurons (default: the detection block)")
    p.add_argument("--top-k", type=positive_int, default=None,
                   help="register neurons kept (default: 10; the planted count for planted_vit)")
    p.add_argument("--controls", type=nonnegative_int, default=5,
                   help="random control neuron sets in the ablation (default 5)")
    p.add_argument("--sae", default=None, type=existing_path, metavar="DIR",
                   help="a trained SAE's folder (interp sae train): an appendix with its artifact features, "
                        "compared with the ranked register neurons (docs/sae.md)")
    add_classifier_arg(p)
    add_preprocess_args(p)
    add_batch_size_arg(p)
    add_strict_arg(p)
    add_overwrite_arg(p, "a report written before into --out (its own files are removed first; a non-empty "
                         "folder that holds no report.json is never touched)")
    add_output_args(p)
    p.set_defaults(func=run)


def check_top_k(top_k, model) -> None:
    """``--top-k`` within what the model has: the random controls of the ablation draw as many other neurons from
    the same blocks, so at most half of one block's MLP width (before: 10**8 ended in a traceback after the first
    studies)."""

    if top_k is None:
        return
    width = min(model.family.d_mlp(layer) for layer in range(model.n_layers))
    if top_k > width // 2:
        raise UsageError(f"--top-k {top_k} is more than half a block's {width} MLP neurons of {getattr(model, 'model_name', 'the model')}; "
                         f"the controls draw as many other neurons from the same blocks: give --top-k <= {width // 2}")


def run(args) -> int:

    threshold = threshold_value(args.threshold)  # fails before the model
    preprocess = preprocess_arg(args)
    if args.model is None:
        if args.weights:
            raise UsageError("--weights needs a MODEL name (the default planted_vit is built by construction)")
        args.model = "planted_vit"
    if args.sae is not None:

        SaeFeaturesConfig(sae=args.sae)
        sae_hook(args.sae)  # a folder without a readable sae.json fails here, before the model
    old_files = prepare_report_dir(args.out, args.overwrite)  # before torch and the model
    from ..report import SYNTHETIC_NOTE, ReportOptions, run_report

    with atomic_output_dir(args.out, REPORT_MARKER, replaces=old_files, what="report") as staging:
        model = model_from_args(args)
        check_top_k(args.top_k, model)
        if args.sae is not None:  # its files checked whole (tensors, model) before the first study, not after
            from ..sae import load as load_sae

            load_sae(args.sae, model=model)
        options = ReportOptions(threshold=threshold, detect_layer=args.detect_layer, preset=args.preset,
                                highest_layer=args.highest_layer, top_k=args.top_k, n_controls=args.controls,
                                seed=args.seed, batch_size=args.batch_size, progress_bars=args.progress,
                                classifier=args.classifier, sae=args.sae)
        # progress_requested drives the stage lines; the bars follow the terminal check (args.progress)
        summary = run_report(model, images=args.images, out_dir=staging, options=options,
                             progress=args.progress_requested, strict=args.strict, preprocess=preprocess)
    index = Path(args.out) / "index.html"
    if summary["synthetic"]:
        if not args.progress_requested:  # with the stage lines it was shown once, when the run began
            print(f"note: {summary.get('synthetic_note') or SYNTHETIC_NOTE}")
        p = summary["planted"]
        print(f"planted block {p['layer']} recovered: {'yes' if p['layer_recovered'] else 'no'}; planted neurons "
              f"recovered: {len(p['neurons_recovered'])} of {len(p['neurons'])}")
    found = ("artifacts (high-norm tokens) found" if summary["artifacts_found"] else "no artifacts (no high-norm "
             "tokens) found" if summary["threshold"] is None else f"no artifacts found: {summary['detection_reason']}")
    small = " (a small sample: every verdict is indicative only)" if summary.get("small_sample") else ""
    print(f"{summary['model']}: {found} ({summary['n_images']} images{small}, {summary['seconds']:.1f} s)")
    if (summary.get("behaviour") or {}).get("note"):
        print(f"note: {summary['behaviour']['note']}")
    print(f"report: {index.resolve()}")
    return 0
