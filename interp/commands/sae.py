"""``interp sae train MODEL (--cache FILE | --images DIR) --hook HOOK --out DIR``: train a sparse autoencoder.

Under ``torchrun --nproc_per_node K -m interp sae train ...`` the K processes train one SAE data-parallel (DDP):
each reads its own data shards, rank 0 writes the files.
"""
from __future__ import annotations

import os
import sys
import dataclasses
from dataclasses import dataclass, fields
from typing import Optional

from ..errors import InterpError, OutputError, UsageError
from ..formats.image_files import list_images
from ..options import Options, group, option
from ..sae_settings import SAE_CHECKPOINT, SAE_CONFIG, SAE_CURVE, SAE_WEIGHTS, TOKEN_CHOICES, TrainSettings
from ..values import positive_int
from ..paths import existing_file, existing_path
from .common import load_model
from .groups import ModelOptions, OutputOptions, SeedOption, Sources
from .inputs import RunInputs, command
from .output import atomic_output_dir, check_output_folder, refuse_special

LIVE_IMAGE_BATCH = 32  # images per forward pass of a live run when --batch-size is not given


@dataclass(frozen=True, kw_only=True)
class SaeSources(Sources):
    """``--cache FILE.h5`` or ``--images DIR`` (one of them)."""

    REQUIRED_GROUPS = ("source",)

    cache: Optional[str] = option(None, "activation cache holding --hook", parse=existing_file, metavar="FILE.h5",
                                  exclusive="source")
    images: Optional[str] = option(None, "images to run live through MODEL", parse=existing_path, metavar="DIR",
                                   exclusive="source")


@dataclass(frozen=True, kw_only=True)
class SaeTrainOptions(Options):
    """The options of ``interp sae train``: the model, the data, :class:`TrainSettings` (declared there, with their
    defaults and help texts) and the run."""

    RENAMED = {"--batch-images": "renamed --batch-size (images per forward); tokens per step is --tokens-per-step"}

    model: ModelOptions = group(ModelOptions)
    source: SaeSources = group(SaeSources)
    hook: str = option(None, "hook to train on, e.g. blocks.9.hook_resid_post", required=True)
    out: str = option(None, "folder of the SAE files", required=True, metavar="DIR")
    settings: TrainSettings = group(TrainSettings)
    batch_size: Optional[int] = option(
        None, f"images per forward pass of a live run (--images; default {LIVE_IMAGE_BATCH}), at most "
              "--window-images; tokens per step is --tokens-per-step", parse=positive_int, metavar="N")
    checkpoint_every: int = option(100, "steps between checkpoints (default 100)", parse=positive_int)
    resume: bool = option(False, "continue from DIR/checkpoint.pt")
    overwrite: bool = option(False, "replace an existing run in DIR")
    output: OutputOptions = group(OutputOptions)

    def check(self) -> None:
        """``--batch-size`` meant tokens per step before it meant images per forward pass (now
        ``--tokens-per-step``): a value that only makes sense as tokens is refused, never read as images."""
        if self.batch_size is None:
            return
        renamed = "--batch-size is images per forward pass now; tokens per step is --tokens-per-step"
        if self.source.cache is not None:
            raise UsageError(f"--batch-size {self.batch_size}: a --cache run makes no forward pass ({renamed})")
        if self.batch_size > self.settings.window_images:
            raise UsageError(f"--batch-size {self.batch_size} images per forward pass is more than --window-images "
                             f"{self.settings.window_images}, the images read at a time ({renamed})")


@dataclass(frozen=True, kw_only=True)
class SaeImportOptions(Options):
    model: ModelOptions = group(ModelOptions)
    seed: SeedOption = group(SeedOption)
    format: str = option(None, "the files' project", positional=True, required=True,
                         choices=("saelens", "saev", "vit_prisma"))
    source: str = option(None, "the SAE's folder or file", positional=True, required=True, parse=existing_path)
    out: str = option(None, "folder of the interp SAE files", required=True, metavar="DIR")
    hook: Optional[str] = option(None, "the hook it reads (default: the one its files name; saev: required)")
    tokens: str = option("patches", "the token kind it was trained on (default patches)", choices=TOKEN_CHOICES)
    overwrite: bool = option(False, "replace an SAE (or an SAE training run) in DIR")


def register(sub) -> None:
    p = sub.add_parser("sae", help="train sparse autoencoders on a hook's activations",
                       description="Sparse autoencoders (overcomplete's modules; pip install -e '.[sae]' in the clone).")
    actions = p.add_subparsers(dest="sae_command", metavar="ACTION", required=True)
    command(actions, "train", SaeTrainOptions, run_train,
            help="train an SAE on one hook, from a cache or live from the model",
            description="Train a sparse autoencoder on HOOK's activations (streamed from an HDF5 cache with bounded "
                        "memory, or computed live), write DIR/sae.safetensors, DIR/sae.json and "
                        "DIR/training_curve.png; checkpoints every --checkpoint-every steps (--resume continues).")
    command(actions, "import", SaeImportOptions, run_import,
            help="convert an SAE trained with SAELens, saev or ViT-Prisma into an interp SAE folder",
            description="Read an SAE in another project's files (SAELens: DIR with cfg.json + sae_weights.safetensors; "
                        "saev: the .pt dump; ViT-Prisma: config.json + a .pt state dict) and write DIR/sae.json + "
                        "DIR/sae.safetensors for MODEL, so sae-features, study ablate --sae and patch export --sae "
                        "run on it (conversion: docs/sae.md).")


RUN_FILES = (SAE_CONFIG, SAE_WEIGHTS, SAE_CHECKPOINT, SAE_CURVE)  # what a run writes in --out


def check_sae_output(out: str, may_replace: bool, hint: str, busy: str) -> None:
    """Before torch: ``out`` is a folder that can be written (not a file, a device node, a FIFO, a path under a
    file, a pseudo-file system), holds no device node or FIFO where an SAE folder's file goes, is not being
    written by another run (``busy``: what that run does, in words), and holds no SAE run unless ``may_replace``
    (``hint``: the options that say what to do with one)."""
    from ..cache.lock import LockHeld, WriterLock  # torch-free: interp.cache resolves its heavy names lazily

    check_output_folder(out)
    for name in RUN_FILES:
        refuse_special(os.path.join(out, name), "")
    if os.path.exists(os.path.join(out, "sae.json.lock")):  # a run is writing into --out: say it now
        lock = WriterLock(os.path.join(out, SAE_CONFIG))
        try:
            lock.acquire()
        except OSError:
            pass  # the run itself says what is wrong with the folder
        except LockHeld as e:
            raise OutputError(f"--out {out!r} is being {busy} by another interp run ({e.holder}); wait for it to "
                              "finish or choose another --out") from None
        else:
            lock.release()
    if not may_replace:
        refuse_held_run(out, hint)


def refuse_held_run(out: str, hint: str) -> None:
    """Refuse (one line) an ``out`` that holds an SAE run (``sae.json`` or ``checkpoint.pt``)."""
    held = [n for n in (SAE_CONFIG, SAE_CHECKPOINT) if os.path.exists(os.path.join(out, n))]
    if held:
        raise OutputError(f"--out {out!r} already holds an SAE run ({', '.join(held)}); {hint}, or choose another "
                          "--out")


def check_train_output(options: SaeTrainOptions) -> None:
    """Before torch: :func:`check_sae_output` (a run in --out only with --resume or --overwrite), and as many
    training images as --data-shards."""
    check_sae_output(options.out, options.resume or options.overwrite, "pass --resume to continue it or "
                     "--overwrite to replace it", "trained into")
    images, shards = options.source.images, options.settings.data_shards
    if images:  # the defaults are for thousands of images: say it before torch loads
        try:
            n_images = len(list_images(images))
        except Exception:  # noqa: BLE001 - the image checks say what is wrong with --images
            n_images = None
        if n_images is not None and n_images < shards:
            raise UsageError(f"--images {images!r} holds {n_images} image(s), fewer than --data-shards "
                             f"{shards} (each shard needs training images): give --data-shards 1 (and a "
                             "smaller --window-images, --tokens-per-step) or more images; docs/sae.md has a recipe")


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


LR_DISTANCES = {"kl_logits": "KL of the logits", "mse_embedding": "MSE of the embedding",
                "mse_pooled": "MSE of the pooled vector: the head has random weights"}


def run_train(options: SaeTrainOptions, inputs: RunInputs) -> int:
    check_train_output(options)  # before torch and the model
    try:
        return _run_train(options, inputs)
    except RuntimeError as e:
        raise peer_lost(e) or e


def _run_train(options: SaeTrainOptions, inputs: RunInputs) -> int:
    from ..sae import train

    o = options
    model = load_model(dataclasses.replace(inputs, seed=o.settings.seed), (o,))  # random weights: the run's seed
    image_batch = LIVE_IMAGE_BATCH if o.batch_size is None else o.batch_size
    settings = {f.name: getattr(o.settings, f.name) for f in fields(TrainSettings)}
    result = train(model, o.hook, o.out, cache=o.source.cache, images=o.source.images, resume=o.resume,
                   overwrite=o.overwrite, checkpoint_every=o.checkpoint_every, progress=inputs.stage_lines,
                   image_batch=image_batch, **settings)
    if int(os.environ.get("RANK", "0")) == 0:
        held = result["metrics"]["held_out"] or result["metrics"]["train_sample"]
        ev = "n/a" if held["explained_variance"] is None else f"{held['explained_variance']:.3f}"
        lr = held.get("loss_recovered") or {}
        lr = (f"{lr['loss_recovered']:.3f} ({LR_DISTANCES.get(lr['distance'], lr['distance'])}, "
              f"{lr['n_images']} held-out images)" if lr.get("loss_recovered") is not None else f"n/a ({lr.get('note', 'no held-out image')})")
        where = "held-out" if result["metrics"]["held_out"] else "training-sample"
        alive = (f"{round(held['alive_fraction'] * result['n_features'])} of {result['n_features']} features alive "
                 f"({held['alive_fraction']:.0%}) on the {where} tokens, {result['metrics']['dead_features']} dead "
                 f"in training (no firing in {result['metrics']['dead_fraction_window_steps']} steps)")
        print(f"SAE {result['arch']} on {result['hook']}: explained variance {ev}, L0 {held['l0']:.1f}, {alive}, "
              f"loss recovered {lr} -> {os.path.join(o.out, 'sae.json')}")
        for line in result.get("warnings", []):
            print(f"warning: {line}", file=sys.stderr)
    return 0


def run_import(options: SaeImportOptions, inputs: RunInputs) -> int:
    """Convert, check with the loader's own checks, then write as every SAE writer does: under --out's lock
    (``sae.json.lock``, the one training takes), staged and moved into place (``sae.json`` last), replacing a
    previous SAE run's files (its checkpoint and curve too) only with --overwrite; a failure leaves --out as it
    was."""
    o = options
    hint = "pass --overwrite to replace it"
    check_sae_output(o.out, o.overwrite, hint, "written")  # before torch
    from ..sae.foreign import convert
    from ..sae.model import save

    model = load_model(inputs, (o,))
    config, tensors = convert(o.format, o.source, model, hook=o.hook, tokens=o.tokens)
    with atomic_output_dir(o.out, SAE_CONFIG, replaces=RUN_FILES, what="imported SAE") as staging:
        if not o.overwrite:  # again under the lock: a run may have finished into --out since the check
            refuse_held_run(o.out, hint)
        save(staging, config, tensors)
    print(f"imported the {o.format} SAE {o.source} -> {o.out}")
    return 0
