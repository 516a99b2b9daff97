"""Linear probes per token group (Darcet et al. Fig. 5b and Table 1; the reassessment's probes; docs/methods.md
sections 4 and 6).

Do high-norm ("artifact") tokens still hold local information? Three probes on one hook's tokens (default
the last block's un-normalised residual stream), fitted on the tokens of the training images and scored per
token group on the held-out images (:mod:`~interp.studies.probes.scores`):

* ``position`` (Fig. 5b): the patch index (softmax probe over all P cells; top-1 accuracy and mean distance
  in patches between predicted and true cell). ``position_loss="ce+mse"`` is the reassessment's variant: an
  extra linear head regresses (row, col) / (grid - 1) and adds 0.5 x its MSE to the cross-entropy.
* ``pixels`` (Fig. 5b): the token's own input patch by ridge regression, scored by the mean per-token L2
  reconstruction error (Darcet's measure), the MSE and R^2, in the model's normalised input space
  (:data:`~interp.studies.probes.scores.PIXEL_SPACE`; recorded as ``pixel_space``). It needs the input
  images: a live source supplies them; for a cache pass ``images=`` (Tensor[N, 3, H, W] preprocessed as the
  cache was); otherwise the probe is skipped with a note.
* ``label`` (Table 1): the image's class from ONE token per image (CLS, the first register, one random normal
  patch, one random high-norm patch), one probe per kind, when labels exist (``source.labels``, e.g. an
  image-folder layout, or ``labels=``).

Groups: ``normal`` and ``high_norm`` patches. High-norm = ``outliers`` (a given bool mask [N, t] or [N, P]),
else the one detection contract on the un-normalised residual stream of a detection block, separate from the
probed hook (:func:`~interp.detection.detection.detect`: ``detection=`` a Detection or DetectionSpec; default
"auto", the block chosen). Every score comes with its
chance level (the best constant guess of the training set); an empty group is reported as such (``n = 0``
and a note), never as a number.

Images: a seeded random split by image (``test_fraction``, default 0.25) unless ``test_images=`` (and
``train_images=``) name the sets (:mod:`~interp.studies.probes.image_sets`). Budget: ``probe_options``
(epochs, min_steps, lr, weight_decay, batch_size, ridge; ``patience`` stops early on a validation split of
``val_fraction`` of the training images); the resolved values are recorded in ``params["probe_options"]``
and the schedule each fit ran in ``training``.

Too little data: below the minimums of :mod:`~interp.studies.probes.scores` (``MIN_IMAGES``,
``MIN_TRAIN_IMAGES``, ``MIN_TEST_IMAGES``, ``MIN_GROUP_TOKENS``, ``MIN_LABEL_IMAGES``) a group gets None and its
``note`` gives the reason; the result lists those groups in ``unscored`` and ``warnings.warn`` says so once.

Memory: two streaming passes over the source (detection norms, then tokens); per image at most
``max_train_tokens / n_train_images`` training tokens and ``max_test_tokens / n_test_images`` test tokens per
group are kept, sampled with a seed per image.

>>> from interp.detection.spec import DetectionSpec
>>> result = probes_study(source, detection=DetectionSpec(threshold="p98"), tasks=("position",), progress=False)
>>> sorted(result.position)                       # one score per token group, each with its chance level
['high_norm', 'normal']
>>> result.position["normal"].score is None       # four photos: the reason instead of a number
True
>>> result.position["normal"].note
'too few images (n=4) for a probe score; need >= 16'
"""
from __future__ import annotations

import math
import warnings
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Dict, List, Optional, Sequence, Tuple, Union

import torch

from ...errors import InterpError, InterpWarning
from ...models.inputs.preprocessing import patch_pixels  # noqa: F401  (its public home of earlier versions)
from ...detection.detection import DetectionLike, RunOptions, detection_header, detection_params
from ...detection.detection import Detection
from ...runtime.passes import Reading, run_readings
from ..core.result import OutlierStudyResult, skipped_records
from ...runtime.source import ActivationSource
from ..declaration import default_detection, study
from .configs import POSITION_LOSSES, TASKS, ProbesConfig, image_entries
from .image_sets import (DEFAULT_TEST_FRACTION, DEFAULT_VAL_FRACTION, cache_images, image_roles, set_labels,
                         split_summary)
from .split_file import read_split
from .scores import (LABEL_KINDS, MIN_GROUP_TOKENS, MIN_IMAGES, MIN_LABEL_IMAGES, MIN_TEST_IMAGES,  # noqa: F401
                     MIN_TRAIN_IMAGES, PIXEL_SPACE, GroupScore, Scoring, as_groups, score_labels, score_pixels,
                     score_position, too_few_images)
from .tokens import TEST, TRAIN, VAL, TokenSample, high_norm_mask
from ...hooks.names import resolve_block

PIXELS_FROM_CACHE = ("pixels: skipped, a cache holds no input images; pass the images the cache was written from "
                     "(--images on the command line, images= in Python) for the pixel probe")
# fit_probe's options and their defaults (recorded resolved in params["probe_options"]); val_fraction is the
# study's: the share of training images set aside for early stopping when patience is given
PROBE_OPTIONS = {"epochs": 30, "min_steps": 300, "batch_size": 4096, "lr": 1e-2, "weight_decay": 0.0,
                 "ridge": 1e-4, "aux_weight": 0.5, "patience": None, "val_fraction": DEFAULT_VAL_FRACTION,
                 "device": None, "seed": None}


@dataclass
class ProbesResult(OutlierStudyResult):
    """Result of :func:`probes_study`: per probe, {group: GroupScore}; ``notes`` say what was skipped and why.

    The detection header (``detect_layer``, ``threshold``, ``threshold_method``, ``artifacts_found``,
    ``warning``, ``preset``) has its one meaning (:class:`~interp.studies.core.result.OutlierStudyResult`);
    with a given ``outliers=`` mask ``threshold_method`` is "given", ``detect_layer`` -1 and ``threshold`` None.

    Attributes:
        hook: the probed tokens. outliers_from: how the high-norm patches were decided, in words.
        split: "random" (seeded, by image) or "given" (``test_images=``); test_ids / val_ids: those images.
        pixel_space: what the pixel targets (and so ``l2_error``, ``mse``) are measured in; pixel_values: values
            per token (3 x ph x pw).
        training: probe ("position", "pixels", "label.cls", ...) -> the schedule its fit ran
            (:attr:`~interp.studies.probes.linear_probe.LinearProbe.training`).
        unscored: "probe/group: reason" of each group with data but too little for a score (empty groups not
            included); too_few: why no probe was scored at all, else None.
    """

    study = "probes"
    hook: str = ""
    outliers_from: str = ""
    high_norm_share: float = 0.0
    n_images: int = 0
    n_train_images: int = 0
    n_val_images: int = 0
    n_test_images: int = 0
    n_train_tokens: int = 0
    split: str = "random"
    test_ids: List[str] = field(default_factory=list)
    val_ids: List[str] = field(default_factory=list)
    position_loss: str = "ce"
    pixel_space: Optional[str] = None
    pixel_values: Optional[int] = None
    position: Dict[str, GroupScore] = field(default_factory=dict)
    pixels: Dict[str, GroupScore] = field(default_factory=dict)
    label: Dict[str, GroupScore] = field(default_factory=dict)
    training: Dict[str, Dict[str, Any]] = field(default_factory=dict)
    notes: List[str] = field(default_factory=list)
    unscored: List[str] = field(default_factory=list)
    too_few: Optional[str] = None

    def __post_init__(self):
        self.position, self.pixels, self.label = as_groups(self.position), as_groups(self.pixels), as_groups(self.label)

    def console_lines(self, config=None) -> List[str]:
        """The split, one line per probe and group (:func:`probe_line`), then the notes."""
        lines = [f"high-norm patches: {self.outliers_from}; {self.n_train_images} training, {self.n_val_images} "
                 f"validation, {self.n_test_images} held-out images ({self.split} split)"]
        lines += [f"{probe:8s} {group:9s} n={entry.n:<6d} {probe_line(probe, entry)}"
                  for probe in ("position", "pixels", "label") for group, entry in getattr(self, probe).items()]
        return lines + list(self.notes)


def probe_line(probe: str, entry: GroupScore) -> str:
    """One group's figures in words (pixels: the L2 error first, then MSE and R^2), or why it has none."""
    if entry.score is None:
        return ("NOT SCORED: " if entry.too_few else "") + (entry.note or "no score")
    if probe == "pixels":
        return (f"L2 error {entry.l2_error:.4g} (chance {entry.chance_l2_error:.4g}), MSE {entry.mse:.4g}, "
                f"R^2 {entry.score:.3f} (chance {entry.chance:.3f})")
    return f"{entry.score:.3f} (chance {entry.chance:.3f})"


def resolve_probe_options(probe_options: Optional[Dict[str, Any]], seed: int) -> Dict[str, Any]:
    """:data:`PROBE_OPTIONS` overridden by ``probe_options`` (unknown keys refused), with the study's seed."""
    unknown = sorted(set(probe_options or {}) - set(PROBE_OPTIONS))
    if unknown:
        raise InterpError(f"probe_options: unknown {unknown}; known: {', '.join(PROBE_OPTIONS)}")
    out = {**PROBE_OPTIONS, "seed": seed, **(probe_options or {})}
    if out["patience"] is not None and (int(out["patience"]) < 1 or not 0 < float(out["val_fraction"]) < 1):
        raise InterpError(f"patience must be >= 1 and val_fraction in (0, 1); got {out['patience']!r} and "
                          f"{out['val_fraction']!r}")
    return out


def _header(found, mask: torch.Tensor, hook: str, blocks, warn: bool = True):
    """The detection header and params part of the result, and ``outliers_from`` in words (``warn``: raise the
    no-artifacts warning; not for a Detection handed in, whose maker warned already)."""
    if found is None:
        return ({"detect_layer": -1, "threshold": None, "threshold_method": "given", "warning": None,
                 "artifacts_found": bool(mask.any()), "preset": None}, {"threshold": None}, "given mask")
    header = detection_header(found, "probes", warn=warn)
    value = "none" if header["threshold"] is None else f"{header['threshold']:.4g}"
    return header, detection_params(found), (f"{found.method} threshold {value} on "
                                             f"{blocks.resid_post(found.layer)} (probed: {hook})")


@study(ProbesConfig)
def probes_study(source: ActivationSource, config: ProbesConfig, *, images: Union[torch.Tensor, str, Path, None] = None,
                 labels: Optional[Sequence[int]] = None, outliers: Optional[torch.Tensor] = None,
                 detection: DetectionLike, progress: bool = True) -> ProbesResult:
    """Position, pixel and label probes per token group (module docstring).

    Args:
        config: the options (:class:`~interp.studies.probes.configs.ProbesConfig`; or pass them as keywords):
            ``hook`` the probed tokens (default ``blocks.{layer}.hook_resid_post``), all token rows for
            CLS/registers; ``tasks`` any of ``position``, ``pixels``, ``label``; ``position_loss`` ``ce`` (Darcet)
            or ``ce+mse`` (the reassessment: + 0.5 x MSE of (row, col)); ``test_images``
            (and ``train_images``): the held-out (and training) images among the source's: ids or paths, or a
            folder / list file naming them (two folders in an image-folder layout label the images by class
            name across both); ``split`` a split file naming both sets; else a seeded random split holding out
            ``test_fraction`` (default 0.25) of the images; ``max_train_tokens`` / ``max_test_tokens`` the token
            caps; ``budget`` the probe budget (a :class:`~interp.studies.core.options.ProbeBudget`: ``epochs``,
            ``min_steps``, ``lr``, ``weight_decay``, ``ridge``, ``patience``, ``val_fraction``) and ``probe_options`` (any of :data:`PROBE_OPTIONS`; the budget options win).
        images: the pixel probe's input images on a cache source: Tensor[N, 3, H, W] preprocessed as the cache
            was, or the image files the cache was written from (read with the cache's transform).
        labels: [N] class ids (default ``source.labels``).
        outliers: a given high-norm mask Bool[N, t] or [N, P]; else the detection decides.
        detection: the high-norm patches: a Detection made on this source, or a DetectionSpec (default the
            config's: "auto", the block chosen, on the block's ``hook_resid_post``); not with ``outliers``.
    """
    c = config
    if outliers is not None and detection == default_detection(ProbesConfig):
        detection = None  # the mask decides
    if isinstance(images, (str, Path)):
        images = cache_images(source, images) if not source.is_live and "pixels" in c.tasks else None
    train, test = ((None, None) if c.split is None else read_split(c.split))
    if c.test_images is not None:
        train = None if c.train_images is None else image_entries(c.train_images)
        test = image_entries(c.test_images)
        if labels is None and _is_folder(c.train_images) and _is_folder(c.test_images):
            labels = set_labels(source.ids, [c.train_images, c.test_images])[0]  # one class index per name
    reading = probes_reading(source, c.hook, layer=c.layer, tasks=c.tasks, position_loss=c.position_loss,
                             outliers=outliers, detection=detection, images=images,
                             labels=labels, test_images=test, train_images=train, test_fraction=c.test_fraction,
                             max_train_tokens=c.max_train_tokens, max_test_tokens=c.max_test_tokens, seed=c.seed,
                             batch_size=source.batch_size,
                             probe_options={**(c.probe_options or {}), **c.budget.probe_budget()}, progress=progress)
    return run_readings(source, [reading], source.batch_size, progress, "probe tokens")[0]


def _is_folder(images) -> bool:
    return isinstance(images, (str, Path)) and Path(images).is_dir()


def probes_reading(source: ActivationSource, hook: Optional[str] = None, *, layer: int = -1,
                   tasks: Sequence[str] = TASKS, position_loss: str = "ce",
                   outliers: Optional[torch.Tensor] = None, detection: DetectionLike = None,
                   images: Optional[torch.Tensor] = None,
                   labels: Optional[Sequence[int]] = None, test_images: Optional[Sequence] = None,
                   train_images: Optional[Sequence] = None, test_fraction: Optional[float] = None,
                   max_train_tokens: int = 50_000, max_test_tokens: int = 20_000, seed: int = 0,
                   batch_size: Optional[int] = None, probe_options: Optional[Dict[str, Any]] = None,
                   progress: bool = False) -> Reading:
    """:func:`probes_study` around its token pass: the checks, the image split and the high-norm mask first
    (a detection pass unless ``detection`` is a Detection; ``progress`` is its bar), then a
    :class:`~interp.runtime.passes.Reading` whose reader samples each batch's tokens and whose ``finish()``
    fits and scores the probes (so the probes can share one pass with other studies).

    Args: those of :func:`probes_study`.
    """
    unknown = set(tasks) - set(TASKS)
    if unknown or position_loss not in POSITION_LOSSES:
        raise InterpError(f"tasks must be among position, pixels, label (got {sorted(unknown)}) and "
                          f"position_loss one of {list(POSITION_LOSSES)} (got {position_loss!r})")
    hook = hook or source.blocks.resid_post(resolve_block(layer, source.n_layers))
    source.require([hook])
    bs = batch_size or source.batch_size
    options = resolve_probe_options(probe_options, seed)
    val_fraction = options.pop("val_fraction")
    if options["patience"] is None:
        val_fraction = None  # no early stopping: every training image is fitted on
    n = len(source)
    if images is not None and tuple(images.shape[:1]) != (n,):
        raise InterpError(f"images must be Tensor[N={n}, 3, H, W], got {tuple(images.shape)}")
    roles, split = image_roles(source.ids, test_images=test_images, train_images=train_images,
                               test_fraction=test_fraction, val_fraction=val_fraction, seed=seed,
                               skipped=[image for image, _ in source.skipped])
    count = split_summary(roles)
    high_mask, found = high_norm_mask(source, outliers, detection, RunOptions(batch_size=bs, progress=progress))
    header, detection_part, outliers_from = _header(found, high_mask, hook, source.blocks,
                                                    warn=not isinstance(detection, Detection))
    caps = {TRAIN: math.ceil(max_train_tokens / max(count["train"], 1)),
            VAL: math.ceil(max_train_tokens / max(count["train"], 1)),
            TEST: math.ceil(max_test_tokens / max(count["test"], 1))}
    labels = source.labels if labels is None else labels
    labels = None if labels is None or "label" not in tasks else torch.as_tensor(list(labels)).long()
    if labels is not None and len(labels) != n:
        raise InterpError(f"labels must give one class id per image ({n}), got {len(labels)}")
    recorded = {**options, "val_fraction": val_fraction, "device": None if options["device"] is None
                else str(options["device"])}
    params = {"hook": hook, "tasks": list(tasks), "position_loss": position_loss, **detection_part,
              "outliers": "given" if found is None else "detection", "split": split,
              "test_fraction": (DEFAULT_TEST_FRACTION if test_fraction is None else test_fraction)
              if split == "random" else None, "max_train_tokens": max_train_tokens,
              "max_test_tokens": max_test_tokens, "probe_options": recorded}
    sample = TokenSample(source, hook, images, high_mask, roles, labels is not None, caps, seed,
                         want_pixels="pixels" in tasks)
    plan = _Plan(source, hook, tuple(tasks), position_loss, labels, roles, split, count, high_mask, header,
                 outliers_from, params, options, seed)
    return Reading([sample.fold], lambda: _finish(sample.collected(), plan))


@dataclass
class _Plan:
    """What :func:`probes_reading` decided before the token pass, for :func:`_finish`."""

    source: ActivationSource
    hook: str
    tasks: Tuple[str, ...]
    position_loss: str
    labels: Optional[torch.Tensor]
    roles: torch.Tensor
    split: str
    count: Dict[str, int]
    high_mask: torch.Tensor
    header: Dict[str, Any]
    outliers_from: str
    params: Dict[str, Any]
    options: Dict[str, Any]
    seed: int


def _finish(got, plan: _Plan) -> ProbesResult:
    """Fit and score the probes on what the token pass kept; the ProbesResult."""
    source, tasks, notes = plan.source, plan.tasks, []

    def note_empty(group: str) -> str:
        return f"empty: no {group.replace('_', '-')} patch token in the test images ({plan.outliers_from})"

    too_few = too_few_images(len(source), plan.count["test"], plan.count["train"])
    val = got.val if len(got.val) else None
    scoring = Scoring(note_empty, too_few, plan.options if val is not None else
                      {k: v for k, v in plan.options.items() if k != "patience"}, val)
    position = score_position(got.train, got.test, source.layout.grid, plan.position_loss, scoring) \
        if "position" in tasks else {}
    pixels: Dict[str, GroupScore] = {}
    if "pixels" in tasks and got.has_pixels:
        pixels = score_pixels(got.train, got.test, scoring)
    elif "pixels" in tasks:
        notes.append(PIXELS_FROM_CACHE)
    label_scores: Dict[str, GroupScore] = {}
    if plan.labels is not None:
        label_scores = score_labels(got.label_tokens, plan.labels, plan.roles, scoring)
    elif "label" in tasks:
        notes.append("label: skipped, the images carry no labels (use an image-folder layout or labels=)")
    unscored = [f"{probe}/{group}: {g.note}" for probe, groups in (("position", position), ("pixels", pixels),
                                                                    ("label", label_scores))
                for group, g in groups.items() if g.too_few]
    if too_few:
        warnings.warn(f"probes: no probe scored: {too_few}", InterpWarning, stacklevel=3)
    elif unscored:
        warnings.warn(f"probes: {len(unscored)} group(s) not scored, too little data: " + "; ".join(unscored),
                      InterpWarning, stacklevel=3)
    px = next((side.px for side in (got.train, got.test) if side.px is not None), None)
    pixel_space, pixel_values = (PIXEL_SPACE, int(px.shape[1])) if pixels and px is not None else (None, None)
    ids, roles = list(source.ids), plan.roles
    return ProbesResult(
        model=source.model_name, fingerprint=source.fingerprint, params=plan.params, seed=plan.seed, ids=ids,
        skipped=skipped_records(source), **plan.header, hook=plan.hook, outliers_from=plan.outliers_from,
        high_norm_share=float(plan.high_mask.float().mean()) if plan.high_mask.numel() else 0.0,
        n_images=len(source), n_train_images=plan.count["train"], n_val_images=plan.count["val"],
        n_test_images=plan.count["test"], n_train_tokens=len(got.train), split=plan.split,
        test_ids=[ids[i] for i in torch.nonzero(roles == TEST).flatten()],
        val_ids=[ids[i] for i in torch.nonzero(roles == VAL).flatten()], position_loss=plan.position_loss,
        pixel_space=pixel_space, pixel_values=pixel_values, position=position, pixels=pixels, label=label_scores,
        training=scoring.training, notes=notes, unscored=unscored, too_few=too_few)
