"""``interp cache MODEL --images DIR --hooks PATTERN... | --for STUDY,... --out FILE.h5``: write an activation cache.

Under ``torchrun --nproc_per_node K -m interp cache ...`` every rank caches one block of the images
into ``FILE.rank{r}-of-K.h5`` and rank 0 writes FILE.h5 as virtual datasets over the shards.
"""
from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Optional, Tuple

from ..options import Options, group, option
from ..studies.catalog import declared, hooks_for_studies
from ..values import positive_int
from ..paths import existing_path, image_list_file
from .common import load_model
from .groups import ModelOptions, OutputOptions, PreprocessOptions, SeedOption, Sources, StrictOption
from .inputs import RunInputs, command


def _study_names(text: str) -> list:
    """``--for norms, neurons`` -> ["norms", "neurons"]."""
    return [s.strip() for s in text.split(",") if s.strip()]


@dataclass(frozen=True, kw_only=True)
class CacheImages(Sources):
    """``--images DIR`` or ``--image-list FILE`` (one of them)."""

    REQUIRED_GROUPS = ("images",)

    images: Optional[str] = option(None, "folder of images (searched recursively)", parse=existing_path,
                                   metavar="DIR", exclusive="images")
    image_list: Optional[str] = option(
        None, ".txt/.lst file with one image path per line (relative paths are relative to the file)",
        parse=image_list_file, metavar="FILE", exclusive="images")


@dataclass(frozen=True, kw_only=True)
class CacheOptions(Options):
    """The options of ``interp cache``: the model, the images, what is stored and where, the run."""

    model: ModelOptions = group(ModelOptions)
    seed: SeedOption = group(SeedOption)
    source: CacheImages = group(CacheImages)
    hooks: Tuple[str, ...] = option((), "hook names or glob patterns, e.g. 'blocks.*.hook_resid_post' (see "
                                        "`interp hooks MODEL`)", many="+", metavar="PATTERN")
    for_studies: Optional[str] = option(
        None, "write exactly the hooks these studies read (with their default options), e.g. --for norms,neurons; "
              "adds to --hooks", flag="--for", metavar="STUDY[,STUDY...]")
    out: str = option(None, "cache file to write", required=True, metavar="FILE.h5")
    batch_size: int = option(32, "images per forward pass (default 32); each batch is also the file's commit unit "
                                 "(a resumed file keeps its own) and HDF5 chunk", parse=positive_int)
    dtype: str = option("float16", "stored float type", choices=("float16", "float32"))
    tokens: str = option("all", "token rows to keep (prefix = CLS + registers); attention maps: query rows",
                         choices=("all", "prefix", "patches", "cls"))
    norms_only: bool = option(False, "store per-token L2 norms [N, T] instead of vectors")
    compression: str = option("none", "HDF5 compression of the stored activations (default none: fastest to read)",
                              choices=("none", "lzf", "gzip"))
    resume: bool = option(False, "continue an interrupted FILE.h5 (same settings)")
    overwrite: bool = option(False, "replace an existing FILE.h5")
    strict: StrictOption = group(StrictOption)
    preprocessing: PreprocessOptions = group(PreprocessOptions)
    output: OutputOptions = group(OutputOptions)

    def check(self) -> None:
        super().check()
        from ..errors import UsageError

        if not self.hooks and not self.for_studies:
            raise UsageError("say what to cache: --hooks PATTERN... and/or --for STUDY[,STUDY...] (e.g. --for norms)")


def register(sub) -> None:
    command(sub, "cache", CacheOptions, run, help="cache hook activations over an image folder into an HDF5 file",
            description="Run MODEL over images and store the activations of the chosen hooks in an HDF5 file "
                        "(streamed batch by batch, resumable after a crash, shardable with torchrun).")


def run(options: CacheOptions, inputs: RunInputs) -> int:
    from ..errors import UsageError
    from .output import check_output_file
    from .prechecks import check_cache_lock

    o = options
    check_output_file(o.out, overwrite=o.overwrite, resume=o.resume, example="acts.h5",
                      hint="pass --resume to continue it, --overwrite to replace it, or choose another path")
    check_cache_lock(o.out)  # another writer: said before torch loads, not after the model is built
    if o.for_studies:
        studies = declared()
        unknown = [s for s in _study_names(o.for_studies) if s not in studies]
        if unknown:
            raise UsageError(f"--for {o.for_studies!r}: unknown study {unknown[0]!r}; known: {', '.join(studies)}")
    from ..cache import write  # imports torch: after the checks above
    from ..cache.format import weights_source
    from ..cache.store import CacheFile

    if o.resume and os.path.exists(o.out):
        CacheFile.check_before_resume(o.out)  # a damaged file: refused before the model loads, not after

    model = load_model(inputs, (o,))
    hooks = list(o.hooks)
    if o.for_studies:
        hooks += [h for h in hooks_for_studies(_study_names(o.for_studies), model.block_names) if h not in hooks]
    replacing = os.path.exists(o.out) and not o.resume
    spec = inputs.model
    try:
        summary = write(
            model, o.source.images or o.source.image_list, hooks=hooks, path=o.out, batch_size=o.batch_size,
            dtype=o.dtype, tokens=o.tokens, norms_only=o.norms_only, compression=o.compression,
            resume=o.resume, overwrite=o.overwrite, strict=inputs.strict, progress=inputs.stage_lines,
            # Recorded so that a mismatch can say how to load these weights again (seed: random weights).
            weights_source=weights_source(pretrained=spec.pretrained and not spec.weights, weights=spec.weights,
                                          seed=getattr(model, "init_seed", None)),
            preprocess=o.preprocessing.preprocess(),
        )
    except KeyboardInterrupt:
        raise KeyboardInterrupt(interrupted_note(o.out, inputs, replacing)) from None
    return 0 if summary.complete else 1


def interrupted_note(out: str, inputs: RunInputs, replacing: bool) -> str:
    """What an interrupted ``interp cache`` into ``out`` kept, and the command that continues it."""
    import shlex

    from ..cache.integrity import open_read_only

    if replacing:
        return f"{out} is unchanged (an interrupted --overwrite keeps the old file)"
    if not os.path.exists(out):
        return f"nothing was committed to {out}; rerun the command to start again"
    argv = [a for a in inputs.argv if a != "--overwrite"] or ["cache", inputs.model.name, "..."]
    resume = shlex.join(["interp", *argv, *([] if "--resume" in argv else ["--resume"])])
    try:
        h5, _ = open_read_only(out)
        with h5:
            kept = f"{int(h5.attrs['n_written'])} of {int(h5.attrs['n_images'])} images are committed in {out}"
    except Exception:  # noqa: BLE001 - the note must not hide the interrupt; the resume run checks the file
        kept = f"the rows committed to {out} so far are kept"
    return f"{kept}; continue with `{resume}`"
