"""The repairs theme's declaration (docs/methods.md section 2, "Every training-free repair on one table"): every
training-free repair of the high-norm tokens on one model and one image set, and SINDER's weight-only direction.
Torch-free: ``interp study repairs --help`` reads it at once.

    interp study repairs vit_small_patch14_dinov2 --images photos/ --out runs/repairs --neurons runs/dino/neurons.json
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar, Dict, List, Optional, Union

from ...detection.spec import DetectionSpec
from ...options import group
from ...values import NEURONS_SYNTAX, fraction, positive_int
from ..core.options import classifier_option, force_option, neurons_option
from ..declaration import StudyConfig, declare, option


@declare
@dataclass(frozen=True, kw_only=True)
class RepairsConfig(StudyConfig):
    """every training-free repair of the high-norm tokens on one table, and SINDER's direction from the weights

    One row per repair (the intact model, the test-time register, the attention bias, Fix-Reg-Mean, mean replacement
    of the high-norm tokens, RegCache, test-time-augmentation denoising): outliers left at the detection block, the
    last block's CLS attention on the artifact patches, behaviour, the final patch features' cosine to the intact
    model's on its normal patches, and the forward passes per image. Then per block: SINDER's singular-defect
    direction, predicted from the weights, against the measured artifact direction and the register neurons'
    writes."""

    name: ClassVar[str] = "repairs"
    module: ClassVar[str] = "interp.studies.repairs.repairs"
    function: ClassVar[str] = "repairs_study"
    result: ClassVar[str] = "RepairsResult"

    detection: DetectionSpec = group(DetectionSpec)
    classifier: Optional[str] = classifier_option()
    neurons: Union[str, Dict[int, List[int]], None] = neurons_option(
        f"register neurons for the test-time register and the attention bias (without them both rows say n/a): "
        f"{NEURONS_SYNTAX}")
    force: bool = force_option()
    tta_views: int = option(10, "views of the test-time-augmentation denoising, the image itself included "
                                "(default 10, PH-Reg's)", parse=positive_int)
    tta_shift: float = option(0.15, "largest view shift as a share of the patch grid (default 0.15, PH-Reg's)",
                              parse=fraction)
    regcache_block: Optional[int] = option(
        None, "first block RegCache's cached prefix enters (default: the block after the first with artifacts)",
        parse=positive_int)
    sinder_samples: int = option(100_000, "random inputs of SINDER's per-block MLP fit (default 100000, SINDER's)",
                                 parse=positive_int)
    sinder: bool = option(True, "skip SINDER's singular-defect directions", off="--no-sinder")
