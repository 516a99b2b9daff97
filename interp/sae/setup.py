"""What one SAE run trains on: the activation rows, the high-norm detection, the token choice, the held-out
split, the normalisation and (archetypal) the candidate points; plus the statistics of a trained encoder
over a set of images.

Memory does not grow with the images' tokens: the detection is fitted on a bounded sample of images
(:mod:`.norm_cuts`) and each image's training tokens are chosen when it is read; what is kept per image is its
token count (one integer)."""
from __future__ import annotations

import hashlib
import os
from dataclasses import dataclass
from typing import Any, Dict, List, Optional, Tuple

import numpy as np
import torch

from ..cache.format import model_fingerprints
from ..cache.reader import open as open_cache
from ..errors import InterpError
from .modules import architecture
from .data import PATCH, ActivationRows, CacheRows, LiveRows, Normalisation, fit_normalisation, token_mask
from .norm_cuts import SampledDetection, detection_sample, fit_detection

CHUNK = 64  # images per read outside the training stream (norms, normalisation, statistics)


def world(device: torch.device) -> Tuple[int, int]:
    """(rank, number of processes): a ``torchrun`` launch joins its process group (gloo on CPU, nccl on GPUs)."""
    if int(os.environ.get("WORLD_SIZE", "1")) <= 1:
        return 0, 1
    import torch.distributed as dist

    if not dist.is_initialized():
        dist.init_process_group("nccl" if device.type == "cuda" else "gloo")
    return dist.get_rank(), dist.get_world_size()


@dataclass(frozen=True)
class TokenChoice:
    """Which stored token rows of an image are training tokens: the kinds (``tokens``) and the high-norm
    patches (``high_norm``: include, exclude or only), decided from the image's own patch norms."""

    kinds: np.ndarray  # int8 [T]
    tokens: str
    high_norm: str
    detection: Optional[SampledDetection]

    def mask(self, x: np.ndarray) -> np.ndarray:
        """Bool [b, T]: the training tokens of activations x [b, T, d]."""
        outliers = None
        if self.detection is not None and self.high_norm != "include":
            outliers = self.detection.outliers(np.linalg.norm(x[:, self.kinds == PATCH], axis=-1))
        return token_mask(self.kinds, self.tokens, self.high_norm, outliers, len(x))


@dataclass
class RunData:
    rows: ActivationRows
    hook: str
    model: Dict[str, str]
    detection: Optional[SampledDetection]
    choice: TokenChoice
    counts: np.ndarray  # [N]: training tokens of each image
    train: np.ndarray
    holdout: np.ndarray
    norm_images: np.ndarray
    norm: Normalisation
    points: Optional[torch.Tensor]
    signature: Dict[str, Any]

    def read_tokens(self, images: np.ndarray) -> np.ndarray:
        """float32 [m, d]: the training tokens of sorted ``images``, image after image."""
        return _read_tokens(self.rows, self.choice, images)


def _read_tokens(rows: ActivationRows, choice: TokenChoice, images: np.ndarray) -> np.ndarray:
    x = rows.read(images)
    return x[choice.mask(x)]


def _blocks(n: int, rank: int, n_ranks: int) -> range:
    """This rank's positions among ``n`` (under torchrun each rank reads its own block; all of them alone)."""
    bounds = np.linspace(0, n, n_ranks + 1).astype(int)
    return range(bounds[rank], bounds[rank + 1])


def _gathered(mine: List[np.ndarray], n_ranks: int) -> List[np.ndarray]:
    if n_ranks == 1:
        return mine
    gathered = [None] * n_ranks
    torch.distributed.all_gather_object(gathered, mine)
    return [a for part in gathered for a in part]


def _sample_norms(rows: ActivationRows, images: np.ndarray, rank: int, n_ranks: int) -> np.ndarray:
    """float64 [len(images), P]: patch norms of the sorted ``images`` (the detection's sample), ``CHUNK`` at a
    time; under torchrun each rank reads its own block and they are gathered."""
    patches = rows.kinds() == PATCH
    block = _blocks(len(images), rank, n_ranks)
    mine = [np.linalg.norm(rows.read(images[i:min(i + CHUNK, block.stop)])[:, patches], axis=-1)
            for i in range(block.start, block.stop, CHUNK)]
    parts = _gathered(mine, n_ranks)
    return np.concatenate(parts).astype(np.float64) if parts else np.zeros((0, int(patches.sum())))


def _token_counts(rows: ActivationRows, choice: TokenChoice, rank: int, n_ranks: int) -> np.ndarray:
    """int64 [N]: training tokens per image. Without a high-norm choice every image has the same; with one, a
    pass over the images counts them (``CHUNK`` at a time, ranks splitting the images)."""
    if choice.detection is None or choice.high_norm == "include":
        per_image = int(token_mask(choice.kinds, choice.tokens, "include", None, 1).sum())
        return np.full(rows.n_images, per_image, np.int64)
    block = _blocks(rows.n_images, rank, n_ranks)
    mine = [choice.mask(rows.read(np.arange(i, min(i + CHUNK, block.stop)))).sum(1)
            for i in range(block.start, block.stop, CHUNK)]
    parts = _gathered(mine, n_ranks)
    return np.concatenate(parts).astype(np.int64) if parts else np.zeros(0, np.int64)


def same_data(saved: Any, now: Dict[str, Any]) -> bool:
    """Whether a checkpoint's data signature ``saved`` is this run's ``now``: a cache's path compared resolved, so
    the same file named relatively, absolutely or through a link is the same data (a relative path a checkpoint
    recorded before paths were stored resolved is read from the working folder)."""
    def resolved(signature):
        if isinstance(signature, dict) and signature.get("source") == "cache" and isinstance(signature.get("path"), str):
            return {**signature, "path": os.path.realpath(signature["path"])}
        return signature

    return resolved(saved) == resolved(now)


def prepare_data(model, hook: str, cfg, *, cache=None, images=None, rank: int = 0, n_ranks: int = 1,
                 image_batch: int = 32) -> RunData:
    if (cache is None) == (images is None):
        raise InterpError("give the activations: cache=FILE.h5 (--cache) or images=DIR (--images), not both")
    if cache is not None:
        reader = open_cache(cache, model=model)
        rows = CacheRows(reader, hook)
        signature = {"source": "cache", "path": os.path.realpath(cache), "n_images": rows.n_images,
                     "images_sha256": reader.meta.get("images_sha256")}
    else:
        model.resolve_hooks([hook])
        rows = LiveRows(model, images, hook, image_batch)
        ids = hashlib.sha256("\0".join(rows.source.ids).encode()).hexdigest()
        signature = {"source": "images", "n_images": rows.n_images, "ids_sha256": ids,
                     "contents_sha256": rows.source.digest()}  # files: every byte
    return prepare_rows(rows, hook, model_fingerprints(model), signature, cfg, rank=rank, n_ranks=n_ranks)


def prepare_rows(rows: ActivationRows, hook: str, model: Dict[str, str], signature: Dict[str, Any], cfg, *,
                 rank: int = 0, n_ranks: int = 1) -> RunData:
    """:func:`prepare_data` on activation rows already open (``model``: the model's fingerprints)."""
    n = rows.n_images
    kinds = rows.kinds()
    detection = None
    if (kinds == PATCH).any():
        fitted = detection_sample(n)
        detection = fit_detection(_sample_norms(rows, fitted, rank, n_ranks), cfg.threshold, n)
    if cfg.high_norm == "only" and detection is not None and not detection.artifacts_found:
        raise InterpError(f"--high-norm only: the detection finds no high-norm tokens at {hook} "
                          f"({detection.threshold.reason}); train with --high-norm include")
    none_high = None if detection is None else np.zeros((1, int((kinds == PATCH).sum())), bool)
    token_mask(kinds, cfg.tokens, cfg.high_norm, none_high, 1)  # a bad choice fails here, before any pass
    choice = TokenChoice(kinds, cfg.tokens, cfg.high_norm, detection)
    counts = _token_counts(rows, choice, rank, n_ranks)
    perm = np.random.default_rng([cfg.seed, 7]).permutation(n)
    n_hold = int(round(cfg.holdout * n))
    if cfg.holdout > 0 and n >= 2:
        n_hold = max(1, n_hold)
    holdout, train = np.sort(perm[:n_hold]), np.sort(perm[n_hold:])
    if len(train) == 0:
        raise InterpError("no training image left after the held-out split; give more images or a smaller holdout")
    sample = np.sort(np.random.default_rng([cfg.seed, 11]).permutation(train)[:cfg.norm_images])
    norm = fit_normalisation(lambda images: _read_tokens(rows, choice, images), sample, rows.d)
    points = None
    if architecture(cfg.arch).needs_points:
        tokens = norm.apply(torch.from_numpy(_read_tokens(rows, choice, sample)))
        pick = np.random.default_rng([cfg.seed, 13]).permutation(len(tokens))[:cfg.n_points]
        points = tokens[np.sort(pick)].contiguous()
    return RunData(rows, hook, model, detection, choice, counts, train, holdout, sample,
                   norm, points, signature)


def describe_detection(detection: Optional[SampledDetection]) -> Optional[Dict[str, Any]]:
    """The detection's verdict in ``sae.json`` (without the per-image cuts)."""
    return None if detection is None else detection.to_dict()


@torch.no_grad()
def stats_over(codes, dictionary: torch.Tensor, data: RunData, images: np.ndarray) -> Dict[str, Any]:
    """Explained variance, L0, normalised MSE, alive fraction and mean code per feature over the training
    tokens of ``images`` (streamed ``CHUNK`` images at a time)."""
    n_feat, d = dictionary.shape
    sse = total_sq = l0 = 0.0
    total, fires, code_sum, count = torch.zeros(d, dtype=torch.float64), torch.zeros(n_feat), \
        torch.zeros(n_feat, dtype=torch.float64), 0
    for i in range(0, len(images), CHUNK):
        x = codes.normalise(torch.from_numpy(data.read_tokens(np.sort(images[i:i + CHUNK]))))
        z = codes(codes.mean + codes.scale * x)
        sse += float((x - z @ dictionary).double().square().sum())
        total += x.double().sum(0)
        total_sq += float(x.double().square().sum())
        l0 += float((z > 0).sum())
        fires += (z > 0).sum(0)
        code_sum += z.double().sum(0)
        count += len(x)
    if count == 0:
        raise InterpError("no token to evaluate the SAE on")
    sst = total_sq - float(total.square().sum()) / count
    return {"n_tokens": count, "explained_variance": 1 - sse / sst if sst > 0 else None,
            "mse_normalised": sse / (count * d), "l0": l0 / count, "alive_fraction": float((fires > 0).float().mean()),
            "feature_means": (code_sum / count).float()}
