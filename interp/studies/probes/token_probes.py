"""Linear probes per token group (Darcet et al. Table 1b; the reassessment's probes; docs/methods.md sections 4 and 6).

Do high-norm ("artifact") tokens still hold local information? Three probes on one hook's tokens (default
the last block's un-normalised residual stream), trained on the tokens of training images and scored per
token group on held-out images (the split is by image, seeded):

* ``position``: the patch index (softmax probe over all P cells; top-1 accuracy and mean distance in
  patches between predicted and true cell). ``position_loss="ce+mse"`` is the reassessment's variant: an
  extra linear head regresses (row, col) / (grid - 1) and adds 0.5 x its MSE to the cross-entropy.
* ``pixels``: the token's own input patch (the model's normalised RGB values, [3 x ph x pw]) by ridge
  regression, scored by R^2. It needs the input images: a live source supplies them; for a cache pass
  ``images=`` (Tensor[N, 3, H, W] preprocessed as the cache was); otherwise the probe is skipped with a note.
* ``label``: the image's class from ONE token per image (CLS, the first register, one random normal patch,
  one random high-norm patch), one probe per kind, when labels exist (``source.labels``, e.g. an image-folder
  layout, or ``labels=``).

Groups: ``normal`` and ``high_norm`` patches. High-norm = ``outliers`` (a given bool mask [N, t] or [N, P]),
else a given :class:`~interp.studies.core.outliers.Detection`, else ``threshold`` (a norm, ``pNN`` such as the
reassessment's ``p98``, or ``auto``: the bimodal split, empty when the model has no artifacts) on the token
norms at the probed hook. Every score comes with its chance level (the best constant guess of the training
set); an empty group is reported as such (``n = 0`` and a note), never as a number.

Too little data: below :data:`MIN_IMAGES` images (or :data:`MIN_TEST_IMAGES` held-out ones) no probe is
trained, and a group with fewer than :data:`MIN_GROUP_TOKENS` held-out tokens (label probes:
:data:`MIN_LABEL_IMAGES` held-out images) is not scored: its ``score`` and ``chance`` are None and its ``note``
gives the reason ("too few images (n=4) for a probe score; need >= 16"). A probe fitted on three images scores
anything (an R^2 of -20 on 768 pixel targets); that is not a finding.

Memory: two streaming passes over the source (norms, then tokens); per image at most
``max_train_tokens / n_train_images`` training tokens and ``max_test_tokens / n_test_images`` test tokens per
group are kept, sampled with a seed per image.

>>> result = probes_study(source, threshold="p98", tasks=("position",), progress=False)
>>> sorted(result.position)                       # one score per token group, each with its chance level
['high_norm', 'normal']
>>> result.position["normal"].score is None       # four photos: the reason instead of a number
True
>>> result.position["normal"].note
'too few images (n=4) for a probe score; need >= 16'
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any, Dict, List, Optional, Sequence, Tuple

import numpy as np
import torch

from ...errors import InterpError
from ...models.preprocessing import patch_pixels
from .linear_probe import accuracy, chance_score, fit_probe, split_indices
from ..core.outliers import Detection, ThresholdSpec, resid_post, resolve_layer, resolve_threshold
from ..aggregation.patch_score import split_tokens
from ..core.result import StudyResult
from ..core.passes import Reader, Reading, run_readings
from ..core.source import ActivationSource, token_norms

POSITION_LOSSES = ("ce", "ce+mse")
# The minimums below which a probe score is noise, not a finding (module docstring). The CLI, the report page,
# ``interp compare`` and the figure all show the GroupScore note these produce instead of a number.
MIN_IMAGES = 16  # images in the source (training + held-out)
MIN_TEST_IMAGES = 4  # held-out images
MIN_GROUP_TOKENS = 32  # held-out tokens of one group (position, pixels)
MIN_LABEL_IMAGES = 8  # held-out images with a token of that kind (label: one token per image)
LABEL_KINDS = ("cls", "register", "normal", "high_norm")


@dataclass
class GroupScore:
    """One probe's score on one token group of the test images.

    Attributes:
        n: test tokens (images, for label probes) in the group; 0 = empty group (see ``note``).
        score: top-1 accuracy (position, label) or R^2 (pixels); None when empty.
        chance: the same score for the best constant guess fitted on the training tokens.
        mean_distance, chance_distance: position only: mean Euclidean distance in patches between predicted
            and true cell, and the same for a uniformly random cell.
    """

    n: int
    score: Optional[float] = None
    chance: Optional[float] = None
    mean_distance: Optional[float] = None
    chance_distance: Optional[float] = None
    note: Optional[str] = None


def _groups(d: Optional[dict]) -> Dict[str, GroupScore]:
    return {k: v if isinstance(v, GroupScore) else GroupScore(**v) for k, v in (d or {}).items()}


@dataclass
class ProbesResult(StudyResult):
    """Result of :func:`probes_study`: per probe, {group: GroupScore}; ``notes`` say what was skipped and why."""

    study = "probes"
    hook: str = ""
    threshold: Optional[float] = None
    threshold_method: str = ""
    high_norm_share: float = 0.0
    n_images: int = 0
    n_train_images: int = 0
    n_test_images: int = 0
    n_train_tokens: int = 0
    position_loss: str = "ce"
    position: Dict[str, GroupScore] = field(default_factory=dict)
    pixels: Dict[str, GroupScore] = field(default_factory=dict)
    label: Dict[str, GroupScore] = field(default_factory=dict)
    notes: List[str] = field(default_factory=list)
    too_few: Optional[str] = None  # why no probe was scored on this many images (MIN_IMAGES), else None

    def __post_init__(self):
        self.position, self.pixels, self.label = _groups(self.position), _groups(self.pixels), _groups(self.label)


def _patch_norms(norms: torch.Tensor, layout) -> torch.Tensor:
    """Patch columns [b, P] of token norms [b, t] (all rows, or a patches-only cache)."""
    if norms.shape[1] == layout.n_tokens:
        return norms[:, layout.patch_slice]
    if norms.shape[1] == layout.n_patches:
        return norms
    raise InterpError(f"the hook has {norms.shape[1]} token rows; the layout has {layout.n_tokens}")


def high_norm_mask(source: ActivationSource, hook: str, outliers: Optional[torch.Tensor],
                   detection: Optional[Detection], threshold: ThresholdSpec,
                   batch_size: int) -> Tuple[torch.Tensor, Optional[float], str]:
    """(bool [N, P] high-norm patches, threshold value or None, how it was decided)."""
    n, layout = len(source), source.layout
    if outliers is not None:
        mask = torch.as_tensor(outliers).bool()
        if mask.ndim == 2 and mask.shape[1] == layout.n_tokens and mask.shape[1] != layout.n_patches:
            mask = mask[:, layout.patch_slice]
        if tuple(mask.shape) != (n, layout.n_patches):
            raise InterpError(f"outliers must be bool [N, t] or [N, P] = [{n}, {layout.n_patches}], got "
                              f"{tuple(mask.shape)}")
        return mask, None, "given mask"
    if detection is not None:
        detection.check(source)
        return detection.outliers, detection.threshold.value, f"{detection.method} at block {detection.layer}"
    norms = torch.cat([_patch_norms(b.acts[hook], b.layout)
                       for b in source.batches([hook], batch_size, reduce={hook: token_norms})])
    thr = resolve_threshold(norms.numpy().ravel(), threshold)
    return norms > thr.value, thr.value, f"{thr.method} ({threshold}) at {hook}"


def _pick(rng: np.random.Generator, idx: np.ndarray, cap: int) -> np.ndarray:
    return idx if idx.size <= cap else np.sort(rng.choice(idx, size=cap, replace=False))


@dataclass
class _Tokens:
    """Sampled tokens of one split: features [n, d], patch index [n], high-norm flag [n], pixels [n, k]."""

    x: List[torch.Tensor] = field(default_factory=list)
    pos: List[torch.Tensor] = field(default_factory=list)
    high: List[torch.Tensor] = field(default_factory=list)
    px: List[torch.Tensor] = field(default_factory=list)

    def add(self, patches, pixels, high, idx) -> None:
        sel = torch.from_numpy(idx)
        self.x.append(patches[sel])
        self.pos.append(sel)
        self.high.append(high[sel])
        if pixels is not None:
            self.px.append(pixels[sel])

    def cat(self, name: str) -> torch.Tensor:
        return torch.cat(getattr(self, name))


def _label_tokens(tokens: torch.Tensor, patches: torch.Tensor, high: torch.Tensor, layout,
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


def too_few_images(n_images: int, n_test_images: int) -> Optional[str]:
    """Why no probe can be scored on this many images (None when there are enough; :data:`MIN_IMAGES`)."""
    if n_images < MIN_IMAGES:
        return f"too few images (n={n_images}) for a probe score; need >= {MIN_IMAGES}"
    if n_test_images < MIN_TEST_IMAGES:
        return (f"too few held-out images ({n_test_images} of {n_images}) for a probe score; need >= "
                f"{MIN_TEST_IMAGES} (more images or a larger test fraction)")
    return None


def _unscored(group: str, n: int, too_few: Optional[str], note_empty, minimum: int = MIN_GROUP_TOKENS,
              what: str = "tokens") -> Optional[GroupScore]:
    """The GroupScore of a group that gets no number (empty, too few images, too few tokens), else None."""
    if n == 0:
        return GroupScore(0, note=note_empty(group))
    if too_few:
        return GroupScore(n, note=too_few)
    if n < minimum:
        return GroupScore(n, note=f"too few held-out {group.replace('_', '-')} {what} (n={n}) for a probe score; "
                                  f"need >= {minimum}")
    return None


def _score_position(train: _Tokens, test: _Tokens, grid, position_loss, note_empty, too_few,
                    options) -> Dict[str, GroupScore]:
    gh, gw = grid
    x_test, y_test, high = test.cat("x"), test.cat("pos"), test.cat("high")
    groups = {"normal": ~high, "high_norm": high}
    out = {g: _unscored(g, int(sel.sum()), too_few, note_empty) for g, sel in groups.items()}
    if all(v is not None for v in out.values()):
        return out  # nothing to score: no probe is trained
    y = train.cat("pos")
    rowcol = torch.stack([y // gw, y % gw], 1).float() / torch.tensor([max(gh - 1, 1), max(gw - 1, 1)])
    probe = fit_probe(train.cat("x"), y, "classify", n_classes=gh * gw,
                      aux_targets=rowcol if position_loss == "ce+mse" else None, **options)
    cells = torch.stack(torch.meshgrid(torch.arange(gh), torch.arange(gw), indexing="ij"), -1).reshape(-1, 2).float()
    to_random_cell = torch.cdist(cells, cells).mean(1)  # [P] mean distance from a cell to a uniform guess
    for group, sel in groups.items():
        if out[group] is not None:
            continue
        pred, truth = probe.predict(x_test[sel]), y_test[sel]
        out[group] = GroupScore(int(sel.sum()), accuracy(pred, truth), chance_score("classify", y, truth),
                                float((cells[pred] - cells[truth]).norm(dim=1).mean()),
                                float(to_random_cell[truth].mean()))
    return out


def _score_pixels(train: _Tokens, test: _Tokens, note_empty, too_few, options) -> Dict[str, GroupScore]:
    x_test, y_test, high = test.cat("x"), test.cat("px"), test.cat("high")
    groups = {"normal": ~high, "high_norm": high}
    out = {g: _unscored(g, int(sel.sum()), too_few, note_empty) for g, sel in groups.items()}
    if all(v is not None for v in out.values()):
        return out
    y = train.cat("px")
    probe = fit_probe(train.cat("x"), y, "regress", **options)
    for group, sel in groups.items():
        if out[group] is None:
            out[group] = GroupScore(int(sel.sum()), probe.score(x_test[sel], y_test[sel]),
                                    chance_score("regress", y, y_test[sel]))
    return out


def _score_labels(label_tokens: Dict[str, List[Tuple[int, torch.Tensor]]], labels: torch.Tensor,
                  is_test: torch.Tensor, too_few: Optional[str], options) -> Dict[str, GroupScore]:
    out = {}
    for kind in LABEL_KINDS:
        rows = label_tokens.get(kind, [])
        tr = [(i, v) for i, v in rows if not is_test[i]]
        te = [(i, v) for i, v in rows if is_test[i]]
        y_tr = labels[[i for i, _ in tr]] if tr else torch.zeros(0, dtype=torch.long)
        if not te or len(set(y_tr.tolist())) < 2:
            if not rows:
                why = f"the model has no {kind} token" if kind in ("cls", "register") else f"no image has a {kind} patch"
            else:
                why = "no such token in the test images" if not te else "training images of fewer than 2 classes"
            out[kind] = GroupScore(len(te), note=f"empty: {why}")
            continue
        unscored = _unscored(kind, len(te), too_few, None, MIN_LABEL_IMAGES, "images")
        if unscored is not None:
            out[kind] = unscored
            continue
        probe = fit_probe(torch.stack([v for _, v in tr]), y_tr, "classify", n_classes=int(labels.max()) + 1,
                          **options)
        y_te = labels[[i for i, _ in te]]
        out[kind] = GroupScore(len(te), probe.score(torch.stack([v for _, v in te]), y_te),
                               chance_score("classify", y_tr, y_te))
    return out


class _Collect:
    """The probes' token pass as a reader (image g sampled with rng([seed, g])); pixels: the forward's or ``images``."""

    def __init__(self, source: ActivationSource, hook: str, images: Optional[torch.Tensor], high_mask: torch.Tensor,
                 is_test: torch.Tensor, labels: Optional[torch.Tensor], cap_train: int, cap_test: int, seed: int,
                 want_pixels: bool = True):
        self.layout, self.hook, self.images, self.want_pixels = source.layout, hook, images, want_pixels
        self.high_mask, self.is_test, self.labels, self.seed = high_mask, is_test, labels, seed
        self.cap_train, self.cap_test = cap_train, cap_test
        self.train, self.test = _Tokens(), _Tokens()
        self.label_tokens: Dict[str, List[Tuple[int, torch.Tensor]]] = {}
        self.has_pixels = want_pixels and (images is not None or source.is_live)
        self.reader = Reader([hook], self.fold, images=want_pixels and images is None and source.is_live)

    def fold(self, batch) -> None:
        layout, start, tokens = self.layout, batch.start, batch.acts[self.hook]
        given = self.images[start:start + len(batch)].float() if self.images is not None else batch.images
        imgs = given if self.want_pixels else None
        patches = split_tokens(tokens, layout)[1]
        pixels = patch_pixels(imgs, layout.grid) if imgs is not None else None
        for i in range(tokens.shape[0]):
            g, high = start + i, self.high_mask[start + i]
            rng = np.random.default_rng([self.seed, g])
            if self.is_test[g]:
                idx = np.concatenate([_pick(rng, np.flatnonzero(~high.numpy()), self.cap_test),
                                      _pick(rng, np.flatnonzero(high.numpy()), self.cap_test)])
                self.test.add(patches[i], None if pixels is None else pixels[i], high, idx)
            else:
                self.train.add(patches[i], None if pixels is None else pixels[i], high,
                               _pick(rng, np.arange(len(high)), self.cap_train))
            if self.labels is not None:
                full = tokens[i] if tokens.shape[1] == layout.n_tokens else None
                for kind, vec in _label_tokens(full, patches[i], high, layout, rng).items():
                    self.label_tokens.setdefault(kind, []).append((g, vec.clone()))


def probes_study(source: ActivationSource, hook: Optional[str] = None, *, layer: int = -1,
                 tasks: Sequence[str] = ("position", "pixels", "label"), position_loss: str = "ce",
                 outliers: Optional[torch.Tensor] = None, detection: Optional[Detection] = None,
                 threshold: ThresholdSpec = "auto", images: Optional[torch.Tensor] = None,
                 labels: Optional[Sequence[int]] = None, test_fraction: float = 0.25,
                 max_train_tokens: int = 50_000, max_test_tokens: int = 20_000, seed: int = 0,
                 batch_size: Optional[int] = None, probe_options: Optional[Dict[str, Any]] = None,
                 progress: bool = True) -> ProbesResult:
    """Position, pixel and label probes per token group (module docstring).

    Args:
        hook: the probed tokens (default ``blocks.{layer}.hook_resid_post``), all token rows for CLS/registers.
        tasks: any of ``position``, ``pixels``, ``label``.
        position_loss: ``ce`` (Darcet) or ``ce+mse`` (the reassessment: + 0.5 x MSE of (row, col)).
        outliers / detection / threshold: what counts as high-norm (first given wins; module docstring).
        images: Tensor[N, 3, H, W] preprocessed inputs for the pixel probe on a cache source.
        labels: [N] class ids (default ``source.labels``).
        probe_options: passed to :func:`~interp.studies.probes.linear_probe.fit_probe` (epochs, lr, device, ...).
    """
    reading = probes_reading(source, hook, layer=layer, tasks=tasks, position_loss=position_loss,
                             outliers=outliers, detection=detection, threshold=threshold, images=images,
                             labels=labels, test_fraction=test_fraction, max_train_tokens=max_train_tokens,
                             max_test_tokens=max_test_tokens, seed=seed, batch_size=batch_size,
                             probe_options=probe_options)
    return run_readings(source, [reading], batch_size, progress, "probe tokens")[0]


def probes_reading(source: ActivationSource, hook: Optional[str] = None, *, layer: int = -1,
                   tasks: Sequence[str] = ("position", "pixels", "label"), position_loss: str = "ce",
                   outliers: Optional[torch.Tensor] = None, detection: Optional[Detection] = None,
                   threshold: ThresholdSpec = "auto", images: Optional[torch.Tensor] = None,
                   labels: Optional[Sequence[int]] = None, test_fraction: float = 0.25,
                   max_train_tokens: int = 50_000, max_test_tokens: int = 20_000, seed: int = 0,
                   batch_size: Optional[int] = None, probe_options: Optional[Dict[str, Any]] = None) -> Reading:
    """:func:`probes_study` around its token pass (the high-norm mask decided first): the reader sampling each
    batch's tokens, then the probes' :class:`ProbesResult` (for a shared pass, :mod:`interp.studies.core.passes`)."""
    unknown = set(tasks) - {"position", "pixels", "label"}
    if unknown or position_loss not in POSITION_LOSSES:
        raise InterpError(f"tasks must be among position, pixels, label (got {sorted(unknown)}) and "
                          f"position_loss one of {list(POSITION_LOSSES)} (got {position_loss!r})")
    hook = hook or resid_post(resolve_layer(layer, source.n_layers))
    source.require([hook])
    bs = batch_size or source.batch_size
    options = {"seed": seed, **(probe_options or {})}
    n, layout, notes = len(source), source.layout, []
    high_mask, thr_value, thr_method = high_norm_mask(source, hook, outliers, detection, threshold, bs)
    # one image cannot be split: it is held out and no probe is trained (too_few_images gives the reason)
    test_idx = split_indices(n, test_fraction=test_fraction, seed=seed)[1] if n >= 2 else list(range(n))
    is_test = torch.zeros(n, dtype=torch.bool)
    is_test[test_idx] = True
    n_train = n - len(test_idx)
    cap_train, cap_test = math.ceil(max_train_tokens / max(n_train, 1)), math.ceil(max_test_tokens / len(test_idx))
    labels = source.labels if labels is None else labels
    labels = None if labels is None or "label" not in tasks else torch.as_tensor(list(labels)).long()
    if images is not None and tuple(images.shape[:1]) != (n,):
        raise InterpError(f"images must be Tensor[N={n}, 3, H, W], got {tuple(images.shape)}")
    collect = _Collect(source, hook, images, high_mask, is_test, labels, cap_train, cap_test, seed,
                       want_pixels="pixels" in tasks)

    def finish() -> ProbesResult:
        train, test, label_tokens, has_pixels = collect.train, collect.test, collect.label_tokens, collect.has_pixels

        def note_empty(group: str) -> str:
            return f"empty: no {group.replace('_', '-')} patch token in the test images ({thr_method})"

        too_few = too_few_images(n, len(test_idx))
        position = _score_position(train, test, layout.grid, position_loss, note_empty, too_few, options) \
            if "position" in tasks else {}
        pixels_scores: Dict[str, GroupScore] = {}
        if "pixels" in tasks and has_pixels:
            pixels_scores = _score_pixels(train, test, note_empty, too_few, options)
        elif "pixels" in tasks:
            notes.append("pixels: skipped, the source has no input images (a cache): pass images=Tensor[N, 3, H, W]")
        label_scores = {}
        if labels is not None:
            label_scores = _score_labels(label_tokens, labels, is_test, too_few, options)
        elif "label" in tasks:
            notes.append("label: skipped, the images carry no labels (use an image-folder layout or labels=)")
        params = {"hook": hook, "tasks": list(tasks), "position_loss": position_loss, "threshold": str(threshold),
                  "test_fraction": test_fraction, "max_train_tokens": max_train_tokens,
                  "max_test_tokens": max_test_tokens, "probe_options": probe_options or {}}
        return ProbesResult(
            model=source.model_name, fingerprint=source.fingerprint, params=params, seed=seed, hook=hook,
            threshold=thr_value, threshold_method=thr_method, high_norm_share=float(high_mask.float().mean()),
            n_images=n, n_train_images=n_train, n_test_images=len(test_idx), n_train_tokens=int(sum(map(len, train.pos))),
            position_loss=position_loss, position=position, pixels=pixels_scores, label=label_scores, notes=notes,
            too_few=too_few)

    return Reading([collect.reader], finish)
