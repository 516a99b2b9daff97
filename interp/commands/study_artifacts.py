"""The artifact studies (docs/methods.md sections 1-2): ``interp study norms|neurons|redundancy|ablate|relocate|registers
MODEL``.

norms, neurons and redundancy read a live model (``--images``) or a cache (``--cache``); ablate, relocate and registers
re-run the model with an edit, so they take ``--images`` and the neurons to edit (``--neurons``).

    interp study neurons vit_small_patch14_dinov2 --images photos/ --out runs/dino --top-k 50
    interp study ablate vit_small_patch14_dinov2 --images photos/ --out runs/dino --neurons runs/dino/neurons.json
    interp study relocate planted_vit --images photos/ --out runs/p --neurons 2:17,2:101 --target box:2,2,3,3
"""
from __future__ import annotations

from .common import add_detection_args, add_study_args, model_from_args, source_from_args, threshold_value
from .saving import save_study
from ..values import positive_int

# ----------------------------------------------------------------------------------------- parsers
def add_norms_arguments(p) -> None:
    """Arguments of ``interp study norms`` (the registry adds the parser)."""
    p.description = ("Per-block patch-token norms of the un-normalised residual stream, outlier "
                     "maps at the detection block, the emergence layer and CLS attention.")
    add_study_args(p)
    add_detection_args(p)


def add_neurons_arguments(p) -> None:
    """Arguments of ``interp study neurons`` (the registry adds the parser)."""
    p.description = ("Score every MLP neuron of blocks <= --highest-layer by its mean |activation| "
                     "on the outlier patches and keep the --top-k best.")
    add_study_args(p)
    add_detection_args(p)
    p.add_argument("--highest-layer", type=int, default=None, help="last block scored (default: the detection block)")
    p.add_argument("--top-k", type=positive_int, default=None, help="neurons kept (default 10, or the preset's)")
    p.add_argument("--sparsity-filter", action="store_true", default=None,
                   help="the reference's filter: per image, a neuron scores 0 unless its activation is below "
                        "0.5 on at least half of the image's tokens (same as --sparsity per_image)")
    p.add_argument("--sparsity", choices=("per_image", "pooled", "none"), default=None,
                   help="sparsity filter: per_image (reference), pooled (over all images at once) or none")
    p.add_argument("--positions", choices=("all", "patches"), default=None,
                   help="outlier positions: all tokens above the threshold (default, reference) or patches only")
    p.add_argument("--max-images", type=positive_int, default=None,
                   help="score on a seeded random subset of this many images")


def add_redundancy_arguments(p) -> None:
    """Arguments of ``interp study redundancy`` (the registry adds the parser)."""
    p.description = ("Cosine similarity of each patch token's input patch embedding to its 4 grid neighbours, "
                     "normal vs high-norm tokens (Darcet et al., Fig. 5a).")
    add_study_args(p)
    add_detection_args(p)
    p.add_argument("--embedding", choices=("patch", "position"), default="patch",
                   help="patch: the patch-embedding output before the position embedding (hook_patch_embed; "
                        "default, the paper's); position: after it (hook_embed)")


# ----------------------------------------------------------------------------------------- runs
def _prepare(args):
    """Validate the cheap arguments first, then build the model and its source."""
    threshold = threshold_value(args.threshold)
    model = model_from_args(args)
    source = source_from_args(args, model)
    images = source.display_images() if source.is_live else None
    return threshold, None, source, images


def _finish(result, args, images) -> int:
    save_study(result, args, images)
    return 0


SHOWN_NEURONS = 50  # neuron ids printed on the terminal; neurons.json holds them all


def run_norms(args, norms_study) -> int:
    threshold, _, source, images = _prepare(args)
    result = norms_study(source, threshold=threshold, detect_layer=args.detect_layer, preset=args.preset,
                         batch_size=args.batch_size, progress=args.progress)
    print(result.detection_message)  # the verdict with the numbers behind it (share above, fitted modes)
    return _finish(result, args, images)


def run_neurons(args, neurons_study) -> int:
    threshold, _, source, images = _prepare(args)
    result = neurons_study(source, threshold=threshold, detect_layer=args.detect_layer,
                           highest_layer=args.highest_layer, top_k=args.top_k, sparsity_filter=args.sparsity_filter,
                           sparsity=args.sparsity, positions=args.positions, preset=args.preset,
                           max_images=args.max_images, seed=args.seed, batch_size=args.batch_size,
                           progress=args.progress)
    if args.top_k is not None and result.neurons and args.top_k > result.top_k:
        print(f"note: --top-k {args.top_k} is more than the {result.top_k} neurons of blocks 0..{result.highest_layer}"
              f": all {result.top_k} are ranked (neurons.json records top_k {result.top_k})")
    shown = [f"{e['layer']}:{e['neuron']}" for e in result.neurons[:SHOWN_NEURONS]]
    more = len(result.neurons) - len(shown)
    print(", ".join(shown) + (f" ... and {more} more (all in neurons.json)" if more > 0 else "") or result.message)
    return _finish(result, args, images)


def run_redundancy(args, redundancy_study) -> int:
    threshold, _, source, images = _prepare(args)
    result = redundancy_study(source, threshold=threshold, detect_layer=args.detect_layer, preset=args.preset,
                              embedding=args.embedding, batch_size=args.batch_size, progress=args.progress)
    print(result.summary())
    return _finish(result, args, images)

