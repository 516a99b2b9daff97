"""What activation and attribution patching share: the sites and their cells, and the metric read from a forward
(through the model's head or a classifier file's class logits).

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
from ...models.classifiers.classifier import Classifier, load_classifier
from ...runtime.patching import cell_masks
from .configs import PatchingOptions
from .targets import OutputTarget

TOKEN_SITES = ("resid_pre", "resid_post", "attn_out", "mlp_out")


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
        classifier: the class logits "logit-diff" and "prob" read instead of the head's (:func:`class_logits`).
    """

    name: str
    batch: int
    target: Optional[OutputTarget] = None
    reference: Optional[torch.Tensor] = None
    threshold: Optional[float] = None
    classifier: Optional[Classifier] = None

    def score(self, logits: torch.Tensor, pooled: torch.Tensor, norms: Optional[torch.Tensor] = None) -> torch.Tensor:
        """[r] per row; rows are copies of the batch (row i is image ``i % b``)."""
        k = logits.shape[0] // self.batch
        logits = class_logits(self.classifier, logits, pooled)
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


def class_logits(classifier: Optional[Classifier], logits: torch.Tensor, pooled: torch.Tensor) -> torch.Tensor:
    """The logits a metric reads [r, C]: the head's ``logits``, or the classifier's class logits of this forward
    (a zero-shot matrix or a head-output linear head reads ``logits``, a pooled linear head ``pooled``);
    differentiable, so attribution's gradient is of the same target."""
    if classifier is None:
        return logits
    return classifier.apply(pooled if classifier.input == "pooled" else logits)


def metric_classifier(source, path: Optional[str]) -> Optional[Classifier]:
    """The classifier file ``path`` bound to ``source``'s model (None without one); a DINOv2 linear head, which
    reads the last blocks' tokens rather than the output, is refused."""
    if path is None:
        return None
    classifier = source.bind_classifier(load_classifier(path))
    if classifier.kind == "dinov2_linear":
        raise InterpError(f"--classifier {path} is a DINOv2 linear head (it reads the last blocks' class tokens): the "
                          "causal studies read a zero-shot matrix or a linear head on the output")
    return classifier


def metric_spec(config: PatchingOptions, clean_logits: torch.Tensor, clean_pooled: torch.Tensor,
                threshold: Optional[float], classifier: Optional[Classifier] = None) -> MetricSpec:
    """The batch's :class:`MetricSpec`: classes from ``config.classes`` (default: each image's clean top-1 output,
    of the classifier's class logits when one is given)."""
    n = clean_logits.shape[0]
    if config.metric == "pooled-cosine":
        return MetricSpec("pooled-cosine", n, reference=clean_pooled)
    if config.metric == "outliers":
        return MetricSpec("outliers", n, threshold=threshold)
    read = class_logits(classifier, clean_logits, clean_pooled)
    classes = config.classes
    if classes and max(classes) >= read.shape[1]:
        raise InterpError(f"--classes {max(classes)} does not exist: the {'classifier' if classifier else 'output'} "
                          f"has {read.shape[1]} classes")
    if config.metric == "logit-diff":
        return MetricSpec("logit-diff", n, OutputTarget("logit-diff", torch.full((n,), classes[0]),
                                                     torch.full((n,), classes[1]), tuple(classes)),
                          classifier=classifier)
    a = torch.full((n,), classes[0]) if classes else read.argmax(-1)
    return MetricSpec("prob", n, OutputTarget("probability", a, None, tuple(classes) if classes else None),
                      classifier=classifier)


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
