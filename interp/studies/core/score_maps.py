"""Patch Score maps (docs/methods.md section 3): ``S_p = cos(x_p, g)`` between each patch token and a global
vector ``g``, per image, over a source. The aggregation studies (Patch Score, PiB, selective CLS) and the
segmentation study read the same maps; the Patch Score study (:mod:`interp.studies.aggregation.patch_score`)
describes the references and adds the distributions.

>>> maps = compute_score_maps(source, hook=FINAL, reference="cls", progress=False)   # [N, h, w] cosines
>>> maps.shape
torch.Size([4, 14, 14])
"""
from __future__ import annotations

from typing import Dict, List, Optional, Sequence, Tuple

import torch

from ..._progress import tqdm
from ...errors import InterpError
from ...interventions.selective_aggregation import selective_aggregate
from ...interventions.selective_cls import SelectiveCLS
from ...models.layout import TokenLayout
from ...runtime.source import ActivationSource, n_batches, split_tokens
from .options import FINAL, REFERENCES, needed_hooks  # torch-free: the studies' configs read them too


def global_vector(acts: Dict[str, torch.Tensor], layout: TokenLayout, reference: str,
                  selective: Optional[SelectiveCLS] = None) -> torch.Tensor:
    """The reference vector g [b, d] from a batch's activations (see the module docstring)."""
    if reference == "pooled":
        return acts["hook_pooled"]
    cls, patches = split_tokens(acts[FINAL], layout)
    if reference == "cls":
        if cls is None:
            raise InterpError("reference='cls' needs the CLS token: this model has none (or the cache kept patch "
                              "rows only); use reference='pooled' or 'selective'")
        return cls
    if reference == "selective":
        spec = selective or SelectiveCLS()
        return selective_aggregate(patches, **spec.params())[0]
    raise InterpError(f"reference={reference!r} is not one of {list(REFERENCES)}")


def cosine_map(patches: torch.Tensor, g: torch.Tensor, grid: Tuple[int, int]) -> torch.Tensor:
    """cos(x_p, g) for patches [b, n, d] and g [b, d] -> [b, h, w] float32."""
    if patches.shape[-1] != g.shape[-1]:
        raise InterpError(f"patch tokens have width {patches.shape[-1]} but the global vector has width "
                          f"{g.shape[-1]}; pick a hook and reference of the same width")
    cos = torch.nn.functional.cosine_similarity(patches.float(), g.float()[:, None, :], dim=-1)
    return cos.reshape(cos.shape[0], *grid)


def score_maps_from_acts(acts: Dict[str, torch.Tensor], layout: TokenLayout, hook: str = FINAL,
                         reference: str = "cls", selective: Optional[SelectiveCLS] = None) -> torch.Tensor:
    """Patch Score maps [b, h, w] of one batch of activations (which must hold :func:`needed_hooks`)."""
    _, patches = split_tokens(acts[hook], layout)
    g = global_vector(acts, layout, reference, selective)
    if reference == "pooled" and g.shape[-1] != patches.shape[-1]:
        raise InterpError(f"the pooled vector (hook_pooled) has width {g.shape[-1]} but the tokens have width "
                          f"{patches.shape[-1]} (the model projects before its head), so their cosine is "
                          "undefined; use reference='cls' or 'selective'")
    return cosine_map(patches, g, layout.grid)


@torch.no_grad()
def check_source(source: ActivationSource, hooks: Sequence[str]) -> None:
    """Raise unless the source can give these hooks in full (a norm-only cache cannot)."""
    source.require(hooks)
    if source.norms_only:
        raise InterpError("this cache stores token norms only; Patch Scores need the token vectors: "
                          "write the cache without --norms-only")


def compute_score_maps(source: ActivationSource, hook: str = FINAL, reference: str = "cls",
                       selective: Optional[SelectiveCLS] = None, batch_size: Optional[int] = None,
                       progress: bool = True) -> torch.Tensor:
    """Patch Score maps of every image of the source: [N, h, w] float32."""
    hooks = needed_hooks(hook, reference)
    check_source(source, hooks)
    maps: List[torch.Tensor] = []
    bs = batch_size or source.batch_size
    for batch in tqdm(source.batches(hooks, bs), total=n_batches(source, bs), disable=not progress,
                      desc="patch scores", unit="batch", leave=False):
        maps.append(score_maps_from_acts(batch.acts, batch.layout, hook, reference, selective))
    return torch.cat(maps) if maps else torch.zeros(0, *source.layout.grid)
