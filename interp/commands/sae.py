"""``interp sae train MODEL (--cache FILE | --images DIR) --hook HOOK --out DIR``: train a sparse autoencoder.

Under ``torchrun --nproc_per_node K -m interp sae train ...`` the K processes train one SAE data-parallel (DDP):
each reads its own data shards, rank 0 writes the files.
"""
from __future__ import annotations

import os
import sys

from ..errors import CacheError, InterpError, OutputError, UsageError
from ..formats.image_files import list_images
from .common import add_model_args, add_output_args, model_from_args
from .output import check_output_folder, refuse_special
from ..values import (SAE_ARCHS, existing_file, existing_path, expansion_arg, nonnegative_float, positive_float,
                      positive_int, sae_batch_arg, threshold_arg, threshold_value)


def register(sub) -> None:
    p = sub.add_parser("sae", help="train sparse autoencoders on a hook's activations",
                       description="Sparse autoencoders (overcomplete's modules; pip install -e '.[sae]' in the clone).")
    actions = p.add_subparsers(dest="sae_command", metavar="ACTION", required=True)
    t = actions.add_parser(
        "train", help="train an SAE on one hook, from a cache or live from the model",
        description="Train a sparse autoencoder on HOOK's activations (streamed from an HDF5 cache with bounded "
                    "memory, or computed live), write DIR/sae.safetensors, DIR/sae.json and "
                    "DIR/training_curve.png; checkpoints every --checkpoint-every steps (--resume continues).")
    add_model_args(t)
    src = t.add_mutually_exclusive_group(required=True)
    src.add_argument("--cache", metavar="FILE.h5", type=existing_file, help="activation cache holding --hook")
    src.add_argument("--images", metavar="DIR", type=existing_path, help="images to run live through MODEL")
    t.add_argument("--hook", required=True, help="hook to train on, e.g. blocks.9.hook_resid_post")
    t.add_argument("--out", required=True, metavar="DIR", help="folder of the SAE files")
    t.add_argument("--arch", choices=SAE_ARCHS, default="topk", help="SAE architecture (default topk)")
    t.add_argument("--expansion", type=expansion_arg, default=8, help="features per dimension of the hook (default 8)")
    t.add_argument("--k", type=positive_int, default=32, help="active features per token: topk, batchtopk, archetypal (default 32)")
    t.add_argument("--tokens", choices=("patches", "all", "cls", "registers"), default="patches",
                   help="which tokens to train on (default patches)")
    t.add_argument("--high-norm", choices=("include", "exclude", "only"), default="include",
                   help="high-norm patch tokens (detection at the hook): keep (default), drop, or train on them only")
    t.add_argument("--threshold", type=threshold_arg, default="auto", help="high-norm detection threshold (auto, pNN, a norm; default auto)")
    t.add_argument("--steps", type=positive_int, default=1000, help="training steps (default 1000)")
    t.add_argument("--batch-size", type=sae_batch_arg, default=1024, help="tokens per step, all processes together (default 1024)")
    t.add_argument("--lr", type=positive_float, default=4e-4, help="Adam learning rate (default 4e-4)")
    t.add_argument("--window-images", type=positive_int, default=256,
                   help="images whose tokens are shuffled together (memory: one window per data shard; default 256)")
    t.add_argument("--data-shards", type=positive_int, default=8,
                   help="interleaved sub-streams of the data; torchrun's process count must divide it (default 8)")
    t.add_argument("--holdout", type=nonnegative_float, default=0.1, help="share of images held out for metrics (default 0.1)")
    t.add_argument("--dead-window", type=positive_int, default=200,
                   help="steps without firing that make a feature dead (AuxK revives those; default 200)")
    t.add_argument("--l1-penalty", type=nonnegative_float, default=0.05,
                   help="relu: weight of the L1 term, per token, in units of the normalised tokens' variance "
                        "(loss = ||x - x_hat||^2 + l1 * sum_f z_f ||d_f||, averaged over tokens; default 0.05)")
    t.add_argument("--l0-penalty", type=nonnegative_float, default=0.002,
                   help="jumprelu: weight of the L0 term per token (each active feature costs this share of the "
                        "variance; straight-through thresholds; default 0.002)")
    t.add_argument("--aux-penalty", type=nonnegative_float, default=1 / 32,
                   help="topk, batchtopk, archetypal: weight of AuxK, the dead features' reconstruction of the "
                        "residual (Gao et al. 2024; default 1/32)")
    t.add_argument("--aux-k", type=positive_int, default=None,
                   help="dead features used by AuxK per token (default: half the hook's width)")
    t.add_argument("--checkpoint-every", type=positive_int, default=100, help="steps between checkpoints (default 100)")
    t.add_argument("--batch-images", type=positive_int, default=32, help="images per forward pass with --images (default 32)")
    t.add_argument("--resume", action="store_true", help="continue from DIR/checkpoint.pt")
    t.add_argument("--overwrite", action="store_true", help="replace an existing run in DIR")
    add_output_args(t)
    t.set_defaults(func=run_train)

    i = actions.add_parser(
        "import", help="convert an SAE trained with SAELens, saev or ViT-Prisma into an interp SAE folder",
        description="Read an SAE in another project's files (SAELens: DIR with cfg.json + sae_weights.safetensors; "
                    "saev: the .pt dump; ViT-Prisma: config.json + a .pt state dict) and write DIR/sae.json + "
                    "DIR/sae.safetensors for MODEL, so sae-features, study ablate --sae and patch export --sae "
                    "run on it (conversion: docs/sae.md).")
    add_model_args(i)
    i.add_argument("format", choices=("saelens", "saev", "vit_prisma"), help="the files' project")
    i.add_argument("source", type=existing_path, help="the SAE's folder or file")
    i.add_argument("--out", required=True, metavar="DIR", help="folder of the interp SAE files")
    i.add_argument("--hook", default=None, help="the hook it reads (default: the one its files name; saev: required)")
    i.add_argument("--tokens", choices=("patches", "all", "cls", "registers"), default="patches",
                   help="the token kind it was trained on (default patches)")
    i.set_defaults(func=run_import)


SAE_FILES = ("sae.json", "sae.safetensors", "checkpoint.pt", "training_curve.png")  # what a run writes in --out


def check_train_output(args) -> None:
    """Before torch: ``--out`` is a folder that can be written (not a file, a device node, a FIFO, a path under a
    file, a pseudo-file system), holds no device node or FIFO where a run's file goes, and holds no run unless
    --resume or --overwrite says what to do with it."""

    check_output_folder(args.out)
    for name in SAE_FILES:
        refuse_special(os.path.join(args.out, name), "")
    if os.path.exists(os.path.join(args.out, "sae.json.lock")):  # a run is training into --out: say it now
        from ..cache.lock import WriterLock

        lock = WriterLock(os.path.join(args.out, "sae.json"))
        try:
            lock.acquire()
        except OSError:
            pass  # the training run says what is wrong with the folder
        except CacheError:
            try:
                holder = lock.path.read_text().strip() or "another process"
            except OSError:
                holder = "another process"
            raise OutputError(f"--out {args.out!r} is being trained into by another interp run ({holder}); wait for "
                              "it to finish or choose another --out") from None
        else:
            lock.release()
    if getattr(args, "images", None):  # the defaults are for thousands of images: say it before torch loads

        try:
            n_images = len(list_images(args.images))
        except Exception:  # noqa: BLE001 - the image checks say what is wrong with --images
            n_images = None
        if n_images is not None and n_images < args.data_shards:
            raise UsageError(f"--images {args.images!r} holds {n_images} image(s), fewer than --data-shards "
                             f"{args.data_shards} (each shard needs training images): give --data-shards 1 (and a "
                             "smaller --window-images, --batch-size) or more images; docs/sae.md has a recipe")
    held = [n for n in ("sae.json", "checkpoint.pt") if os.path.exists(os.path.join(args.out, n))]
    if held and not (args.resume or args.overwrite):
        raise OutputError(f"--out {args.out!r} already holds an SAE run ({', '.join(held)}); pass --resume to "
                         "continue it or --overwrite to replace it, or choose another --out")


PEER_WORDS = ("peer", "connection", "gloo", "nccl", "timed out", "timeout", "socket", "closed", "broken pipe")


def peer_lost(e: RuntimeError):
    """Under torchrun, the one-line error for a collective that failed because another process of the run died
    (torch.distributed raises DistError or a RuntimeError naming the transport); None otherwise (a bug keeps its
    traceback)."""
    import torch.distributed as dist

    if int(os.environ.get("WORLD_SIZE", "1")) <= 1:
        return None
    if not (isinstance(e, getattr(dist, "DistError", ())) or any(w in str(e).lower() for w in PEER_WORDS)):
        return None

    first = (str(e).strip().splitlines() or [type(e).__name__])[0][:200]
    return InterpError(f"rank {os.environ.get('RANK', '?')}: another process of this torchrun run stopped ({first}); "
                       "the last checkpoint in --out is kept: rerun the same torchrun command with --resume")


def run_train(args) -> int:
    check_train_output(args)  # before torch and the model
    try:
        return _run_train(args)
    except RuntimeError as e:
        raise peer_lost(e) or e


def _run_train(args) -> int:
    from ..sae import train

    model = model_from_args(args)
    result = train(model, args.hook, args.out, cache=args.cache, images=args.images, resume=args.resume,
                   overwrite=args.overwrite, checkpoint_every=args.checkpoint_every, progress=args.progress,
                   image_batch=args.batch_images, arch=args.arch, expansion=args.expansion, k=args.k,
                   tokens=args.tokens, high_norm=args.high_norm, threshold=threshold_value(args.threshold),
                   steps=args.steps, batch_size=args.batch_size, lr=args.lr, seed=args.seed,
                   window_images=args.window_images, data_shards=args.data_shards, holdout=args.holdout,
                   dead_window=args.dead_window, l1_penalty=args.l1_penalty, l0_penalty=args.l0_penalty,
                   aux_penalty=args.aux_penalty, aux_k=args.aux_k)
    if int(os.environ.get("RANK", "0")) == 0:
        held = result["metrics"]["held_out"] or result["metrics"]["train_sample"]
        ev = "n/a" if held["explained_variance"] is None else f"{held['explained_variance']:.3f}"
        lr = held.get("loss_recovered") or {}
        lr = (f"{lr['loss_recovered']:.3f} ({'KL of the logits' if lr['distance'] == 'kl_logits' else 'MSE of the embedding'}, "
              f"{lr['n_images']} held-out images)" if lr.get("loss_recovered") is not None else f"n/a ({lr.get('note', 'no held-out image')})")
        print(f"SAE {result['arch']} with {result['n_features']} features on {result['hook']}: explained variance "
              f"{ev}, L0 {held['l0']:.1f}, alive {held['alive_fraction']:.2f}, loss recovered {lr} -> "
              f"{os.path.join(args.out, 'sae.json')}")
        for line in result.get("warnings", []):
            print(f"warning: {line}", file=sys.stderr)
    return 0


def run_import(args) -> int:
    from ..sae.foreign import import_sae

    model = model_from_args(args)
    out = import_sae(args.format, args.source, args.out, model, hook=args.hook, tokens=args.tokens)
    print(f"imported the {args.format} SAE {args.source} -> {out}")
    return 0
