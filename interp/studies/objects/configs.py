"""The object studies' declarations (docs/methods.md sections 3 and 5): LOST object discovery and the coarse
segmentation from Patch Scores; their options, the hooks they read from a cache, and what the command line
says of them. Torch-free: ``interp study NAME --help`` reads them at once.

    interp study lost vit_small_patch16_224.dino --images voc/JPEGImages --boxes voc/Annotations --out runs/lost
    interp study segment vit_small_patch16_224 --images photos/ --masks masks/ --out runs/seg --neurons 2:17
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, ClassVar, Dict, List, Optional, Union

from ...errors import UsageError
from ...hooks.names import BlockNames
from ...values import finite_float, positive_int, register_count
from ...paths import existing_path
from ..core.options import FINAL, REFERENCES, SCORE_DOC, needed_hooks
from ..declaration import StudyConfig, declare, option
from ...hooks.names import resolve_block

PROTOCOLS = ("model", "lost")
TIES = ("index", "torch")  # lost_core.degree_order
AVERAGES = ("image", "dataset")  # seg_scoring
FRAMES = ("input", "full")

Neurons = Union[str, Dict[int, List[int]], None]


def neurons_option(what: str) -> Any:
    """``--neurons``: the register neurons of a test-time register the study also runs with."""
    return option(None, f"register neurons (LAYER:NEURON,... or a neurons.json): also run {what} with a test-time "
                        "register fed by them, and report both")


def n_registers_option() -> Any:
    return option(1, "test-time register tokens (with --neurons)", parse=register_count)


@declare
@dataclass(frozen=True, kw_only=True)
class LostConfig(StudyConfig):
    """LOST object discovery: seed, mask, box per image, CorLoc

    LOST object discovery (Simeoni et al.) on the keys of one block: seed, mask and box per image, CorLoc with
    --boxes (Darcet et al. Table 3)."""

    name: ClassVar[str] = "lost"
    module: ClassVar[str] = "interp.studies.objects.lost"
    function: ClassVar[str] = "lost_study"
    result: ClassVar[str] = "LostResult"
    inputs: ClassVar[str] = "images_or_cache"
    cache_doc: ClassVar[str] = "`blocks.{L}.attn.hook_k` for `--layer L` (default last)"

    boxes: Any = option(None, "ground-truth boxes for CorLoc (original pixels): CSV/JSON/COCO, a VOC .xml file or a "
                              "folder of them (VOC's Annotations)", parse=existing_path)
    layer: int = option(-1, "block whose keys are used (default: the last)")
    k: int = option(100, "lowest-degree patches considered at seed expansion", parse=positive_int)
    protocol: str = option(
        "model", "model: the model's own transform, batched (default); lost: LOST's own (each image at full "
                 "resolution, zero-padded to the patch size, the position table resampled per image as DINO does; "
                 "COCO crowd boxes dropped; LOST's IoU). Load the model at its own size", choices=PROTOCOLS)
    ties: str = option("index", "order of patches of equal degree: index (default, reproducible) or torch (LOST's "
                                "unstable torch.argsort; its order depends on the device)", choices=TIES)
    neurons: Neurons = neurons_option("LOST")
    n_registers: int = n_registers_option()
    iou: float = 0.5  # CorLoc's IoU threshold
    n_boot: int = 1000  # bootstrap resamples of CorLoc's interval
    level: float = 0.95  # its confidence level

    def check(self) -> None:
        super().check()
        if int(self.k) < 1:
            raise UsageError(f"k must be >= 1, got {self.k}")

    def check_inputs(self, images: Any, cache: Optional[str]) -> None:
        if self.protocol == "lost" and cache:
            raise UsageError("--protocol lost reads each image file at full resolution: give --images, not --cache")

    def hooks(self, blocks: BlockNames) -> List[str]:
        """The keys of block ``layer`` (default the last), LOST's features."""
        return [blocks.attn_k(resolve_block(self.layer, len(blocks), -1))]


@declare
@dataclass(frozen=True, kw_only=True)
class SegmentConfig(StudyConfig):
    """coarse segmentation from Patch Scores, Jaccard vs masks

    Coarse segmentation from Patch Score maps (score > mean + k std), mIoU and Jaccard against ground-truth
    masks, with and without SelectiveCLS / a test-time register (LaSt Table 6)."""

    name: ClassVar[str] = "segment"
    module: ClassVar[str] = "interp.studies.objects.segment"
    function: ClassVar[str] = "segment_study"
    result: ClassVar[str] = "SegmentResult"
    inputs: ClassVar[str] = "images_or_cache"
    cache_doc: ClassVar[str] = SCORE_DOC

    masks: Any = option(None, "ground truth: a folder of masks <image stem>.png (palette PNGs by index: 0 background, "
                              "255 void, others foreground; other images nonzero = foreground) or COCO polygons",
                        parse=existing_path, required=True)
    reference: str = option("cls", "global vector of the Patch Score", choices=REFERENCES)
    hook: str = option(FINAL, "patch tokens of the Patch Score")
    k_std: float = option(1.0, "foreground = score > mean + K x std of the map", parse=finite_float)
    average: str = option("image", "mIoU over background/foreground: mean of the images' mIoU (image, default) or "
                                   "from intersections and unions summed over the dataset (dataset)",
                          choices=AVERAGES)
    frame: str = option("input", "score in the model-input frame, the crop's border left out (input, default), or "
                                 "on the whole original image, what the crop cut away counted as background (full)",
                        choices=FRAMES)
    whole_image: bool = option(False, "show the model each whole image, resized to its input size without the "
                                      "centre crop (aspect not kept), so every pixel is seen and scored")
    selective_k: int = option(1, "k of the SelectiveCLS vector (the 'selective' reference and variant)",
                              parse=positive_int)
    with_selective: bool = option(True, "skip the SelectiveCLS variant", off="--no-selective")
    neurons: Neurons = neurons_option("the segmentation")
    n_registers: int = n_registers_option()

    def hooks(self, blocks: BlockNames) -> List[str]:
        """The Patch Score's patch tokens (``hook``) and the hook its global vector is read from (``reference``)."""
        return needed_hooks(self.hook, self.reference)
