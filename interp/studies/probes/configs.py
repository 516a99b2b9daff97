"""The probes study's declaration (docs/methods.md sections 4 and 6): its options, the hooks it reads from a cache,
and which images a run opens. Torch-free: ``interp study probes --help`` reads it at once.

    interp study probes vit_small_patch14_dinov2 --images photos/ --out runs/dino --position-loss ce+mse
    interp study probes vit_small_patch14_dinov2 --images train/ --test-images val/ --out runs/dino
    interp study probes vit_small_patch14_dinov2 --cache acts.h5 --images photos/ --out runs/dino
"""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar, Dict, List, Optional, Sequence, Tuple, Union

from ...formats.image_files import list_images
from ...errors import UsageError
from ...hooks.names import BlockNames
from ...values import open_fraction, positive_int
from ...paths import existing_file, existing_path
from ...detection.spec import DetectionSpec
from ...options import group
from ..core.options import ProbeBudget
from ..declaration import StudyConfig, declare, option
from .split_file import read_split
from ...hooks.names import resolve_block

TASKS = ("position", "pixels", "label")
POSITION_LOSSES = ("ce", "ce+mse")
SETS = "train and test images (default: a seeded random split by image)"

Images = Union[str, Path, Sequence[Union[str, Path]], None]  # a folder, list file or image; or ids / paths


@declare
@dataclass(frozen=True, kw_only=True)
class ProbesConfig(StudyConfig):
    """linear probes per token group: position, pixels, image label

    Linear probes per token group (normal / high-norm patches, CLS, registers): position and pixels (Darcet et
    al. Fig. 5b) and the image label from one token (their Table 1)."""

    name: ClassVar[str] = "probes"
    module: ClassVar[str] = "interp.studies.probes.probes"
    function: ClassVar[str] = "probes_study"
    result: ClassVar[str] = "ProbesResult"
    inputs: ClassVar[str] = "images_and_cache"
    cache_doc: ClassVar[str] = ("`--hook`, or `blocks.{L}.hook_resid_post` for `--layer L` (default last), and "
                                "`blocks.{D}.hook_resid_post` for `--detect-layer D` (default last); pixel probes "
                                "need `--images`")
    cache_images_help: ClassVar[str] = "the images the cache was written from, for the pixel probe"

    detection: DetectionSpec = group(DetectionSpec)
    budget: ProbeBudget = group(ProbeBudget)
    hook: Optional[str] = option(None, "probed tokens (default blocks.{layer}.hook_resid_post)")
    layer: int = option(-1, "block of the default hook (negative counts from the end)")
    tasks: Tuple[str, ...] = option(TASKS, "probes to train (default all)", choices=TASKS, many=True)
    position_loss: str = option("ce", "ce (Darcet) or ce+mse (the reassessment: + 0.5 x MSE of (row, col))",
                                choices=POSITION_LOSSES)
    max_train_tokens: int = option(50_000, "training tokens kept (seeded sample)", parse=positive_int)
    max_test_tokens: int = option(20_000, "test tokens kept per group", parse=positive_int)
    test_fraction: Optional[float] = option(None, "share of images held out by the random split (default 0.25)",
                                            parse=open_fraction, group=SETS)
    test_images: Images = option(
        None, "held-out images (folder, list file or image); --images are then the training images",
        parse=existing_path, group=SETS)
    split: Optional[str] = option(
        None, "a split file: lines 'train PATH' / 'test PATH' (or JSON {\"train\": [...], \"test\": [...]}) naming "
              "the images of --images / --cache, or alone the images to run on", parse=existing_file, group=SETS)
    # Python only: the training images when test_images names the held-out ones (default: every other image)
    train_images: Images = None
    # Python only: more of the probes' fit options (batch_size, aux_weight, device, or the budget's; the budget
    # options above win)
    probe_options: Optional[Dict[str, Any]] = None

    def check(self) -> None:
        super().check()
        unknown = set(self.tasks) - set(TASKS)
        if unknown or self.position_loss not in POSITION_LOSSES:
            raise UsageError(f"tasks must be among position, pixels, label (got {sorted(unknown)}) and "
                             f"position_loss one of {list(POSITION_LOSSES)} (got {self.position_loss!r})")
        if self.test_images is not None and self.split is not None:
            raise UsageError("give the held-out images by --test-images or by --split, not both")
        if self.test_fraction is not None and self.split is not None:
            raise UsageError("--test-fraction sets the random split; --test-images / --split give the sets instead")
        if self.test_fraction is not None and self.test_images is not None:
            raise UsageError("test_fraction applies to the random split only; the held-out set is given by "
                             "--test-images (test_images=)")

    def check_inputs(self, images: Any, cache: Optional[str]) -> None:
        """A run needs --images, --cache or --split; --test-images adds to --images, never to a cache."""
        if not images and not cache and not self.split:
            raise UsageError("give --images (a live run), --cache (an interp cache file) or --split FILE")
        if self.test_images and (cache or not images):
            raise UsageError("--test-images needs --images (the training images) and no --cache; with a cache, "
                             "name the held-out images by --split FILE")

    def source_images(self, images: Any) -> Any:
        """--images and --test-images together (one source over both sets), or the images of --split alone."""
        if self.test_images and images:
            return image_entries(images) + image_entries(self.test_images)
        if self.split and not images:
            train, test = read_split(self.split)
            return train + test
        return images

    def run_keywords(self, images: Any, cache: Optional[str]) -> Dict[str, Any]:
        """--images as the training images of --test-images; with --cache, as the pixel probe's input images."""
        if self.test_images and images:
            return {"train_images": images}
        if cache and images and "pixels" in self.tasks:
            return {"images": images}
        return {}

    def hooks(self, blocks: BlockNames) -> List[str]:
        """The probed tokens (``hook``, else block ``layer``'s residual stream) and the detection block's output,
        which decides the high-norm patches."""
        n_layers = len(blocks)
        return [self.hook or blocks.resid_post(resolve_block(self.layer, n_layers, -1)),
                blocks.resid_post(self.detection.detect_block(n_layers))]


def image_entries(images: Images) -> List[str]:
    """The image paths an image argument names (a folder, list file or image: its files; a sequence: as given)."""
    if isinstance(images, (str, Path)):
        return [str(p) for p in list_images(images)]
    return [str(p) for p in images or ()]
