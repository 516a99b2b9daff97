"""``interp reassess MODEL [MODEL ...]``: the cross-architecture reassessment's claims as one table, one row
per measured figure (claims 2-5, definitions in ``interp.report.reassessment_cells.ROWS`` and docs/methods.md section
6), one column per model; writes ``reassess.json``, ``reassess.md`` and ``reassess.png`` with ``--out``.

Per-model options take one value per MODEL, in order, ``-`` meaning "none" for that model; a single value
applies to every model (as ``interp compare``; :class:`~interp.commands.groups.ModelSet`):

    interp reassess vit_small_patch14_dinov2 vit_small_patch14_reg4_dinov2 --img-size 224 --images photos/
    interp reassess planted_vit planted_pvt --out out/reassess
"""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Dict, List, Optional, Tuple

from ..errors import UsageError
from ..options import Options, group, option
from ..values import top_k_arg
from ..paths import classifier_source
from .groups import NONE, ModelTable, OutputOptions, checked_per_model, overwrite_option
from .inputs import RunInputs, command


@dataclass(frozen=True, kw_only=True)
class ReassessOptions(Options):
    """The options of ``interp reassess``: those of ``interp compare`` and claim 5's inputs (the classifier
    files, the trained-register pairs, the test-time register's neurons), checked against MODEL when built."""

    table: ModelTable = group(ModelTable)
    classifier: Optional[Tuple[str, ...]] = option(
        None, f"classifier file per model, in order ('{NONE}': the model's own head), whose class logits give claim "
              "5's accuracy (labelled images) or top-1 agreement (interp classifier)", many=True, metavar="FILE|-")
    siblings: Optional[Tuple[str, ...]] = option(
        None, "trained-register model and its no-register sibling, by position in MODEL (1-based) or name, for "
              "claim 5 (default: names that differ by _regN, e.g. vit_small_patch14_reg4_dinov2="
              "vit_small_patch14_dinov2)", many=True, metavar="REG=PLAIN")
    top_k: Optional[int] = option(None, "register neurons the test-time register edits (default: a planted model's "
                                        "own count, else 10)", parse=top_k_arg)
    out: Optional[str] = option(None, "write reassess.json, reassess.md and reassess.png into this folder")
    overwrite: bool = overwrite_option("an existing reassess.json in --out")
    output: OutputOptions = group(OutputOptions)

    def check(self) -> None:
        super().check()
        self.classifiers()
        self.sibling_columns()

    def classifiers(self) -> List[Optional[str]]:
        """One classifier file per model (None: the model's own head)."""
        return checked_per_model(self.classifier, len(self.table.models.models), "--classifier", classifier_source,
                                 shared=False)

    def sibling_columns(self) -> Optional[Dict[str, str]]:
        """``--siblings`` as {trained-register column: its no-register sibling's column} (None: not given)."""
        return parse_siblings(self.siblings, self.table.models.labels())


HELP = {
    "models": "timm model names (or planted_vit, planted_dinov3, planted_pvt, planted_swin)",
    "images": "image directory, list file or image (default: the bundled sample photos); an image-folder layout "
              "DIR/<class>/img gives the label probe",
    "probes": "skip the linear probes (claim 4's rows say n/a)",
}


def register(sub) -> None:
    command(sub, "reassess", ReassessOptions, run, option_help=HELP,
            help="the cross-architecture reassessment: its claims as one table over models",
            description="Measure the reassessment's claims on each model over the same images: artifact share and "
                        "norm ratio (2), redundancy of high-norm vs normal tokens (3), label / position / pixel "
                        "probes (4), attention cleanliness and behaviour with and without registers (5). Per-model "
                        f"options (--weights, --img-size, --classifier) take one value per model in order, '{NONE}' "
                        "for none, or one value for all.")


def parse_siblings(values: Optional[Tuple[str, ...]], labels: List[str]) -> Optional[Dict[str, str]]:
    """``REG=PLAIN`` pairs (each a 1-based position in MODEL or a column name) -> {column: column}."""
    if values is None:
        return None

    def column(text: str) -> str:
        if text.isdigit() and 1 <= int(text) <= len(labels):
            return labels[int(text) - 1]
        if text in labels:
            return text
        raise UsageError(f"argument --siblings: {text!r} is neither a model nor a position 1..{len(labels)}")

    pairs: Dict[str, str] = {}
    for value in values:
        reg, sep, plain = value.partition("=")
        if not sep:
            raise UsageError(f"argument --siblings: {value!r} is not REG=PLAIN (e.g. 2=1)")
        reg, plain = column(reg), column(plain)
        if reg == plain or {reg, plain} & (set(pairs) | set(pairs.values())):  # refused after the loads before
            raise UsageError(f"argument --siblings: {value!r} pairs a model with itself or twice; give each pair "
                             "of two models once")
        pairs[reg] = plain
    return pairs


def run(options: ReassessOptions, inputs: RunInputs) -> int:
    import contextlib

    from .common import check_device, check_top_k, load_models
    from .output import atomic_output_dir, check_output_folder
    from .saving import refuse_existing_file, write_outputs

    o = options
    o.table.detection.resolved()  # an unknown preset is refused before torch
    out = Path(o.out) if o.out else None
    if out is not None:
        check_output_folder(o.out)
        refuse_existing_file(out / "reassess.json", o.overwrite)
    check_device(inputs.device)
    from ..hooks.load import load_skeleton
    from ..models import sample_image_paths
    from ..report.reassessment import ReassessSettings, reassess_models
    from ..report.reassessment_figure import reassessment_figure

    for spec in inputs.models:  # on each model's skeleton, before any model loads
        skeleton = load_skeleton(spec.name, **({"img_size": spec.img_size} if spec.img_size else {}))
        if skeleton is not None:
            check_top_k(o.top_k, skeleton)
    settings = ReassessSettings(**o.table.settings(inputs.stage_lines), top_k=o.top_k)
    staged = atomic_output_dir(out, "reassess.json", replaces=["reassess.md", "reassess.png"],
                               what="reassessment") if out else contextlib.nullcontext()
    with staged as staging:
        models = load_models(inputs, (o,))
        result = reassess_models(models, o.table.source.images or sample_image_paths(), settings,
                                 names=[spec.label for spec in inputs.models], siblings=o.sibling_columns(),
                                 classifiers=o.classifiers())
        print(result.table())
        if staging is not None:
            (Path(staging) / "reassess.md").write_text(result.table(markdown=True))
            write_outputs(result, staging, [("reassess", reassessment_figure(result))])
    return 0
