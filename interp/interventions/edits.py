"""The arithmetic of every MLP-activation edit, as pure functions (one per edit).

Each function takes ``sel`` [b, t, k]: the k selected neurons of the MLP activation ``h`` [b, t, d_mlp]
(token axis ordered ``[prefix tokens (n_prefix rows), patches]``), and returns the edited [b, t, k].
``edit_columns`` writes the result back into ``h``. Every statistic (max, mean, std) is taken per
image, so a batch of b images gives the same values as b batches of one. All functions are
out-of-place, so autograd and cached activations stay valid.

The hook path (``blocks.{l}.mlp.hook_post``) and the plain-module path (``blocks[l].mlp.drop1``) both call
these through the modules in :mod:`interp.interventions.modules`.
"""
from __future__ import annotations

from typing import Any, Callable, Dict, Optional

import torch

from ..errors import InterpError

ABLATION_MODES = ("zero", "mean", "resample")
TOKEN_SETS = ("all", "patches")
VALUE_MODES = ("layer_max", "neuron_max")
PATCH_FILLS = ("zero", "mean", "outliers")


def edit_columns(h: torch.Tensor, idx: torch.Tensor, edit: Callable[[torch.Tensor], torch.Tensor]) -> torch.Tensor:
    """``h`` [b, t, D] with columns ``idx`` [k] replaced by ``edit(h[..., idx])`` ([b, t, k] -> [b, t, k])."""
    idx = idx.to(h.device)
    return h.index_copy(h.dim() - 1, idx, edit(h.index_select(h.dim() - 1, idx)).to(h.dtype))


def signed_abs_max(sel: torch.Tensor) -> torch.Tensor:
    """Per image, the entry of largest absolute value over all tokens and neurons, sign kept.

    sel [b, t, k] -> [b].
    """
    flat = sel.reshape(sel.shape[0], -1)
    return flat.gather(1, flat.abs().argmax(dim=1, keepdim=True)).squeeze(1)


def register_value(sel: torch.Tensor, value: str) -> torch.Tensor:
    """The value written for each image and neuron, from all of that image's tokens. sel [b, t, k] -> [b, k].

    ``layer_max``: one scalar per image (:func:`signed_abs_max`) for every neuron (the reference code);
    ``neuron_max``: each neuron's own maximum over the tokens (older code).
    """
    if value == "layer_max":
        return signed_abs_max(sel)[:, None].expand(-1, sel.shape[2])
    if value == "neuron_max":
        return sel.amax(dim=1)
    raise ValueError(f"value={value!r} is not one of {list(VALUE_MODES)}")


def derangement(n: int, generator: torch.Generator) -> torch.Tensor:
    """A random permutation of ``range(n)`` (n >= 2) with no fixed point: entry i names the image i reads from."""
    order = torch.randperm(n, generator=generator)
    shift = int(torch.randint(1, n, (1,), generator=generator))
    source = torch.empty_like(order)
    source[order] = order.roll(shift)  # image order[i] reads image order[i - shift]
    return source


class Donors:
    """Another image's values for each image of a batch (the ``resample`` replacement), drawn from one seeded
    generator that advances over every forward: a derangement of the batch, or for a batch of one an image of
    the previous batch seen under the same ``key`` (kept, detached, for that case)."""

    def __init__(self, seed: int):
        self.generator = torch.Generator().manual_seed(int(seed))
        self.previous: Dict[Any, torch.Tensor] = {}

    def draw(self, key: Any, sel: torch.Tensor) -> torch.Tensor:
        """``sel`` [b, ...] -> [b, ...]: row i holds the values of another image at the same positions."""
        previous = self.previous.get(key)
        if sel.shape[0] > 1:
            donors = sel[derangement(sel.shape[0], self.generator).to(sel.device)]
        elif previous is not None and previous.shape[1:] == sel.shape[1:]:
            donors = previous[int(torch.randint(0, len(previous), (1,), generator=self.generator))][None]
        else:
            raise InterpError("mode='resample' takes each image's values from another image: run at least two "
                              "images (a batch of one reads the previous batch)")
        self.previous[key] = sel.detach()
        return donors


def ablate(sel: torch.Tensor, n_prefix: int, mode: str, tokens: str, means: Optional[torch.Tensor],
           donors: Optional[torch.Tensor] = None) -> torch.Tensor:
    """Set the neurons to 0 (``mode="zero"``), to ``means`` [k] (``"mean"``) or to another image's values
    (``"resample"``: ``donors`` [b, t, k], the same tokens of other images) on all tokens or only patches."""
    if mode == "resample":
        fill = donors.to(sel)
    else:
        fill = torch.zeros((), dtype=sel.dtype, device=sel.device) if mode == "zero" else means.to(sel)
    if tokens == "all":
        return fill.expand(sel.shape)
    patches = fill[:, n_prefix:] if fill.dim() == 3 else fill.expand(sel.shape[0], sel.shape[1] - n_prefix,
                                                                      sel.shape[2])
    return torch.cat([sel[:, :n_prefix], patches], dim=1)


def relocate(sel: torch.Tensor, n_prefix: int, target: torch.Tensor, value: str) -> torch.Tensor:
    """Write the per-image value (:func:`register_value`) on the ``target`` patches [n] (bool), 0 on the others.

    Prefix tokens are left as they are.
    """
    n_patches = sel.shape[1] - n_prefix
    if target.numel() != n_patches:
        raise InterpError(f"the relocation mask has {target.numel()} cells but the input has {n_patches} patches; "
                          "draw the mask on the patch grid of this input size (model.layout_for(img_size).grid)")
    v = register_value(sel, value)  # [b, k]
    target = target.to(sel.device).reshape(1, n_patches, 1)
    patches = torch.where(target, v[:, None, :], torch.zeros((), dtype=sel.dtype, device=sel.device))
    return torch.cat([sel[:, :n_prefix], patches], dim=1)


def fill_patches(patches: torch.Tensor, patch_fill: str) -> torch.Tensor:
    """Register neurons on the patch tokens [b, n, k] after the register takes their role.

    ``zero``: 0; ``mean``: the image's mean over patches; ``outliers``: values above mean + 1 std
    (over the image's patches, unbiased std as ``torch.std``) replaced by the mean, others kept.
    """
    if patch_fill == "zero":
        return torch.zeros_like(patches)
    mean = patches.mean(dim=1, keepdim=True)
    if patch_fill == "mean":
        return mean.expand(patches.shape)
    if patch_fill == "outliers":
        std = patches.std(dim=1, keepdim=True)
        return torch.where(patches > mean + std, mean, patches)
    raise ValueError(f"patch_fill={patch_fill!r} is not one of {list(PATCH_FILLS)}")


def move_to_register(sel: torch.Tensor, n_prefix: int, extra_start: Optional[int], n_extra: int, value: str,
                     patch_fill: str) -> torch.Tensor:
    """Test-time register edit: write v into the register rows ``[extra_start, extra_start + n_extra)``
    and replace the neurons on the patches by ``fill_patches``; CLS and trained registers are untouched.

    With ``n_extra = 0`` only the patches are edited (the attention-bias variant).
    """
    prefix = sel[:, :n_prefix]
    if n_extra:
        v = register_value(sel, value)[:, None, :].expand(-1, n_extra, -1)  # [b, n_extra, k]
        prefix = torch.cat([prefix[:, :extra_start], v, prefix[:, extra_start + n_extra:]], dim=1)
    return torch.cat([prefix, fill_patches(sel[:, n_prefix:], patch_fill)], dim=1)
