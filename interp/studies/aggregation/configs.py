"""The lazy-aggregation studies' declarations (docs/methods.md section 3): their options, the hooks they read
from a cache, and what the command line says of them. Torch-free: ``interp study NAME --help`` reads them at once.

patch-score and pib read a live model (``--images``) or a cache (``--cache``); masking and selective-cls re-run
the model (masked images, a SelectiveCLS edit), so they take ``--images``.

    interp study patch-score MODEL --images DIR [--boxes FILE | --masks DIR] --out OUT [--cell-rule majority]
        [--normalise minmax]
    interp study pib MODEL --images DIR --boxes FILE --out OUT
    interp study masking MODEL --images DIR --out OUT [--fractions 0 0.1 ... | --steps 7] [--fill zero|mean|blur]
        [--orders top bottom random] [--threshold p98] [--detect-layer N] [--preset NAME]
    interp study selective-cls MODEL --images DIR --boxes FILE --out OUT [--k 1 7 98]
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, ClassVar, Dict, List, Optional, Tuple, Union

from ...errors import UsageError
from ...values import (fraction, fraction_below_one, nonnegative_int, open_fraction, positive_float, positive_int,
                       threshold_arg)
from ...paths import existing_file, existing_path
from ...detection.spec import DetectionSpec
from ...options import Options, group
from ..core.options import FINAL, REFERENCES, SCORE_DOC, classifier_option, needed_hooks
from ..declaration import StudyConfig, declare, option


def _max_box_fraction(default: Optional[float]) -> Any:
    """``--max-box-fraction`` with its default (said in the help)."""
    return option(default, "drop boxes larger than this share of the original image area "
                           f"(default {default}; 1 keeps all)", parse=fraction)


def _n_maps() -> Any:
    """``--n-maps``: the ``score_maps.png`` figure's size."""
    return option(8, "images drawn in score_maps.png", parse=nonnegative_int)


# ---------------------------------------------------------------------------------------------- option groups
@dataclass(frozen=True, kw_only=True)
class SelectiveCLSSettings(Options):
    """The parameters of a SelectiveCLS (:class:`~interp.interventions.selective_cls.SelectiveCLS`) but its k."""

    sigma: Optional[float] = option(None, "SelectiveCLS low-pass width (default sqrt(d))", parse=positive_float)
    score: str = option("code", "SelectiveCLS stability score: code = x/|x_low - x| (LaSt reference code, default), "
                                "paper = x_low/(|x_low - x| + eps), contrib = x_low/(x_low - x + eps)",
                        choices=("code", "paper", "contrib"))
    fft: str = option("shift", "SelectiveCLS FFT variant: shift (fftshift, the reference) or rfft",
                      choices=("shift", "rfft"))
    eps: float = option(1e-6, "SelectiveCLS epsilon", parse=positive_float)

    def params(self, k: int) -> Dict[str, Any]:
        """``SelectiveCLS(**params(k))``: the edit these options describe, keeping ``k`` patches."""
        return {"k": k, "sigma": self.sigma, "score": self.score, "fft": self.fft, "eps": self.eps}


@dataclass(frozen=True, kw_only=True)
class PatchScoreSettings(Options):
    """The Patch Score ``cos(x_p, g)``: where the patch tokens come from and the global vector g (with the
    SelectiveCLS of the ``selective`` vector)."""

    reference: str = option("cls", "global vector g of the Patch Score: CLS output, the pooled vector the head "
                                   "sees, or the SelectiveCLS vector", choices=REFERENCES)
    hook: str = option(FINAL, "patch tokens: hook_norm_final (default) or blocks.{i}.hook_resid_post")
    selective_k: int = option(1, "k of the SelectiveCLS vector (--reference selective)", parse=positive_int)
    selective_cls: SelectiveCLSSettings = group(SelectiveCLSSettings)

    def selective_params(self) -> Dict[str, Any]:
        """``SelectiveCLS(**selective_params())``: the edit of the ``selective`` vector (k ``selective_k``)."""
        return self.selective_cls.params(self.selective_k)

    def hooks(self) -> List[str]:
        """The patch tokens' hook and the hook the global vector is read from."""
        return needed_hooks(self.hook, self.reference)


@dataclass(frozen=True, kw_only=True)
class ObjectBoxes(Options):
    """The object boxes of PiB and their filters, under a box protocol (:mod:`.pib_protocol`)."""

    boxes: Any = option(None, "box file: CSV/JSON (image,x0,y0,x1,y1) or COCO instances JSON", parse=existing_file,
                        required=True)
    single_object: bool = option(True, "keep images with several boxes (default: exactly one box, as the reference)",
                                 off="--all-objects")
    max_box_fraction: Optional[float] = _max_box_fraction(0.25)
    protocol: str = option("model", "model: the model's own transform (default); last: the LaSt reference's "
                                    "Resize 256 + CenterCrop 224, box cells and filters (overrides the box filters; "
                                    "needs a 224-px grid)", choices=("model", "last"))


@dataclass(frozen=True, kw_only=True)
class Bootstrap(Options):
    """The seeded percentile bootstrap interval of PiB (the config's ``--seed``)."""

    n_boot: int = option(1000, "bootstrap resamples for the PiB interval", parse=positive_int)
    level: float = option(0.95, "confidence level of the PiB interval", parse=open_fraction)


# ---------------------------------------------------------------------------------------------- studies
@declare
@dataclass(frozen=True, kw_only=True)
class PatchScoreConfig(StudyConfig):
    """Patch Score maps cos(patch, global vector), fg/bg distributions

    Patch Score S_p = cos(x_p, g) per image (docs/methods.md section 3)."""

    name: ClassVar[str] = "patch-score"
    module: ClassVar[str] = "interp.studies.aggregation.patch_score"
    function: ClassVar[str] = "patch_score_study"
    result: ClassVar[str] = "PatchScoreResult"
    inputs: ClassVar[str] = "images_or_cache"
    cache_doc: ClassVar[str] = SCORE_DOC

    patch_score: PatchScoreSettings = group(PatchScoreSettings)
    boxes: Optional[str] = option(None, "box file (CSV/JSON/COCO) for foreground/background scores",
                                  parse=existing_file)
    masks: Optional[str] = option(None, "directory of masks <image stem>.png (nonzero = foreground; palette PNGs by "
                                        "index, 255 void)", parse=existing_path)
    single_object: bool = option(False, "keep only images with exactly one box")
    max_box_fraction: Optional[float] = _max_box_fraction(None)
    cell_rule: str = option("touch", "a patch is foreground when its cell touches the box / a mask pixel (touch, "
                                     "default) or when most of its area is inside (majority)",
                            choices=("touch", "majority"))
    normalise: str = option("none", "score distributions of the raw cosines (none, default) or of each image's map "
                                    "min-max rescaled to [0, 1] (minmax)", choices=("none", "minmax"))
    n_maps: int = _n_maps()
    bins: int = 40  # histogram bins over [-1, 1]

    def check(self) -> None:
        super().check()
        if self.boxes and self.masks:
            raise UsageError("give --boxes or --masks, not both")

    def hooks(self, blocks) -> List[str]:
        return self.patch_score.hooks()


@declare
@dataclass(frozen=True, kw_only=True)
class PiBConfig(StudyConfig):
    """PiB: share of images whose top Patch Score patch is in the box

    Point in box with a bootstrap interval (docs/methods.md section 3)."""

    name: ClassVar[str] = "pib"
    module: ClassVar[str] = "interp.studies.aggregation.pib"
    function: ClassVar[str] = "pib_study"
    result: ClassVar[str] = "PiBResult"
    inputs: ClassVar[str] = "images_or_cache"
    cache_doc: ClassVar[str] = SCORE_DOC

    objects: ObjectBoxes = group(ObjectBoxes)
    patch_score: PatchScoreSettings = group(PatchScoreSettings)
    bootstrap: Bootstrap = group(Bootstrap)
    n_maps: int = _n_maps()
    store_maps: bool = True  # keep the [N, h, w] score maps in the result (for plots)

    def hooks(self, blocks) -> List[str]:
        return self.patch_score.hooks()


MASKING_THRESHOLD = "p98"  # masking's own threshold when neither a threshold nor a preset is given


@dataclass(frozen=True, kw_only=True)
class MaskingDetection(DetectionSpec):
    """The masking probe's detection group: a :class:`DetectionSpec` whose threshold, when neither it nor a
    preset is given, is :data:`MASKING_THRESHOLD` (the per-model 98th percentile of the unmasked run)."""

    threshold: Union[float, str, None] = option(
        None, "outlier token norm at the detection block: a number > 0, pNN (percentile of the unmasked run) or "
              f"auto; default {MASKING_THRESHOLD}, or the preset's (--outlier-threshold: its former name)",
        parse=threshold_arg, aliases=("--outlier-threshold",))

    def resolved(self) -> DetectionSpec:
        if self.threshold is None and self.preset is None:
            return DetectionSpec(threshold=MASKING_THRESHOLD, detect_layer=self.detect_layer).resolved()
        return super().resolved()


@declare
@dataclass(frozen=True, kw_only=True)
class MaskingConfig(StudyConfig):
    """mask top-k / bottom-k patches by Patch Score and re-measure

    Masking probe (docs/methods.md section 3): accuracy or agreement and outlier counts per masked fraction, for
    both orders."""

    name: ClassVar[str] = "masking"
    module: ClassVar[str] = "interp.studies.aggregation.masking"
    function: ClassVar[str] = "masking_study"
    result: ClassVar[str] = "MaskingResult"

    patch_score: PatchScoreSettings = group(PatchScoreSettings)
    classifier: Optional[str] = classifier_option()
    detection: DetectionSpec = group(MaskingDetection)
    fractions: Optional[Tuple[float, ...]] = option(None, "shares of patches to mask (default 0 0.1 ... 0.9)",
                                                    parse=fraction_below_one, many=True)
    steps: Optional[int] = option(None, "mask the fractions k/STEPS, k = 0 .. STEPS-1 (7: the LaSt paper's steps "
                                        "of 1/7)", parse=positive_int)
    orders: Tuple[str, ...] = option(("top", "bottom", "random"),
                                     "masking orders: highest score first, lowest first, and the seeded random "
                                     "control (--seed; default all three)",
                                     choices=("top", "bottom", "random"), many=True)
    fill: str = option("zero", "zero (0 in normalised space), mean (dataset mean per channel) or blur",
                       choices=("zero", "mean", "blur"))
    blur_sigma: Optional[float] = option(None, "blur sigma in pixels (default patch size / 2)", parse=positive_float)

    def check(self) -> None:
        super().check()
        if self.steps is not None and self.fractions is not None:
            raise UsageError("give --fractions or --steps, not both")


@declare
@dataclass(frozen=True, kw_only=True)
class SelectiveCLSConfig(StudyConfig):
    """PiB, score distributions and agreement with/without SelectiveCLS

    The measured effect of SelectiveCLS(k) on a frozen model, one table."""

    name: ClassVar[str] = "selective-cls"
    module: ClassVar[str] = "interp.studies.aggregation.selective_cls"
    function: ClassVar[str] = "selective_cls_study"
    result: ClassVar[str] = "SelectiveCLSResult"

    objects: ObjectBoxes = group(ObjectBoxes)
    ks: Tuple[int, ...] = option((1, 7, 98), "SelectiveCLS k values (default 1 7 98)", flag="--k", parse=positive_int,
                                 many=True)
    selective_cls: SelectiveCLSSettings = group(SelectiveCLSSettings)
    reference: str = option("cls", "the baseline's global vector", choices=("cls", "pooled"))
    bootstrap: Bootstrap = group(Bootstrap)
    classifier: Optional[str] = classifier_option()
    bins: int = 40  # histogram bins over [-1, 1]
