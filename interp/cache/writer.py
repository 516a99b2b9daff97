"""``interp.cache.write``: stream images through a HookedViT and store hook activations in HDF5.

This module checks the arguments and dispatches: one file (:mod:`.file_writer`) or, under ``torchrun``,
one shard per rank plus a virtual top file (:mod:`.distributed`, which writes each shard with
:mod:`.file_writer` too).
"""
from __future__ import annotations

from pathlib import Path
from typing import Optional, Union

from ..hooks.names import NamesSpec
from . import distributed as dist_mod
from .file_writer import WriteSummary, write_file
from .format import COMPRESSIONS, DTYPES, TOKEN_MODES
from ..models.inputs.preprocessing import ImagesSpec
from .image_feed import image_feed

__all__ = ["write", "WriteSummary"]


def write(
    model,
    images: ImagesSpec,
    *,
    hooks: NamesSpec,
    path: Union[str, Path],
    batch_size: int = 32,
    dtype: str = "float16",
    tokens: str = "all",
    norms_only: bool = False,
    compression: str = "none",
    resume: bool = False,
    overwrite: bool = False,
    strict: bool = False,
    progress: bool = True,
    distributed: Optional[bool] = None,
    weights_source: Optional[dict] = None,
    preprocess=None,
) -> WriteSummary:
    """Cache hook activations of ``model`` over ``images`` into the HDF5 file ``path``.

    Args:
        model: a ``HookedViT``.
        images: a directory (searched recursively), a ``.txt``/``.lst`` list of paths, a list of paths,
            or an already preprocessed Tensor[N, 3, H, W] (ids ``tensor:<i>``).
        hooks: hook names or glob patterns (``"blocks.*.hook_resid_post"``), or a list of them.
        path: the ``.h5`` file to write.
        batch_size: images per forward pass and rows per HDF5 chunk.
        dtype: stored float type, ``float16`` or ``float32`` (the forward runs in the model's dtype).
        tokens: token rows to keep: ``all``, ``prefix`` (CLS + registers), ``patches`` or ``cls``.
            For attention scores/patterns [h, t, t] the query axis is selected; all keys are kept.
        norms_only: store the per-token L2 norm ([N, T]) instead of the vectors.
        compression: ``none``, ``lzf`` or ``gzip`` (with byte shuffling).
        resume: continue an existing file after its last committed batch (its settings must match;
            its batch size is used). Without ``resume`` or ``overwrite`` an existing file is an error.
        overwrite: replace an existing file.
        strict: stop at the first unreadable image (``ImageError`` naming it) instead of skipping it.
        progress: show a tqdm bar (images/s, MB/s) and print a summary line to stderr.
        distributed: split the images over ``torch.distributed`` ranks (one shard file each, plus a
            virtual top file written by rank 0). None: when ``WORLD_SIZE`` > 1 in the environment.
        weights_source: where the model's weights came from, recorded so that a mismatch can say how to
            load them again: ``interp.cache.format.weights_source(pretrained=..., weights=..., seed=...)``
            (the CLI fills it in; unknown fields are None).
        preprocess: decode the files with a paper's eval transform (``"resize256-crop224"``, an
            ``interp.models.EvalTransform``) instead of the model's own; recorded in the ``data_config``
            attribute (its ``preprocess`` key), and a study asking for another one is refused.

    Returns:
        WriteSummary (this rank's shard under ``torchrun``).

    Raises:
        CacheError: existing file without ``resume``/``overwrite``, a file another process is writing,
            a resume with other settings, a damaged file to resume (left unchanged), a full disk or a
            folder that cannot be written. ImageError: an unreadable image with ``strict``.
    """
    if dtype not in DTYPES:
        raise ValueError(f"dtype must be one of {tuple(DTYPES)}, got {dtype!r}")
    if tokens not in TOKEN_MODES:
        raise ValueError(f"tokens must be one of {TOKEN_MODES}, got {tokens!r}")
    if compression not in COMPRESSIONS:
        raise ValueError(f"compression must be one of {COMPRESSIONS}, got {compression!r}")
    if batch_size < 1:
        raise ValueError(f"batch_size must be >= 1, got {batch_size}")
    hook_names = model.resolve_hooks(hooks)
    source = image_feed(images, model, strict=strict, preprocess=preprocess)
    options = dict(batch_size=batch_size, dtype=dtype, tokens=tokens, norms_only=norms_only,
                   compression=compression, resume=resume, overwrite=overwrite, progress=progress,
                   weights_source=weights_source)

    context = dist_mod.detect() if distributed is None else (dist_mod.detect(required=True) if distributed else None)
    if context is not None:
        return dist_mod.write_sharded(model, source, hook_names, Path(path), context, **options)
    return write_file(model, source, hook_names, Path(path), **options)
