"""``interp study probes|lost|segment``: what the artifact tokens hold and what they break (issue 11).

    interp study probes MODEL --images DIR|--cache FILE --out OUT [--hook H] [--layer N] [--position-loss ce+mse]
        [--detect-layer N] [--threshold T] [--preset P] [--test-images DIR | --split FILE] [--epochs N] [--patience N]
    interp study lost MODEL --images DIR --out OUT [--boxes FILE|DIR] [--layer N] [--k 100] [--protocol model|lost]
        [--ties index|torch] [--neurons 2:17,...]
    interp study segment MODEL --images DIR --masks DIR|COCO.json --out OUT [--reference cls|pooled|selective]
        [--average image|dataset] [--frame input|full] [--whole-image] [--neurons 2:17,...]

Each writes ``<study>.json`` (``probes.json``, ``lost.json``, ``segmentation.json``) and its PNG figures
(:mod:`interp.plots.registry`) into ``--out``. With ``--neurons`` (the register neurons of a test-time
register), LOST and the segmentation run with and without the register and report both.
"""
from __future__ import annotations

from pathlib import Path

from .common import (add_detection_args, add_probe_budget_args, add_study_args, model_from_args, probe_budget,
                     source_from_args, threshold_value)
from .saving import save_study
from ..values import existing_file, existing_path, finite_float, open_fraction, positive_int, register_count

OVERLAY_IMAGES = 8  # images drawn by the LOST and segmentation figures


def _test_time_register(args):
    """The ``TestTimeRegister`` of ``--neurons`` (None without the flag)."""
    if not getattr(args, "neurons", None):
        return None
    from ..interventions import TestTimeRegister
    from .common import parse_neurons  # the one parser of the --neurons syntax

    return TestTimeRegister(parse_neurons(args.neurons), n_registers=args.n_registers)


def _save(result, args, source) -> None:
    """``result`` with its registered figures, drawn over the source's images when it has them (live)."""
    save_study(result, args, source.display_images(OVERLAY_IMAGES) if source.is_live else None)


def _neurons_args(p, what: str) -> None:
    p.add_argument("--neurons", default=None,
                   help=f"register neurons (LAYER:NEURON,... or a neurons.json): also run {what} with a test-time "
                        "register fed by them, and report both")
    p.add_argument("--n-registers", type=register_count, default=1, help="test-time register tokens (with --neurons)")


# ---------------------------------------------------------------------------------------------- probes
def add_probes_arguments(p) -> None:
    """Arguments of ``interp study probes`` (the registry adds the parser)."""
    p.description = ("Linear probes per token group (normal / high-norm patches, CLS, registers): position and "
                     "pixels (Darcet et al. Fig. 5b) and the image label from one token (their Table 1).")
    add_study_args(p, images_with_cache="the images the cache was written from, for the pixel probe")
    p.add_argument("--hook", default=None, help="probed tokens (default blocks.{layer}.hook_resid_post)")
    p.add_argument("--layer", type=int, default=-1, help="block of the default hook (negative counts from the end)")
    p.add_argument("--tasks", nargs="+", choices=("position", "pixels", "label"),
                   default=["position", "pixels", "label"], help="probes to train (default all)")
    p.add_argument("--position-loss", choices=("ce", "ce+mse"), default="ce",
                   help="ce (Darcet) or ce+mse (the reassessment: + 0.5 x MSE of (row, col))")
    add_detection_args(p)  # --threshold, --preset, --detect-layer: outliers on that block's un-normalised output
    p.add_argument("--max-train-tokens", type=positive_int, default=50_000, help="training tokens kept (seeded sample)")
    p.add_argument("--max-test-tokens", type=positive_int, default=20_000, help="test tokens kept per group")
    sets = p.add_argument_group("train and test images (default: a seeded random split by image)")
    sets.add_argument("--test-fraction", type=open_fraction, default=None,
                      help="share of images held out by the random split (default 0.25)")
    sets.add_argument("--test-images", type=existing_path, default=None,
                      help="held-out images (folder, list file or image); --images are then the training images")
    sets.add_argument("--split", type=existing_file, default=None,
                      help="a split file: lines 'train PATH' / 'test PATH' (or JSON {\"train\": [...], \"test\": "
                           "[...]}) naming the images of --images / --cache, or alone the images to run on")
    add_probe_budget_args(p)


def cache_images(source, images, model):
    """The input images of a cache source, read from ``images`` (a folder or list file) in the cache's order,
    preprocessed for ``model`` as the cache's were (its recorded transform): Tensor[N, 3, H, W]. Every cached image
    must be among them."""
    from ..errors import UsageError
    from ..models import list_images, load_images

    given = {p.resolve(): p for p in list_images(images)}
    wanted = [Path(i).resolve() for i in source.ids]
    missing = [str(w) for w in wanted if w not in given]
    if missing:
        raise UsageError(f"--images {images!r} lacks {len(missing)} of the cache's {len(wanted)} images "
                         f"(first: {missing[0]!r}); pass the images the cache was written from")
    return load_images([given[w] for w in wanted], model, strict=True, preprocess=source.preprocess)  # as cached


PIXELS_FROM_CACHE = ("pixels: skipped, a cache holds no input images; add --images (the images the cache was "
                     "written from) for the pixel probe")


def _check_probe_sets(args) -> None:
    """The image-set flags that cannot go together, refused before the model is built."""
    from ..errors import UsageError

    if not args.images and not args.cache and not args.split:
        raise UsageError("give --images (a live run), --cache (an interp cache file) or --split FILE")
    if args.test_images and args.split:
        raise UsageError("give the held-out images by --test-images or by --split, not both")
    if args.test_images and (args.cache or not args.images):
        raise UsageError("--test-images needs --images (the training images) and no --cache; with a cache, "
                         "name the held-out images by --split FILE")
    if args.test_fraction is not None and (args.test_images or args.split):
        raise UsageError("--test-fraction sets the random split; --test-images / --split give the sets instead")
    probe_budget(args)  # --val-fraction without --patience: refused here


def _probe_sets(args):
    """(train image entries or None, test image entries or None, folders their labels come from): the
    explicit sets of --test-images / --split. A live run opens one source over both sets (args.images)."""
    from ..models import list_images
    from ..studies.probes.image_sets import read_split

    if args.test_images:
        train, test = [str(p) for p in list_images(args.images)], [str(p) for p in list_images(args.test_images)]
        roots = [args.images, args.test_images]
        args.images = train + test
        return train, test, roots
    if args.split:
        train, test = read_split(args.split)
        if not args.images and not args.cache:
            args.images = train + test
            return train, test, []
        return train, test, [args.images] if args.images else []
    return None, None, []


def run_probes(args, probes_study) -> int:
    _check_probe_sets(args)  # before torch is imported
    from ..studies.probes.image_sets import set_labels

    threshold = threshold_value(args.threshold)
    images_arg = args.images
    train, test, roots = _probe_sets(args)
    model = model_from_args(args)
    source = source_from_args(args, model)
    # two folders (--images + --test-images): one class index per class name across both
    labels = set_labels(source.ids, roots)[0] if len(roots) > 1 else None
    pixels = None
    if args.cache and images_arg and "pixels" in args.tasks:
        pixels = cache_images(source, images_arg, model)
    budget = probe_budget(args)
    result = probes_study(source, args.hook, layer=args.layer, tasks=args.tasks, position_loss=args.position_loss,
                          threshold=threshold, detect_layer=args.detect_layer, preset=args.preset,
                          test_images=test, train_images=train, test_fraction=args.test_fraction,
                          labels=labels, max_train_tokens=args.max_train_tokens, max_test_tokens=args.max_test_tokens,
                          images=pixels, seed=args.seed, batch_size=args.batch_size, probe_options=budget,
                          progress=args.progress)
    if not source.is_live and pixels is None:  # the library's note gives Python advice; the CLI gives its own
        result.notes = [PIXELS_FROM_CACHE if n.startswith("pixels: skipped") else n for n in result.notes]
    print(f"high-norm patches: {result.outliers_from}; {result.n_train_images} training, {result.n_val_images} "
          f"validation, {result.n_test_images} held-out images ({result.split} split)")
    for probe in ("position", "pixels", "label"):
        for group, entry in getattr(result, probe).items():
            print(f"{probe:8s} {group:9s} n={entry.n:<6d} {probe_line(probe, entry)}")
    for note in result.notes:
        print(note)
    _save(result, args, source)
    return 0


def probe_line(probe: str, entry) -> str:
    """One group's figures in words (pixels: the L2 error first, then MSE and R^2), or why it has none."""
    if entry.score is None:
        return ("NOT SCORED: " if entry.too_few else "") + (entry.note or "no score")
    if probe == "pixels":
        return (f"L2 error {entry.l2_error:.4g} (chance {entry.chance_l2_error:.4g}), MSE {entry.mse:.4g}, "
                f"R^2 {entry.score:.3f} (chance {entry.chance:.3f})")
    return f"{entry.score:.3f} (chance {entry.chance:.3f})"


# ---------------------------------------------------------------------------------------------- lost
def add_lost_arguments(p) -> None:
    """Arguments of ``interp study lost`` (the registry adds the parser)."""
    p.description = ("LOST object discovery (Simeoni et al.) on the keys of one block: seed, mask and box per "
                     "image, CorLoc with --boxes (Darcet et al. Table 3).")
    add_study_args(p, cache_ok=True)
    p.add_argument("--boxes", default=None, type=existing_path,
                   help="ground-truth boxes for CorLoc (original pixels): CSV/JSON/COCO, a VOC .xml file or a "
                        "folder of them (VOC's Annotations)")
    p.add_argument("--layer", type=int, default=-1, help="block whose keys are used (default: the last)")
    p.add_argument("--k", type=positive_int, default=100, help="lowest-degree patches considered at seed expansion")
    p.add_argument("--protocol", choices=("model", "lost"), default="model",
                   help="model: the model's own transform, batched (default); lost: LOST's own (each image at full "
                        "resolution, zero-padded to the patch size, the position table resampled per image as "
                        "DINO does; COCO crowd boxes dropped; LOST's IoU). Load the model at its own size")
    p.add_argument("--ties", choices=("index", "torch"), default="index",
                   help="order of patches of equal degree: index (default, reproducible) or torch (LOST's unstable "
                        "torch.argsort; its order depends on the device)")
    _neurons_args(p, "LOST")


def _check_lost_args(args) -> None:
    """Flag combinations ``--protocol lost`` cannot take, refused before the model is built."""
    from ..errors import UsageError

    if args.protocol != "lost":
        return
    if args.cache:
        raise UsageError("--protocol lost reads each image file at full resolution: give --images, not --cache")
    if args.eval_resize or args.eval_crop or args.eval_transform:
        raise UsageError("--protocol lost feeds full-resolution images (no resize or crop): leave "
                         "--resize/--crop/--transform out")


def run_lost(args, lost_study) -> int:
    _check_lost_args(args)
    model = model_from_args(args)
    source = source_from_args(args, model)
    result = lost_study(source, args.layer, args.k, args.boxes, intervention=_test_time_register(args),
                        seed=args.seed, batch_size=args.batch_size, progress=args.progress, protocol=args.protocol,
                        ties=args.ties)
    print(result.summary())
    _save_lost(result, args, source)
    return 0


def _save_lost(result, args, source) -> None:
    """``_save``; under ``--protocol lost`` the figure is drawn over the padded full-resolution images."""
    if result.protocol != "lost":
        _save(result, args, source)
        return
    from ..studies.objects.lost_protocol import display_image

    ids = result.ids[:OVERLAY_IMAGES]
    save_study(result, args, [display_image(i, int(result.patch_size[0])) for i in ids] if ids else None)


# ---------------------------------------------------------------------------------------------- segment
def add_segment_arguments(p) -> None:
    """Arguments of ``interp study segment`` (the registry adds the parser)."""
    p.description = ("Coarse segmentation from Patch Score maps (score > mean + k std), mIoU and Jaccard against "
                     "ground-truth masks, with and without SelectiveCLS / a test-time register (LaSt Table 6).")
    add_study_args(p, cache_ok=True)
    p.add_argument("--masks", required=True, type=existing_path,
                   help="ground truth: a folder of masks <image stem>.png (palette PNGs by index: 0 background, 255 "
                        "void, others foreground; other images nonzero = foreground) or COCO polygons")
    p.add_argument("--reference", choices=("cls", "pooled", "selective"), default="cls",
                   help="global vector of the Patch Score")
    p.add_argument("--hook", default="hook_norm_final", help="patch tokens of the Patch Score")
    p.add_argument("--k-std", type=finite_float, default=1.0, help="foreground = score > mean + K x std of the map")
    p.add_argument("--average", choices=("image", "dataset"), default="image",
                   help="mIoU over background/foreground: mean of the images' mIoU (image, default) or from "
                        "intersections and unions summed over the dataset (dataset)")
    p.add_argument("--frame", choices=("input", "full"), default="input",
                   help="score in the model-input frame, the crop's border left out (input, default), or on the "
                        "whole original image, what the crop cut away counted as background (full)")
    p.add_argument("--whole-image", action="store_true", default=False,
                   help="show the model each whole image, resized to its input size without the centre crop "
                        "(aspect not kept), so every pixel is seen and scored")
    p.add_argument("--selective-k", type=positive_int, default=1,
                   help="k of the SelectiveCLS vector (the 'selective' reference and variant)")
    p.add_argument("--no-selective", dest="with_selective", action="store_false", default=True,
                   help="skip the SelectiveCLS variant")
    _neurons_args(p, "the segmentation")


def run_segment(args, segmentation_variants) -> int:
    from ..interventions.selective_cls import SelectiveCLS
    from ..studies.objects.whole_image import whole_image_source

    model = model_from_args(args)
    source = source_from_args(args, model)
    if args.whole_image:
        source = whole_image_source(source)  # the figures show what the model saw
    selective = SelectiveCLS(k=args.selective_k) if args.with_selective or args.reference == "selective" else None
    result = segmentation_variants(source, args.masks, reference=args.reference, selective=selective,
                                   intervention=_test_time_register(args), hook=args.hook, k_std=args.k_std,
                                   average=args.average, frame=args.frame, whole_image=args.whole_image,
                                   batch_size=args.batch_size, progress=args.progress)
    print(result.summary())
    _save(result, args, source)
    return 0
