"""What one SAE run trains on: the activation rows, the high-norm detection, the token mask, the held-out
split, the normalisation and (archetypal) the candidate points; plus the statistics of a trained encoder
over a set of images."""
from __future__ import annotations

import hashlib
import os
from dataclasses import dataclass
from typing import Any, Dict, Optional, Tuple

import numpy as np
import torch

from ..cache.format import model_fingerprints
from ..cache.reader import open as open_cache
from ..errors import InterpError
from ..detection.thresholds import NormsDetection, detect_norms
from .modules import architecture
from .data import PATCH, ActivationRows, CacheRows, LiveRows, Normalisation, fit_normalisation, token_mask

CHUNK = 64  # images per read outside the training stream (norms, normalisation, statistics)


def world(device: torch.device) -> Tuple[int, int]:
    """(rank, number of processes): a ``torchrun`` launch joins its process group (gloo on CPU, nccl on GPUs)."""
    if int(os.environ.get("WORLD_SIZE", "1")) <= 1:
        return 0, 1
    import torch.distributed as dist

    if not dist.is_initialized():
        dist.init_process_group("nccl" if device.type == "cuda" else "gloo")
    return dist.get_rank(), dist.get_world_size()


@dataclass
class RunData:
    rows: ActivationRows
    hook: str
    model: Dict[str, str]
    detection: Optional[NormsDetection]
    mask: np.ndarray  # Bool [N, T]: training tokens of each image
    counts: np.ndarray  # [N]
    train: np.ndarray
    holdout: np.ndarray
    norm_images: np.ndarray
    norm: Normalisation
    points: Optional[torch.Tensor]
    signature: Dict[str, Any]

    def read_tokens(self, images: np.ndarray) -> np.ndarray:
        """float32 [m, d]: the training tokens of sorted ``images``, image after image."""
        return self.rows.read(images)[self.mask[images]]


def _all_norms(rows: ActivationRows, rank: int, n_ranks: int) -> np.ndarray:
    """Patch norms [N, P] of every image; under torchrun each rank reads its own block and they are gathered."""
    if n_ranks == 1:
        return rows.patch_norms(CHUNK)
    bounds = np.linspace(0, rows.n_images, n_ranks + 1).astype(int)
    patches = rows.kinds() == PATCH
    mine = [np.linalg.norm(rows.read(np.arange(i, min(i + CHUNK, bounds[rank + 1])))[:, patches], axis=-1)
            for i in range(bounds[rank], bounds[rank + 1], CHUNK)]
    gathered = [None] * n_ranks
    torch.distributed.all_gather_object(gathered, mine)
    return np.concatenate([a for part in gathered for a in part]).astype(np.float64)


def contents_digest(source) -> str:
    """sha256 of what the images are: every file's bytes (in order) for image files, the feed's own digest (ids,
    shape and a pixel sample) for in-memory pixels. A resume over images whose contents changed under the same
    names is refused with it."""
    paths = getattr(source, "paths", None)
    if paths is None:
        return source.digest()
    h = hashlib.sha256()
    for path in paths:
        h.update(str(path).encode("utf-8") + b"\0")
        try:
            with open(path, "rb") as f:
                for block in iter(lambda: f.read(1 << 20), b""):
                    h.update(block)
        except OSError as e:
            h.update(f"unreadable: {e.errno}".encode())
        h.update(b"\0")
    return h.hexdigest()


def prepare_data(model, hook: str, cfg, *, cache=None, images=None, rank: int = 0, n_ranks: int = 1,
                 image_batch: int = 32) -> RunData:
    if (cache is None) == (images is None):
        raise InterpError("give the activations: cache=FILE.h5 (--cache) or images=DIR (--images), not both")
    if cache is not None:
        reader = open_cache(cache, model=model)
        rows = CacheRows(reader, hook)
        signature = {"source": "cache", "path": str(cache), "n_images": rows.n_images,
                     "images_sha256": reader.meta.get("images_sha256")}
    else:
        model.resolve_hooks([hook])
        rows = LiveRows(model, images, hook, image_batch)
        ids = hashlib.sha256("\0".join(rows.source.ids).encode()).hexdigest()
        signature = {"source": "images", "n_images": rows.n_images, "ids_sha256": ids,
                     "contents_sha256": contents_digest(rows.source)}
    n = rows.n_images
    kinds = rows.kinds()
    detection = detect_norms(_all_norms(rows, rank, n_ranks), cfg.threshold) if (kinds == PATCH).any() else None
    if cfg.high_norm == "only" and detection is not None and not detection.artifacts_found:
        raise InterpError(f"--high-norm only: the detection finds no high-norm tokens at {hook} "
                          f"({detection.threshold.reason}); train with --high-norm include")
    mask = token_mask(kinds, cfg.tokens, cfg.high_norm, None if detection is None else detection.outliers, n)
    perm = np.random.default_rng([cfg.seed, 7]).permutation(n)
    n_hold = int(round(cfg.holdout * n))
    if cfg.holdout > 0 and n >= 2:
        n_hold = max(1, n_hold)
    holdout, train = np.sort(perm[:n_hold]), np.sort(perm[n_hold:])
    if len(train) == 0:
        raise InterpError("no training image left after the held-out split; give more images or a smaller holdout")
    sample = np.sort(np.random.default_rng([cfg.seed, 11]).permutation(train)[:cfg.norm_images])
    norm = fit_normalisation(rows, sample, mask)
    points = None
    if architecture(cfg.arch).needs_points:
        tokens = norm.apply(torch.from_numpy(rows.read(sample)[mask[sample]]))
        pick = np.random.default_rng([cfg.seed, 13]).permutation(len(tokens))[:cfg.n_points]
        points = tokens[np.sort(pick)].contiguous()
    return RunData(rows, hook, model_fingerprints(model), detection, mask, mask.sum(1), train, holdout, sample,
                   norm, points, signature)


def describe_detection(detection: Optional[NormsDetection]) -> Optional[Dict[str, Any]]:
    """The detection's verdict in ``sae.json`` (without the per-image cuts)."""
    if detection is None:
        return None
    t = detection.threshold.to_dict()
    return {"where": "patch-token norms at the SAE's hook", "artifacts_found": t["artifacts_found"],
            "method": t["method"], "value": t["value"], "n_tokens": t["n_tokens"], "n_above": t["n_above"],
            "share_above": t["share_above"], "reason": t["reason"], "warning": t["warning"]}


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
