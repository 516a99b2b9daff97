"""What decides an SAE's weights, declared once (torch-free, outside the ``interp.sae`` package, whose import
loads torch): :class:`TrainSettings`, whose fields are the options
of ``interp sae train`` (defaults, help texts and parse-time checks here, nowhere else) and the keywords of
:func:`interp.sae.train`.

One word per concept: ``tokens_per_step`` here (``--tokens-per-step``) is tokens per training step; images per
forward pass of a live run are ``interp sae train``'s ``--batch-size`` (``image_batch`` of :func:`interp.sae.train`),
as in every other command. ``sae.json``'s ``training`` and ``checkpoint.pt``'s ``settings`` record the fields by name.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Optional

from .errors import InterpError, UsageError
from .options import Options, option
from .values import (MAX_EXPANSION, MAX_SAE_BATCH, MAX_SAE_WEIGHTS, SAE_ARCHS, SEED_HELP, expansion_arg, fraction_below_one,
                     nonnegative_float, positive_float, positive_int, sae_batch_arg, seed_arg, threshold_arg)

# The files of an SAE folder: the trained SAE (its description, its weights), then what a training run adds.
SAE_CONFIG, SAE_WEIGHTS = "sae.json", "sae.safetensors"
SAE_CHECKPOINT, SAE_CURVE = "checkpoint.pt", "training_curve.png"
TOKEN_CHOICES = ("patches", "all", "cls", "registers")
HIGH_NORM_CHOICES = ("include", "exclude", "only")


@dataclass(frozen=True, kw_only=True)
class TrainSettings(Options):
    """Everything that decides the weights (a resumed run must match all of them but ``steps``). Fields without
    a command-line form (``norm_images``, ``clip_grad``, ``n_points``) are for Python callers.

    Built without checks (``interp.sae.train`` calls :meth:`check`, whose errors name the fields)."""

    arch: str = option("topk", "SAE architecture (default topk)", choices=SAE_ARCHS)
    expansion: int = option(8, "features per dimension of the hook (default 8)", parse=expansion_arg)
    k: int = option(32, "active features per token: topk, batchtopk, archetypal (default 32)", parse=positive_int)
    tokens: str = option("patches", "which tokens to train on (default patches)", choices=TOKEN_CHOICES)
    high_norm: str = option("include", "high-norm patch tokens (detection at the hook): keep (default), drop, or "
                                       "train on them only", choices=HIGH_NORM_CHOICES)
    threshold: Any = option("auto", "high-norm detection threshold (auto, pNN, a norm; default auto)",
                            parse=threshold_arg)
    steps: int = option(1000, "training steps (default 1000)", parse=positive_int)
    tokens_per_step: int = option(1024, "tokens per training step, all processes together (default 1024)",
                                  parse=sae_batch_arg, metavar="N")
    lr: float = option(4e-4, "Adam learning rate (default 4e-4)", parse=positive_float)
    seed: int = option(0, SEED_HELP, parse=seed_arg)
    window_images: int = option(256, "images whose tokens are shuffled together (memory: one window per data "
                                     "shard; default 256)", parse=positive_int)
    data_shards: int = option(8, "interleaved sub-streams of the data; torchrun's process count must divide it "
                                 "(default 8)", parse=positive_int)
    holdout: float = option(0.1, "share of images held out for metrics (default 0.1)", parse=fraction_below_one)
    norm_images: int = 64
    dead_window: int = option(200, "steps without firing that make a feature dead (AuxK revives those; default "
                                   "200)", parse=positive_int)
    aux_penalty: float = option(1 / 32, "topk, batchtopk, archetypal: weight of AuxK, the dead features' "
                                        "reconstruction of the residual (Gao et al. 2024; default 1/32)",
                                parse=nonnegative_float)
    aux_k: Optional[int] = option(None, "dead features used by AuxK per token (default: half the hook's width)",
                                  parse=positive_int)
    l1_penalty: float = option(0.05, "relu: weight of the L1 term, per token, in units of the normalised tokens' "
                                     "variance (loss = ||x - x_hat||^2 + l1 * sum_f z_f ||d_f||, averaged over "
                                     "tokens; default 0.05)", parse=nonnegative_float)
    l0_penalty: float = option(0.002, "jumprelu: weight of the L0 term per token (each active feature costs this "
                                      "share of the variance; straight-through thresholds; default 0.002)",
                               parse=nonnegative_float)
    clip_grad: float = 1.0
    n_points: int = 1024

    def __post_init__(self) -> None:
        """No checks on construction: :func:`interp.sae.train` calls :meth:`check` (the command line's parser has
        checked each value already)."""

    def check(self) -> None:
        for name, choices in (("arch", SAE_ARCHS), ("tokens", TOKEN_CHOICES), ("high_norm", HIGH_NORM_CHOICES)):
            if getattr(self, name) not in choices:
                raise InterpError(f"{name} must be one of {list(choices)}, got {getattr(self, name)!r}")
        for name in ("expansion", "k", "steps", "tokens_per_step", "window_images", "data_shards", "norm_images",
                     "dead_window", "n_points"):
            if not isinstance(getattr(self, name), int) or getattr(self, name) < 1:
                raise InterpError(f"{name} must be a whole number >= 1, got {getattr(self, name)!r}")
        if self.expansion > MAX_EXPANSION or self.tokens_per_step > MAX_SAE_BATCH:
            raise UsageError(f"expansion must be <= {MAX_EXPANSION} and tokens_per_step <= {MAX_SAE_BATCH} "
                             f"(interp's bounds on one run), got {self.expansion} and {self.tokens_per_step}")
        for name in ("aux_penalty", "l1_penalty", "l0_penalty"):
            if not getattr(self, name) >= 0:
                raise InterpError(f"{name} must be >= 0, got {getattr(self, name)!r}")
        if self.aux_k is not None and not (isinstance(self.aux_k, int) and self.aux_k >= 1):
            raise InterpError(f"aux_k must be a whole number >= 1 or None, got {self.aux_k!r}")
        if not 0 <= self.holdout < 1:
            raise InterpError(f"holdout must be in [0, 1), got {self.holdout}")
        if not self.lr > 0:
            raise InterpError(f"lr must be > 0, got {self.lr}")


def check_sae_size(expansion: int, width: int) -> None:
    """``expansion`` features per dimension of a hook of ``width`` within :data:`interp.values.MAX_SAE_WEIGHTS`
    weights per matrix (``--expansion`` is bounded per dimension when parsed; this bounds the SAE itself, on the
    model's skeleton before the model loads and again once the data's width is read).

    Raises:
        UsageError: one line naming the bound and the largest ``--expansion`` that fits.
    """
    if expansion * width * width > MAX_SAE_WEIGHTS:
        fits = max(1, MAX_SAE_WEIGHTS // (width * width))
        raise UsageError(f"--expansion {expansion} on a hook of width {width} makes an SAE of {expansion * width:,} "
                         f"features x {width} ({expansion * width * width:,} weights per matrix), over interp's bound "
                         f"of {MAX_SAE_WEIGHTS:,}: give --expansion <= {fits}")
