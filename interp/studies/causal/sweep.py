"""What activation and attribution patching share: the corrupted input, the sites and their cells, and the metric
read from a forward.

A *site* is one block's hook (``blocks.3.hook_resid_post``); its *cells* are what one patch replaces: a token (of
``resid_pre``/``resid_post``/``attn_out``/``mlp_out``: [b, t, d]), a head at every token (``attn.hook_z``:
[b, t, h, dh]) or an MLP neuron at every token (``mlp.hook_post``: [b, t, n]).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Dict, List, Optional, Sequence, Tuple

import torch
import torch.nn.functional as F

from ...errors import InterpError
from ...interventions.neuron_sets import neuron_set
from ...runtime.patching import cell_masks
from .configs import PatchingOptions
from .targets import OutputTarget

TOKEN_SITES = ("resid_pre", "resid_post", "attn_out", "mlp_out")


def corrupt(x: torch.Tensor, config: PatchingOptions, start: int, patch_size: Tuple[int, int]) -> torch.Tensor:
    """The corrupted batch of images ``x`` [b, 3, H, W] (normalised pixels): the next image of the batch, Gaussian
    noise added (seeded by ``config.seed`` and the batch's first image ``start``), or the box masked to 0 (the
    normalisation's mean colour)."""
    if config.corruption == "image":
        if len(x) < 2:
            raise InterpError("--corruption image pairs each image with the next one of its batch: a batch of one "
                              "image has none; give an even number of images or a batch size that divides them")
        return x.roll(-1, 0)
    if config.corruption == "noise":
        g = torch.Generator().manual_seed(config.seed * 1_000_003 + start)
        return x + config.noise * torch.randn(x.shape, generator=g).to(x.device, x.dtype)
    x0, y0, x1, y1 = config.box
    h, w = x.shape[-2:]
    if x1 > w or y1 > h:
        raise InterpError(f"--box {x0},{y0},{x1},{y1} reaches past the {w}x{h} input")
    out = x.clone()
    out[..., y0:y1, x0:x1] = 0
    return out


@dataclass
class Site:
    """One swept block: its hook, the axis its cells index and the cells (token rows, heads or neurons)."""

    block: int
    hook: str
    axis: int
    cells: List[int]

    def mask_shape(self, acts_shape: Sequence[int]) -> Tuple[int, ...]:
        """The shape of one copy's mask, broadcast over the rest of the activation."""
        b = acts_shape[0]
        if self.axis == 1:
            return (b, acts_shape[1]) + (1,) * (len(acts_shape) - 2)
        return (b, 1, acts_shape[2]) + (1,) * (len(acts_shape) - 3)

    def masks(self, acts_shape: Sequence[int], cells: Sequence[int]) -> torch.Tensor:
        return cell_masks(self.mask_shape(acts_shape), self.axis, cells, acts_shape[0])


def sites(source, config: PatchingOptions) -> List[Site]:
    """The sites a sweep visits, in block order; the cells of a token or ``z`` site (its tokens, its heads) are
    filled in from the activation's shape (:func:`with_cells`: a pyramid's stages have their own token counts)."""
    blocks = source.blocks
    chosen = list(config.blocks) if config.blocks is not None else list(range(len(blocks)))
    bad = [b for b in chosen if b >= len(blocks)]
    if bad:
        raise InterpError(f"--blocks {bad[0]} does not exist: the model has blocks 0..{len(blocks) - 1}")
    if config.site == "mlp_post":
        neurons = neuron_set(config.neurons).neurons
        out = []
        for layer, idx in sorted((int(k), v) for k, v in neurons.items()):
            if layer >= len(blocks) or max(idx) >= source.d_mlp(layer):
                raise InterpError(f"--neurons {layer}:{max(idx)} does not exist in this model")
            out.append(Site(layer, blocks.mlp_post(layer), 2, sorted(int(i) for i in idx)))
        return out
    if config.site == "z":
        return [Site(i, blocks.attn_z(i), 2, []) for i in chosen]
    return [Site(i, blocks.hook(i, f"hook_{config.site}"), 1, []) for i in chosen]


def with_cells(found: List[Site], acts: Dict[str, torch.Tensor]) -> List[Site]:
    """``found`` with the cells of every token site (its rows, ``acts[hook]`` [b, t, ...]) and ``z`` site (its
    heads, [b, t, h, dh]) filled in; a neuron site keeps its neurons."""
    for site in found:
        if not site.cells:
            site.cells = list(range(acts[site.hook].shape[site.axis]))
    return found


Metric = Callable[[torch.Tensor, torch.Tensor, Optional[torch.Tensor]], torch.Tensor]


@dataclass
class MetricSpec:
    """How one forward is scored, per image row: ``score(logits [r, C], pooled [r, d'], norms [r, P] or None)``.

    Attributes:
        name: the metric (``configs.METRICS``); batch: images per batch b.
        target: the output read by "logit-diff" and "prob" (each image's class; rows repeat the batch).
        reference: the clean run's pooled vectors [b, d'] ("pooled-cosine").
        threshold: the norm above which a patch counts ("outliers").
    """

    name: str
    batch: int
    target: Optional[OutputTarget] = None
    reference: Optional[torch.Tensor] = None
    threshold: Optional[float] = None

    def score(self, logits: torch.Tensor, pooled: torch.Tensor, norms: Optional[torch.Tensor] = None) -> torch.Tensor:
        """[r] per row; rows are copies of the batch (row i is image ``i % b``)."""
        k = logits.shape[0] // self.batch
        if self.name == "pooled-cosine":
            ref = self.reference.to(pooled.device).repeat(k, 1)
            return F.cosine_similarity(pooled.float(), ref.float(), dim=-1)
        if self.name == "outliers":
            return (norms > self.threshold).sum(-1).float()
        target = OutputTarget(self.target.kind, self.target.a.repeat(k),
                              None if self.target.b is None else self.target.b.repeat(k))
        if self.name == "prob":
            return _softmax_take(logits, target.a)
        return target.logit(logits.float())


def _softmax_take(logits: torch.Tensor, classes: torch.Tensor) -> torch.Tensor:
    return logits.float().softmax(-1).gather(-1, classes.to(logits.device)[:, None]).squeeze(-1)


def metric_spec(config: PatchingOptions, clean_logits: torch.Tensor, clean_pooled: torch.Tensor,
                threshold: Optional[float]) -> MetricSpec:
    """The batch's :class:`MetricSpec`: classes from ``config.classes`` (default: each image's clean top-1 output)."""
    n = clean_logits.shape[0]
    if config.metric == "pooled-cosine":
        return MetricSpec("pooled-cosine", n, reference=clean_pooled)
    if config.metric == "outliers":
        return MetricSpec("outliers", n, threshold=threshold)
    classes = config.classes
    if classes and max(classes) >= clean_logits.shape[1]:
        raise InterpError(f"--classes {max(classes)} does not exist: the output has {clean_logits.shape[1]} "
                          "coordinates")
    if config.metric == "logit-diff":
        return MetricSpec("logit-diff", n, OutputTarget("logit-diff", torch.full((n,), classes[0]),
                                                     torch.full((n,), classes[1]), tuple(classes)))
    a = torch.full((n,), classes[0]) if classes else clean_logits.argmax(-1)
    return MetricSpec("prob", n, OutputTarget("probability", a, None, tuple(classes) if classes else None))


def normalised(patched: torch.Tensor, donor: float, base: float) -> torch.Tensor:
    """TransformerLens's recovered share ``(patched - corrupted) / (clean - corrupted)`` when denoising (the donor
    is the clean run, the base the corrupted one; the reverse when noising); NaN where the two runs agree."""
    scale = donor - base
    if scale == 0:
        return torch.full_like(patched, float("nan"))
    return (patched - base) / scale


def pearson(a: torch.Tensor, b: torch.Tensor) -> Optional[float]:
    """Pearson correlation of two flat tensors (NaN cells dropped); None without spread."""
    a, b = a.flatten().double(), b.flatten().double()
    keep = ~(a.isnan() | b.isnan())
    a, b = a[keep] - a[keep].mean(), b[keep] - b[keep].mean()
    den = float(a.norm() * b.norm())
    return None if den == 0 else float((a * b).sum()) / den


def average_ranks(x: torch.Tensor) -> torch.Tensor:
    """Ranks 0..n-1 of a flat tensor, ties given their average rank (as ``scipy.stats.rankdata`` minus one)."""
    _, inverse, counts = torch.unique(x.double(), return_inverse=True, return_counts=True)
    ends = counts.cumsum(0).double()
    return ((ends - counts + ends - 1) / 2)[inverse]


def spearman(a: torch.Tensor, b: torch.Tensor) -> Optional[float]:
    """Spearman rank correlation of two flat tensors (NaN cells dropped; ties averaged); None without spread."""
    a, b = a.flatten(), b.flatten()
    keep = ~(a.isnan() | b.isnan())
    if int(keep.sum()) < 2:
        return None
    return pearson(average_ranks(a[keep]), average_ranks(b[keep]))


def cell_labels(site: Site, layout) -> List[str]:
    """What each cell of ``site`` is, for tables: "CLS", "reg 0", "patch (r, c)", "head 2", "neuron 17"."""
    if site.axis == 2:
        return [f"{'head' if site.hook.endswith('hook_z') else 'neuron'} {c}" for c in site.cells]
    gw = layout.grid[1]
    labels = []
    for c in site.cells:
        if layout.cls_index is not None and c == layout.cls_index:
            labels.append("CLS")
        elif c < layout.n_prefix:
            labels.append(f"prefix {c}")
        else:
            p = c - layout.n_prefix
            labels.append(f"patch ({p // gw}, {p % gw})")
    return labels
