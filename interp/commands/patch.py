"""``interp patch export|apply|show``: write intervention patch files, check them on a plain model, print them."""
from __future__ import annotations

import copy

from .common import add_batch_size_arg, add_model_args
from .output import atomic_file
from .saving import refuse_existing_file
from .._model_names import PLANTED_NAMES
from ..errors import InterpError, UsageError
from ..values import existing_file, existing_path, nonnegative_float, sae_feature_ids


def register(sub) -> None:
    p = sub.add_parser("patch", help="export / apply / show intervention patch files",
                       description="Intervention patch files (.safetensors) for plain timm models.")
    actions = p.add_subparsers(dest="patch_command", metavar="ACTION", required=True)

    e = actions.add_parser("export", help="write a patch file from an intervention spec (JSON)",
                           description="Build the interventions of SPEC.json for MODEL (calibrating those that "
                                       "need it) and write them as one patch file.")
    add_model_args(e)
    e.add_argument("--interventions", default=None, metavar="SPEC.json", type=existing_file,
                   help="JSON list of {\"kind\": ..., params}; see interp.interventions.spec (required unless "
                        "--sae)")
    e.add_argument("--sae", default=None, metavar="DIR", type=existing_path,
                   help="add the ablation of --features of this trained SAE (interp sae train) after the spec's "
                        "interventions, on the token kind the SAE was trained on")
    e.add_argument("--features", default=None, metavar="F,...|FILE.json", type=sae_feature_ids,
                   help="with --sae: feature ids (12,40) or the sae_features.json of interp study sae-features "
                        "(its artifact subspace)")
    e.add_argument("--sae-mode", default="zero", choices=("zero", "mean"),
                   help="with --sae: remove the features (zero, default) or set them to their mean code (mean)")
    e.add_argument("--out", required=True, help="patch file to write (.safetensors)")
    e.add_argument("--overwrite", action="store_true", help="replace an existing --out file")
    e.add_argument("--calibration-images", default=None, metavar="DIR", type=existing_path,
                   help="images for interventions that need calibration (mean ablation, AttentionBias)")
    e.add_argument("--as-weights", action="store_true",
                   help="write a plain state dict with the edits folded into the weights instead "
                        "(only full-token NeuronAblation)")
    _add_common(e)
    e.set_defaults(func=run_export)

    a = actions.add_parser("apply", help="apply a patch to a plain timm MODEL and compare with the hooked model",
                           description="Load MODEL as a plain timm module, apply the patch, and report the max "
                                       "absolute output difference to the hooked model with the same interventions.")
    add_model_args(a)
    a.add_argument("patch", type=existing_file, help="patch file (.safetensors)")
    a.add_argument("--check-images", default=None, metavar="DIR", type=existing_path,
                   help="images to compare on (default: the bundled sample photos)")
    a.add_argument("--force", action="store_true", help="apply even if the patch was made for another model")
    a.add_argument("--tol", type=nonnegative_float, default=1e-4, help="fail (exit 1) when the difference exceeds this")
    _add_common(a)
    a.set_defaults(func=run_apply)

    s = actions.add_parser("show", help="print a patch file's spec")
    s.add_argument("patch", type=existing_file, help="patch file (.safetensors)")
    s.set_defaults(func=run_show)


def _add_common(parser) -> None:
    add_batch_size_arg(parser)


def _models(args):
    """(plain timm model, HookedViT over an identical copy) for the model arguments."""
    import torch

    from ..hooks.hooked_vit import HookedViT
    from ..models.loading import create_timm_vit
    from .common import check_device, check_model_args

    kwargs = {}
    if args.img_size:
        kwargs["img_size"] = args.img_size
    if args.depth:
        kwargs["depth"] = args.depth
    check_device(args.device)
    torch.manual_seed(args.seed)
    plain = create_timm_vit(args.model, pretrained=args.pretrained, weights=args.weights, device=args.device,
                            seed=args.seed, pos_resample=getattr(args, "pos_resample", "auto"), **kwargs)
    hooked = HookedViT.from_timm(copy.deepcopy(plain), name=args.model)
    check_model_args(args, hooked)
    return plain, hooked


def run_export(args) -> int:
    if args.interventions is None and args.sae is None:
        raise UsageError("interp patch export needs --interventions SPEC.json, or --sae DIR --features F,...")
    if (args.sae is None) != (args.features is None):
        raise UsageError("--sae DIR and --features go together: the SAE and the features of it to ablate")
    refuse_existing_file(args.out, args.overwrite)  # before torch and the model
    from ..interventions import export as patch
    from ..interventions import interventions_from_spec
    from ..models import load_images

    _, model = _models(args)
    images = load_images(args.calibration_images, model) if args.calibration_images else None
    interventions = [] if args.interventions is None else interventions_from_spec(
        args.interventions, model=model, calibration_images=images, batch_size=args.batch_size)
    if args.sae is not None:
        interventions.append(_sae_ablation(args, model))
    what = "edited weights" if args.as_weights else "patch"
    with atomic_file(args.out, what) as tmp:  # a failed write (full disk, ulimit -f) leaves --out as it was
        if args.as_weights:
            patch.export_weights(interventions, model, tmp)
        else:
            patch.save(interventions, tmp, model)
    if args.as_weights:
        print(f"wrote edited weights {args.out} (plain timm loads them: {weights_recipe(args)})")
    else:
        print(f"wrote patch {args.out} ({', '.join(iv.kind for iv in interventions)})")
    return 0


def weights_recipe(args) -> str:
    """How plain timm (or, for a synthetic planted model, which is no timm name, interp's builder) makes the
    module that ``--as-weights`` weights load into: the same name and the --depth/--img-size given."""

    if args.model in PLANTED_NAMES:
        return (f"model = interp.models.{args.model}(); model.load_state_dict(safetensors.torch.load_file(FILE)) "
                f"({args.model} is interp's synthetic model, not a timm name)")
    extra = "".join(f", {k}={v!r}" for k, v in (("depth", getattr(args, "depth", None)),
                                                 ("img_size", getattr(args, "img_size", None))) if v)
    return (f"model = timm.create_model({args.model!r}{extra}); "
            "model.load_state_dict(safetensors.torch.load_file(FILE))")


def _sae_ablation(args, model):
    """The SAEFeatureAblation of ``--sae DIR --features ...`` on ``model`` (an SAE of another model is refused)."""
    from ..interventions import SAEFeatureAblation
    from ..sae.model import load

    sae = load(args.sae, model=model)
    try:
        return SAEFeatureAblation(sae, list(args.features), mode=args.sae_mode,
                                  prefix={"cls_index": model.layout.cls_index, "n_registers": model.layout.n_registers})
    except ValueError as e:
        raise InterpError(f"--features: {e}") from None


def run_apply(args) -> int:
    import torch

    from ..interventions import export as patch
    from ..models import load_images, sample_image_paths

    plain, hooked = _models(args)
    patched = patch.apply(plain, args.patch, force=args.force)
    interventions = patch.load(args.patch)
    images = load_images(args.check_images or sample_image_paths(), hooked)
    worst = 0.0
    with torch.no_grad():
        for batch in images.split(args.batch_size):
            batch = batch.to(args.device)
            expected = hooked.run_with_interventions(batch, interventions)
            worst = max(worst, float((patched(batch) - expected).abs().max()))
    print(f"applied {args.patch} to plain {args.model}: {len(images)} images, "
          f"max |plain - hooked| = {worst:.3e} (tolerance {args.tol:g})")
    return 0 if worst <= args.tol else 1


def run_show(args) -> int:
    from ..interventions import export as patch

    print(patch.describe(args.patch))
    return 0
