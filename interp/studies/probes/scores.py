"""Scores of the probes study per token group, and the minimums below which a score is noise, not a finding.

Each probe is fitted once on the training tokens and scored on every token group of the held-out images:

* position (Darcet et al. Fig. 5b, left): top-1 accuracy over the P cells and the mean distance in patches
  between predicted and true cell;
* pixels (Darcet et al. Fig. 5b, right): the token's own input patch, scored by the mean per-token L2
  reconstruction error (the paper's measure), the MSE and R^2, all in the model's normalised input space
  (:data:`PIXEL_SPACE`). R^2 divides by each group's own target variance, so it can order the groups
  differently from the L2 error; the L2 error is the figure to compare with the paper;
* label (Darcet et al. Table 1): the image class from one token per image, one probe per token kind.

Too little data (the named minimums below): no probe is trained below :data:`MIN_IMAGES` images,
:data:`MIN_TRAIN_IMAGES` training or :data:`MIN_TEST_IMAGES` held-out images, and a group is not scored below
:data:`MIN_GROUP_TOKENS` held-out tokens (label probes: :data:`MIN_LABEL_IMAGES` held-out images). Such a group's
numbers are None and its ``note`` says why ("too few images (n=4) for a probe score; need >= 16"): a probe
fitted on four images scores anything (an R^2 of -20 on 768 pixel targets), which is not a finding.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable, Dict, List, Optional, Tuple

import torch

from .linear_probe import accuracy, chance_score, fit_probe

MIN_IMAGES = 16  # images in the source (training + held-out)
MIN_TRAIN_IMAGES = 8  # images the probes are fitted on (a validation split for early stopping excluded)
MIN_TEST_IMAGES = 4  # held-out images
MIN_GROUP_TOKENS = 32  # held-out tokens of one group (position, pixels)
MIN_LABEL_IMAGES = 8  # held-out images with a token of that kind (label: one token per image)
LABEL_KINDS = ("cls", "register", "normal", "high_norm")
TOKEN_GROUPS = ("normal", "high_norm")
PIXEL_SPACE = ("the model's normalised input: (x - mean) / std per channel of its preprocessing (timm data "
               "config), x the RGB value in [0, 1] after resize and crop; 3 x ph x pw values per token")
TOO_FEW = "too few"  # every note of a group left unscored for lack of data starts so (empty groups say "empty")


@dataclass
class GroupScore:
    """One probe's score on one token group of the test images.

    Attributes:
        n: test tokens (images, for label probes) in the group; 0 = empty group (see ``note``).
        score: top-1 accuracy (position, label) or R^2 (pixels); None when not scored (``note`` says why).
        chance: the same score for the best constant guess fitted on the training tokens.
        mean_distance, chance_distance: position only: mean Euclidean distance in patches between predicted
            and true cell, and the same for a uniformly random cell.
        l2_error, chance_l2_error: pixels only: mean over the group's tokens of the Euclidean norm of
            (prediction - target) over the token's 3 x ph x pw values (:data:`PIXEL_SPACE`), for the probe
            and for the training mean patch.
        mse: pixels only: mean squared error per value (the same space).
        note: why there is no number (empty group, too few images or tokens), else None.
    """

    n: int
    score: Optional[float] = None
    chance: Optional[float] = None
    mean_distance: Optional[float] = None
    chance_distance: Optional[float] = None
    l2_error: Optional[float] = None
    chance_l2_error: Optional[float] = None
    mse: Optional[float] = None
    note: Optional[str] = None

    @property
    def too_few(self) -> bool:
        """True when the group has data but too little of it for a score (not when it is empty)."""
        return self.score is None and bool(self.note) and self.note.startswith(TOO_FEW)


def as_groups(d: Optional[dict]) -> Dict[str, GroupScore]:
    """{group: GroupScore} from GroupScores or their JSON dicts."""
    return {k: v if isinstance(v, GroupScore) else GroupScore(**v) for k, v in (d or {}).items()}


def too_few_images(n_images: int, n_test_images: int, n_train_images: Optional[int] = None) -> Optional[str]:
    """Why no probe can be scored on this many images (None when there are enough; :data:`MIN_IMAGES`,
    :data:`MIN_TEST_IMAGES`, :data:`MIN_TRAIN_IMAGES`)."""
    if n_images < MIN_IMAGES:
        return f"too few images (n={n_images}) for a probe score; need >= {MIN_IMAGES}"
    if n_test_images < MIN_TEST_IMAGES:
        return (f"too few held-out images ({n_test_images} of {n_images}) for a probe score; need >= "
                f"{MIN_TEST_IMAGES} (more images, a larger test fraction or more test images)")
    if n_train_images is not None and n_train_images < MIN_TRAIN_IMAGES:
        return (f"too few training images ({n_train_images} of {n_images}) for a probe score; need >= "
                f"{MIN_TRAIN_IMAGES} (more training images or a smaller test or validation fraction)")
    return None


def unscored(group: str, n: int, too_few: Optional[str], note_empty: Callable[[str], str],
             minimum: int = MIN_GROUP_TOKENS, what: str = "tokens") -> Optional[GroupScore]:
    """The GroupScore of a group that gets no number (empty, too few images, too few tokens), else None."""
    if n == 0:
        return GroupScore(0, note=note_empty(group))
    if too_few:
        return GroupScore(n, note=too_few)
    if n < minimum:
        return GroupScore(n, note=f"too few held-out {group.replace('_', '-')} {what} (n={n}) for a probe score; "
                                  f"need >= {minimum}")
    return None


@dataclass
class Split:
    """The sampled tokens of one side (train, validation or test), concatenated: features x [n, d], patch
    index pos [n], high-norm flag high [n], pixels px [n, k] (None without input images)."""

    x: torch.Tensor
    pos: torch.Tensor
    high: torch.Tensor
    px: Optional[torch.Tensor] = None

    def __len__(self) -> int:
        return int(self.x.shape[0])


@dataclass
class Scoring:
    """What every scorer needs: the note of an empty group, the too-few-images reason, the fit options
    (:func:`~interp.studies.probes.linear_probe.fit_probe`) and the validation split (None: no early stopping)."""

    note_empty: Callable[[str], str]
    too_few: Optional[str]
    options: Dict
    val: Optional[Split] = None
    training: Dict[str, Dict] = field(default_factory=dict)  # probe -> the fit's schedule record


def _groups_of(test: Split) -> Dict[str, torch.Tensor]:
    return {"normal": ~test.high, "high_norm": test.high}


def _rowcol(y: torch.Tensor, grid: Tuple[int, int]) -> torch.Tensor:
    """(row, col) / (grid - 1) of patch indices y [n]: the auxiliary target of the ``ce+mse`` position loss."""
    gh, gw = grid
    return torch.stack([y // gw, y % gw], 1).float() / torch.tensor([max(gh - 1, 1), max(gw - 1, 1)])


def score_position(train: Split, test: Split, grid: Tuple[int, int], position_loss: str,
                   s: Scoring) -> Dict[str, GroupScore]:
    gh, gw = grid
    groups = _groups_of(test)
    out = {g: unscored(g, int(sel.sum()), s.too_few, s.note_empty) for g, sel in groups.items()}
    if all(v is not None for v in out.values()):
        return out  # nothing to score: no probe is trained
    aux = position_loss == "ce+mse"
    validation = None if s.val is None else (s.val.x, s.val.pos)
    probe = fit_probe(train.x, train.pos, "classify", n_classes=gh * gw,
                      aux_targets=_rowcol(train.pos, grid) if aux else None, validation=validation,
                      aux_validation=_rowcol(s.val.pos, grid) if aux and s.val is not None else None, **s.options)
    s.training["position"] = probe.training
    cells = torch.stack(torch.meshgrid(torch.arange(gh), torch.arange(gw), indexing="ij"), -1).reshape(-1, 2).float()
    to_random_cell = torch.cdist(cells, cells).mean(1)  # [P] mean distance from a cell to a uniform guess
    for group, sel in groups.items():
        if out[group] is not None:
            continue
        pred, truth = probe.predict(test.x[sel]), test.pos[sel]
        out[group] = GroupScore(int(sel.sum()), accuracy(pred, truth), chance_score("classify", train.pos, truth),
                                float((cells[pred] - cells[truth]).norm(dim=1).mean()),
                                float(to_random_cell[truth].mean()))
    return out


def pixel_errors(pred: torch.Tensor, target: torch.Tensor) -> Tuple[float, float]:
    """(mean per-token L2 error, MSE per value) of predictions against targets, both [n, k] (n > 0)."""
    err = pred.double() - target.double().reshape(pred.shape)
    return float(err.norm(dim=1).mean()), float(err.pow(2).mean())


def score_pixels(train: Split, test: Split, s: Scoring) -> Dict[str, GroupScore]:
    groups = _groups_of(test)
    out = {g: unscored(g, int(sel.sum()), s.too_few, s.note_empty) for g, sel in groups.items()}
    if all(v is not None for v in out.values()):
        return out
    probe = fit_probe(train.x, train.px, "regress", **s.options)
    s.training["pixels"] = probe.training
    mean_patch = train.px.double().mean(0, keepdim=True)  # the best constant guess
    for group, sel in groups.items():
        if out[group] is not None:
            continue
        x, y = test.x[sel], test.px[sel]
        pred = probe.predict(x)
        l2, mse = pixel_errors(pred, y)
        out[group] = GroupScore(int(sel.sum()), probe.score(x, y), chance_score("regress", train.px, y),
                                l2_error=l2, chance_l2_error=pixel_errors(mean_patch.expand(len(y), -1), y)[0],
                                mse=mse)
    return out


def score_labels(label_tokens: Dict[str, List[Tuple[int, torch.Tensor]]], labels: torch.Tensor,
                 roles: torch.Tensor, s: Scoring) -> Dict[str, GroupScore]:
    """Label probes, one per token kind: ``roles`` [N] is 0 (train), 1 (test) or 2 (validation) per image."""
    out = {}
    for kind in LABEL_KINDS:
        rows = label_tokens.get(kind, [])
        side = {r: [(i, v) for i, v in rows if int(roles[i]) == r] for r in (0, 1, 2)}
        tr, te, va = side[0], side[1], side[2]
        y_tr = labels[[i for i, _ in tr]] if tr else torch.zeros(0, dtype=torch.long)
        if not te or len(set(y_tr.tolist())) < 2:
            if not rows:
                why = f"the model has no {kind} token" if kind in ("cls", "register") else f"no image has a {kind} patch"
            else:
                why = "no such token in the test images" if not te else "training images of fewer than 2 classes"
            out[kind] = GroupScore(len(te), note=f"empty: {why}")
            continue
        missing = unscored(kind, len(te), s.too_few, s.note_empty, MIN_LABEL_IMAGES, "images")
        if missing is not None:
            out[kind] = missing
            continue
        validation = (torch.stack([v for _, v in va]), labels[[i for i, _ in va]]) if s.val is not None and va else None
        options = s.options if validation is not None else {k: v for k, v in s.options.items() if k != "patience"}
        probe = fit_probe(torch.stack([v for _, v in tr]), y_tr, "classify", n_classes=int(labels.max()) + 1,
                          validation=validation, **options)
        s.training[f"label.{kind}"] = probe.training
        y_te = labels[[i for i, _ in te]]
        out[kind] = GroupScore(len(te), probe.score(torch.stack([v for _, v in te]), y_te),
                               chance_score("classify", y_tr, y_te))
    return out
