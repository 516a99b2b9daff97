"""Register-neuron scores (Jiang et al.; docs/methods.md section 2), streamed batch by batch.

``score[l, n] = mean over images with outliers of ( mean over p in O_i of |a[l, n](p)| )`` where ``a`` is
the MLP hidden activation (``blocks.{l}.mlp.hook_post``) and ``O_i`` the outlier positions of image ``i``.

The defaults reproduce the reference code (``find_register_neurons`` in ``nickjiang2378/test-time-registers``
``shared/algorithms.py``) exactly:

* ``positions="all"``: ``O_i`` = every token of the detection block's output (CLS and registers included)
  whose L2 norm is strictly above the threshold. ``"patches"``: patch tokens only (this project's earlier
  behaviour).
* images without an outlier are skipped (they do not count in the mean);
* ``sparsity="per_image"``: for each image and layer, a neuron scores 0 for that image unless at least
  ``sparsity_fraction`` of that image's tokens (all of them) have signed activation below
  ``sparsity_activation``; the image still counts in the mean. ``"pooled"``: the same test over all tokens
  of all scored images at once (this project's earlier behaviour; failing neurons score 0). ``None`` (or
  ``"none"``): no filter (the reference function's default; its notebook turns the filter on).

Ranking (:func:`rank_neurons`): layers above ``highest_layer`` are dropped, scores sorted descending, ties
broken by lower layer then lower neuron index (the reference's ``torch.sort`` leaves tie order unspecified).

>>> acc = RegisterScoreAccumulator(n_layers=2, n_neurons=8, sparsity=None)
>>> acts = {0: torch.zeros(1, 5, 8), 1: torch.zeros(1, 5, 8)}    # {layer: [b, t, m]} MLP activations
>>> acts[1][0, 3, 6] = 4.0                                         # neuron 6 of block 1 fires on token 3
>>> norms = torch.tensor([[1.0, 1.0, 1.0, 50.0, 1.0]])             # [b, t] detection-block norms
>>> acc.update(acts, norms, threshold=30.0)                        # token 3 is the outlier: image used
tensor([True])
>>> scores = acc.finalize()                                        # [2, 8] float64
>>> rank_neurons(scores, top_k=1, highest_layer=1)
[{'layer': 1, 'neuron': 6, 'score': 4.0}]
"""
from __future__ import annotations

from typing import Dict, List, Mapping, Optional

import torch

from ...errors import InterpError

POSITIONS = ("all", "patches")
SPARSITY = ("per_image", "pooled", "none", None)


class RegisterScoreAccumulator:
    """Running sums for register-neuron scores over batches of images.

    Args:
        n_layers: number of scored layers; ``update`` needs activations of layers ``0 .. n_layers - 1``.
        n_neurons: MLP width m.
        positions: ``"all"`` (reference) or ``"patches"`` (needs ``patch_slice``).
        sparsity: ``"per_image"`` (reference notebook), ``"pooled"`` or ``None``/``"none"``.
        patch_slice: the patch tokens on the token axis (``model.layout.patch_slice``).
        sparsity_activation, sparsity_fraction: the filter's constants (reference: 0.5 and 0.5).
    """

    def __init__(self, n_layers: int, n_neurons: int, *, positions: str = "all",
                 sparsity: Optional[str] = "per_image", patch_slice: Optional[slice] = None,
                 sparsity_activation: float = 0.5, sparsity_fraction: float = 0.5):
        if positions not in POSITIONS:
            raise InterpError(f"positions={positions!r}: use one of {POSITIONS}")
        if sparsity not in SPARSITY:
            raise InterpError(f"sparsity={sparsity!r}: use one of {SPARSITY}")
        if positions == "patches" and patch_slice is None:
            raise InterpError('positions="patches" needs patch_slice (e.g. model.layout.patch_slice)')
        self.n_layers, self.n_neurons = int(n_layers), int(n_neurons)
        self.positions, self.patch_slice = positions, patch_slice
        self.sparsity = None if sparsity == "none" else sparsity
        self.sparsity_activation, self.sparsity_fraction = float(sparsity_activation), float(sparsity_fraction)
        self.score_sum = torch.zeros(self.n_layers, self.n_neurons, dtype=torch.float64)  # [L, m]
        self.below_sum = torch.zeros(self.n_layers, self.n_neurons, dtype=torch.float64)  # [L, m] (pooled)
        self.n_images = 0          # images seen
        self.n_images_used = 0     # images with at least one outlier position
        self.n_outlier_tokens = 0  # outlier positions over the used images
        self.n_tokens_used = 0     # tokens of the used images (pooled filter's denominator)

    def outlier_mask(self, detection_norms: torch.Tensor, threshold: float) -> torch.Tensor:
        """Outlier positions: bool [b, t], norm strictly above ``threshold`` (only patch tokens for
        ``positions="patches"``). ``detection_norms``: [b, t] norms of the detection block's output."""
        mask = detection_norms > threshold
        if self.positions == "patches":
            keep = torch.zeros_like(mask)
            keep[:, self.patch_slice] = True
            mask = mask & keep
        return mask

    def update(self, acts: Mapping[int, torch.Tensor], detection_norms: torch.Tensor,
               threshold: float) -> torch.Tensor:
        """Add one batch.

        Args:
            acts: ``{layer: [b, t, m]}`` MLP activations for every layer ``0 .. n_layers - 1``.
            detection_norms: [b, t] token norms of the detection block's output (all tokens).
            threshold: outlier norm (strict ``>``), or each image's own cut as a [b, 1] tensor.

        Returns:
            bool [b]: which images of the batch had outliers (were scored).
        """
        missing = [l for l in range(self.n_layers) if l not in acts]
        if missing:
            raise InterpError(f"activations of layers {missing} are missing; pass blocks.{{l}}.mlp.hook_post "
                              f"for every layer 0..{self.n_layers - 1}")
        norms = detection_norms.detach().cpu()
        cut = threshold if isinstance(threshold, torch.Tensor) else float(threshold)  # [b, 1] or one norm
        mask = self.outlier_mask(norms, cut)  # [b, t]
        used = mask.any(dim=1)  # [b]
        self.n_images += int(norms.shape[0])
        if not bool(used.any()):
            return used
        mask = mask[used].to(torch.float64)  # [u, t]
        counts = mask.sum(dim=1, keepdim=True)  # [u, 1]
        for layer in range(self.n_layers):
            a = acts[layer].detach()
            if a.shape[:2] != norms.shape or a.shape[2] != self.n_neurons:
                raise InterpError(f"layer {layer}: activations {tuple(a.shape)} do not match norms "
                                  f"{tuple(norms.shape)} and width {self.n_neurons}")
            a = a[used.to(a.device)].cpu().to(torch.float64)  # [u, t, m]
            per_image = torch.einsum("utm,ut->um", a.abs(), mask) / counts  # [u, m]
            below = (a < self.sparsity_activation).sum(dim=1)  # [u, m]
            if self.sparsity == "per_image":
                per_image = per_image * (below >= self.sparsity_fraction * a.shape[1])
            elif self.sparsity == "pooled":
                self.below_sum[layer] += below.sum(dim=0)
            self.score_sum[layer] += per_image.sum(dim=0)
        self.n_images_used += int(used.sum())
        self.n_outlier_tokens += int(mask.sum())
        self.n_tokens_used += int(mask.shape[0] * mask.shape[1])
        return used

    def finalize(self) -> torch.Tensor:
        """Scores float64 [n_layers, n_neurons].

        Raises:
            InterpError: no image had an outlier (lower the threshold or use more images).
        """
        if self.n_images_used == 0:
            raise InterpError(f"none of the {self.n_images} images has a token above the threshold: lower the "
                              "threshold (a number or pNN) or use more images")
        scores = self.score_sum / self.n_images_used
        if self.sparsity == "pooled":
            scores = scores * (self.below_sum >= self.sparsity_fraction * self.n_tokens_used)
        return scores


def rank_neurons(scores: torch.Tensor, top_k: Optional[int] = None, highest_layer: Optional[int] = None,
                 lowest_layer: int = 0) -> List[Dict]:
    """The best neurons: ``[{"layer", "neuron", "score"}]``, best first.

    Args:
        scores: [L, m] from :meth:`RegisterScoreAccumulator.finalize`.
        top_k: how many (None: all).
        highest_layer, lowest_layer: keep layers ``lowest_layer <= l <= highest_layer`` (None: no upper
            limit; the reference's ``filter_layers`` spells that ``-1``; here negative values are an error).

    Ties: higher score first, then lower layer, then lower neuron index (deterministic).
    """
    n_layers, n_neurons = scores.shape
    if highest_layer is not None and highest_layer < 0:
        raise InterpError(f"highest_layer={highest_layer}: give a block index >= 0, or None for no limit")
    top = n_layers - 1 if highest_layer is None else min(int(highest_layer), n_layers - 1)
    window = scores[lowest_layer:top + 1]
    flat = window.flatten()
    values, idx = torch.sort(flat, descending=True, stable=True)
    if top_k is not None:
        values, idx = values[:top_k], idx[:top_k]
    return [{"layer": int(i) // n_neurons + lowest_layer, "neuron": int(i) % n_neurons, "score": float(v)}
            for v, i in zip(values, idx)]
