"""The causal toolkit's declarations (docs/causal.md): logit lens and direct logit attribution, activation
patching and attribution patching. Torch-free. Every one re-runs the model (``--images``).

    interp study logit-lens planted_vit --images photos/ --out runs/p
    interp study patching planted_vit --images photos/ --out runs/p --site mlp_out --metric outliers
    interp study attribution planted_vit --images photos/ --out runs/p --metric pooled-cosine
"""
from __future__ import annotations

import argparse
from dataclasses import dataclass
from typing import ClassVar, Optional, Tuple

from ...errors import UsageError
from ...values import NEURONS_SYNTAX, index_list, nonnegative_int, positive_float, positive_int
from ...paths import existing_file, existing_path
from ...detection.spec import DetectionSpec
from ...options import group
from ..declaration import StudyConfig, declare, option

SITES = ("resid_pre", "resid_post", "attn_out", "mlp_out", "z", "mlp_post")  # the hook leaves a sweep patches
CORRUPTIONS = ("image", "noise", "region", "registers", "test-time-register")
FILLS = ("mean", "blur")  # what a --corruption region puts in the region
METRICS = ("pooled-cosine", "logit-diff", "prob", "outliers")
DIRECTIONS = ("denoise", "noise")


def classes_arg(text: str) -> Tuple[int, ...]:
    """``C`` (one class) or ``A,B`` (the logit difference A - B): distinct whole numbers."""
    values = index_list(text)
    if len(values) > 2:
        raise argparse.ArgumentTypeError(f"{text!r}: give one class C or two, A,B (the difference A - B)")
    return values


def box_arg(text: str) -> Tuple[int, int, int, int]:
    """``x0,y0,x1,y1``: a box in the model input's pixels, x0 < x1 and y0 < y1."""
    parts = str(text).split(",")
    if len(parts) != 4 or not all(p.strip().isdigit() for p in parts):
        raise argparse.ArgumentTypeError(f"{text!r}: expected x0,y0,x1,y1 in input pixels, e.g. 32,32,96,96")
    x0, y0, x1, y1 = (int(p) for p in parts)
    if x0 >= x1 or y0 >= y1:
        raise argparse.ArgumentTypeError(f"{text!r}: the box needs x0 < x1 and y0 < y1")
    return x0, y0, x1, y1


CLASSES_HELP = ("the output to explain: C (its logit; a probability where the metric is one) or A,B (the logit "
                "difference A - B); default each image's top-1 output")


@declare
@dataclass(frozen=True, kw_only=True)
class LogitLensConfig(StudyConfig):
    """logit lens and direct logit attribution: each block read through the final norm and head

    Each block's residual stream (the pooled read and every token) read through the final norm and the head; the
    final output decomposed into the embedding's and each block's attention (per head) and MLP (per neuron)
    contributions, with the final norm's scale frozen from the full residual stream (TransformerLens's
    convention): they sum to the output. A model without a head gets each block's pooled-vector cosine to the
    final pooled vector instead."""

    name: ClassVar[str] = "logit-lens"
    module: ClassVar[str] = "interp.studies.causal.logit_lens"
    function: ClassVar[str] = "logit_lens_study"
    result: ClassVar[str] = "LogitLensResult"

    classes: Optional[Tuple[int, ...]] = option(None, CLASSES_HELP, parse=classes_arg, metavar="C|A,B")
    per_head: bool = option(True, "split each block's attention contribution into its heads (attn.hook_z)",
                            off="--no-per-head")
    top_neurons: int = option(5, "MLP neurons listed per block by their mean contribution", parse=positive_int)


@dataclass(frozen=True, kw_only=True)
class PatchingOptions(StudyConfig):
    """What activation and attribution patching share: the two inputs, the sites, the metric (its ``outliers``
    counted under the detection)."""

    detection: DetectionSpec = group(DetectionSpec)

    corruption: str = option("image", "the corrupted run: image (the next image of the batch), noise (Gaussian "
                                      "noise added, --noise), region (--box, --boxes or --masks filled, --fill), "
                                      "registers (the trained registers zeroed at every block's output), "
                                      "test-time-register (the clean run has one, --register-neurons; the corrupted "
                                      "run not)", choices=CORRUPTIONS)
    noise: float = option(1.0, "standard deviation of the noise, in normalised pixel units", parse=positive_float)
    box: Optional[Tuple[int, int, int, int]] = option(None, "with --corruption region: one box for every image, "
                                                            "x0,y0,x1,y1 in input pixels", parse=box_arg,
                                                      metavar="X0,Y0,X1,Y1")
    boxes: Optional[str] = option(None, "with --corruption region: each image's boxes, a box file (CSV/JSON/COCO/VOC; "
                                        "original pixels)", parse=existing_file, metavar="FILE")
    masks: Optional[str] = option(None, "with --corruption region: each image's region, a folder of masks <image "
                                        "stem>.png (nonzero = region)", parse=existing_path, metavar="DIR")
    fill: str = option("mean", "what fills the region: mean (the normalisation's mean colour) or blur (a Gaussian "
                               "blur of the image, --blur-sigma)", choices=FILLS)
    blur_sigma: Optional[float] = option(None, "with --fill blur: the blur's sigma in input pixels (default half a "
                                               "patch)", parse=positive_float)
    register_neurons: Optional[str] = option(None, "with --corruption test-time-register: the register neurons the "
                                                   f"test-time register takes over, {NEURONS_SYNTAX}")
    direction: str = option("denoise", "denoise: clean values patched into the corrupted run (default); noise: "
                                       "corrupted values into the clean run", choices=DIRECTIONS)
    site: str = option("resid_post", "the site swept: a block's resid_pre, resid_post, attn_out, mlp_out (block x "
                                     "token), z (block x head) or mlp_post (the --neurons, each at every token)",
                       choices=SITES)
    metric: str = option("pooled-cosine", "pooled-cosine (to the clean run), logit-diff (--classes A,B), prob "
                                          "(--classes C), outliers (high-norm patches at the detection block)",
                         choices=METRICS)
    classes: Optional[Tuple[int, ...]] = option(None, CLASSES_HELP, parse=classes_arg, metavar="C|A,B")
    blocks: Optional[Tuple[int, ...]] = option(None, "blocks swept (default all)", parse=index_list,
                                               metavar="I,...")
    neurons: Optional[str] = option(None, f"with --site mlp_post, the neurons swept one by one: {NEURONS_SYNTAX}")
    cells: int = option(16, "sweep cells per forward (each a copy of the batch)", parse=positive_int)
    classifier: Optional[str] = option(None, "with --metric logit-diff or prob: a classifier file (zero-shot matrix or "
                                             "linear head) whose class logits are read instead of the model's head",
                                       parse=existing_file, metavar="FILE")

    def check(self) -> None:
        super().check()
        regions = [flag for flag, value in (("--box", self.box), ("--boxes", self.boxes), ("--masks", self.masks))
                   if value is not None]
        if (self.corruption == "region") != bool(regions) or len(regions) > 1:
            raise UsageError("--corruption region takes one of --box, --boxes or --masks (and they go with it)")
        if self.corruption != "region" and (self.fill != "mean" or self.blur_sigma is not None):
            raise UsageError("--fill and --blur-sigma go with --corruption region")
        if self.blur_sigma is not None and self.fill != "blur":
            raise UsageError("--blur-sigma goes with --fill blur")
        if (self.corruption == "test-time-register") != (self.register_neurons is not None):
            raise UsageError("--register-neurons goes with --corruption test-time-register (and it needs them), "
                             "e.g. --register-neurons 2:17,2:101")
        if self.classifier is not None and self.metric not in ("logit-diff", "prob"):
            raise UsageError("--classifier is read by --metric logit-diff or prob")
        if (self.site == "mlp_post") != (self.neurons is not None):
            raise UsageError("--neurons goes with --site mlp_post (and it needs them), e.g. --neurons 2:17,2:101")
        if self.metric == "logit-diff" and (self.classes is None or len(self.classes) != 2):
            raise UsageError("--metric logit-diff needs --classes A,B")
        if self.metric == "prob" and self.classes is not None and len(self.classes) != 1:
            raise UsageError("--metric prob takes one class: --classes C")


@declare
@dataclass(frozen=True, kw_only=True)
class PatchingConfig(PatchingOptions):
    """activation patching: block x token (x head, x neuron) sweeps of clean into corrupted runs

    Run a clean and a corrupted input; patch the clean activation at one site (a block's hook at one token, one
    head at every token, one MLP neuron at every token) into the corrupted run (denoising) or the reverse
    (noising) and measure the metric; the sweep's cells are batched. The normalised effect is (patched -
    corrupted) / (clean - corrupted), TransformerLens's."""

    name: ClassVar[str] = "patching"
    module: ClassVar[str] = "interp.studies.causal.patching"
    function: ClassVar[str] = "patching_study"
    result: ClassVar[str] = "PatchingResult"


@declare
@dataclass(frozen=True, kw_only=True)
class AttributionConfig(PatchingOptions):
    """attribution patching: gradient x (clean - corrupted) at every site, beside real patching

    The first-order estimate of every patching cell from two forwards and one backward: the metric's gradient
    in the run patched into, times the difference of the two runs' activations; with --compare, the real
    patching sweep too and their correlation (where the effect is linear they agree)."""

    name: ClassVar[str] = "attribution"
    module: ClassVar[str] = "interp.studies.causal.attribution"
    function: ClassVar[str] = "attribution_study"
    result: ClassVar[str] = "AttributionResult"

    compare: bool = option(True, "also run the real patching sweep and report the correlation", off="--no-compare")

    def check(self) -> None:
        super().check()
        if self.metric == "outliers":
            raise UsageError("--metric outliers counts tokens: it has no gradient; attribution takes pooled-cosine, "
                             "logit-diff or prob")


@declare
@dataclass(frozen=True, kw_only=True)
class RolloutConfig(StudyConfig):
    """attention rollout and gradient-weighted relevance maps of the CLS token

    Attention rollout (Abnar and Zuidema 2020) as Transformer-Explainability computes it: each block's head-mean
    attention plus the identity, rows renormalised, multiplied from --start-layer on; and the gradient-weighted
    relevance of Chefer et al. (2021): R = I, then per block R += mean over heads of (grad x attention)^+ @ R, the
    gradient of the explained output. The CLS row over the patch grid (registers apart). Pyramids are refused:
    their spatial-reduction or window attention is not token-to-token over one grid."""

    name: ClassVar[str] = "rollout"
    module: ClassVar[str] = "interp.studies.causal.rollout"
    function: ClassVar[str] = "rollout_study"
    result: ClassVar[str] = "RolloutResult"

    classes: Optional[Tuple[int, ...]] = option(None, "the output the relevance explains: C (one class; default "
                                                      "each image's top-1 output)", parse=classes_arg, metavar="C")
    start_layer: int = option(0, "first block of the rollout", parse=nonnegative_int)
    relevance: bool = option(True, "also the gradient-weighted relevance (one backward per batch)",
                             off="--no-relevance")

    def check(self) -> None:
        super().check()
        if self.classes is not None and len(self.classes) != 1:
            raise UsageError("rollout explains one output: --classes C")
