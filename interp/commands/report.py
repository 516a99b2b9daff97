"""``interp report [MODEL]``: run the artifact battery (norms, register neurons, ablation, test-time
register, relocation) and write JSON, PNGs and an ``index.html`` into one folder.

Without MODEL it runs the synthetic ``planted_vit`` on the bundled sample photos: a demo whose ground truth
is known by construction.
"""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Optional

from ..detection.spec import DetectionSpec
from ..options import Options, group, option
from ..studies.core.options import ClassifierFile
from ..studies.sae.configs import SaeFeaturesConfig, sae_hook
from ..values import control_count, top_k_arg
from ..paths import existing_path
from .common import check_top_k, load_model
from .groups import (DemoModelOptions, Images, OutputOptions, PreprocessOptions, SeedOption, StrictOption,
                     batch_size_option, overwrite_option)
from .inputs import RunInputs, command
from .output import atomic_output_dir
from .saving import REPORT_MARKER, prepare_report_dir

PLANTED = "planted_vit"  # MODEL when none is given: the synthetic demo


@dataclass(frozen=True, kw_only=True)
class ReportOptions(Options):
    """The options of ``interp report``."""

    model: DemoModelOptions = group(DemoModelOptions)
    seed: SeedOption = group(SeedOption)
    source: Images = group(Images)
    out: str = option("report", "output directory (default: report/)")
    detection: DetectionSpec = group(DetectionSpec)
    classifier: ClassifierFile = group(ClassifierFile)
    highest_layer: Optional[int] = option(None, "last block scored for register neurons (default: the detection "
                                                "block)")
    top_k: Optional[int] = option(None, "register neurons kept (default: 10; the planted count for planted_vit)",
                                  parse=top_k_arg)
    controls: int = option(5, "random control neuron sets in the ablation (default 5)", parse=control_count)
    sae: Optional[str] = option(None, "a trained SAE's folder (interp sae train): an appendix with its artifact "
                                      "features, compared with the ranked register neurons (docs/sae.md)",
                                parse=existing_path, metavar="DIR")
    preprocessing: PreprocessOptions = group(PreprocessOptions)
    strict: StrictOption = group(StrictOption)
    batch_size: int = batch_size_option(16)
    overwrite: bool = overwrite_option("a report written before into --out (its own files are removed first; a "
                                       "non-empty folder that holds no report.json is never touched)")
    output: OutputOptions = group(OutputOptions)


def register(sub) -> None:
    command(sub, "report", ReportOptions, run,
            option_help={"images": "image directory, list file or image (default: the 16 bundled photos)"},
            help="run the artifact studies end to end and write an HTML report",
            description="Run norms, redundancy, probes, LOST and register neurons (one unedited pass), then ablation "
                        "-> test-time register -> relocation on MODEL over images and write each study's JSON, the "
                        "figures, report.json and index.html. Without MODEL: the synthetic planted_vit (planted by "
                        "construction, not a trained network) on the bundled sample photos (16).")


def run(options: ReportOptions, inputs: RunInputs) -> int:
    o = options
    spec = inputs.model.named(PLANTED)
    if o.sae is not None:
        SaeFeaturesConfig(sae=o.sae)
        sae_hook(o.sae)  # a folder without a readable sae.json fails here, before the model
    old_files = prepare_report_dir(o.out, o.overwrite)  # before torch and the model
    from ..report import SYNTHETIC_NOTE, ReportOptions as StudyOptions, run_report

    with atomic_output_dir(o.out, REPORT_MARKER, replaces=old_files, what="report") as staging:
        model = load_model(inputs, (o,), spec=spec)
        check_top_k(o.top_k, model, "the controls draw as many other neurons from the same blocks")
        if o.sae is not None:  # its files checked whole (tensors, model) before the first study, not after
            from ..sae import load as load_sae

            load_sae(o.sae, model=model)
        # stage_lines drives the stage lines and the bars (drawn on a terminal, else lines in a long run)
        studies = StudyOptions(detection=o.detection, highest_layer=o.highest_layer, top_k=o.top_k,
                               n_controls=o.controls, seed=o.seed.seed, batch_size=o.batch_size,
                               classifier=o.classifier.classifier, sae=o.sae, progress=inputs.stage_lines,
                               strict=o.strict.strict, preprocess=o.preprocessing.preprocess())
        summary = run_report(model, images=o.source.images, out_dir=staging, options=studies)
    index = Path(o.out) / "index.html"
    if summary["synthetic"]:
        if not inputs.stage_lines:  # with the stage lines it was shown once, when the run began
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
