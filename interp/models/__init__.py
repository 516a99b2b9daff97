"""Getting a timm ViT: by name, local weights or module; its preprocessing and token layout."""
from .fingerprint import architecture_fingerprint, weights_fingerprint
from .layout import TokenLayout, read_layout
from .loading import create_timm_vit, read_state_dict
from .preprocessing import EvalTransform, data_config, eval_transform, list_images, load_images, open_image, preprocessing
from .planted import PLANTED_NAME, PlantedTruth, planted_truth, planted_vit
from .samples import sample_image_paths
from .support import SUPPORTED_FAMILIES, check_supported

__all__ = [
    "TokenLayout", "read_layout", "create_timm_vit", "read_state_dict", "data_config", "list_images",
    "load_images", "open_image", "preprocessing", "EvalTransform", "eval_transform", "SUPPORTED_FAMILIES", "check_supported",
    "architecture_fingerprint", "weights_fingerprint", "PLANTED_NAME", "PlantedTruth", "planted_truth", "planted_vit",
    "sample_image_paths",
]
