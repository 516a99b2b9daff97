"""Where the artifacts are: the verdict at every block, stage by stage, and the default detection block.

A model's artifacts can live in any stage of a pyramid (each stage has its own grid and norm scale, and each
stage's patch embedding or merging normalises the tokens again: a PVTv2 planted in stage 2 shows none at the
last block) and can fade before the last block of a plain ViT. So when no detection block is given,
:func:`~interp.detection.detection.detect` reads every block's output in its one pass and judges each with the
same threshold rule and the same formed-inside rule (:mod:`interp.detection.formation`); this module holds those
verdicts and picks the block (:func:`choose_block`):

* no block has artifacts: the last block (as the papers detect; the verdict there is "no artifacts");
* else the stage where they are strongest (the largest fitted mode ratio, :attr:`BlockVerdict.mode_ratio`; a
  plain ViT is one stage), and in it the last block that has them: on a plain ViT whose last block has
  artifacts that is the last block, as before.

>>> v = [BlockVerdict(0, "block 0", 0, False, 1.0, 0, 0), BlockVerdict(1, "block 1", 0, True, 4.0, 12, 0),
...      BlockVerdict(2, "block 2", 0, False, 1.0, 0, 0)]
>>> choose_block(v)
1
>>> Survey(tuple(v), 1, False).describe()
'artifacts at blocks 1 (up to 4.00x), none at the last block'
"""
from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Dict, List, Optional, Sequence, Tuple

import torch

from .formation import formed_mask, input_ratios
from .norm_split import MIN_UPPER_TOKENS
from .thresholds import Threshold, ThresholdSpec, detect_norms


@dataclass(frozen=True)
class BlockVerdict:
    """One block's verdict.

    Attributes:
        layer, label, stage: the block, its name (``stage 2 block 0``) and its stage (0 on a plain ViT).
        found: artifacts at this block (the threshold's verdict, with tokens formed by the blocks).
        mode_ratio: the two-mode fit's upper mode over the bulk (1.0 without a fit).
        n_outliers: tokens above the threshold formed by the blocks; n_from_input: those carried from the input.
    """

    layer: int
    label: str
    stage: int
    found: bool
    mode_ratio: float
    n_outliers: int
    n_from_input: int


def formed_verdict(threshold: Threshold, n_formed: int, n_above: int) -> bool:
    """Artifacts: the threshold finds them and the blocks formed enough of the tokens above it (all of them
    when fewer than the split's minimum, ``MIN_UPPER_TOKENS``, are above; at least that many otherwise)."""
    return bool(threshold.artifacts_found and n_formed >= min(MIN_UPPER_TOKENS, n_above) and n_formed > 0)


def judge_block(source, layer: int, norms: torch.Tensor, spec: ThresholdSpec,
                entry: Optional[torch.Tensor]) -> Tuple[Threshold, Optional[torch.Tensor], BlockVerdict]:
    """(threshold, input ratios on the block's grid, verdict) of block ``layer`` of ``source`` (an
    ActivationSource) from its norms [N, P] and the input's norms [N, P_0] (None: no input to compare with)."""
    thr = detect_norms(norms, spec).threshold
    ratio = None
    if entry is not None:
        grid0 = source.layout_of(source.blocks.resid_pre(0)).grid
        ratio = input_ratios(entry, grid0, source.layout_of(source.blocks.resid_post(layer)).grid)
    above = thr.mask(norms)
    formed = above if ratio is None else above & formed_mask(norms, ratio)
    n_formed, n_above = int(formed.sum()), int(above.sum())
    verdict = BlockVerdict(layer, source.blocks.label(layer), source.layout.stage_of(layer),
                           formed_verdict(thr, n_formed, n_above), float(thr.mode_ratio), n_formed,
                           n_above - n_formed)
    return thr, ratio, verdict


def _ranges(layers: Sequence[int]) -> str:
    """'4-5', '2-3, 6' from sorted block indices."""
    out, start = [], None
    for i, layer in enumerate(layers):
        if start is None:
            start = layer
        if i + 1 == len(layers) or layers[i + 1] != layer + 1:
            out.append(str(layer) if start == layer else f"{start}-{layer}")
            start = None
    return ", ".join(out)


def choose_block(verdicts: Sequence[BlockVerdict]) -> int:
    """The default detection block (module docstring): the last block when none has artifacts, else the last
    block with artifacts of the stage where they are strongest."""
    found = [v for v in verdicts if v.found]
    if not found:
        return verdicts[-1].layer
    stage = max(found, key=lambda v: (v.mode_ratio, v.layer)).stage
    return max(v.layer for v in found if v.stage == stage)


@dataclass(frozen=True)
class Survey:
    """The verdict at every block read (:class:`BlockVerdict`, in order) and the block chosen.

    Attributes:
        blocks: the verdicts; chosen: the detection block; staged: whether the model is a pyramid.
    """

    blocks: Tuple[BlockVerdict, ...]
    chosen: int
    staged: bool

    def stages(self) -> List[Dict]:
        """Per stage: {"stage", "found", "blocks": the blocks with artifacts, "mode_ratio": the largest there}."""
        out = []
        for stage in sorted({v.stage for v in self.blocks}):
            found = [v for v in self.blocks if v.stage == stage and v.found]
            out.append({"stage": stage, "found": bool(found), "blocks": [v.layer for v in found],
                        "mode_ratio": max((v.mode_ratio for v in found), default=None)})
        return out

    def describe(self) -> str:
        """'stage 2: artifacts, 2.6x, blocks 4-5; stage 3: none' on a pyramid; 'artifacts at blocks 2-3 (up to
        4.1x), none at the last block' on a plain ViT (nothing about the last block when it has them)."""
        if self.staged:
            return "; ".join(f"stage {s['stage']}: artifacts, {s['mode_ratio']:.2f}x, blocks {_ranges(s['blocks'])}"
                             if s["found"] else f"stage {s['stage']}: none" for s in self.stages())
        found = [v for v in self.blocks if v.found]
        if not found:
            return "no artifacts at any block"
        text = (f"artifacts at blocks {_ranges([v.layer for v in found])} (up to "
                f"{max(v.mode_ratio for v in found):.2f}x)")
        return text + ("" if self.blocks[-1].found else ", none at the last block")

    def to_dict(self) -> Dict:
        return {"chosen": self.chosen, "summary": self.describe(), "stages": self.stages(),
                "blocks": [asdict(v) for v in self.blocks]}


def survey_of(verdicts: Sequence[BlockVerdict], staged: bool) -> Optional[Survey]:
    """The :class:`Survey` of ``verdicts`` with its chosen block; None when there are none."""
    return Survey(tuple(verdicts), choose_block(verdicts), staged) if verdicts else None
