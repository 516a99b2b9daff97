"""``interp patch export|apply|show``: write intervention patch files, check them on a plain model, print them."""
from __future__ import annotations

import copy
from dataclasses import dataclass
from typing import Optional, Tuple

from .._model_names import PLANTED_NAMES
from ..errors import InterpError, UsageError
from ..options import Options, group, option
from ..values import nonnegative_float, sae_feature_ids
from ..paths import existing_file, existing_path
from .common import check_model_args
from .groups import ModelOptions, ModelSpec, SeedOption, batch_size_option
from .inputs import RunInputs, command
from .output import atomic_file
from .saving import refuse_existing_file


@dataclass(frozen=True, kw_only=True)
class ExportOptions(Options):
    """The options of ``interp patch export``."""

    model: ModelOptions = group(ModelOptions)
    seed: SeedOption = group(SeedOption)
    interventions: Optional[str] = option(
        None, "JSON list of {\"kind\": ..., params}; see interp.interventions.spec (required unless --sae)",
        metavar="SPEC.json", parse=existing_file)
    sae: Optional[str] = option(None, "add the ablation of --features of this trained SAE (interp sae train) after "
                                      "the spec's interventions, on the token kind the SAE was trained on",
                                metavar="DIR", parse=existing_path)
    features: Optional[Tuple[int, ...]] = option(
        None, "with --sae: feature ids (12,40) or the sae_features.json of interp study sae-features (its artifact "
              "subspace)", metavar="F,...|FILE.json", parse=sae_feature_ids)
    sae_mode: str = option("zero", "with --sae: remove the features (zero, default) or set them to their mean code "
                                   "(mean)", choices=("zero", "mean"))
    out: str = option(None, "patch file to write (.safetensors)", required=True)
    overwrite: bool = option(False, "replace an existing --out file")
    calibration_images: Optional[str] = option(
        None, "images for interventions that need calibration (mean ablation, AttentionBias)", metavar="DIR",
        parse=existing_path)
    as_weights: bool = option(False, "write a plain state dict with the edits folded into the weights instead "
                                     "(only full-token NeuronAblation)")
    batch_size: int = batch_size_option(16)

    def check(self) -> None:
        super().check()
        if self.interventions is None and self.sae is None:
            raise UsageError("interp patch export needs --interventions SPEC.json, or --sae DIR --features F,...")
        if (self.sae is None) != (self.features is None):
            raise UsageError("--sae DIR and --features go together: the SAE and the features of it to ablate")


@dataclass(frozen=True, kw_only=True)
class ApplyOptions(Options):
    """The options of ``interp patch apply``."""

    model: ModelOptions = group(ModelOptions)
    seed: SeedOption = group(SeedOption)
    patch: str = option(None, "patch file (.safetensors)", positional=True, required=True, parse=existing_file)
    check_images: Optional[str] = option(None, "images to compare on (default: the bundled sample photos)",
                                         metavar="DIR", parse=existing_path)
    force: bool = option(False, "apply even if the patch was made for another model")
    tol: float = option(1e-4, "fail (exit 1) when the difference exceeds this", parse=nonnegative_float)
    batch_size: int = batch_size_option(16)


@dataclass(frozen=True, kw_only=True)
class ShowOptions(Options):
    patch: str = option(None, "patch file (.safetensors)", positional=True, required=True, parse=existing_file)


def register(sub) -> None:
    p = sub.add_parser("patch", help="export / apply / show intervention patch files",
                       description="Intervention patch files (.safetensors) for plain timm models.")
    actions = p.add_subparsers(dest="patch_command", metavar="ACTION", required=True)
    command(actions, "export", ExportOptions, run_export, help="write a patch file from an intervention spec (JSON)",
            description="Build the interventions of SPEC.json for MODEL (calibrating those that need it) and write "
                        "them as one patch file.")
    command(actions, "apply", ApplyOptions, run_apply,
            help="apply a patch to a plain timm MODEL and compare with the hooked model",
            description="Load MODEL as a plain timm module, apply the patch, and report the max absolute output "
                        "difference to the hooked model with the same interventions.")
    command(actions, "show", ShowOptions, run_show, help="print a patch file's spec")


def _models(options: Options, inputs: RunInputs):
    """(plain timm model, HookedViT over an identical copy) for the run's model."""
    import torch

    from ..hooks.hooked_vit import HookedViT
    from ..hooks.load import load_timm_module
    from .common import check_before_load, check_device, timm_kwargs

    spec = inputs.model
    check_device(inputs.device)
    checked = check_before_load(spec, (options,))
    torch.manual_seed(inputs.seed)
    plain = load_timm_module(spec.name, pretrained=spec.pretrained, weights=spec.weights, device=inputs.device,
                             seed=inputs.seed, pos_resample=spec.pos_resample, **timm_kwargs(spec))
    hooked = HookedViT.from_timm(copy.deepcopy(plain), name=spec.name)
    if not checked:  # as load_model: what the skeleton could not stand for
        check_model_args(hooked, spec, (options,))
    return plain, hooked


def run_export(options: ExportOptions, inputs: RunInputs) -> int:
    refuse_existing_file(options.out, options.overwrite)  # before torch and the model
    from ..interventions import export as patch
    from ..interventions import interventions_from_spec
    from ..models import load_images

    _, model = _models(options, inputs)
    images = load_images(options.calibration_images, model) if options.calibration_images else None
    interventions = [] if options.interventions is None else interventions_from_spec(
        options.interventions, model=model, calibration_images=images, batch_size=options.batch_size)
    if options.sae is not None:
        interventions.append(_sae_ablation(options, model))
    what = "edited weights" if options.as_weights else "patch"
    with atomic_file(options.out, what) as tmp:  # a failed write (full disk, ulimit -f) leaves --out as it was
        if options.as_weights:
            patch.export_weights(interventions, model, tmp)
        else:
            patch.save(interventions, tmp, model)
    if options.as_weights:
        print(f"wrote edited weights {options.out} (plain timm loads them: {weights_recipe(inputs.model)})")
    else:
        print(f"wrote patch {options.out} ({', '.join(iv.kind for iv in interventions)})")
    return 0


def weights_recipe(spec: ModelSpec) -> str:
    """How plain timm (or, for a synthetic planted model, which is no timm name, interp's builder) makes the
    module that ``--as-weights`` weights load into: the same name and the --depth/--img-size given."""

    if spec.name in PLANTED_NAMES:
        return (f"model = interp.models.{spec.name}(); model.load_state_dict(safetensors.torch.load_file(FILE)) "
                f"({spec.name} is interp's synthetic model, not a timm name)")
    extra = "".join(f", {k}={v!r}" for k, v in (("depth", spec.depth), ("img_size", spec.img_size)) if v)
    return (f"model = timm.create_model({spec.name!r}{extra}); "
            "model.load_state_dict(safetensors.torch.load_file(FILE))")


def _sae_ablation(options: ExportOptions, model):
    """The SAEFeatureAblation of ``--sae DIR --features ...`` on ``model`` (an SAE of another model is refused)."""
    from ..interventions import SAEFeatureAblation
    from ..sae.model import load

    sae = load(options.sae, model=model)
    try:
        return SAEFeatureAblation(sae, list(options.features), mode=options.sae_mode,
                                  prefix={"cls_index": model.layout.cls_index, "n_registers": model.layout.n_registers})
    except ValueError as e:
        raise InterpError(f"--features: {e}") from None


def run_apply(options: ApplyOptions, inputs: RunInputs) -> int:
    import torch

    from ..interventions import export as patch
    from ..models import load_images, sample_image_paths

    plain, hooked = _models(options, inputs)
    patched = patch.apply(plain, options.patch, force=options.force)
    interventions = patch.load(options.patch)
    images = load_images(options.check_images or sample_image_paths(), hooked)
    worst = 0.0
    with torch.no_grad():
        for batch in images.split(options.batch_size):
            batch = batch.to(inputs.device)
            expected = hooked.run_with_interventions(batch, interventions)
            worst = max(worst, float((patched(batch) - expected).abs().max()))
    print(f"applied {options.patch} to plain {inputs.model.name}: {len(images)} images, "
          f"max |plain - hooked| = {worst:.3e} (tolerance {options.tol:g})")
    return 0 if worst <= options.tol else 1


def run_show(options: ShowOptions, inputs: RunInputs) -> int:
    from ..formats.patch_spec import describe  # torch-free: no model, no torch

    print(describe(options.patch))
    return 0
