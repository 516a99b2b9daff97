"""Peak RSS of an SAE run's data set-up and token stream, and of the SAE feature report over a source, at 1x
and 4x the images (``test_sae_memory.py``), on synthetic activations made per read (the run's from a seed per
image, the report's from ``memory_helpers``' few stored noise images; the [N, T, d] data are never held): 1024
patches per image, so an [N, P] float64 array of norms grows by 8 KB per image. Run in a fresh
interpreter (``memory_helpers``'s reasons); also as a script: ``PYTHONPATH=. python tests/sae/sae_memory.py``."""
from __future__ import annotations

import json
import sys
from pathlib import Path

import numpy as np
import torch

TESTS = Path(__file__).resolve().parents[1]
if str(TESTS) not in sys.path:
    sys.path.insert(0, str(TESTS))

import memory_helpers  # noqa: E402  (tests/ on the path first)
from interp.models.layout import TokenLayout  # noqa: E402
from interp.sae import setup  # noqa: E402
from interp.sae.data import ActivationRows, TokenStream  # noqa: E402
from interp.sae.features import source_feature_report  # noqa: E402
from interp.studies import CacheSource  # noqa: E402
from interp.sae.train import TrainSettings  # noqa: E402

GRID = (32, 32)  # 1024 patches
D = 8
N_HIGH_REPORT = 8
D_REPORT = 32  # the feature report's source: normal tokens' norms within ~12 % (8 channels spread them too wide)
N_HIGH = 3  # high-norm patches per image (x20)
IMAGES_1X = 600
CAP = 200  # detection images in the measurement (norm_cuts.MAX_DETECTION_IMAGES is 4096: 1x and 4x both above it)
SETTINGS = dict(tokens="patches", high_norm="exclude", tokens_per_step=512, window_images=32, data_shards=2,
                norm_images=32, steps=20)


class LazyRows(ActivationRows):
    """``n_images`` images of [1 + 1024, D] activations (1 + 0.2 x noise from seed i); patches 1..N_HIGH x20."""

    def __init__(self, n_images: int):
        self.n_images, self.d, self.first_token = n_images, D, 0
        self.layout = TokenLayout(n_prefix=1, n_registers=0, cls_index=0, grid=GRID)
        self.n_tokens = self.layout.n_tokens

    def read(self, images: np.ndarray) -> np.ndarray:
        out = np.empty((len(images), self.n_tokens, D), np.float32)
        for j, i in enumerate(images):
            out[j] = 1 + 0.2 * np.random.default_rng(int(i)).standard_normal((self.n_tokens, D), dtype=np.float32)
        out[:, 1:1 + N_HIGH] *= 20
        return out


def run(n_images: int) -> dict:
    """Set up the run's data on ``n_images`` images and stream ``steps`` batches (what training reads)."""
    cfg = TrainSettings(**SETTINGS)
    data = setup.prepare_rows(LazyRows(n_images), "blocks.0.hook_resid_post", {}, {}, cfg)
    stream = TokenStream(data.train, data.counts[data.train], data.read_tokens, cfg.seed, cfg.window_images,
                         cfg.tokens_per_step, cfg.data_shards, range(cfg.data_shards))
    seen = sum(len(stream.batch(t)) for t in range(cfg.steps))
    return {"artifacts_found": bool(data.detection.artifacts_found), "counts": sorted(set(data.counts.tolist())),
            "tokens_streamed": seen}


class ChannelSAE:
    """An SAE on the patches of ``blocks.1.hook_resid_post``: codes = relu(x), directions = the unit channels."""

    hook, tokens, n_features, d = "blocks.1.hook_resid_post", "patches", D_REPORT, D_REPORT

    def __init__(self):
        self.mean, self.directions = torch.zeros(D_REPORT), torch.eye(D_REPORT)

    def check_hook(self, hook, d=None):
        assert d == D_REPORT

    def encode(self, x):
        return torch.relu(x)

    def decode(self, codes):
        return self.mean + codes @ self.directions


def lazy_source(n_images: int) -> CacheSource:
    """``memory_helpers.LazyReader`` with 1024 patches of width D_REPORT; the last block's patches 1..8 are x20
    (at 1x already more high-norm tokens than the report's bounded sample of them holds, 4096)."""
    reader = memory_helpers.LazyReader(n_images, d_model=D_REPORT, n_outliers=N_HIGH_REPORT)
    reader.layout = TokenLayout(n_prefix=1, n_registers=0, cls_index=0, grid=GRID)
    source = CacheSource(reader)
    source.batch_size = 16
    return source


def report(n_images: int) -> dict:
    out = source_feature_report(ChannelSAE(), lazy_source(n_images))
    return {"artifacts_found": out["artifacts_found"], "high_norm": out["n_tokens"]["high_norm"]}


def measure() -> dict:
    """Peak RSS growth (bytes) of :func:`run` and :func:`report` at 1x and 4x, after warm-up runs."""
    from interp.sae import norm_cuts

    norm_cuts.MAX_DETECTION_IMAGES = CAP
    run(64)  # warm-up: lazy imports, allocator pools
    report(64)
    one, r1 = memory_helpers.peak_growth(lambda: run(IMAGES_1X))
    four, r4 = memory_helpers.peak_growth(lambda: run(4 * IMAGES_1X))
    f1, rep1 = memory_helpers.peak_growth(lambda: report(IMAGES_1X))
    f4, rep4 = memory_helpers.peak_growth(lambda: report(4 * IMAGES_1X))
    return {"1x": one, "4x": four, "run_1x": r1, "run_4x": r4, "features_1x": f1, "features_4x": f4,
            "report_1x": rep1, "report_4x": rep4}


if __name__ == "__main__":
    print(json.dumps(measure()))
