"""Massive activations (Sun, Chen, Kolter, Liu 2024, "Massive Activations in Large Language Models", section 5 on
ViTs; docs/methods.md section 2): per block, the largest magnitudes of the residual stream over tokens x channels
against the median magnitude, which channels and which tokens carry them, and the attention logits those tokens
receive.

Arithmetic of the reference code (``locuslab/massive-activations`` ``main_vit.py --exp2``, commit 7e5e64cb1c2c):
per image (one at a time) and block, ``a = |block output|`` (the un-normalised residual stream, in float64), the
three largest entries of ``a`` over every token (CLS, registers, patches) and channel, and ``torch.median(a)`` (the
lower of the two middle values); the profile is the mean of these four numbers over the images. A block's largest
activation is *massive* when it is above ``min_value`` (100) and at least ``min_ratio`` (about 1,000) times the
median, Sun et al.'s description.

The readout matters: the final norm divides each token by its own scale, so after it a massive activation is at most
``sqrt(D)`` times that token's typical entry; the study therefore reads every block's output before the final norm
and reports the final norm's output beside it (``final_norm``), where the same tokens look tame.

>>> result = massive_study(source, progress=False)
>>> result.massive_blocks[0], result.channels[2][0]["channel"]   # planted_vit: formed at block 2, in channel 9
(2, 9)
"""
from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from typing import Dict, List, Optional

import numpy as np
import torch

from ...runtime.passes import Fold, Reading, run_readings
from ...runtime.source import ActivationSource
from ..core.options import FINAL
from ..core.result import StudyResult, skipped_records
from ..declaration import study
from .configs import MassiveConfig

TOP = 3  # the reference's top-1/2/3
MEDIAN, TOKEN, CHANNEL = TOP, TOP + 1, TOP + 2  # columns of magnitude_stats after the TOP values
CHANNELS_SHOWN = 3  # channels listed per block
KIND_WORDS = {"cls": "CLS", "distillation": "distillation", "registers": "register", "patches": "patch"}


def magnitude_stats(acts: torch.Tensor) -> torch.Tensor:
    """The reference's per-image numbers of one block output.

    Args:
        acts: [b, t, d] a block's output (any float dtype).

    Returns:
        Float64[b, TOP + 3]: the TOP largest |activation| over tokens x channels (descending), the median
        |activation| (``torch.median``: the lower middle value), then the largest entry's token and channel.
    """
    a = acts.detach().to(torch.float64).abs().flatten(1)  # [b, t * d]
    top = a.topk(TOP, dim=1)
    first = top.indices[:, :1]
    where = torch.cat([first // acts.shape[-1], first % acts.shape[-1]], 1).to(torch.float64)
    return torch.cat([top.values, a.median(dim=1).values[:, None], where], 1).cpu()


def received_logits(scores: torch.Tensor) -> torch.Tensor:
    """[b, h, t, t] pre-softmax attention logits -> [b, t] the logit each key token receives, averaged over heads
    and queries."""
    return scores.detach().float().mean(dim=(1, 2)).cpu()


def token_kind(layout, token: int) -> str:
    """The kind of a row of ``layout``'s token axis: a key of :data:`KIND_WORDS` (registers: trained and test-time)."""
    rows = {**layout.kind_slices(), "distillation": layout.dist_slice}
    return next(kind for kind, sl in rows.items() if sl.start <= token < sl.stop)


@dataclass
class MassiveResult(StudyResult):
    """Result of :func:`massive_study`.

    Attributes:
        blocks: the name of every block, in order.
        top: [TOP][L] the mean over images of each block's k-th largest |activation| (k = 1, 2, 3).
        median: [L] the mean over images of each block's median |activation|.
        ratio: [L] ``top[0] / median`` per block.
        massive_blocks: the blocks whose largest activation is massive (above ``min_value`` and ``min_ratio`` times
            the median); empty when there are none.
        channels: per block, the channels that carry the images' largest activation, most frequent first:
            ``[{"channel", "images", "mean"}]`` (at most CHANNELS_SHOWN).
        tokens: per block, how many images have their largest activation on each token kind
            (``{"cls", "distillation", "registers", "patches"}``).
        attention: per block L >= 1 (None at block 0 and where the model has no key per token), the head- and
            query-mean attention logit that the token carrying block L-1's largest activation receives in block L
            (``"massive"``) and the median over the other tokens (``"others"``); None when no logits were read.
        attention_note: why ``attention`` is None, or None.
        final_norm: the same numbers after the final norm (``{"top": [TOP], "median", "ratio"}``), None without it.
        message: one line: where the massive activations are (or that there are none), which channel, which tokens.
    """

    study = "massive"
    blocks: List[str] = field(default_factory=list)
    top: List[List[float]] = field(default_factory=list)
    median: List[float] = field(default_factory=list)
    ratio: List[float] = field(default_factory=list)
    massive_blocks: List[int] = field(default_factory=list)
    channels: List[List[Dict]] = field(default_factory=list)
    tokens: List[Dict[str, int]] = field(default_factory=list)
    attention: Optional[Dict[str, List[Optional[float]]]] = None
    attention_note: Optional[str] = None
    final_norm: Optional[Dict] = None
    message: str = ""

    def console_lines(self, config=None) -> List[str]:
        return [self.message]


class _Tally:
    """Per image and block: the reference's numbers, the largest activation's token, and the logits it receives."""

    def __init__(self, n_layers: int):
        self.stats: List[List[torch.Tensor]] = [[] for _ in range(n_layers)]  # per block: Float64[b, TOP + 3] a batch
        self.kinds: List[Counter] = [Counter() for _ in range(n_layers)]
        self.massive_logit: List[List[float]] = [[] for _ in range(n_layers)]
        self.other_logit: List[List[float]] = [[] for _ in range(n_layers)]
        self.final: List[torch.Tensor] = []

    def add(self, batch, names, attention: bool, final: bool) -> None:
        for i in range(len(self.stats)):
            rows = batch.acts[names.resid_post(i)]
            self.stats[i].append(rows)
            lay = batch.layout.for_block(i)
            for token in rows[:, TOKEN].long().tolist():
                self.kinds[i][token_kind(lay, token)] += 1
            if attention and i >= 1:
                carriers = self.stats[i - 1][-1][:, TOKEN].long().tolist()  # block i's input: block i-1's output
                for row, tok in zip(batch.acts[names.attn_scores(i)], carriers):  # [t] logits received
                    self.massive_logit[i].append(float(row[tok]))
                    self.other_logit[i].append(float(torch.cat([row[:tok], row[tok + 1:]]).median()))
        if final:
            self.final.append(batch.acts[FINAL])


@study(MassiveConfig)
def massive_study(source: ActivationSource, config: MassiveConfig, *, progress: bool = True) -> MassiveResult:
    """The massive-activation profile of every block, with the channels and tokens that carry it.

    Args:
        source: a live model over images, or a cache with every block's ``hook_resid_post`` (full vectors;
            attention logits and the final norm are read when the cache holds them).
        config: the options (:class:`~interp.studies.artifacts.configs.MassiveConfig`; or pass them as keywords):
            ``min_value`` and ``min_ratio`` what counts as massive; ``attention`` read the logits the carrying
            tokens receive.
        progress: show progress bars.
    """
    reading = massive_reading(source, config)
    return run_readings(source, [reading], source.batch_size, progress, "massive activations")[0]


def _attention_plan(source: ActivationSource, wanted: bool):
    """(read the logits?, why not): logits need one key per token (no pyramid) and the scores hooks."""
    if not wanted:
        return False, "not asked for"
    if source.blocks.staged:
        return False, ("pyramid attention has no key per token (spatial reduction or windows): the logits a token "
                       "receives are not defined")
    hooks = [source.blocks.attn_scores(i) for i in range(1, source.n_layers)]
    if not hooks:
        return False, "one block: no next block to receive the carrying token"
    if not all(source.has(h) for h in hooks):
        return False, "the cache holds no attention logits (blocks.*.attn.hook_attn_scores)"
    return True, None


def massive_reading(source: ActivationSource, config: MassiveConfig) -> Reading:
    """:func:`massive_study` around its pass (see :mod:`interp.runtime.passes`)."""
    names, n_layers = source.blocks, source.n_layers
    attention, note = _attention_plan(source, config.attention)
    final = source.has(FINAL)
    hooks = [names.resid_post(i) for i in range(n_layers)]
    reduce = {h: magnitude_stats for h in hooks}
    if attention:
        for i in range(1, n_layers):
            reduce[names.attn_scores(i)] = received_logits
            hooks.append(names.attn_scores(i))
    if final:
        reduce[FINAL] = magnitude_stats
        hooks.append(FINAL)
    tally = _Tally(n_layers)
    return Reading([Fold(hooks, lambda batch: tally.add(batch, names, attention, final), reduce)],
                   lambda: _result(source, config, tally, note))


def _channels(stats: torch.Tensor) -> List[Dict]:
    """The channels carrying the images' largest activation (``stats`` Float64[N, TOP + 3]), most frequent first."""
    chans = stats[:, CHANNEL].long().tolist()
    values = stats[:, 0].tolist()
    out = []
    for channel, count in Counter(chans).most_common(CHANNELS_SHOWN):
        mine = [v for c, v in zip(chans, values) if c == channel]
        out.append({"channel": int(channel), "images": int(count), "mean": float(np.mean(mine))})
    return out


def _result(source: ActivationSource, config: MassiveConfig, tally: _Tally, note: Optional[str]) -> MassiveResult:
    names, n_layers = source.blocks, source.n_layers
    per_block = [torch.cat(s) for s in tally.stats]  # [N, TOP + 3] each
    means = np.array([s[:, :MEDIAN + 1].mean(0).numpy() for s in per_block])  # [L, TOP + 1]
    top, median = means[:, :TOP].T, means[:, MEDIAN]
    ratio = top[0] / np.maximum(median, np.finfo(np.float64).tiny)
    massive = [i for i in range(n_layers) if top[0, i] > config.min_value and ratio[i] >= config.min_ratio]
    channels = [_channels(s) for s in per_block]
    kinds = [{k: int(c.get(k, 0)) for k in KIND_WORDS} for c in tally.kinds]
    attention = None
    if any(tally.massive_logit):
        attention = {"massive": [float(np.mean(v)) if v else None for v in tally.massive_logit],
                     "others": [float(np.mean(v)) if v else None for v in tally.other_logit]}
    final_norm = None
    if tally.final:
        f = torch.cat(tally.final)[:, :MEDIAN + 1].mean(0).numpy()
        final_norm = {"top": f[:TOP].tolist(), "median": float(f[MEDIAN]),
                      "ratio": float(f[0] / max(f[MEDIAN], np.finfo(np.float64).tiny))}
    message = _message(names, massive, ratio, top, channels, kinds, config, final_norm)
    return MassiveResult(
        model=source.model_name, fingerprint=source.fingerprint,
        params={"min_value": config.min_value, "min_ratio": config.min_ratio, "attention": config.attention},
        seed=None, ids=list(source.ids), skipped=skipped_records(source),
        blocks=[names.label(i) for i in range(n_layers)], top=top.tolist(), median=median.tolist(),
        ratio=ratio.tolist(), massive_blocks=massive, channels=channels, tokens=kinds, attention=attention,
        attention_note=None if attention is not None else note, final_norm=final_norm, message=message)


def _message(names, massive, ratio, top, channels, kinds, config, final_norm) -> str:
    """One line: where the massive activations are, or that there are none and the largest ratio seen."""
    after = (f"; after the final norm the largest is {final_norm['ratio']:.0f}x the median (it rescales each token)"
             if final_norm else "")
    if not massive:
        peak = int(np.argmax(ratio))
        return (f"no massive activations (|a| > {config.min_value:g} and >= {config.min_ratio:g}x the median) at any "
                f"block; the largest is {top[0, peak]:.3g} = {ratio[peak]:.0f}x the median at {names.label(peak)}")
    first = massive[0]
    where = KIND_WORDS[max(kinds[first], key=kinds[first].get)]
    chan = channels[first][0]["channel"] if channels[first] else None
    return (f"massive activations from {names.label(first)} on ({len(massive)} of {len(ratio)} blocks): "
            f"{top[0, first]:.3g} = {ratio[first]:.0f}x the median, channel {chan}, on {where} tokens" + after)
