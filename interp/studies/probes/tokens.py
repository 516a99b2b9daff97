"""The tokens the probes study fits and scores: which patches are high-norm, and the fold of one streaming
pass (alone or shared with other studies, :mod:`interp.runtime.passes`) that keeps a seeded sample of
each image's patch tokens (with their input pixels) and one token per kind per image.

High-norm patches are decided on the un-normalised residual stream of a detection block, through the one
detection contract (:mod:`interp.detection.detection`), never from the norms of the probed hook: probing
``hook_norm_final`` must not pick outliers after the final LayerNorm (which evens the norms out).
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Dict, List, Optional, Tuple

import numpy as np
import torch

from ...errors import InterpError
from ...models.inputs.preprocessing import patch_pixels
from ...runtime.source import split_tokens
from ...detection.detection import DetectionLike, RunOptions, detect
from ...detection.detection import Detection
from ...runtime.passes import Fold
from ...runtime.source import ActivationSource
from .linear_probe import image_key
from .scores import Split

TRAIN, TEST, VAL = 0, 1, 2  # an image's role in the probes study


def high_norm_mask(source: ActivationSource, outliers: Optional[torch.Tensor] = None,
                   detection: DetectionLike = None, options: Optional[RunOptions] = None
                   ) -> Tuple[torch.Tensor, Optional[Detection]]:
    """(Bool[N, P] high-norm patches, the Detection they came from or None for a given mask).

    ``outliers``: a given Bool[N, t] or [N, P] mask (then no ``detection``). Otherwise
    :func:`~interp.detection.detection.detect` resolves ``detection`` (a Detection or a DetectionSpec; None:
    "auto", the block chosen) on ``source`` (the block's ``hook_resid_post``)."""
    n, layout = len(source), source.layout
    if outliers is None:
        found = detect(source, detection, options)
        return found.outliers, found
    if detection is not None:
        raise InterpError("give outliers= (a mask) or detection= (a Detection or DetectionSpec), not both")
    mask = torch.as_tensor(outliers).bool()
    if mask.ndim == 2 and mask.shape[1] == layout.n_tokens and mask.shape[1] != layout.n_patches:
        mask = mask[:, layout.patch_slice]
    if tuple(mask.shape) != (n, layout.n_patches):
        raise InterpError(f"outliers must be bool [N, t] or [N, P] = [{n}, {layout.n_patches}], got "
                          f"{tuple(mask.shape)}")
    return mask, None


def _pick(rng: np.random.Generator, idx: np.ndarray, cap: int) -> np.ndarray:
    return idx if idx.size <= cap else np.sort(rng.choice(idx, size=cap, replace=False))


@dataclass
class _Tokens:
    """Sampled tokens of one side, gathered image by image (see :class:`~.scores.Split`), given out in the order
    of the images' keys (:func:`~.linear_probe.image_key`), not the pass's: a probe trained on mini-batches sees
    the same rows in the same order whatever the order of the images."""

    keys: List[int] = field(default_factory=list)
    x: List[torch.Tensor] = field(default_factory=list)
    pos: List[torch.Tensor] = field(default_factory=list)
    high: List[torch.Tensor] = field(default_factory=list)
    px: List[torch.Tensor] = field(default_factory=list)

    def add(self, key: int, patches, pixels, high, idx) -> None:
        self.keys.append(key)
        sel = torch.from_numpy(idx)
        self.x.append(patches[sel])
        self.pos.append(sel)
        self.high.append(high[sel])
        if pixels is not None:
            self.px.append(pixels[sel])

    def split(self, d: int) -> Split:
        if not self.x:
            return Split(torch.zeros(0, d), torch.zeros(0, dtype=torch.long), torch.zeros(0, dtype=torch.bool))
        order = sorted(range(len(self.x)), key=self.keys.__getitem__)
        return Split(torch.cat([self.x[i] for i in order]), torch.cat([self.pos[i] for i in order]),
                     torch.cat([self.high[i] for i in order]),
                     torch.cat([self.px[i] for i in order]) if self.px else None)


def _label_tokens(tokens: Optional[torch.Tensor], patches: torch.Tensor, high: torch.Tensor, layout,
                  rng: np.random.Generator) -> Dict[str, torch.Tensor]:
    """One token per kind for one image: tokens [t, d] (all rows) or None, patches [P, d], high [P]."""
    out: Dict[str, torch.Tensor] = {}
    if tokens is not None and layout.cls_index is not None:
        out["cls"] = tokens[layout.cls_index]
    if tokens is not None and layout.register_slice.stop > layout.register_slice.start:
        out["register"] = tokens[layout.register_slice.start]
    for kind, idx in (("normal", np.flatnonzero(~high.numpy())), ("high_norm", np.flatnonzero(high.numpy()))):
        if idx.size:
            out[kind] = patches[int(rng.choice(idx))]
    return out


@dataclass
class Collected:
    """What one pass kept: the three sides' token samples, one token per kind per image
    (kind -> [(image index, Tensor[d])], when labels exist) and whether input pixels were available."""

    train: Split
    val: Split
    test: Split
    label_tokens: Dict[str, List[Tuple[int, torch.Tensor]]]
    has_pixels: bool


class TokenSample:
    """The probes' token pass as a :class:`~interp.runtime.passes.Fold` (``self.fold``): each batch's
    patch tokens of ``hook`` sampled per image and role, their input pixels (the forward's inputs on a live
    source, else ``images``), and one token per kind per image when ``want_labels``.

    ``roles`` [N]: TRAIN, TEST or VAL per image; ``caps``: tokens kept per image and role (test images keep up
    to that many of each group). The sample of image g uses rng([seed, image_key(id of g)]), so it does not
    depend on the batch size, on which other studies share the pass, or on the image's place in the set."""

    def __init__(self, source: ActivationSource, hook: str, images: Optional[torch.Tensor], high_mask: torch.Tensor,
                 roles: torch.Tensor, want_labels: bool, caps: Dict[int, int], seed: int, want_pixels: bool = True):
        self.layout, self.hook, self.images, self.want_pixels = source.layout, hook, images, want_pixels
        self.high_mask, self.roles, self.want_labels, self.caps, self.seed = high_mask, roles, want_labels, caps, seed
        self.keys = [image_key(i) for i in source.ids]
        self.sides = {TRAIN: _Tokens(), TEST: _Tokens(), VAL: _Tokens()}
        self.label_tokens: Dict[str, List[Tuple[int, torch.Tensor]]] = {}
        self.has_pixels = want_pixels and (images is not None or source.is_live) and len(source) > 0
        self.d = 0
        self.fold = Fold([hook], self.add, images=want_pixels and images is None and source.is_live)

    def add(self, batch) -> None:
        layout, start, tokens = self.layout, batch.start, batch.acts[self.hook]
        imgs = None
        if self.want_pixels:
            imgs = self.images[start:start + len(batch)].float() if self.images is not None else batch.images
        patches = split_tokens(tokens, layout)[1]
        self.d = patches.shape[-1]
        pixels = patch_pixels(imgs, layout.grid) if imgs is not None else None
        for i in range(tokens.shape[0]):
            g, high = start + i, self.high_mask[start + i]
            rng = np.random.default_rng([self.seed, self.keys[g]])  # the image's own, wherever it is
            role = int(self.roles[g])
            if role == TEST:
                idx = np.concatenate([_pick(rng, np.flatnonzero(~high.numpy()), self.caps[TEST]),
                                      _pick(rng, np.flatnonzero(high.numpy()), self.caps[TEST])])
            else:
                idx = _pick(rng, np.arange(len(high)), self.caps[role])
            self.sides[role].add(self.keys[g], patches[i], None if pixels is None else pixels[i], high, idx)
            if self.want_labels:
                full = tokens[i] if tokens.shape[1] == layout.n_tokens else None
                for kind, vec in _label_tokens(full, patches[i], high, layout, rng).items():
                    self.label_tokens.setdefault(kind, []).append((g, vec.clone()))

    def collected(self) -> Collected:
        """What the pass kept (call after it)."""
        s = self.sides
        labels = {kind: sorted(found, key=lambda item: self.keys[item[0]]) for kind, found in self.label_tokens.items()}
        return Collected(s[TRAIN].split(self.d), s[VAL].split(self.d), s[TEST].split(self.d), labels,
                         self.has_pixels)
