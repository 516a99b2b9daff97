"""Training tokens for an SAE: one hook's activations, read a window of images at a time (from an HDF5 cache or
live from the model), the tokens chosen (``tokens`` x ``high_norm``), normalised, and shuffled across images.

The stream is a pure function of ``(seed, position)``: every epoch permutes the training images; the images are
dealt to ``n_shards`` sub-streams (``perm[s::n_shards]``); each sub-stream reads ``window_images /
n_shards`` images at a time, permutes all their tokens together (tokens of one image are correlated, so a
batch mixes many images) and hands them out in order. Global batch ``t`` is the concatenation over shards of
tokens ``[t * b, (t + 1) * b)`` of each sub-stream (``b = batch_size / n_shards``). So a run can seek to any
step after a crash (no buffer to save) and ``torchrun`` ranks, each reading only its own shards, together see
exactly the batches one process sees. Memory: one window of tokens per shard, whatever the data size.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Dict, List, Optional, Sequence

import numpy as np
import torch

from ..errors import InterpError, UsageError
from ..models.layout import TOKEN_SELECTIONS, TokenLayout
from ..runtime.forward import run_hooks
from ..sae_settings import HIGH_NORM_CHOICES, TOKEN_CHOICES  # noqa: F401  (declared with the settings)

CLS, REGISTER, PATCH = 0, 1, 2  # token kinds
KIND_CODES = {"cls": CLS, "registers": REGISTER, "patches": PATCH}  # TOKEN_SELECTIONS' kinds


def token_kinds(layout: TokenLayout, first_token: int, n_tokens: int) -> np.ndarray:
    """int8 [n_tokens]: CLS, REGISTER or PATCH for the stored token rows ``first_token ..`` of ``layout``."""
    idx = np.arange(first_token, first_token + n_tokens)
    kinds = np.full(n_tokens, PATCH, np.int8)
    kinds[idx < layout.n_prefix] = REGISTER
    if layout.cls_index is not None:
        kinds[idx == layout.cls_index] = CLS
    return kinds


class ActivationRows:
    """One hook's activations per image. Subclasses set the attributes and implement :meth:`read`.

    Attributes:
        n_images: images (rows); layout: the model's token layout; first_token: token index of stored row 0;
        n_tokens: stored token rows per image; d: width.
    """

    n_images: int
    layout: TokenLayout
    first_token: int
    n_tokens: int
    d: int

    def read(self, images: np.ndarray) -> np.ndarray:
        """float32 [len(images), n_tokens, d] for sorted image indices."""
        raise NotImplementedError

    def kinds(self) -> np.ndarray:
        """int8 [n_tokens]: CLS, REGISTER or PATCH for each stored token row."""
        return token_kinds(self.layout, self.first_token, self.n_tokens)


class CacheRows(ActivationRows):
    """A hook of an open cache (``interp.cache.open``), read a window of rows at a time."""

    def __init__(self, reader, hook: str):
        if hook not in reader:
            hints = ", ".join(reader.hooks)
            raise InterpError(f"{str(reader.path)!r} does not hold {hook!r} (it holds {hints}); write a cache with "
                              f"that hook: `interp cache MODEL --images DIR --hooks {hook} --out FILE.h5`")
        if reader.meta.get("norms_only"):
            raise InterpError(f"{str(reader.path)!r} holds token norms only; an SAE needs the activations "
                              "(write the cache without --norms-only)")
        self.view, self.reader = reader[hook], reader
        if len(self.view.shape) != 3:
            raise InterpError(f"{hook} is not a token activation [N, T, d] (shape {self.view.shape})")
        self.n_images, self.n_tokens, self.d = (int(s) for s in self.view.shape)
        self.layout = reader.layout
        self.first_token = int((reader.meta.get("token_rows") or (0, self.n_tokens))[0])

    def read(self, images: np.ndarray) -> np.ndarray:
        # one slice per run of consecutive rows: h5py's list indexing read a window of 64 scattered rows of
        # ViT-S tokens 18x slower (0.45 s against 0.025 s; benchmarks/sae_step_profile.py)
        images = np.asarray(images, np.int64)
        if len(images) == 0:
            return np.zeros((0, self.n_tokens, self.d), np.float32)
        runs = np.split(images, np.flatnonzero(np.diff(images) != 1) + 1)
        return np.concatenate([np.asarray(self.view[int(r[0]):int(r[-1]) + 1], dtype=np.float32) for r in runs])


class LiveRows(ActivationRows):
    """A hook computed by running the model over images (no cache): forward passes of ``batch_size`` images."""

    def __init__(self, model, images, hook: str, batch_size: int = 32):
        from ..cache.image_feed import image_feed

        self.model, self.hook, self.batch_size = model, hook, batch_size
        self.source = image_feed(images, model)
        self.n_images = len(self.source)
        self.layout, self.first_token = model.layout, 0
        x = self._forward(np.arange(min(1, self.n_images)))
        if x.ndim != 3:
            raise UsageError(f"--hook {hook!r} is not a token activation [N, T, d] (shape {list(x.shape)}); train "
                             "the SAE on a block output such as blocks.N.hook_resid_post (`interp hooks MODEL` lists "
                             "the hooks and their shapes)")
        self.n_tokens, self.d = int(x.shape[1]), int(x.shape[2])

    @torch.no_grad()
    def _forward(self, images: np.ndarray) -> np.ndarray:
        pixels = [self.source.load(int(i), int(i) + 1).pixels for i in images]
        if any(p is None for p in pixels):
            bad = [self.source.ids[int(i)] for i, p in zip(images, pixels) if p is None]
            raise InterpError(f"cannot read image {bad[0]!r}; remove it or cache the images first")
        device = next(self.model.parameters()).device
        out = []
        for i in range(0, len(pixels), self.batch_size):
            batch = torch.cat(pixels[i:i + self.batch_size]).to(device)
            acts = run_hooks(self.model, batch, [self.hook]).acts[self.hook]  # stops after the hook's block
            out.append(acts.float().cpu().numpy())
        return np.concatenate(out) if out else np.zeros((0, 0, 0), np.float32)

    def read(self, images: np.ndarray) -> np.ndarray:
        return self._forward(np.asarray(images))


def token_mask(kinds: np.ndarray, tokens: str, high_norm: str, outliers: Optional[np.ndarray],
               n_images: int) -> np.ndarray:
    """Bool [n_images, n_tokens]: the training tokens of each image.

    ``outliers``: Bool [n_images, P] high-norm patches (the detection's), needed unless ``high_norm`` is include.
    """
    if tokens not in TOKEN_CHOICES:
        raise InterpError(f"tokens must be one of {TOKEN_CHOICES}, got {tokens!r}")
    if high_norm not in HIGH_NORM_CHOICES:
        raise InterpError(f"high_norm must be one of {HIGH_NORM_CHOICES}, got {high_norm!r}")
    base = np.isin(kinds, [KIND_CODES[k] for k in TOKEN_SELECTIONS[tokens]])
    if not base.any():
        raise InterpError(f"the stored tokens hold no {tokens} token (model layout / cache --tokens); choose "
                          f"--tokens among those the cache holds")
    if high_norm == "include":
        return np.repeat(base[None], n_images, 0)
    if outliers is None:
        raise InterpError(f"--high-norm {high_norm} needs the high-norm patches: the stored tokens hold no patch")
    if tokens in ("cls", "registers"):
        raise InterpError(f"--high-norm {high_norm} selects patch tokens; it does not apply to --tokens {tokens}")
    high = np.zeros((n_images, kinds.size), bool)
    high[:, kinds == PATCH] = outliers
    return base[None] & (~high if high_norm == "exclude" else high)


@dataclass(frozen=True)
class Normalisation:
    """``(x - mean) / scale``: mean-centred, unit mean squared norm on the tokens it was fitted on."""

    mean: torch.Tensor  # [d] float32
    scale: float
    n_tokens: int

    def apply(self, x: torch.Tensor) -> torch.Tensor:
        return (x - self.mean) / self.scale

    def to_dict(self) -> Dict:
        return {"mean_centred": True, "scale": self.scale, "fitted_on_tokens": self.n_tokens,
                "rule": "x_sae = (x - mean) / scale, scale**2 = mean ||x - mean||^2 over the fitting tokens"}


def fit_normalisation(read_tokens: Callable[[np.ndarray], np.ndarray], images: np.ndarray, d: int) -> Normalisation:
    """Mean and scale over the chosen tokens of ``images`` (a sample), in float64. ``read_tokens(images) ->
    float32 [m, d]``: the training tokens of sorted images."""
    total, sq, count = np.zeros(d), 0.0, 0
    chunks = [np.sort(images[i:i + 64]) for i in range(0, len(images), 64)]
    for chunk in chunks:
        x = read_tokens(chunk).astype(np.float64)
        total += x.sum(0)
        count += len(x)
    if count == 0:
        raise InterpError("no training token in the normalisation sample: the token choice selects nothing")
    mean = total / count
    for chunk in chunks:
        x = read_tokens(chunk).astype(np.float64)
        sq += float(((x - mean) ** 2).sum())
    scale = float(np.sqrt(sq / count)) or 1.0
    return Normalisation(torch.tensor(mean, dtype=torch.float32), scale, count)


class TokenStream:
    """The shuffled token stream of the module docstring, for the shards ``shards`` of ``n_shards``.

    ``read_tokens(images) -> float32 [m, d]`` gives the chosen tokens of sorted images, in image order.
    """

    def __init__(self, images: np.ndarray, counts: np.ndarray, read_tokens: Callable[[np.ndarray], np.ndarray],
                 seed: int, window_images: int, batch_size: int, n_shards: int, shards: Sequence[int]):
        if batch_size % n_shards:
            raise InterpError(f"the batch size ({batch_size}) must be a multiple of the data shards ({n_shards})")
        if len(images) < n_shards:
            raise InterpError(f"{len(images)} training images cannot fill {n_shards} data shards; give more images "
                              "or fewer --data-shards")
        self.images, self.counts, self.read_tokens = np.asarray(images), np.asarray(counts), read_tokens
        self.seed, self.n_shards, self.shards = seed, n_shards, list(shards)
        self.per_window = max(1, window_images // n_shards)
        self.b = batch_size // n_shards
        self._subs: Dict[int, "_SubStream"] = {}

    def epoch_windows(self, epoch: int, shard: int) -> List[np.ndarray]:
        """The windows (image index arrays) of one shard in one epoch."""
        perm = np.random.default_rng([self.seed, epoch]).permutation(len(self.images))
        mine = perm[shard::self.n_shards]
        return [mine[i:i + self.per_window] for i in range(0, len(mine), self.per_window)]

    def batch(self, step: int) -> torch.Tensor:
        """float32 [b * len(shards), d]: this process's part of global batch ``step`` (steps in increasing order)."""
        parts = []
        for s in self.shards:
            sub = self._subs.get(s)
            if sub is None or sub.position > step * self.b:
                sub = self._subs[s] = _SubStream(self, s, step * self.b)
            parts.append(sub.take(step * self.b, self.b))
        return torch.from_numpy(np.concatenate(parts))


class _SubStream:
    """One shard's tokens, window by window (only the current window is in memory)."""

    def __init__(self, stream: TokenStream, shard: int, position: int):
        self.stream, self.shard = stream, shard
        self.epoch, self.windows, self.w, self.start = 0, stream.epoch_windows(0, shard), 0, 0  # start: window's 1st token
        self.tokens: Optional[np.ndarray] = None
        self.position = 0
        self._skip_to(position)

    def _window_size(self) -> int:
        return int(self.stream.counts[self.windows[self.w]].sum())

    def _next_window(self) -> None:
        self.start += self._window_size()
        self.tokens, self.w = None, self.w + 1
        if self.w == len(self.windows):
            self.epoch, self.w = self.epoch + 1, 0
            self.windows = self.stream.epoch_windows(self.epoch, self.shard)
            if self.epoch > 1 and self.start == 0:
                raise InterpError("a data shard has no training token; give more images or fewer --data-shards")

    def _skip_to(self, position: int) -> None:
        while self.start + self._window_size() <= position:
            self._next_window()
        self.position = position

    def _load(self) -> np.ndarray:
        images = self.stream.images[np.sort(self.windows[self.w])]
        tokens = self.stream.read_tokens(images)
        order = np.random.default_rng([self.stream.seed, self.epoch, self.shard, self.w, 1]).permutation(len(tokens))
        return tokens[order]

    def take(self, position: int, n: int) -> np.ndarray:
        self._skip_to(position)
        out = []
        while n > 0:
            if self.tokens is None:
                self.tokens = self._load()
            offset = self.position - self.start
            piece = self.tokens[offset:offset + n]
            out.append(piece)
            n -= len(piece)
            self.position += len(piece)
            if self.position - self.start >= len(self.tokens):
                self._next_window()
        return np.concatenate(out)
