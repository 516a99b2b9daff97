"""Masking probe (docs/methods.md section 3): mask the top-k or bottom-k patches by Patch Score on the input
image, re-run the model, and measure what is lost.

Two passes over the images:

1. Unmasked forward: Patch Score maps (:mod:`interp.studies.aggregation.patch_score`), top-1 predictions, last-block
   patch-token norms (for a percentile outlier threshold) and, for ``fill="mean"``, the dataset mean.
2. For each batch, one forward per (fraction, order): the ``round(fraction * n_patches)`` patches of highest
   (``top``) or lowest (``bottom``) score, or of a seeded random order (``random``, the control: one
   permutation per image drawn from ``seed``, so the masked sets grow nested over the fractions as they do for
   the score orders), are replaced, on the input grid of the model's patch size
   (cell (r, c) = input pixels ``[r*ph, (r+1)*ph) x [c*pw, (c+1)*pw)``), by the fill:

   * ``zero``: 0 in normalised input space (the normalisation mean colour);
   * ``mean``: the per-channel mean of all images of the source, in normalised space;
   * ``blur``: the same pixels of a Gaussian-blurred copy of the image (``blur_sigma`` pixels,
     default half the patch size; replicate padding).

Reported per (order, fraction): accuracy (when the image folder gives labels) and top-1 agreement with the
unmasked model through a real classifier, the pooled vector's cosine to the unmasked one (always;
:mod:`interp.studies.core.behaviour`), and the mean number of outlier patch tokens per image: patch tokens whose norm at the
detection block's ``hook_resid_post`` exceed the detection threshold. Outliers follow the one detection
contract (:mod:`interp.detection.detection`: ``detection=`` a Detection or DetectionSpec); the threshold is
resolved on the unmasked run's patch-token norms (the config's default: ``"p98"`` at the last block when neither
a threshold nor a preset is given, :class:`~interp.studies.aggregation.configs.MaskingDetection`) and counted
with the causal studies' counting threshold (the 99th percentile when "auto" finds no separated mode).

Fractions: the default is 0, 0.1, ..., 0.9; the LaSt paper's masking curve (its Fig. 2b) is drawn at steps of
1/7, ``fractions=fraction_steps(7)`` (0, 1/7, ..., 6/7; CLI ``--steps 7``).

Labels: accuracy only when the image folders name the classifier's classes (the one label rule of
:mod:`interp.studies.core.behaviour`; e.g. ImageNet synset ids or class names for an ImageNet head).

>>> result = masking_study(source, fractions=[0, 0.3, 0.6], fill="blur", progress=False)
>>> round(result.curves["bottom"]["pooled_cosine"][0], 6)    # nothing masked: the pooled vector is the unmasked one
1.0
>>> result.curves["bottom"]["agreement"] is None   # planted_vit's random head classifies nothing: no top-1
True
>>> result.metric
'pooled_cosine'
"""
from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Dict, List, Optional, Tuple

import torch

from ...errors import InterpError
from ...interventions.selective_cls import SelectiveCLS
from ...detection.detection import DetectionLike, detect, detection_header, detection_params
from ..core.behaviour import BehaviourMeter, behaviour_readout, headline_metric
from ..core.behaviour import target_classes  # noqa: F401  (its home is core.behaviour; imported from here too)
from ...runtime.paired import Condition, paired_pass
from ...detection.detection import Detection
from ..core.score_maps import FINAL, needed_hooks, score_maps_from_acts
from ..core.pixels import gaussian_blur
from ..core.regions import cell_size
from ..core.result import OutlierStudyResult, behaviour_lines
from ..declaration import study
from .configs import MaskingConfig
from ...hooks.names import resolve_block
from ...runtime.source import require_live

FILLS = ("zero", "mean", "blur")
ORDERS = ("top", "bottom", "random")
DEFAULT_FRACTIONS = tuple(round(0.1 * i, 1) for i in range(10))


def fraction_steps(n: int) -> List[float]:
    """Fractions ``k / n`` for k = 0 .. n - 1 (``fraction_steps(7)``: the paper's steps of 1/7)."""
    if isinstance(n, bool) or not isinstance(n, int) or n < 1:
        raise InterpError(f"steps={n!r}: give a whole number of steps >= 1 (e.g. 7 for fractions k/7)")
    return [k / n for k in range(n)]


def random_keys(n_images: int, grid: Tuple[int, int], seed: int) -> torch.Tensor:
    """Seeded uniform keys [N, h, w]: the ``random`` order masks each image's highest keys first (one
    permutation per image, the same whatever the batch size)."""
    generator = torch.Generator().manual_seed(int(seed))
    return torch.rand(n_images, *grid, generator=generator)


# ---------------------------------------------------------------------------------------------- masking
def n_masked(fraction: float, n_patches: int) -> int:
    """Patches masked for a fraction: ``round(fraction * n_patches)``."""
    if not 0.0 <= fraction <= 1.0:
        raise InterpError(f"masking fraction {fraction} must be in [0, 1]")
    return int(round(fraction * n_patches))


def cells_to_mask(scores: torch.Tensor, k: int, order: str, keys: Optional[torch.Tensor] = None) -> torch.Tensor:
    """The k highest (``top``) or lowest (``bottom``) score cells of each image, or (``random``) the k cells of
    highest ``keys`` (:func:`random_keys`, same shape). scores [b, h, w] -> bool [b, h, w].

    Ties keep row-major order (stable sort)."""
    if order not in ORDERS:
        raise InterpError(f"order={order!r} is not one of {list(ORDERS)}")
    if order == "random":
        if keys is None or keys.shape != scores.shape:
            raise InterpError("order='random' needs keys of the scores' shape (random_keys(n, grid, seed))")
        scores = keys
    flat = scores.flatten(1)
    ranked = torch.sort(flat, dim=1, descending=(order != "bottom"), stable=True).indices[:, :k]
    mask = torch.zeros_like(flat, dtype=torch.bool)
    mask.scatter_(1, ranked, True)
    return mask.view_as(scores)


def pixel_mask(cells: torch.Tensor, patch_size: Tuple[int, int]) -> torch.Tensor:
    """Cells [b, h, w] -> input pixels [b, h*ph, w*pw] (each cell covers its patch of the input grid)."""
    ph, pw = patch_size
    return cells.repeat_interleave(ph, dim=1).repeat_interleave(pw, dim=2)


def mask_images(x: torch.Tensor, cells: torch.Tensor, fill: torch.Tensor, patch_size: Tuple[int, int]) -> torch.Tensor:
    """Images [b, C, H, W] with the pixels of the chosen cells replaced by ``fill`` (broadcast to x:
    [C] per channel, or [b, C, H, W] images); other pixels are left exactly as they are."""
    pixels = pixel_mask(cells, patch_size)
    if pixels.shape[-2:] != x.shape[-2:]:
        raise InterpError(f"images are {tuple(x.shape[-2:])} but the patch grid covers {tuple(pixels.shape[-2:])}")
    if fill.dim() == 1:
        fill = fill.view(1, -1, 1, 1)
    return torch.where(pixels[:, None].to(x.device), fill.to(x.dtype), x)


# ---------------------------------------------------------------------------------------------- result
@dataclass
class MaskingResult(OutlierStudyResult):
    """Result of :func:`masking_study` (the detection header of :class:`OutlierStudyResult` describes the
    outliers it counts).

    Attributes:
        fractions: masked share of patches; n_masked: patches masked per fraction.
        orders: the orders run ("top", "bottom", "random"); seed: the random order's seed.
        curves: order -> {"accuracy": [...] or None, "agreement": [...] or None, "pooled_cosine": [...],
            "outliers_per_image": [...]}, one value per fraction (accuracy and agreement only through a real
            classifier).
        unmasked: {"accuracy": ... or None, "outliers_per_image": ...} of the unmasked run.
        metric: "accuracy" when labels and a real classifier exist, else "agreement", else "pooled_cosine"
            (the curve plots show this one).
        conditions: "unmasked" and "<order>@<fraction>" -> behaviour metrics
            (``interp.studies.core.behaviour.METRICS``); classifier: which classifier they used;
            behaviour_note: why there is no agreement or accuracy.
        fill_value: the per-channel fill in normalised space (``zero``/``mean``; None for ``blur``).
        counting_threshold: the norm the outliers are counted above (``threshold``, or the 99th percentile of
            the unmasked norms when "auto" finds no separated mode).
    """

    study = "masking"
    fractions: List[float] = field(default_factory=list)
    n_masked: List[int] = field(default_factory=list)
    n_images: int = 0
    n_patches: int = 0
    grid: List[int] = field(default_factory=list)
    patch_size: List[int] = field(default_factory=list)
    fill: str = "zero"
    fill_value: Optional[List[float]] = None
    blur_sigma: Optional[float] = None
    reference: str = "cls"
    hook: str = FINAL
    metric: str = "agreement"
    curves: Dict[str, Dict[str, Optional[List[float]]]] = field(default_factory=dict)
    unmasked: Dict[str, Optional[float]] = field(default_factory=dict)
    orders: List[str] = field(default_factory=lambda: list(ORDERS))
    counting_threshold: Optional[float] = None
    conditions: Dict[str, Dict] = field(default_factory=dict)
    classifier: Optional[Dict] = None
    behaviour_note: Optional[str] = None

    def console_lines(self, config=None) -> List[str]:
        """The headline metric per order and fraction, then what the behaviour metrics went through."""
        lines = []
        for order in self.orders:
            values = " ".join(f"{v:.3f}" for v in self.curves[order][self.metric])
            lines.append(f"{self.metric} masking {order}-k at {self.fractions}: {values}")
        return lines + behaviour_lines(self)

    @classmethod
    def _aliases(cls, data: dict) -> dict:
        """Results written before the detection contract: ``outlier_threshold`` was the counting threshold."""
        if "outlier_threshold" in data and "counting_threshold" not in data:
            data["counting_threshold"] = data["outlier_threshold"]
        return data


# ---------------------------------------------------------------------------------------------- study
@dataclass
class _Unmasked:
    scores: torch.Tensor       # [N, h, w]
    preds: torch.Tensor        # [N] top-1 class (of the classifier when one is given)
    pooled: torch.Tensor       # [N, d'] the pooled vector hook_pooled
    norms: torch.Tensor        # [N, n_patches] last-block patch-token norms
    channel_mean: torch.Tensor  # [C] mean of the images in normalised space


def _unmasked_pass(source, hook: str, reference: str, selective: Optional[SelectiveCLS], detect: int,
                   progress: bool, classifier=None) -> _Unmasked:
    score_hooks = needed_hooks(hook, reference)
    scores, preds, norms, pooled = [], [], [], []
    channel_sum, n_pixels = None, 0
    unmasked = {"unmasked": Condition(hooks=score_hooks)}
    for pair in paired_pass(source, unmasked, detect_layer=detect, classifier=classifier, baseline=False,
                            progress=progress, desc="masking: unmasked pass"):
        run, x = pair.edited["unmasked"], pair.images
        scores.append(score_maps_from_acts(run.acts, source.blocks.layout_of(run.layout, hook), hook, reference,
                                           selective))
        preds.append(run.logits.argmax(-1))
        pooled.append(run.pooled)
        norms.append(run.patch_norms)
        s = x.double().sum(dim=(0, 2, 3)).cpu()
        channel_sum = s if channel_sum is None else channel_sum + s
        n_pixels += x.shape[0] * x.shape[2] * x.shape[3]
    return _Unmasked(torch.cat(scores), torch.cat(preds), torch.cat(pooled), torch.cat(norms),
                     (channel_sum / n_pixels).float())


@study(MaskingConfig)
def masking_study(source, config: MaskingConfig, *, selective: Optional[SelectiveCLS] = None,
                  detection: DetectionLike, progress: bool = True) -> MaskingResult:
    """Masking probe on a live source (module docstring).

    Args:
        source: a live source (``open_source(model=..., images=...)``); labels from an image-folder layout.
        config: the options (:class:`~interp.studies.aggregation.configs.MaskingConfig`; or pass them as
            keywords, a group's flat): ``fractions`` shares of the patches to mask, each in [0, 1] (default 0, 0.1, ..., 0.9), or
            ``steps`` (the fractions ``k / steps``: :func:`fraction_steps`; 7 for the paper's steps of 1/7);
            ``fill`` ``zero``, ``mean`` or ``blur``; ``blur_sigma`` Gaussian sigma in input pixels for ``blur``
            (default: half the patch size); ``patch_score`` (``reference``, ``hook``, ``selective_k``, ``sigma``,
            ``score``, ``fft``, ``eps``, flat as keywords) the Patch Score that orders the patches; ``orders``
            which of ``top``, ``bottom``, ``random`` to run (default all three);
            ``seed`` seed of the ``random`` order; ``classifier`` a classifier file (or object) whose class
            logits give top-1 agreement and accuracy.
        selective: a SelectiveCLS whose parameters define the ``selective`` vector (default: the config's).
        detection: the outliers counted (module docstring): a Detection of the unmasked model made on this
            source, or a DetectionSpec (default the config's: ``"p98"`` at the last block) resolved on the unmasked
            run's norms at its block.
        progress: show progress bars.
    """
    c = config
    fill, blur_sigma, seed = c.fill, c.blur_sigma, c.seed
    reference, hook = c.patch_score.reference, c.patch_score.hook
    fractions = fraction_steps(c.steps) if c.steps is not None else (
        DEFAULT_FRACTIONS if c.fractions is None else c.fractions)
    selective = selective or SelectiveCLS(**c.patch_score.selective_params())
    require_live(source, "masking probe")
    if fill not in FILLS:
        raise InterpError(f"fill={fill!r} is not one of {list(FILLS)}")
    orders = list(dict.fromkeys([c.orders] if isinstance(c.orders, str) else c.orders))
    if not orders:
        raise InterpError(f"orders=[]: give at least one of {list(ORDERS)}")
    for order in orders:
        if order not in ORDERS:
            raise InterpError(f"order {order!r} is not one of {list(ORDERS)}")
    readout = behaviour_readout(source, c.classifier)  # a classifier that does not fit fails before any forward
    meter = BehaviourMeter(readout)
    fractions = [float(f) for f in fractions]
    grid = tuple(source.layout.grid)
    patch = cell_size(source)  # a pyramid's cells are its last stage's: image / grid pixels, not the stride
    n_patches = grid[0] * grid[1]
    ks = [n_masked(f, n_patches) for f in fractions]
    sigma = float(blur_sigma) if blur_sigma is not None else patch[0] / 2.0

    if isinstance(detection, Detection):
        found = detect(source, detection)
        block, spec = found.layer, None
    else:  # the detection comes from the unmasked pass: no pass of its own
        block = resolve_block(detection.resolved().detect_layer, source.n_layers)
        spec = replace(detection.resolved(), detect_layer=block)
    base = _unmasked_pass(source, hook, reference, selective, block, progress, readout.classifier)
    if spec is not None:
        found = detect(source, spec, norms={source.blocks.resid_post(block): base.norms})
    header = detection_header(found, "masking")
    thr = found.counting_threshold()
    keys = random_keys(len(source), grid, seed)
    fill_value = torch.zeros_like(base.channel_mean) if fill == "zero" else base.channel_mean

    def masking(order: str, k: int):
        def edit(start: int, x: torch.Tensor) -> torch.Tensor:
            fill_images = gaussian_blur(x, sigma) if fill == "blur" else fill_value.to(x.device)
            cells = cells_to_mask(base.scores[start:start + len(x)], k, order, keys[start:start + len(x)])
            return mask_images(x, cells, fill_images, patch)
        return edit

    outliers = {(o, i): [] for o in orders for i in range(len(ks))}
    names = {(o, i): f"{o}@{f:g}" for i, f in enumerate(fractions) for o in orders}
    masked = {names[(o, i)]: Condition(images=masking(o, ks[i])) for (o, i) in names}
    for pair in paired_pass(source, masked, detect_layer=block, classifier=readout.classifier, baseline=False,
                            progress=progress, desc="masking: masked runs"):
        start, n = pair.start, len(pair)
        base_top1, base_pooled = base.preds[start:start + n], base.pooled[start:start + n]
        meter.add("unmasked", start, base_top1, base_pooled, base_top1, base_pooled)
        for key, name in names.items():
            run = pair.edited[name]
            meter.add(name, start, run.logits, run.pooled, base_top1, base_pooled)
            outliers[key].append((run.patch_norms > thr).sum(1))

    curves: Dict[str, Dict[str, Optional[List[float]]]] = {}
    for order in orders:
        o = [torch.cat(outliers[(order, i)]) for i in range(len(ks))]
        m = [meter.metrics(names[(order, i)]) for i in range(len(ks))]
        curves[order] = {
            "accuracy": None if m[0]["accuracy"] is None else [mi["accuracy"] for mi in m],
            "agreement": None if m[0]["top1_agreement"] is None else [mi["top1_agreement"] for mi in m],
            "pooled_cosine": [mi["pooled_cosine"] for mi in m],
            "outliers_per_image": [float(oi.float().mean()) for oi in o],
        }
    unmasked = {"accuracy": meter.metrics("unmasked")["accuracy"],
                "outliers_per_image": float((base.norms > thr).sum(1).float().mean())}
    params = {"fractions": fractions, "fill": fill, "blur_sigma": sigma if fill == "blur" else None,
              "reference": reference, "hook": hook, **detection_params(found), "orders": orders, "seed": seed,
              "selective": selective.params() if reference == "selective" else None}
    return MaskingResult(
        model=source.model_name, fingerprint=source.fingerprint, params=params,
        seed=seed if "random" in orders else None, **header, orders=orders, fractions=fractions, n_masked=ks,
        n_images=len(source), n_patches=n_patches, grid=list(grid),
        patch_size=list(patch), fill=fill, fill_value=None if fill == "blur" else fill_value.tolist(),
        blur_sigma=sigma if fill == "blur" else None, reference=reference, hook=hook,
        metric={"top1_agreement": "agreement"}.get(headline_metric(readout), headline_metric(readout)),
        curves=curves, unmasked=unmasked, counting_threshold=float(thr),
        conditions=meter.conditions(), classifier=readout.record(), behaviour_note=readout.note,
    )
