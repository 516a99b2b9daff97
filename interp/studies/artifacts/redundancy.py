"""Do high-norm tokens sit on redundant patches? (Darcet et al., Fig. 5a; docs/methods.md section 1)

For every patch token, the cosine similarity of its input patch embedding to those of its 4 grid neighbours
(up, down, left, right; 2 or 3 at the border), averaged per token (on a pyramid model, whose detection block runs
on a coarser grid than the patch embedding, the similarity is measured on the patch embedding's grid and each
token of the detection grid gets the mean over the cells it covers: :func:`pool_to_grid`); then the distribution of that value over the
normal and over the high-norm patch tokens. Darcet et al. measure it "right after the patch embedding layer":
here ``hook_patch_embed``, timm's patch-embedding output before the prefix tokens and the position embedding
(``embedding="position"`` reads ``hook_embed`` instead, after the position embedding, for comparison). They
find the high-norm tokens' patches nearly identical to their neighbours (similarity about 1).

The outliers come from the one detection contract (:mod:`interp.detection.detection`): a ``Detection``,
a ``DetectionSpec`` or threshold / detection block / preset. A group with fewer than :data:`MIN_GROUP_TOKENS`
tokens gets no statistics (``None``) and a ``note`` saying why.

>>> from interp.studies import open_source
>>> result = redundancy_study(open_source(model=model, images=photos), progress=False)   # planted_vit
>>> result.groups["high_norm"]["mean"] > result.groups["normal"]["mean"]   # its outliers are flat patches
True
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Dict, List, Optional

import numpy as np
import torch
import torch.nn.functional as F

from ...errors import InterpError
from ...hooks.names import EMBED, PATCH_EMBED
from ...detection.detection import DetectionLike, RunOptions, detect, detection_header, detection_params
from ...runtime.passes import Fold, Reading, run_readings
from ..core.result import OutlierStudyResult, skipped_records
from ...runtime.source import ActivationSource
from ..declaration import study
from .configs import RedundancyConfig

EMBEDDINGS = {"patch": PATCH_EMBED, "position": EMBED}  # where the input patch embedding is read
GROUPS = ("normal", "high_norm")
MIN_GROUP_TOKENS = RedundancyConfig.min_tokens
HIST_BINS = RedundancyConfig.bins


def neighbour_similarity(embeddings: torch.Tensor, grid) -> torch.Tensor:
    """Per patch the mean cosine similarity to its 4-neighbours on the grid.

    Args:
        embeddings: [b, P, d] patch embeddings in row-major grid order (P = h * w).
        grid: (h, w).

    Returns:
        [b, P] float32: the mean over the token's grid neighbours (4 inside, 3 on an edge, 2 in a corner; 0
        when the grid is one cell). A zero vector has similarity 0 to everything.
    """
    h, w = (int(v) for v in grid)
    b, p, d = embeddings.shape
    if p != h * w:
        raise InterpError(f"{p} patch rows do not fill the {h} x {w} grid")
    e = F.normalize(embeddings.float(), dim=-1).reshape(b, h, w, d)
    total = e.new_zeros(b, h, w)
    count = e.new_zeros(1, h, w)
    right = (e[:, :, :-1] * e[:, :, 1:]).sum(-1)  # [b, h, w - 1]: cell with its right neighbour
    down = (e[:, :-1] * e[:, 1:]).sum(-1)  # [b, h - 1, w]: cell with the one below
    total[:, :, :-1] += right
    total[:, :, 1:] += right
    total[:, :-1] += down
    total[:, 1:] += down
    count[:, :, :-1] += 1
    count[:, :, 1:] += 1
    count[:, :-1] += 1
    count[:, 1:] += 1
    return (total / count.clamp(min=1)).clamp(-1.0, 1.0).reshape(b, p)  # rounding can step past +-1


def pool_to_grid(embeddings: torch.Tensor, grid, target) -> torch.Tensor:
    """[b, h*w, d] values on ``grid`` -> [b, h'*w', d] on ``target``: each target cell the mean of the cells it
    covers (adaptive average pooling; the values themselves when the grids agree, as in a plain ViT)."""
    grid, target = tuple(int(v) for v in grid), tuple(int(v) for v in target)
    if grid == target:
        return embeddings
    b, _, d = embeddings.shape
    maps = embeddings.float().reshape(b, grid[0], grid[1], d).permute(0, 3, 1, 2)
    return F.adaptive_avg_pool2d(maps, target).flatten(2).transpose(1, 2)


def group_summary(values: np.ndarray, edges: np.ndarray, min_tokens: int = MIN_GROUP_TOKENS) -> Dict:
    """Statistics of one token group's similarities: ``n_tokens``, ``mean``, ``median``, ``p10``, ``p90``,
    ``histogram`` (counts over ``edges``) and ``note``; the statistics are None (and the note says why) below
    ``min_tokens`` tokens."""
    n = int(values.size)
    out = {"n_tokens": n, "mean": None, "median": None, "p10": None, "p90": None,
           "histogram": np.histogram(values, bins=edges)[0].tolist() if n else [0] * (len(edges) - 1), "note": None}
    if n < min_tokens:
        out["note"] = (f"too few tokens (n={n}) for a distribution; need >= {min_tokens}" if n else
                       "no token in this group")
        return out
    out.update(mean=float(values.mean()), median=float(np.median(values)),
               p10=float(np.percentile(values, 10)), p90=float(np.percentile(values, 90)))
    return out


@dataclass
class RedundancyResult(OutlierStudyResult):
    """Result of :func:`redundancy_study`.

    Attributes:
        embedding: ``"patch"`` (``hook_patch_embed``, before the position embedding: Darcet's measure) or
            ``"position"`` (``hook_embed``, after it); hook: that hook's name.
        grid: (h, w) of the detection block's grid (the patch grid of a plain ViT).
        groups: ``"normal"`` / ``"high_norm"`` -> :func:`group_summary` (n_tokens, mean, median, p10, p90,
            histogram, note).
        hist_edges: the histogram bin edges over [-1, 1].
        difference: high-norm mean minus normal mean; None when either group has no statistic.
        similarity_maps: [N][h][w] per-token neighbour similarity, outlier_maps: [N][h][w] 0/1 outliers.
    """

    study = "redundancy"
    embedding: str = "patch"
    hook: str = PATCH_EMBED
    grid: List[int] = field(default_factory=list)
    groups: Dict[str, Dict] = field(default_factory=dict)
    hist_edges: List[float] = field(default_factory=list)
    difference: Optional[float] = None
    similarity_maps: List = field(default_factory=list)
    outlier_maps: List = field(default_factory=list)

    def summary(self) -> str:
        """One line per group: mean and median similarity with the token count, or why there is none."""
        parts = []
        for name in GROUPS:
            g = self.groups.get(name, {})
            if g.get("mean") is None:
                parts.append(f"{name}: - ({g.get('note')})")
            else:
                parts.append(f"{name}: mean {g['mean']:.3f}, median {g['median']:.3f} (n={g['n_tokens']})")
        return f"cosine to the 4 neighbouring input patches ({self.hook}): " + "; ".join(parts)


def redundancy_reading(source: ActivationSource, detection, *, embedding: str = "patch", bins: int = HIST_BINS,
                       min_tokens: int = MIN_GROUP_TOKENS, warn: bool = True) -> Reading:
    """:func:`redundancy_study` around its pass, for a resolved ``detection`` (a
    :class:`~interp.detection.detection.Detection` on ``source``): the fold that keeps each batch's
    per-token neighbour similarity [b, P], then the :class:`RedundancyResult` (for a shared pass,
    :mod:`interp.runtime.passes`)."""
    if embedding not in EMBEDDINGS:
        raise InterpError(f"embedding={embedding!r}: use one of {sorted(EMBEDDINGS)}")
    if bins < 1 or min_tokens < 1:
        raise InterpError(f"bins ({bins}) and min_tokens ({min_tokens}) must be >= 1")
    hook = EMBEDDINGS[embedding]
    source.require([hook])
    det = detection.check(source)
    parts: List[torch.Tensor] = []

    det_hook = source.blocks.resid_post(det.layer)

    def reducers(layout):
        target = source.blocks.layout_of(layout, det_hook).grid  # a pyramid: the detection stage's grid
        layout = source.blocks.layout_of(layout, hook)
        rows = slice(None) if hook == PATCH_EMBED else layout.patch_slice  # hook_patch_embed holds patches only
        return {hook: lambda t: pool_to_grid(neighbour_similarity(t[:, rows], layout.grid)[..., None], layout.grid,
                                             target)[..., 0]}

    def finish() -> RedundancyResult:
        grid = tuple(source.layout_of(det_hook).grid)
        similarity = torch.cat(parts) if parts else torch.zeros(0, grid[0] * grid[1])  # [N, P]
        outliers = det.outliers
        if outliers.shape != similarity.shape:
            raise InterpError(f"the detection holds {tuple(outliers.shape)} patch norms but the source gives "
                              f"{tuple(similarity.shape)} patch similarities; detect on the same source")
        edges = np.linspace(-1.0, 1.0, bins + 1)
        values, mask = similarity.numpy(), outliers.numpy()
        groups = {"normal": group_summary(values[~mask], edges, min_tokens),
                  "high_norm": group_summary(values[mask], edges, min_tokens)}
        means = [groups[g]["mean"] for g in GROUPS]
        params = {**detection_params(det), "embedding": embedding, "bins": bins, "min_tokens": min_tokens}
        return RedundancyResult(
            model=source.model_name, fingerprint=source.fingerprint, params=params, seed=None,
            ids=list(source.ids), skipped=skipped_records(source), **detection_header(det, "redundancy", warn=warn),
            embedding=embedding, hook=hook, grid=list(grid), groups=groups, hist_edges=edges.tolist(),
            difference=None if None in means else means[1] - means[0],
            similarity_maps=similarity.reshape(-1, *grid).tolist(),
            outlier_maps=outliers.reshape(-1, *grid).int().tolist())

    return Reading([Fold([hook], lambda batch: parts.append(batch.acts[hook]), reduce=reducers)], finish)


@study(RedundancyConfig)
def redundancy_study(source: ActivationSource, config: RedundancyConfig, *, detection: DetectionLike,
                     progress: bool = True, warn: bool = True) -> RedundancyResult:
    """Neighbour similarity of the input patch embeddings, normal vs high-norm patch tokens.

    Args:
        source: a live model over images, or a cache with ``hook_patch_embed`` (``hook_embed`` for
            ``embedding="position"``) and the detection block's ``hook_resid_post``.
        config: the options (:class:`~interp.studies.artifacts.configs.RedundancyConfig`; or as keywords):
            ``embedding`` ``"patch"`` (default, before the
            position embedding) or ``"position"`` (after it); ``bins`` histogram bins over [-1, 1];
            ``min_tokens`` fewest tokens a group needs for its statistics.
        detection: the high-norm tokens: a Detection made on this source by
            :func:`~interp.detection.detection.detect` (no detection pass then), or a
            :class:`~interp.detection.spec.DetectionSpec` (default the config's).
        warn: raise the detection header's warning (no artifacts, a threshold inside the bulk) with
            ``warnings.warn`` too (it is in ``warning`` either way).
    """
    embedding, bins, min_tokens, batch_size = config.embedding, config.bins, config.min_tokens, None
    if embedding not in EMBEDDINGS:  # before the detection pass
        raise InterpError(f"embedding={embedding!r}: use one of {sorted(EMBEDDINGS)}")
    source.require([EMBEDDINGS[embedding]])
    det = detect(source, detection, RunOptions(batch_size, progress=progress))
    reading = redundancy_reading(source, det, embedding=embedding, bins=bins, min_tokens=min_tokens, warn=warn)
    return run_readings(source, [reading], batch_size, progress, desc="neighbour similarity")[0]
