"""Published settings as presets: a preset fills study defaults, explicit arguments win.

Sources (numbers checked against the files; differences noted per preset):

* Jiang et al., repo ``nickjiang2378/test-time-registers``, ``configs/*.yaml`` (commit 70e7cdb1 for
  ``openclip_base``/``openai_clip_base``/``dinov2_large``, 79b1d405 for ``openclip_large``), and
  ``register_neurons.ipynb``, which calls ``find_register_neurons(..., apply_sparsity_filter=True)`` on 100
  random images and keeps ``filter_layers(highest_layer)[:top_k]``.
* Darcet et al. (ICLR 2024): output patch tokens of the last block, cut-off 150 (DINOv2 ViT-g).
* The reassessment (Baxevanakis et al., 2026): per-model 98th percentile, norms before the final LayerNorm.

``detect_layer`` counts blocks (negative: from the end) and always means that block's un-normalised output
(``hook_resid_post``, before the final norm). ``highest_layer`` None = no upper limit.

>>> r = resolve_preset("jiang-openclip-b16", top_k=20, threshold=None)   # None = not given
>>> r["threshold"], r["detect_layer"], r["highest_layer"], r["top_k"], r["preset"]
(30.0, -1, 5, 20, 'jiang-openclip-b16')
"""
from __future__ import annotations

from typing import Any, Dict, Optional

from ..errors import InterpError

_JIANG = {"positions": "all", "sparsity": "per_image"}

PRESETS: Dict[str, Dict[str, Any]] = {
    # configs/openclip_base.yaml (ViT-B-16 laion2b_s34b_b88k): detect -1, threshold 30, highest 5, top_k 10.
    "jiang-openclip-b16": {**_JIANG, "threshold": 30.0, "detect_layer": -1, "highest_layer": 5, "top_k": 10},
    # configs/openai_clip_base.yaml (ViT-B-16 openai): the same four numbers.
    "jiang-openai-clip-b16": {**_JIANG, "threshold": 30.0, "detect_layer": -1, "highest_layer": 5, "top_k": 10},
    # configs/dinov2_large.yaml (vitl14): detect -2, threshold 150, highest 17, top_k 50.
    "jiang-dinov2-l14": {**_JIANG, "threshold": 150.0, "detect_layer": -2, "highest_layer": 17, "top_k": 50},
    # configs/openclip_large.yaml (ViT-L-14 laion2b_s32b_b82k): detect -2, threshold 150, highest 14; the
    # config gives no top_k (the study's own default applies).
    "jiang-openclip-l14": {**_JIANG, "threshold": 150.0, "detect_layer": -2, "highest_layer": 14},
    # Darcet et al.: output tokens of the last block, fixed cut-off 150.
    "darcet": {"threshold": 150.0, "detect_layer": -1},
    # Reassessment: the model's own 98th percentile, last block output before the final norm.
    "reassessment": {"threshold": "p98", "detect_layer": -1},
}

ALIASES = {"openclip-b16": "jiang-openclip-b16", "openai-clip-b16": "jiang-openai-clip-b16",
           "dinov2-l14": "jiang-dinov2-l14", "openclip-l14": "jiang-openclip-l14"}


# Jiang et al.'s loader builds every CLIP with QuickGELU (open_clip's force_quick_gelu), laion2b weights included,
# so their numbers are those of the QuickGELU architecture: preset -> (timm model that runs it, its weights).
CLIP_PRESETS = {
    "jiang-openclip-b16": ("vit_base_patch16_clip_quickgelu_224", "the laion2b weights (open_clip ViT-B-16 "
                           "laion2b_s34b_b88k, weights=FILE; CLI --weights FILE)"),
    "jiang-openai-clip-b16": ("vit_base_patch16_clip_quickgelu_224", "the OpenAI weights "
                              "(vit_base_patch16_clip_quickgelu_224.openai, or weights=FILE)"),
    "jiang-openclip-l14": ("vit_large_patch14_clip_quickgelu_224", "the laion2b weights (open_clip ViT-L-14 "
                           "laion2b_s32b_b82k, weights=FILE; CLI --weights FILE)"),
}


def check_preset_model(name: Optional[str], model) -> None:
    """Refuse a model a CLIP preset's numbers were not measured on, in one line naming the model to use.

    Under ``jiang-openclip-b16``, ``jiang-openai-clip-b16`` and ``jiang-openclip-l14`` the model must be a CLIP image
    tower (a LayerNorm before the blocks) whose MLPs compute QuickGELU; both are read from the modules, not the
    name. ``model``: a HookedViT or timm ViT; None (a cache source, no module to read) is not checked. Other
    presets take any model.
    """
    from ..models.families.traits import is_clip_tower, mlp_activation

    if name is None or model is None:
        return
    key = _canonical(name)
    if key not in CLIP_PRESETS:
        return
    fit, weights = CLIP_PRESETS[key]
    module = getattr(model, "timm_model", model)
    shown = getattr(model, "model_name", None) or type(module).__name__
    if not is_clip_tower(module):
        raise InterpError(f"preset {key} holds Jiang et al.'s numbers for a CLIP image tower, and {shown} is not "
                          f"one (no LayerNorm before the blocks): load {fit} with {weights}, or drop the preset "
                          "and give --threshold/--detect-layer for this model")
    act = mlp_activation(module)
    if act != "quick_gelu":
        raise InterpError(f"preset {key} runs CLIP with QuickGELU MLPs, as Jiang et al.'s loader does, but "
                          f"{shown}'s MLP activation is {act}: load {fit} with {weights}")


def preset_names() -> list:
    """Names accepted by :func:`resolve_preset` (aliases excluded)."""
    return sorted(PRESETS)


def _canonical(name: str) -> str:
    key = str(name).strip().lower().replace("_", "-")
    key = ALIASES.get(key, key)
    if key not in PRESETS:
        raise InterpError(f"unknown preset {name!r}; choose one of {', '.join(preset_names())}")
    return key


def resolve_preset(name: Optional[str], **explicit: Any) -> Dict[str, Any]:
    """The preset's values overridden by every explicit argument that is not None.

    Args:
        name: a preset name (``_`` and ``-`` are interchangeable, case ignored), or None for no preset.
        explicit: the caller's arguments (None = not given).

    Returns:
        The resolved values (for the result JSON), with ``"preset"`` = the canonical name (or None). Keys the
        preset does not set and the caller left None are absent.
    """
    resolved: Dict[str, Any] = {}
    canonical = None
    if name is not None:
        canonical = _canonical(name)
        resolved.update(PRESETS[canonical])
    resolved.update({k: v for k, v in explicit.items() if v is not None})
    resolved["preset"] = canonical
    return resolved

