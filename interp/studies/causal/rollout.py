"""Attention rollout and gradient-weighted relevance (docs/causal.md): where the CLS token's output comes from,
read from the attention maps.

>>> result = rollout_study(source, progress=False)          # planted_vit
>>> len(result.rollout_map), len(result.rollout_map[0])        # the CLS row on the patch grid
(14, 14)

**Rollout** (Abnar and Zuidema 2020), as ``hila-chefer/Transformer-Explainability`` computes it
(``baselines/ViT/ViT_explanation_generator.py``, ``compute_rollout_attention``): each block's attention averaged
over heads, plus the identity (the residual path), each row renormalised to sum 1, multiplied block after block
from ``start_layer``. **Relevance** (Chefer, Gur and Wolf 2021, rules 5 and 6 as
``hila-chefer/Transformer-MM-Explainability``'s ViT notebook computes them): ``R = I``, then per block
``R += mean_h((dy/dA * A)^+) @ R``, ``y`` the explained output (a class logit; each image's top-1 by default).
Both report the CLS row: its patch columns on the grid, its prefix columns (CLS itself, registers) apart.

Models without a CLS token have no row to read, and the pyramids' attentions (PVTv2's spatial reduction,
Swin's windows) are not token-to-token over one grid: both are refused in one line.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import List, Optional

import torch

from ..._progress import tqdm
from ...errors import InterpError
from ...runtime.source import n_batches, require_live
from ..core.result import StudyResult, skipped_records
from ..declaration import study
from .configs import RolloutConfig


@dataclass
class RolloutResult(StudyResult):
    """Result of :func:`rollout_study`.

    Attributes:
        rollout_map: [gh][gw] the rollout's CLS row over the patches (mean over images); rollout_prefix: its
            prefix columns (CLS, registers). relevance_map, relevance_prefix: the same of the relevance (None
            without it, the reason in ``notes``).
        per_image_rollout, per_image_relevance: each image's patch row [N][P] (for overlays).
        grid: (gh, gw); start_layer: the first block rolled out.
    """

    study = "rollout"
    rollout_map: List = field(default_factory=list)
    rollout_prefix: List[float] = field(default_factory=list)
    relevance_map: Optional[List] = None
    relevance_prefix: Optional[List[float]] = None
    per_image_rollout: List = field(default_factory=list)
    per_image_relevance: Optional[List] = None
    grid: List[int] = field(default_factory=list)
    start_layer: int = 0
    n_images: int = 0
    notes: List[str] = field(default_factory=list)

    def console_lines(self, config=None) -> List[str]:
        def peak(grid_map):
            t = torch.tensor(grid_map)
            r, c = divmod(int(t.argmax()), t.shape[1])
            return f"patch ({r}, {c})"
        lines = [f"rollout: CLS row peaks at {peak(self.rollout_map)}"]
        if self.relevance_map is not None:
            lines.append(f"relevance: peaks at {peak(self.relevance_map)}")
        return lines + self.notes


def rollout(patterns: List[torch.Tensor], start_layer: int = 0) -> torch.Tensor:
    """[b, t, t]: the rollout of head-mean attention maps ``patterns`` (each [b, h, t, t])."""
    eye = torch.eye(patterns[0].shape[-1], dtype=patterns[0].dtype)
    joint = None
    for a in patterns[start_layer:]:
        a = a.mean(1) + eye
        a = a / a.sum(-1, keepdim=True)
        joint = a if joint is None else a @ joint
    return joint


def relevance(patterns: List[torch.Tensor], grads: List[torch.Tensor]) -> torch.Tensor:
    """[b, t, t]: ``R = I``, then per block ``R += mean_h((grad * A)^+) @ R``."""
    r = torch.eye(patterns[0].shape[-1], dtype=patterns[0].dtype).expand(patterns[0].shape[0], -1, -1)
    for a, g in zip(patterns, grads):
        r = r + (g * a).clamp(min=0).mean(1) @ r
    return r


def refusal(source) -> Optional[str]:
    """Why this source's model has no rollout, or None."""
    layout = source.layout
    if layout.block_stages:
        return ("its spatial-reduction or window attention is not token-to-token over one grid of tokens, so "
                "attention maps do not compose across blocks")
    if layout.cls_index is None:
        return "it has no CLS token: there is no CLS row to read"
    return None


@study(RolloutConfig)
def rollout_study(source, config: RolloutConfig, *, progress: bool = True) -> RolloutResult:
    """Rollout and relevance maps of the CLS row over the images of a live ``source`` (module doc)."""
    require_live(source, "rollout")
    why = refusal(source)
    if why:
        raise InterpError(f"no attention rollout for {source.model_name}: {why}")
    n = len(source.blocks)
    if config.start_layer >= n:
        raise InterpError(f"--start-layer {config.start_layer} does not exist: the model has blocks 0..{n - 1}")
    hooks = [source.blocks.attn_pattern(i) for i in range(n)]
    has_head = source.final_readout().has_head if config.relevance else False
    notes = [] if has_head or not config.relevance else [
        "no relevance: the model has no head, so there is no output to take the gradient of"]
    rolled, relevant = [], []
    layout = None
    for _, x in tqdm(source.image_batches(), disable=not progress, desc="rollout", unit="batch",
                     total=n_batches(source, None), leave=False):
        if has_head:
            chosen = config.classes

            def objective(out):
                index = (torch.full((len(x),), chosen[0], device=out.logits.device) if chosen
                         else out.logits.argmax(-1))
                return out.logits.gather(-1, index[:, None]).squeeze(-1)

            run = source.run_with_grads(x, hooks, objective)
            relevant.append(relevance([run.acts[h] for h in hooks], [run.grads[h] for h in hooks]))
            acts = run.acts
        else:
            acts = source.run(x, hooks).acts
        layout = source.blocks.layout_of(source.layout, hooks[0])
        rolled.append(rollout([acts[h] for h in hooks], config.start_layer))
    if layout is None:
        raise InterpError("rollout needs at least one image")
    cls, gh, gw = layout.cls_index, *layout.grid

    def rows(maps):
        return torch.cat(maps)[:, cls]  # [N, t]

    roll = rows(rolled)
    rel = rows(relevant) if relevant else None
    if has_head and source.head().kind != "classifier":
        notes.append(f"the head is not a classifier ({source.head().why}): the relevance explains an output "
                     "coordinate, not a class")
    return RolloutResult(
        model=source.model_name, fingerprint=source.fingerprint, seed=None, ids=list(source.ids),
        skipped=skipped_records(source),
        params={"classes": list(config.classes) if config.classes else None, "start_layer": config.start_layer,
                "relevance": config.relevance},
        rollout_map=roll[:, layout.patch_slice].mean(0).reshape(gh, gw).tolist(),
        rollout_prefix=roll[:, :layout.n_prefix].mean(0).tolist(),
        relevance_map=None if rel is None else rel[:, layout.patch_slice].mean(0).reshape(gh, gw).tolist(),
        relevance_prefix=None if rel is None else rel[:, :layout.n_prefix].mean(0).tolist(),
        per_image_rollout=roll[:, layout.patch_slice].tolist(),
        per_image_relevance=None if rel is None else rel[:, layout.patch_slice].tolist(),
        grid=[gh, gw], start_layer=config.start_layer, n_images=len(roll), notes=notes)
