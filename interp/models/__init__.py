"""Getting a timm vision transformer: by name, local weights or module (``loading.py``); its family adapter
(``families/``: blocks, token layout, hooked forward), weight files and foreign layouts (``weights/``), its inputs
(``inputs/``: preprocessing), classifiers (``classifiers/``) and the planted models (``planted/``)."""
from .fingerprint import architecture_fingerprint, weights_fingerprint
from .families import family_of, supported_families
from .layout import TokenLayout
from .loading import create_timm_vit, read_state_dict
from .inputs.preprocessing import (EvalTransform, data_config, eval_transform, list_images, load_images, open_image,
                                   preprocessing)
from .planted import (PLANTED_NAME, PLANTED_PVT_NAME, PlantedPvtTruth, PlantedSwinTruth, PlantedTruth, planted_dinov3,
                      planted_pvt, planted_swin, planted_truth, planted_vit)
from .inputs.samples import sample_image_paths

__all__ = [
    "TokenLayout", "family_of", "supported_families", "create_timm_vit", "read_state_dict", "data_config", "list_images",
    "load_images", "open_image", "preprocessing", "EvalTransform", "eval_transform",
    "architecture_fingerprint", "weights_fingerprint", "PLANTED_NAME", "PlantedTruth", "planted_truth", "planted_vit",
    "planted_dinov3", "PLANTED_PVT_NAME", "PlantedPvtTruth", "planted_pvt", "PlantedSwinTruth", "planted_swin",
    "sample_image_paths",
]
