"""The cache file format (version 2; version 1 files are still read): dataset paths, attributes, token rows.

Layout of one file (see docs/cache-format.md):

    /acts/<hook name>   [N, *per-image shape]  chunked one batch per chunk, resizable along N
    /ids                [N] UTF-8 strings       image path (or generated id) of each row
    /index              [N] int64               position of each row's image in the input list
    /skipped/index|path|reason                  images that could not be read, in input order
    /checksums          [N, hooks + 1] uint32   CRC-32 of each row of each hook, then of its index and id
                                                (format 2; see integrity.py)
    root attributes                             see ``ATTRIBUTES``

Only the first ``n_written`` rows of every row dataset are valid; ``complete`` is True only when the
run that wrote the file ended cleanly.
"""
from __future__ import annotations

import hashlib
import json
from typing import Dict, Iterable, List, Optional, Sequence

import h5py
import numpy as np

from .._version import __version__
from ..errors import CacheError
from ..models.layout import TokenLayout

FORMAT_VERSION = 2
READABLE_VERSIONS = (1, 2)  # 2 added /checksums and the model_depth, weights_source attributes

# HDF5 file-format bounds for writing: SWMR needs at least 1.10 structures, and capping at 1.10 keeps the
# files readable by any HDF5 >= 1.10 (h5py, h5dump, other languages), whatever HDF5 wrote them.
LIBVER = ("v110", "v110")

ACTS = "acts"
IDS = "ids"
INDEX = "index"
SKIPPED = "skipped"
SKIPPED_FIELDS = ("index", "path", "reason")
CHECKSUMS = "checksums"

TOKEN_MODES = ("all", "prefix", "patches", "cls")
DTYPES = {"float16": np.float16, "float32": np.float32}
COMPRESSIONS = ("none", "lzf", "gzip")

# Root attributes, in the order they are written. JSON_ATTRIBUTES hold JSON text (lists, dicts, None).
ATTRIBUTES = (
    "format_version", "interp_version", "timm_version", "torch_version", "h5py_version",
    "model_name", "weights_fingerprint", "architecture_fingerprint", "model_depth", "weights_source",
    "data_config", "input_size", "layout", "blocks",
    "hooks", "dtype", "tokens", "token_rows", "norms_only", "compression", "batch_size",
    "n_images", "images_sha256", "n_written", "n_skipped", "complete", "shard", "shards",
)
JSON_ATTRIBUTES = ("weights_source", "data_config", "input_size", "layout", "blocks", "hooks", "token_rows", "shard",
                   "shards")

# Settings a resumed run must share with the file it continues.
RESUME_KEYS = ("architecture_fingerprint", "weights_fingerprint", "input_size", "data_config", "layout", "hooks",
               "dtype", "tokens", "norms_only", "n_images", "images_sha256", "shard")

# Per-image token axis of hooks whose token axis is not the first one (None: no full token axis; stored
# whole). Attention scores/patterns are [h, t_query, t_key]; token selection applies to the query axis.
_TOKEN_AXIS_BY_SUFFIX = {"hook_attn_scores": 1, "hook_pattern": 1, "hook_pooled": None, "hook_logits": None,
                         "hook_selective_votes": None}


# Hooks whose token axis holds the patches only ([P, d] per image, no prefix rows): stored whole whatever
# ``--tokens`` says (their rows are not the layout's), per-token norms with ``--norms-only``.
PATCH_ONLY_HOOKS = ("hook_patch_embed",)  # hooks.names.PATCH_EMBED (that package imports transformer_lens)


def acts_path(hook: str) -> str:
    return f"{ACTS}/{hook}"


def token_axis(hook: str) -> Optional[int]:
    """Axis of the token dimension in one image's activation (0 for [t, ...]); None for pooled/logits."""
    return _TOKEN_AXIS_BY_SUFFIX.get(hook.rsplit(".", 1)[-1], 0)


def is_attention_map(hook: str) -> bool:
    return hook.rsplit(".", 1)[-1] in ("hook_attn_scores", "hook_pattern")


def token_rows(layout: TokenLayout, mode: str) -> slice:
    """Rows of the token axis kept by ``mode`` (all, prefix = CLS + registers, patches, cls)."""
    if mode not in TOKEN_MODES:
        raise ValueError(f"tokens must be one of {TOKEN_MODES}, got {mode!r}")
    if mode == "all":
        return slice(0, layout.n_tokens)
    if mode == "patches":
        return layout.patch_slice
    if mode == "prefix":
        if layout.n_prefix == 0:
            raise CacheError("this model has no prefix tokens (no CLS, no registers); use tokens='all' or 'patches'")
        return slice(0, layout.n_prefix)
    if layout.cls_index is None:
        raise CacheError("this model has no CLS token; use tokens='prefix', 'patches' or 'all'")
    return slice(layout.cls_index, layout.cls_index + 1)


def images_digest(ids: Sequence[str], extra: bytes = b"") -> str:
    """sha256 of the image ids in order (plus ``extra`` bytes, e.g. a digest of in-memory pixels)."""
    h = hashlib.sha256()
    for i in ids:
        h.update(i.encode("utf-8") + b"\0")
    h.update(extra)
    return h.hexdigest()


def model_fingerprints(model) -> Dict[str, str]:
    """Name, weights and architecture fingerprints of a HookedViT (or a timm ViT)."""
    from ..models import architecture_fingerprint, weights_fingerprint

    module = getattr(model, "timm_model", model)
    return {
        "model_name": str(getattr(model, "model_name", type(module).__name__)),
        "weights_fingerprint": weights_fingerprint(module),
        "architecture_fingerprint": architecture_fingerprint(module),
    }


def versions() -> Dict[str, str]:
    import timm
    import torch

    return {"interp_version": __version__, "timm_version": timm.__version__, "torch_version": torch.__version__,
            "h5py_version": h5py.__version__}


# ---------------------------------------------------------------------------------------------- attributes
def write_attrs(h5: h5py.File, meta: dict) -> None:
    """Write ``meta`` as root attributes (JSON text for lists/dicts/None)."""
    for key in ATTRIBUTES:
        if key not in meta:
            raise KeyError(f"cache metadata lacks {key!r}")
        value = meta[key]
        if key in JSON_ATTRIBUTES:
            value = json.dumps(value)
        elif isinstance(value, str):
            value = str(value)  # plain str: h5py stores str subclasses (torch.__version__) as fixed-width unicode
        h5.attrs[key] = value


def damaged(path, why: str) -> CacheError:
    """The one-line error for a damaged cache file (nothing was changed in it)."""
    return CacheError(
        f"{str(path)!r} is damaged ({why}); it was left unchanged. Move it away (or delete it) and write the "
        "cache again without --resume (resume=False): its rows cannot be trusted.")


def read_attrs(h5: h5py.File, path=None) -> dict:
    """Root attributes as plain Python values (JSON attributes decoded). An attribute HDF5 cannot read or
    JSON text that does not parse is a :class:`CacheError` naming it."""
    path = h5.filename if path is None else path
    meta = {}
    try:
        items = list(h5.attrs.items())
    except (OSError, KeyError, RuntimeError, ValueError, TypeError) as e:  # h5py: KeyError for a damaged header
        raise damaged(path, f"its attributes cannot be read: {str(e).strip(chr(39))}") from None
    for key, value in items:
        if isinstance(value, bytes):
            value = value.decode("utf-8", "replace")
        if isinstance(value, np.generic):
            value = value.item()
        if key in JSON_ATTRIBUTES and isinstance(value, str):
            try:
                value = json.loads(value)
            except (json.JSONDecodeError, RecursionError) as e:
                raise damaged(path, f"attribute {key!r} is not valid JSON: {e or 'nested too deeply'}") from None
        meta[key] = value
    return meta


def check_version(meta: dict, path, versions: Sequence[int] = READABLE_VERSIONS) -> None:
    """Raise :class:`CacheError` unless ``meta`` is from an interp cache of a format version in ``versions``."""
    if "format_version" not in meta:
        raise CacheError(f"{str(path)!r} is not an interp activation cache (no 'format_version' attribute)")
    version = meta["format_version"]
    if isinstance(version, bool) or not isinstance(version, int):
        raise damaged(path, f"attribute 'format_version' is {version!r}, expected an integer")
    if version not in versions:
        raise CacheError(
            f"{str(path)!r} uses cache format version {version} (written by interp "
            f"{meta.get('interp_version', '?')}); this interp ({__version__}) "
            f"{'reads' if versions == READABLE_VERSIONS else 'resumes'} version"
            f"{'s' if len(versions) > 1 else ''} {', '.join(map(str, versions))}. "
            "Rewrite the cache with `interp cache ... --overwrite`, or use the interp version that wrote it."
        )


def settings_mismatch(file_meta: dict, run_meta: dict, keys: Iterable[str] = RESUME_KEYS) -> List[str]:
    """Human-readable differences between the file's settings and a run's."""
    out = []
    for key in keys:
        a, b = file_meta.get(key), run_meta.get(key)
        if a != b:
            if key == "images_sha256":
                out.append(f"{key} differs (other images, or files whose contents changed)")
            elif isinstance(a, (list, dict)) and len(json.dumps(a)) > 120:
                out.append(f"{key} differs")
            else:
                out.append(f"{key}: file has {a!r}, this run has {b!r}")
    return out


def weights_source(pretrained: Optional[bool] = None, weights=None, seed: Optional[int] = None) -> dict:
    """The ``weights_source`` attribute: where the model's weights came from, as the writer knew it (any
    field may be None: unknown). Only used to say how to load the same weights again."""
    return {"pretrained": None if pretrained is None else bool(pretrained),
            "weights": None if weights is None else str(weights), "seed": None if seed is None else int(seed)}


def weights_advice(meta: dict) -> str:
    """How to load the weights a cache was written with ('' when the file does not say)."""
    src = meta.get("weights_source")
    if not isinstance(src, dict):
        return ""
    model = meta.get("model_name", "MODEL")
    if src.get("weights"):
        return f"It was written with the weights file {src['weights']!r}: pass --weights {src['weights']}. "
    if src.get("pretrained") is False:
        seed = src.get("seed")
        if seed is None:
            return ("It was written with random weights (--no-pretrained) whose seed it does not record: "
                    "rerun with --no-pretrained and the --seed used then (default 0), or --overwrite. ")
        return (f"It was written with random weights, seed {seed}: rerun with --no-pretrained --seed {seed} "
                f"(interp.load({model!r}, pretrained=False, seed={seed})). ")
    if src.get("pretrained"):
        return f"It was written with the hub weights of {model!r} (--pretrained, no --weights). "
    return ""


def weights_hint(file_meta: dict, run_meta: dict, problems: Sequence[str]) -> str:
    """:func:`weights_advice` when the weights are among the differences."""
    if any(p.startswith(("weights_fingerprint", "architecture_fingerprint")) for p in problems):
        return weights_advice(file_meta)
    return ""


# ---------------------------------------------------------------------------------------------- progress
def resume_position(index: np.ndarray, n_written: int, batch_size: int, n_images: int) -> int:
    """First input position a resumed run must process.

    Batches start at multiples of ``batch_size``; a batch is committed as a whole (rows and skipped
    entries), so work restarts at the batch after the one holding the last committed row.
    """
    if n_written == 0:
        return 0
    last = int(index[n_written - 1])
    return min(n_images, (last // batch_size + 1) * batch_size)


def committed_skipped(h5: h5py.File, position: int) -> int:
    """Number of /skipped entries (input order) for images before ``position``."""
    index = h5[f"{SKIPPED}/index"][...]
    return int(np.searchsorted(index, position, side="left"))


def decode_strings(values: np.ndarray) -> List[str]:
    return [v.decode("utf-8") if isinstance(v, bytes) else str(v) for v in values]
