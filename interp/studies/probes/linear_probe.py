"""Linear probes on frozen features (docs/methods.md sections 4 and 6): can a linear map read a target out of tokens?

Two tasks:

* ``classify``: softmax regression trained with Adam on shuffled mini-batches (a fixed budget: ``epochs``
  passes, at least ``min_steps`` steps, cosine-decayed learning rate, optional weight decay), scored by top-1
  accuracy. With ``validation=`` data and ``patience``, training stops early: after each pass over the
  training data the validation loss is measured, and when it has not improved for ``patience`` passes the
  weights of the best pass are kept (:attr:`LinearProbe.training` records the schedule actually run). An optional auxiliary regression head (``aux_targets``) adds ``aux_weight`` x MSE to the loss:
  the reassessment's position probe (cross-entropy + 0.5 x regression of the (row, col)).
* ``regress``: ridge regression solved in closed form from ``X^T X`` and ``X^T Y`` accumulated chunk by chunk
  (the least-squares optimum that a gradient-trained linear probe approaches, without an epoch budget that
  would change the answer), scored by R^2.

Features are standardised with the training set's mean and std. Memory: the features stay where they are
(CPU); only ``batch_size`` rows at a time move to ``device``, so 10^6 tokens x 1024 dims (4 GB as float32)
train on a small GPU. Everything is deterministic for a seed (zero-initialised weights, seeded shuffling).

>>> g = torch.Generator().manual_seed(0)
>>> labels = torch.arange(400) % 4                                  # 4 classes, 100 images of 1 token each
>>> tokens = torch.randn(400, 16, generator=g) + 3 * torch.nn.functional.one_hot(labels, 16)
>>> result = linear_probe(tokens, labels, task="classify", groups=torch.arange(400), seed=0)
>>> result.test_score > 0.9 > result.chance      # chance: the best constant guess (the most frequent class)
True
"""
from __future__ import annotations

import dataclasses
import hashlib
import json
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Dict, Optional, Sequence, Tuple, Union

import numpy as np
import torch

from ...errors import InterpError
from ..core.result import jsonable

TASKS = ("classify", "regress")
ArrayLike = Union[torch.Tensor, np.ndarray, Sequence]


@dataclass
class ProbeFit:
    """Scores of one linear probe (JSON-serialisable like the study results).

    Attributes:
        task: ``classify`` (scores are top-1 accuracies) or ``regress`` (scores are R^2, pooled over outputs).
        test_score, train_score: the score on the held-out and on the training samples.
        chance: the score of the best constant guess fitted on the training set (the most frequent training
            class; the training mean for R^2), measured on the test samples.
        n_train, n_test: samples on each side; n_features, n_outputs: probe input and output sizes.
        params: the probe's settings (epochs, lr, ridge, ...), as passed.
    """

    task: str
    test_score: Optional[float]
    train_score: Optional[float]
    chance: Optional[float]
    n_train: int
    n_test: int
    n_features: int
    n_outputs: int
    seed: int
    params: Dict[str, Any] = field(default_factory=dict)

    def to_dict(self) -> dict:
        return jsonable(self)

    def to_json(self, path: Union[str, Path, None] = None) -> str:
        text = json.dumps(self.to_dict(), indent=1)
        if path is not None:
            Path(path).write_text(text)
        return text

    @classmethod
    def from_dict(cls, data: dict) -> "ProbeFit":
        names = {f.name for f in dataclasses.fields(cls)}
        return cls(**{k: v for k, v in data.items() if k in names})


def _as_tensor(a: ArrayLike) -> torch.Tensor:
    return a if isinstance(a, torch.Tensor) else torch.as_tensor(np.asarray(a))


def image_key(image_id: str) -> int:
    """A 64-bit key of an image from its identity, the last two parts of its id (``class/name.jpg``), so that the
    same image gets the same key whatever its place in the set and whether it was named by an absolute or a
    relative path (its seeded token sample and its side of a split follow the image, not its position)."""
    tail = "/".join(str(image_id).replace("\\", "/").split("/")[-2:])
    return int(hashlib.sha256(tail.encode()).hexdigest()[:16], 16)


def split_by_identity(ids: Sequence[str], fraction: float, seed: int = 0) -> torch.Tensor:
    """The indices (sorted) of the ``fraction`` of ``ids`` held out (at least one, never all), chosen by a seeded
    hash of each image's :func:`image_key`: the same images in any order hold out the same images.

    >>> ids = ["a.jpg", "b.jpg", "c.jpg", "d.jpg"]
    >>> held = sorted(ids[i] for i in split_by_identity(ids, 0.5))
    >>> held == sorted(ids[::-1][i] for i in split_by_identity(ids[::-1], 0.5)) and len(held) == 2
    True
    """
    n = len(ids)
    n_test = min(n - 1, max(1, int(round(fraction * n))))
    rank = sorted(range(n), key=lambda i: hashlib.sha256(f"{seed}:{image_key(ids[i])}".encode()).digest())
    return torch.tensor(sorted(rank[:n_test]), dtype=torch.long)


def split_indices(n: int, *, test_fraction: float = 0.25, seed: int = 0,
                  groups: Optional[ArrayLike] = None) -> Tuple[torch.Tensor, torch.Tensor]:
    """Seeded train/test split of ``n`` samples -> (train indices [n_train], test indices [n_test]), sorted.

    With ``groups`` (one key per sample, e.g. the image id of each token) whole groups go to one side, so no
    image has tokens on both sides; ``test_fraction`` is then the share of groups held out (at least one).
    """
    if not 0 < test_fraction < 1:
        raise InterpError(f"test_fraction must be in (0, 1), got {test_fraction}")
    keys = np.arange(n) if groups is None else np.asarray(groups.cpu() if isinstance(groups, torch.Tensor) else groups)
    if keys.shape[0] != n:
        raise InterpError(f"groups has {keys.shape[0]} entries but there are {n} samples")
    unique, inverse = np.unique(keys, return_inverse=True)
    if unique.size < 2:
        raise InterpError(f"a train/test split needs at least 2 {'groups' if groups is not None else 'samples'}, "
                          f"got {unique.size}")
    n_test = min(unique.size - 1, max(1, int(round(test_fraction * unique.size))))
    held_out = np.random.default_rng(seed).permutation(unique.size)[:n_test]
    is_test = np.isin(inverse, held_out)
    return torch.from_numpy(np.flatnonzero(~is_test)), torch.from_numpy(np.flatnonzero(is_test))


@dataclass
class LinearProbe:
    """A fitted probe: ``outputs = ((x - mean) / std) @ weight + bias``.

    Attributes:
        mean, std: [d] training-feature statistics; weight: [d, k]; bias: [k] (float32, CPU).
        n_classes: classes (the first ``n_classes`` outputs are logits; any further outputs are the auxiliary
            regression head); None for ``regress``.
        training: ``classify``: ``steps``, ``passes`` (over the training data), ``patience``, ``stopped_early``,
            ``best_pass`` and ``val_loss`` (the kept weights' validation loss; None without validation data);
            ``regress``: ``{"closed_form": True}`` (no epochs).
    """

    task: str
    mean: torch.Tensor
    std: torch.Tensor
    weight: torch.Tensor
    bias: torch.Tensor
    n_classes: Optional[int] = None
    training: Dict[str, Any] = field(default_factory=dict)  # the schedule actually run (see fit_probe)

    @torch.no_grad()
    def outputs(self, x: ArrayLike, batch_size: int = 65536) -> torch.Tensor:
        """Raw outputs [n, k] for features x [n, d] (computed chunk by chunk on the CPU)."""
        x = _as_tensor(x)
        chunks = [((x[i:i + batch_size].float() - self.mean) / self.std) @ self.weight + self.bias
                  for i in range(0, x.shape[0], batch_size)]
        return torch.cat(chunks) if chunks else torch.zeros(0, self.weight.shape[1])

    def predict(self, x: ArrayLike) -> torch.Tensor:
        """Class ids [n] (``classify``) or predicted targets [n, k] (``regress``)."""
        out = self.outputs(x)
        return out[:, :self.n_classes].argmax(1) if self.task == "classify" else out

    def score(self, x: ArrayLike, y: ArrayLike) -> Optional[float]:
        """Top-1 accuracy or R^2 on (x, y); None for no samples."""
        y = _as_tensor(y)
        if y.shape[0] == 0:
            return None
        pred = self.predict(x)
        return accuracy(pred, y) if self.task == "classify" else r2_score(pred, y.reshape(pred.shape))


def accuracy(pred: torch.Tensor, y: torch.Tensor) -> float:
    """Share of equal entries of two [n] label tensors."""
    return float((pred.long() == y.long()).float().mean())


def r2_score(pred: torch.Tensor, y: torch.Tensor) -> float:
    """Pooled R^2 = 1 - sum (y - pred)^2 / sum (y - mean_y)^2 over all samples and outputs; [n, k] each.

    Pooling weights each output by its variance (sklearn's ``variance_weighted``). A constant y gives
    -inf/nan: the caller should not score a probe on constant targets."""
    y = y.double().reshape(y.shape[0], -1)
    pred = pred.double().reshape(y.shape)
    total = ((y - y.mean(0)) ** 2).sum()
    return float(1.0 - ((y - pred) ** 2).sum() / total) if total > 0 else float("nan")


def chance_score(task: str, y_train: ArrayLike, y_test: ArrayLike) -> Optional[float]:
    """Score of the best constant guess fitted on ``y_train`` (most frequent class / mean), on ``y_test``."""
    y_train, y_test = _as_tensor(y_train), _as_tensor(y_test)
    if y_test.shape[0] == 0 or y_train.shape[0] == 0:
        return None
    if task == "classify":
        majority = torch.bincount(y_train.long().reshape(-1)).argmax()
        return accuracy(torch.full_like(y_test.long(), int(majority)), y_test)
    mean = y_train.double().reshape(y_train.shape[0], -1).mean(0)
    return r2_score(mean.expand(y_test.shape[0], -1), y_test.reshape(y_test.shape[0], -1))


def feature_stats(x: torch.Tensor, chunk: int = 65536) -> Tuple[torch.Tensor, torch.Tensor]:
    """Mean and std [d] of x [n, d] in float64 chunks (no float copy of x); std floored at 1e-6 x max."""
    total = torch.zeros(x.shape[1], dtype=torch.float64)
    squares = torch.zeros(x.shape[1], dtype=torch.float64)
    for i in range(0, x.shape[0], chunk):
        part = x[i:i + chunk].double()
        total += part.sum(0)
        squares += (part ** 2).sum(0)
    mean = total / max(1, x.shape[0])
    std = (squares / max(1, x.shape[0]) - mean ** 2).clamp_min(0).sqrt()
    std = std.clamp_min(max(1e-6 * float(std.max()) if std.numel() else 0.0, 1e-12))
    return mean.float(), std.float()


def _fit_ridge(x: torch.Tensor, y: torch.Tensor, mean: torch.Tensor, std: torch.Tensor, ridge: float,
               device: torch.device, chunk: int) -> Tuple[torch.Tensor, torch.Tensor]:
    """Closed-form ridge on standardised x [n, d], y [n, k] -> (weight [d, k], bias [k]).

    The penalty is ``ridge * n`` (each standardised feature has sum of squares n)."""
    d, k = x.shape[1], y.shape[1]
    y_mean = y.double().mean(0)
    xtx = torch.zeros(d, d, dtype=torch.float64, device=device)
    xty = torch.zeros(d, k, dtype=torch.float64, device=device)
    m, s = mean.to(device), std.to(device)
    for i in range(0, x.shape[0], chunk):
        xs = ((x[i:i + chunk].to(device).float() - m) / s).double()
        xtx += xs.T @ xs
        xty += xs.T @ (y[i:i + chunk].to(device).double() - y_mean.to(device))
    xtx += ridge * x.shape[0] * torch.eye(d, dtype=torch.float64, device=device)
    weight = torch.linalg.solve(xtx, xty)
    return weight.float().cpu(), y_mean.float()


def _loss(out: torch.Tensor, y: torch.Tensor, aux: Optional[torch.Tensor], n_classes: int,
          aux_weight: float) -> torch.Tensor:
    """Cross-entropy of the first n_classes outputs (+ aux_weight x MSE of the auxiliary head), mean over rows."""
    loss = torch.nn.functional.cross_entropy(out[:, :n_classes], y.long())
    if aux is not None:
        loss = loss + aux_weight * torch.nn.functional.mse_loss(out[:, n_classes:], aux.float())
    return loss


@torch.no_grad()
def _validation_loss(weight, bias, val, m, s, n_classes: int, aux_weight: float, batch_size: int) -> float:
    """The loss of (weight, bias) on the validation data (x [v, d], y [v], aux [v, a] or None), mean over rows."""
    x, y, aux = val
    total = 0.0
    for i in range(0, x.shape[0], batch_size):
        xs = (x[i:i + batch_size].to(m.device).float() - m) / s
        part = _loss(xs @ weight + bias, y[i:i + batch_size].to(m.device), None if aux is None else
                     aux[i:i + batch_size].to(m.device), n_classes, aux_weight)
        total += float(part) * min(batch_size, x.shape[0] - i)
    return total / x.shape[0]


def _fit_softmax(x: torch.Tensor, y: torch.Tensor, aux: Optional[torch.Tensor], n_classes: int, *,
                 mean: torch.Tensor, std: torch.Tensor, aux_weight: float, epochs: int, min_steps: int,
                 batch_size: int, lr: float, weight_decay: float, seed: int, device: torch.device,
                 val=None, patience: Optional[int] = None) -> Tuple[torch.Tensor, torch.Tensor, Dict[str, Any]]:
    """Adam on shuffled mini-batches of standardised x [n, d] -> (weight [d, k], bias [k], schedule record).

    k = n_classes (+ aux width). Loss: cross-entropy (+ aux_weight x MSE of the auxiliary head). ``val``:
    (x [v, d], y [v], aux [v, a] or None), measured after every pass; with ``patience`` the run stops when it
    has not improved for that many passes and the best pass's weights are returned."""
    n, d = x.shape
    k = n_classes + (aux.shape[1] if aux is not None else 0)
    weight = torch.zeros(d, k, device=device, requires_grad=True)
    bias = torch.zeros(k, device=device, requires_grad=True)
    opt = torch.optim.AdamW([weight, bias], lr=lr, weight_decay=weight_decay)
    per_epoch = math.ceil(n / batch_size)
    total = max(epochs * per_epoch, min_steps)
    gen = torch.Generator().manual_seed(seed)
    m, s = mean.to(device), std.to(device)
    step = passes = best_pass = 0
    best = (math.inf, None, None)  # validation loss, weight, bias of the best pass
    stopped = False
    while step < total and not stopped:
        order = torch.randperm(n, generator=gen)
        for i in range(0, n, batch_size):
            if step >= total:
                break
            idx = order[i:i + batch_size]
            xs = (x[idx].to(device).float() - m) / s
            loss = _loss(xs @ weight + bias, y[idx].to(device), None if aux is None else aux[idx].to(device),
                         n_classes, aux_weight)
            for group in opt.param_groups:
                group["lr"] = lr * 0.5 * (1 + math.cos(math.pi * step / total))
            opt.zero_grad(set_to_none=True)
            loss.backward()
            opt.step()
            step += 1
        passes += 1
        if val is not None:
            current = _validation_loss(weight, bias, val, m, s, n_classes, aux_weight, batch_size)
            if current < best[0]:
                best, best_pass = (current, weight.detach().clone(), bias.detach().clone()), passes
            stopped = patience is not None and passes - best_pass >= patience
    record = {"steps": step, "passes": passes, "patience": patience, "stopped_early": stopped,
              "best_pass": best_pass if val is not None else None,
              "val_loss": best[0] if val is not None and math.isfinite(best[0]) else None}
    if patience is not None and best[1] is not None:
        return best[1].cpu(), best[2].cpu(), record
    return weight.detach().cpu(), bias.detach().cpu(), record


def fit_probe(x: ArrayLike, y: ArrayLike, task: str = "classify", *, n_classes: Optional[int] = None,
              aux_targets: Optional[ArrayLike] = None, aux_weight: float = 0.5, epochs: int = 30,
              min_steps: int = 300, batch_size: int = 4096, lr: float = 1e-2, weight_decay: float = 0.0,
              ridge: float = 1e-4, seed: int = 0, device: Union[str, torch.device, None] = None,
              validation: Optional[Tuple[ArrayLike, ArrayLike]] = None, aux_validation: Optional[ArrayLike] = None,
              patience: Optional[int] = None) -> LinearProbe:
    """Fit a linear probe on features x [n, d] to targets y ([n] class ids, or [n] / [n, k] values).

    Args:
        n_classes: classes of a ``classify`` probe (default: max(y) + 1).
        aux_targets: [n, a] values an auxiliary linear head regresses with ``aux_weight`` x MSE (classify only).
        epochs, min_steps, batch_size, lr, weight_decay: the mini-batch Adam budget (classify): at least
            ``epochs`` passes and ``min_steps`` steps, the learning rate cosine-decayed over them.
        validation: (x_val [v, d], y_val [v]) held-out training data (e.g. other images than x's), its loss
            measured after every pass (classify); ``aux_validation`` [v, a]: its auxiliary targets.
        patience: stop when the validation loss has not improved for this many passes and keep the best pass's
            weights (classify; needs ``validation``). None: the whole budget runs.
        ridge: relative L2 penalty of the closed-form regression (regress).
        device: where mini-batches are computed (default CPU); x itself is never copied there whole.
    """
    if task not in TASKS:
        raise InterpError(f"task={task!r} is not one of {list(TASKS)}")
    x, y = _as_tensor(x), _as_tensor(y)
    if x.ndim != 2 or x.shape[0] != y.shape[0] or x.shape[0] == 0:
        raise InterpError(f"features must be [n, d] with n = len(targets) > 0; got {tuple(x.shape)} and "
                          f"{tuple(y.shape)}")
    device = torch.device(device or "cpu")
    mean, std = feature_stats(x)
    if task == "regress":
        y2 = y.reshape(y.shape[0], -1)
        weight, bias = _fit_ridge(x, y2, mean, std, ridge, device, batch_size)
        return LinearProbe("regress", mean, std, weight, bias, training={"closed_form": True, "ridge": ridge})
    if y.is_floating_point() and not torch.equal(y, y.round()):
        raise InterpError("classify needs integer class ids as targets; use task='regress' for real values")
    n_classes = int(n_classes if n_classes is not None else int(y.max()) + 1)
    if patience is not None and (validation is None or int(patience) < 1):
        raise InterpError(f"patience={patience!r}: early stopping needs validation=(x_val, y_val) and patience >= 1")
    aux = None if aux_targets is None else _as_tensor(aux_targets).reshape(x.shape[0], -1)
    val = None
    if validation is not None:
        x_val, y_val = _as_tensor(validation[0]), _as_tensor(validation[1])
        if x_val.ndim != 2 or x_val.shape[1] != x.shape[1] or x_val.shape[0] != y_val.shape[0] or not len(y_val):
            raise InterpError(f"validation must be (x_val [v, {x.shape[1]}], y_val [v]) with v > 0; got "
                              f"{tuple(x_val.shape)} and {tuple(y_val.shape)}")
        aux_val = None if aux is None or aux_validation is None else _as_tensor(aux_validation).reshape(len(y_val), -1)
        if (aux is None) != (aux_val is None):
            raise InterpError("aux_validation must be given with aux_targets (and only then)")
        val = (x_val, y_val, aux_val)
    weight, bias, record = _fit_softmax(x, y, aux, n_classes, mean=mean, std=std, aux_weight=aux_weight,
                                        epochs=epochs, min_steps=min_steps, batch_size=batch_size, lr=lr,
                                        weight_decay=weight_decay, seed=seed, device=device, val=val,
                                        patience=None if patience is None else int(patience))
    return LinearProbe("classify", mean, std, weight, bias, n_classes, training=record)


def linear_probe(features: ArrayLike, targets: ArrayLike, *, task: str = "classify", test_fraction: float = 0.25,
                 seed: int = 0, groups: Optional[ArrayLike] = None, epochs: int = 30, min_steps: int = 300,
                 batch_size: int = 4096, lr: float = 1e-2, weight_decay: float = 0.0, ridge: float = 1e-4,
                 device: Union[str, torch.device, None] = None) -> ProbeFit:
    """Train a linear probe on a seeded train split of (features [n, d], targets [n] or [n, k]) and score it.

    Args:
        task: ``classify`` (targets are class ids; top-1 accuracy) or ``regress`` (R^2).
        groups: [n] keys (e.g. image ids): a group's samples all land on the same side of the split.
        Others: see :func:`fit_probe`.
    """
    x, y = _as_tensor(features), _as_tensor(targets)
    if x.ndim != 2 or x.shape[0] != y.shape[0]:
        raise InterpError(f"features must be [n, d] and targets [n, ...] with the same n; got {tuple(x.shape)} "
                          f"and {tuple(y.shape)}")
    train, test = split_indices(x.shape[0], test_fraction=test_fraction, seed=seed, groups=groups)
    n_classes = int(y.max()) + 1 if task == "classify" else None
    x_train, y_train, x_test, y_test = x[train], y[train], x[test], y[test]
    probe = fit_probe(x_train, y_train, task, n_classes=n_classes, epochs=epochs, min_steps=min_steps,
                      batch_size=batch_size, lr=lr, weight_decay=weight_decay, ridge=ridge, seed=seed, device=device)
    params = {"test_fraction": test_fraction, "grouped": groups is not None, "epochs": epochs,
              "min_steps": min_steps, "batch_size": batch_size, "lr": lr, "weight_decay": weight_decay,
              "ridge": ridge}
    return ProbeFit(task=task, test_score=probe.score(x_test, y_test), train_score=probe.score(x_train, y_train),
                       chance=chance_score(task, y_train, y_test), n_train=len(train), n_test=len(test),
                       n_features=x.shape[1], n_outputs=n_classes if task == "classify" else
                       int(np.prod(y.shape[1:])) if y.ndim > 1 else 1, seed=seed, params=params)
