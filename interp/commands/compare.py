"""``interp compare MODEL [MODEL ...] --images DIR``: the norms battery, the redundancy measure and the linear
probes on several models, one table (its columns: ``interp.report.compare.COLUMN_DOCS``). The high-norm tokens
of every model follow one detection rule (``--threshold``, ``--preset``, ``--detect-layer``: a ``DetectionSpec``).

Per-model options take one value per MODEL, in order, ``-`` meaning "none" for that model; a single value
applies to every model (:class:`~interp.commands.groups.ModelSet`):

    interp compare vit_small_patch16_224 vit_small_patch16_224 --weights trained.pth - --no-pretrained
    interp compare vit_small_patch14_reg4_dinov2 vit_base_patch16_224 --img-size 518 -
"""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Optional

from ..options import Options, group, option
from .groups import NONE, ModelTable, OutputOptions, overwrite_option
from .inputs import RunInputs, command
from .saving import write_outputs


@dataclass(frozen=True, kw_only=True)
class CompareOptions(Options):
    """The options of ``interp compare``."""

    table: ModelTable = group(ModelTable)
    out: Optional[str] = option(None, "write compare.json into this folder")
    overwrite: bool = overwrite_option("an existing compare.json in --out")
    output: OutputOptions = group(OutputOptions)


def register(sub) -> None:
    command(sub, "compare", CompareOptions, run, help="compare high-norm artifacts across models (one table)",
            description="Run the norms study on each model over the same images; print one table. Per-model options "
                        f"(--weights, --img-size) take one value per model in order, '{NONE}' for none, or one "
                        "value for all.")


def run(options: CompareOptions, inputs: RunInputs) -> int:
    import contextlib

    from .common import check_device, load_models
    from .output import atomic_output_dir, check_output_folder

    o = options
    o.table.detection.resolved()  # an unknown preset is refused before torch and any model
    if o.out:
        from .saving import refuse_existing_file

        check_output_folder(o.out)
        refuse_existing_file(Path(o.out) / "compare.json", o.overwrite)
    check_device(inputs.device)
    from ..models import sample_image_paths
    from ..report.compare import CompareSettings, compare_models

    settings = CompareSettings(**o.table.settings(inputs.stage_lines))
    staged = atomic_output_dir(o.out, "compare.json", what="comparison") if o.out else contextlib.nullcontext()
    with staged as staging:
        models = load_models(inputs, (o,))
        result = compare_models(models, o.table.source.images or sample_image_paths(), settings,
                                names=[spec.label for spec in inputs.models])
        print(result.table())
        if staging is not None:
            write_outputs(result, staging)
    return 0
