"""``interp study patch-score|pib|masking|selective-cls``: the lazy-aggregation studies (docs/methods.md section 3).

    interp study patch-score MODEL --images DIR [--boxes FILE | --masks DIR] --out OUT [--cell-rule majority]
        [--normalise minmax]
    interp study pib MODEL --images DIR --boxes FILE --out OUT
    interp study masking MODEL --images DIR --out OUT [--fractions 0 0.1 ... | --steps 7] [--fill zero|mean|blur]
        [--orders top bottom random] [--threshold p98] [--detect-layer N] [--preset NAME]
    interp study selective-cls MODEL --images DIR --boxes FILE --out OUT [--k 1 7 98]

Each writes ``<study>.json`` and PNG figures into ``--out``.
"""
from __future__ import annotations

import argparse

from .common import (add_classifier_arg, add_detection_args, add_study_args, model_from_args,
                     print_behaviour, source_from_args, threshold_value)
from .saving import save_study
from ..errors import UsageError
from ..values import (existing_file, existing_path, fraction, masked_fraction, nonnegative_int, open_fraction,
                     positive_float, positive_int)


def _add_selective_params(p: argparse.ArgumentParser) -> None:
    p.add_argument("--sigma", type=positive_float, default=None, help="SelectiveCLS low-pass width (default sqrt(d))")
    p.add_argument("--score", choices=("code", "paper", "contrib"), default="code",
                   help="SelectiveCLS stability score: code = x/|x_low - x| (LaSt reference code, default), "
                        "paper = x_low/(|x_low - x| + eps), contrib = x_low/(x_low - x + eps)")
    p.add_argument("--fft", choices=("shift", "rfft"), default="shift",
                   help="SelectiveCLS FFT variant: shift (fftshift, the reference) or rfft")
    p.add_argument("--eps", type=positive_float, default=1e-6, help="SelectiveCLS epsilon")


def _add_score_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--reference", choices=("cls", "pooled", "selective"), default="cls",
                   help="global vector g of the Patch Score: CLS output, the pooled vector the head sees, "
                        "or the SelectiveCLS vector")
    p.add_argument("--hook", default="hook_norm_final",
                   help="patch tokens: hook_norm_final (default) or blocks.{i}.hook_resid_post")
    p.add_argument("--selective-k", type=positive_int, default=1, help="k of the SelectiveCLS vector (--reference selective)")
    _add_selective_params(p)


def _add_box_filters(p: argparse.ArgumentParser, single_default: bool, max_fraction_default) -> None:
    if single_default:
        p.add_argument("--all-objects", dest="single_object", action="store_false", default=True,
                       help="keep images with several boxes (default: exactly one box, as the reference)")
    else:
        p.add_argument("--single-object", dest="single_object", action="store_true", default=False,
                       help="keep only images with exactly one box")
    p.add_argument("--max-box-fraction", type=fraction, default=max_fraction_default,
                   help="drop boxes larger than this share of the original image area "
                        f"(default {max_fraction_default}; 1 keeps all)")


def _add_bootstrap(p: argparse.ArgumentParser) -> None:
    p.add_argument("--n-boot", type=positive_int, default=1000, help="bootstrap resamples for the PiB interval")
    p.add_argument("--level", type=open_fraction, default=0.95, help="confidence level of the PiB interval")


def _selective(args, k: int):
    from ..interventions.selective_cls import SelectiveCLS

    return SelectiveCLS(k=k, sigma=args.sigma, score=args.score, fft=args.fft, eps=args.eps)


# ---------------------------------------------------------------------------------------------- commands
def run_patch_score(args, patch_score_study) -> int:
    from ..errors import InterpError
    from ..studies.aggregation.pib import load_regions
    from ..studies.core.regions import regions_from_masks

    if args.boxes and args.masks:
        raise InterpError("give --boxes or --masks, not both")
    model = model_from_args(args)
    source = source_from_args(args, model)
    regions = None
    if args.boxes:
        regions = load_regions(source, args.boxes, args.single_object, args.max_box_fraction, args.cell_rule)
    elif args.masks:
        regions = regions_from_masks(source.ids, args.masks, source.data_config(), tuple(source.layout.grid),
                                     args.cell_rule)
    result = patch_score_study(source, hook=args.hook, reference=args.reference,
                               selective=_selective(args, args.selective_k), regions=regions,
                               normalise=args.normalise, batch_size=args.batch_size, progress=args.progress)
    if result.fg is not None:
        print(f"Patch Score ({args.reference}): foreground mean {result.fg.mean}, background mean {result.bg.mean}; "
              f"excluded {result.excluded}")
    save_study(result, args, n_maps=args.n_maps)
    return 0


def run_pib(args, pib_study) -> int:
    model = model_from_args(args)
    source = source_from_args(args, model)
    result = pib_study(source, args.boxes, reference=args.reference, hook=args.hook,
                       selective=_selective(args, args.selective_k), single_object=args.single_object,
                       max_box_fraction=args.max_box_fraction, n_boot=args.n_boot, level=args.level,
                       seed=args.seed, batch_size=args.batch_size, progress=args.progress,
                       protocol=args.protocol)
    print(result.summary())
    save_study(result, args, n_maps=args.n_maps)
    return 0


def run_masking(args, masking_study) -> int:
    from ..studies.aggregation.masking import DEFAULT_FRACTIONS, fraction_steps

    if args.steps is not None and args.fractions is not None:
        raise UsageError("give --fractions or --steps, not both")
    fractions = fraction_steps(args.steps) if args.steps is not None else args.fractions or list(DEFAULT_FRACTIONS)
    model = model_from_args(args)
    source = source_from_args(args, model)
    threshold = threshold_value(args.threshold)
    result = masking_study(source, fractions=fractions, fill=args.fill, blur_sigma=args.blur_sigma,
                           reference=args.reference, hook=args.hook, selective=_selective(args, args.selective_k),
                           threshold=threshold, detect_layer=args.detect_layer, preset=args.preset,
                           orders=args.orders, seed=args.seed, classifier=args.classifier, batch_size=args.batch_size,
                           progress=args.progress)
    for order in result.orders:
        values = " ".join(f"{v:.3f}" for v in result.curves[order][result.metric])
        print(f"{result.metric} masking {order}-k at {result.fractions}: {values}")
    print_behaviour(result)
    save_study(result, args)
    return 0


def run_selective_cls(args, selective_cls_study) -> int:
    model = model_from_args(args)
    source = source_from_args(args, model)
    result = selective_cls_study(source, args.boxes, ks=args.k, selective=_selective(args, 1),
                                 reference=args.reference, single_object=args.single_object,
                                 max_box_fraction=args.max_box_fraction, n_boot=args.n_boot, level=args.level,
                                 seed=args.seed, batch_size=args.batch_size, progress=args.progress,
                                 protocol=args.protocol, classifier=args.classifier)
    print(result.table())
    print_behaviour(result)
    print(f"{result.n_used} of {result.n_images} images with a usable box; excluded: {result.excluded}")
    save_study(result, args)
    return 0


# ---------------------------------------------------------------------------------------------- parsers
def add_patch_score_arguments(p) -> None:
    """Arguments of ``interp study patch-score`` (the registry adds the parser)."""
    p.description = ("Patch Score S_p = cos(x_p, g) per image (docs/methods.md section 3).")
    add_study_args(p, cache_ok=True)
    _add_score_args(p)
    p.add_argument("--boxes", default=None, type=existing_file,
                   help="box file (CSV/JSON/COCO) for foreground/background scores")
    p.add_argument("--masks", default=None, type=existing_path,
                   help="directory of masks <image stem>.png (nonzero = foreground; palette PNGs by index, 255 void)")
    _add_box_filters(p, single_default=False, max_fraction_default=None)
    p.add_argument("--cell-rule", choices=("touch", "majority"), default="touch",
                   help="a patch is foreground when its cell touches the box / a mask pixel (touch, default) or "
                        "when most of its area is inside (majority)")
    p.add_argument("--normalise", choices=("none", "minmax"), default="none",
                   help="score distributions of the raw cosines (none, default) or of each image's map "
                        "min-max rescaled to [0, 1] (minmax)")
    p.add_argument("--n-maps", type=nonnegative_int, default=8, help="images drawn in score_maps.png")


def _add_protocol_arg(p) -> None:
    p.add_argument("--protocol", choices=("model", "last"), default="model",
                   help="model: the model's own transform (default); last: the LaSt reference's Resize 256 + "
                        "CenterCrop 224, box cells and filters (overrides the box filters; needs a 224-px grid)")


def add_pib_arguments(p) -> None:
    """Arguments of ``interp study pib`` (the registry adds the parser)."""
    p.description = ("Point in box with a bootstrap interval (docs/methods.md section 3).")
    add_study_args(p, cache_ok=True)
    _add_score_args(p)
    p.add_argument("--boxes", required=True, type=existing_file, help="box file: CSV/JSON (image,x0,y0,x1,y1) or COCO instances JSON")
    _add_box_filters(p, single_default=True, max_fraction_default=0.25)
    _add_protocol_arg(p)
    _add_bootstrap(p)
    p.add_argument("--n-maps", type=nonnegative_int, default=8, help="images drawn in score_maps.png")


def add_masking_arguments(p) -> None:
    """Arguments of ``interp study masking`` (the registry adds the parser)."""
    p.description = ("Masking probe (docs/methods.md section 3): accuracy or agreement and outlier "
                     "counts per masked fraction, for both orders.")
    add_study_args(p, cache_ok=False)
    add_classifier_arg(p)
    _add_score_args(p)
    p.add_argument("--fractions", type=masked_fraction, nargs="+", default=None,
                   help="shares of patches to mask (default 0 0.1 ... 0.9)")
    p.add_argument("--steps", type=positive_int, default=None,
                   help="mask the fractions k/STEPS, k = 0 .. STEPS-1 (7: the LaSt paper's steps of 1/7)")
    p.add_argument("--orders", nargs="+", choices=("top", "bottom", "random"), default=["top", "bottom", "random"],
                   help="masking orders: highest score first, lowest first, and the seeded random control "
                        "(--seed; default all three)")
    p.add_argument("--fill", choices=("zero", "mean", "blur"), default="zero",
                   help="zero (0 in normalised space), mean (dataset mean per channel) or blur")
    p.add_argument("--blur-sigma", type=positive_float, default=None, help="blur sigma in pixels (default patch size / 2)")
    add_detection_args(p, threshold_aliases=("--outlier-threshold",),
                       threshold_help="outlier token norm at the detection block: a number > 0, pNN (percentile of "
                                      "the unmasked run) or auto; default p98, or the preset's (--outlier-threshold: "
                                      "its former name)")


def add_selective_cls_arguments(p) -> None:
    """Arguments of ``interp study selective-cls`` (the registry adds the parser)."""
    p.description = ("The measured effect of SelectiveCLS(k) on a frozen model, one table.")
    add_study_args(p, cache_ok=False)
    add_classifier_arg(p)
    p.add_argument("--boxes", required=True, type=existing_file, help="box file: CSV/JSON (image,x0,y0,x1,y1) or COCO instances JSON")
    p.add_argument("--k", type=positive_int, nargs="+", default=[1, 7, 98], help="SelectiveCLS k values (default 1 7 98)")
    _add_selective_params(p)
    p.add_argument("--reference", choices=("cls", "pooled"), default="cls", help="the baseline's global vector")
    _add_box_filters(p, single_default=True, max_fraction_default=0.25)
    _add_protocol_arg(p)
    _add_bootstrap(p)
