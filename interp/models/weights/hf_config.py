"""A Hugging Face ``transformers`` folder (``config.json`` + weights) described as the timm model that computes
the same thing, read without torch or ``transformers``.

``hf_spec(folder)`` reads ``config.json`` (the class in ``architectures``, depth, width, heads, patch, image size,
registers, layer-norm epsilon, activation), ``preprocessor_config.json`` (mean, std, resize, crop, resampling)
and ``id2label``, and returns an :class:`HFSpec`: the timm name and kwargs to build, the data config, the class
names. The weights are converted by :mod:`interp.models.weights.hf_weights`, loaded by :mod:`interp.models.weights.hf_folder`.
"""
from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Dict, List, Optional, Tuple

from ..._model_names import is_hf_folder, looks_like_hub_id  # noqa: F401 (this module's names too)
from ...errors import ModelLoadError, UnsupportedModelError

# transformers class -> (timm family word, prefix of its backbone keys in the file, its head)
HF_CLASSES: Dict[str, Tuple[str, str, str]] = {
    "ViTModel": ("vit", "", "none"),
    "ViTForImageClassification": ("vit", "vit.", "classifier"),
    "Dinov2Model": ("dinov2", "", "none"),
    "Dinov2WithRegistersModel": ("dinov2", "", "none"),
    "Dinov2ForImageClassification": ("dinov2", "dinov2.", "dinov2_linear"),
    "Dinov2WithRegistersForImageClassification": ("dinov2", "dinov2_with_registers.", "dinov2_linear"),
    "DINOv3ViTModel": ("dinov3", "", "none"),
    "CLIPVisionModel": ("clip", "vision_model.", "none"),
    "CLIPVisionModelWithProjection": ("clip", "vision_model.", "projection"),
    "CLIPForImageClassification": ("clip", "vision_model.", "classifier"),
    "SiglipVisionModel": ("siglip", "vision_model.", "none"),
    "SiglipForImageClassification": ("siglip", "vision_model.", "classifier"),
}
_BASE = dict(hidden_size=768, num_hidden_layers=12, num_attention_heads=12, image_size=224, num_channels=3)
# the defaults of each transformers config class (what a config.json written with only its differences omits),
# by the class's config model_type; tests/models/weights/test_hf_folders.py compares them with the installed transformers
HF_DEFAULTS: Dict[str, Dict[str, Any]] = {
    "vit": dict(_BASE, intermediate_size=3072, hidden_act="gelu", layer_norm_eps=1e-12, patch_size=16, qkv_bias=True),
    "dinov2": dict(_BASE, mlp_ratio=4, hidden_act="gelu", layer_norm_eps=1e-6, patch_size=14, qkv_bias=True,
                   layerscale_value=1.0, use_swiglu_ffn=False),
    "dinov2_with_registers": dict(_BASE, mlp_ratio=4, hidden_act="gelu", layer_norm_eps=1e-6, patch_size=16,
                                  qkv_bias=True, layerscale_value=1.0, use_swiglu_ffn=False, num_register_tokens=4),
    "dinov3_vit": dict(_BASE, hidden_size=384, num_attention_heads=6, intermediate_size=1536, hidden_act="gelu",
                       layer_norm_eps=1e-5, patch_size=16, layerscale_value=1.0, num_register_tokens=0,
                       rope_theta=100.0, query_bias=True, key_bias=False, value_bias=True, proj_bias=True,
                       mlp_bias=True, use_gated_mlp=False),
    "clip_vision_model": dict(_BASE, intermediate_size=3072, hidden_act="quick_gelu", layer_norm_eps=1e-5,
                              patch_size=32, projection_dim=512),
    "siglip_vision_model": dict(_BASE, intermediate_size=3072, hidden_act="gelu_pytorch_tanh", layer_norm_eps=1e-6,
                                patch_size=16, vision_use_head=True),
}
_MODEL_TYPE = {"ViTModel": "vit", "ViTForImageClassification": "vit", "Dinov2Model": "dinov2",
               "Dinov2ForImageClassification": "dinov2", "Dinov2WithRegistersModel": "dinov2_with_registers",
               "Dinov2WithRegistersForImageClassification": "dinov2_with_registers", "DINOv3ViTModel": "dinov3_vit",
               "CLIPVisionModel": "clip_vision_model", "CLIPVisionModelWithProjection": "clip_vision_model",
               "CLIPForImageClassification": "clip_vision_model", "SiglipVisionModel": "siglip_vision_model",
               "SiglipForImageClassification": "siglip_vision_model"}
# the timm architecture each family's kwargs start from
TIMM_BASE = {"vit": "vit_base_patch16_224", "dinov2": "vit_small_patch14_dinov2",
             "dinov2_reg": "vit_small_patch14_reg4_dinov2", "dinov3": "vit_small_patch16_dinov3",
             "clip": "vit_base_patch16_clip_224", "siglip": "vit_base_patch16_siglip_224"}
# transformers' hidden_act -> timm act_layer (every one of these is the same function in both)
ACTIVATIONS = {"gelu": "gelu", "gelu_pytorch_tanh": "gelu_tanh", "gelu_new": "gelu_tanh", "quick_gelu": "quick_gelu",
               "silu": "silu", "swish": "silu", "relu": "relu"}
WEIGHT_FILES = ("model.safetensors", "model.safetensors.index.json", "pytorch_model.bin",
                "pytorch_model.bin.index.json")
PIL_RESAMPLE = {0: "nearest", 1: "bicubic", 2: "bilinear", 3: "bicubic", "nearest": "nearest",
                "bilinear": "bilinear", "bicubic": "bicubic"}  # transformers' PILImageResampling 1 is LANCZOS
ADD_FAMILY = "interp.register_family (docs: Your own model)"


@dataclass
class HFSpec:
    """What a ``transformers`` folder is, as timm builds it.

    Attributes:
        architecture: the ``transformers`` class (``ViTModel`` ...); family: ``vit``, ``dinov2``, ``dinov3``,
            ``clip`` or ``siglip``; head: ``none``, ``classifier``, ``projection`` (timm's head computes them) or
            ``dinov2_linear`` (a linear map of [CLS, patch mean], which no timm head computes: the model is built
            without a head and the map is a classifier file, :func:`~interp.models.weights.hf_folder.hf_classifier`).
        timm_name, kwargs: the timm architecture and the ``timm.create_model`` kwargs that shape it; ``norm_eps``
            and ``act`` are given separately (the loader turns them into ``norm_layer``/``act_layer``).
        config: the vision part of ``config.json``; prefix: the backbone keys' prefix in the weight file.
        data: timm data-config entries from ``preprocessor_config.json`` (empty when the folder has none).
        label_names: ``id2label`` in class order for a classification head (``dinov2_linear`` too), else empty.
    """

    folder: Path
    architecture: str
    family: str
    head: str
    prefix: str
    config: Dict[str, Any]
    timm_name: str
    kwargs: Dict[str, Any]
    norm_eps: float
    act: str
    data: Dict[str, Any] = field(default_factory=dict)
    label_names: List[str] = field(default_factory=list)

    @property
    def n_registers(self) -> int:
        return int(self.config.get("num_register_tokens", 0) or 0)

    @property
    def pos_resample(self) -> Optional[str]:
        """How the class's ``interpolate_pos_encoding`` resamples its position table to another input size
        (:mod:`interp.models.weights.pos_table`): ``"dinov2_reg"`` (antialiased) for ``Dinov2WithRegisters``,
        ``"transformers"`` (not antialiased) for the others; None for DINOv3, which has no table (RoPE)."""
        if self.family == "dinov3":
            return None
        return "dinov2_reg" if self.family == "dinov2" and self.n_registers else "transformers"


def _read_json(path: Path, what: str) -> dict:
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError) as e:
        raise ModelLoadError(f"cannot read {what} {str(path)!r}: {e}") from None
    if not isinstance(data, dict):
        raise ModelLoadError(f"{what} {str(path)!r} does not hold a JSON object")
    return data


def weight_file(folder: Path) -> Path:
    """The folder's weight file (safetensors first, a shard index where the weights are sharded)."""
    for name in WEIGHT_FILES:
        if (folder / name).is_file():
            return folder / name
    raise ModelLoadError(f"{str(folder)!r} holds a config.json but no weights ({', '.join(WEIGHT_FILES[::2])}): "
                         "save the model with save_pretrained")


def architecture_of(config: dict, folder: Path) -> str:
    """The ``transformers`` class of a folder's config, refused in one line when interp does not convert it."""
    archs = config.get("architectures") or []
    arch = archs[0] if archs else None
    if arch in HF_CLASSES:
        return arch
    supported = ", ".join(HF_CLASSES)
    what = f"a {arch}" if arch else f"a model_type {config.get('model_type')!r} without 'architectures'"
    raise UnsupportedModelError(f"{str(folder)!r} is {what}, which interp does not convert; supported transformers "
                                f"classes: {supported}. Another class: convert it to a timm model and add its "
                                f"family with {ADD_FAMILY}")


def _pair(value, what: str) -> int:
    if isinstance(value, (list, tuple)):
        if len(set(value)) != 1:
            raise ModelLoadError(f"config.json {what} {value}: interp builds square {what}s only")
        value = value[0]
    return int(value)


def _kwargs(family: str, c: dict, head: str, n_classes: int) -> Dict[str, Any]:
    """The timm kwargs of a family's config ``c`` (the vision config)."""
    width, heads = int(c["hidden_size"]), int(c["num_attention_heads"])
    if width % heads:
        raise ModelLoadError(f"config.json hidden_size {width} is not a multiple of num_attention_heads {heads}")
    k: Dict[str, Any] = dict(embed_dim=width, depth=int(c["num_hidden_layers"]), num_heads=heads,
                             patch_size=_pair(c["patch_size"], "patch_size"),
                             img_size=_pair(c["image_size"], "image_size"), in_chans=int(c["num_channels"]),
                             num_classes=n_classes)
    if family == "dinov2":
        k["mlp_ratio"] = float(c["mlp_ratio"])
        k["init_values"] = float(c["layerscale_value"])
        k["qkv_bias"] = bool(c["qkv_bias"])
        if int(c.get("num_register_tokens", 0) or 0):
            k["reg_tokens"] = int(c["num_register_tokens"])
        if c.get("use_swiglu_ffn"):  # transformers' hidden width: 2/3 of mlp_ratio's, rounded up to 8
            hidden = (int(int(width * k["mlp_ratio"]) * 2 / 3) + 7) // 8 * 8
            k["mlp_ratio"] = 2 * hidden / width  # timm's packed SwiGLU counts both halves
    elif family == "dinov3":
        k.update(mlp_ratio=int(c["intermediate_size"]) / width, num_reg_tokens=int(c["num_register_tokens"]),
                 init_values=float(c["layerscale_value"]), rope_temperature=float(c["rope_theta"]),
                 swiglu_mlp=bool(c["use_gated_mlp"]), qkv_bias=True)
    else:
        k["mlp_ratio"] = int(c["intermediate_size"]) / width
        if family == "vit":
            k["qkv_bias"] = bool(c["qkv_bias"])
        if family in ("clip", "siglip"):
            k["global_pool"] = "token" if family == "clip" else ("map" if c["vision_use_head"] else "avg")
            if k["global_pool"] == "avg":  # the last hidden state is normed before any pooling, as timm's norm
                k["fc_norm"] = False
            if head == "classifier":  # transformers averages the last hidden state (CLIP: the patch tokens)
                k.update(global_pool="avg", fc_norm=False)
                if family == "clip":
                    k["final_norm"] = False  # CLIPForImageClassification averages before post_layernorm
    return k


def _data_config(folder: Path, img_size: int) -> Dict[str, Any]:
    """timm data-config entries of the folder's ``preprocessor_config.json`` (empty without one)."""
    path = folder / "preprocessor_config.json"
    if not path.is_file():
        return {}
    p = _read_json(path, "preprocessor config")
    data: Dict[str, Any] = {"input_size": (3, img_size, img_size)}
    if p.get("do_normalize", True):
        if "image_mean" in p:
            data["mean"] = tuple(float(v) for v in p["image_mean"])
        if "image_std" in p:
            data["std"] = tuple(float(v) for v in p["image_std"])
    else:
        data.update(mean=(0.0, 0.0, 0.0), std=(1.0, 1.0, 1.0))
    data["interpolation"] = PIL_RESAMPLE.get(p.get("resample", 3), "bicubic")
    size = p.get("size") or {}
    size = {"shortest_edge": size} if isinstance(size, int) else size
    crop = p.get("crop_size") or {}
    crop = {"height": crop, "width": crop} if isinstance(crop, int) else crop
    if "shortest_edge" in size and p.get("do_center_crop", bool(crop)) and crop:
        data.update(crop_pct=int(crop["height"]) / int(size["shortest_edge"]), crop_mode="center")
    elif "shortest_edge" in size:
        data.update(crop_pct=1.0, crop_mode="center")
    else:  # resize to (height, width): the whole image, no crop
        data.update(crop_pct=1.0, crop_mode="squash")
    return data


def hf_spec(folder) -> HFSpec:
    """The :class:`HFSpec` of a ``transformers`` folder (``config.json``, ``preprocessor_config.json``).

    Raises:
        UnsupportedModelError: a class interp does not convert (the supported ones named).
        ModelLoadError: an unreadable config, or one describing what timm's family cannot build.
    """
    folder = Path(folder)
    top = _read_json(folder / "config.json", "config")
    arch = architecture_of(top, folder)
    family, prefix, head = HF_CLASSES[arch]
    vision = top.get("vision_config") if isinstance(top.get("vision_config"), dict) else top
    vision = {**HF_DEFAULTS[_MODEL_TYPE[arch]], **vision}
    labels = top.get("id2label") or {}
    n_labels = int(top.get("num_labels") or len(labels) or 2)  # transformers' default: 2 labels
    n_classes = {"classifier": n_labels, "dinov2_linear": 0, "none": 0}.get(head) if head != "projection" else int(
        vision.get("projection_dim", top.get("projection_dim", 512)))
    try:
        kwargs = _kwargs(family, vision, head, n_classes)
    except KeyError as e:
        raise ModelLoadError(f"config.json of {str(folder)!r} has no {e.args[0]!r} for its {arch}") from None
    act = str(vision["hidden_act"])
    if act not in ACTIVATIONS:
        raise ModelLoadError(f"config.json of {str(folder)!r}: hidden_act {act!r} has no timm equivalent "
                             f"(known: {', '.join(ACTIVATIONS)})")
    if family == "dinov2" and vision.get("use_swiglu_ffn"):
        act = "silu"
    base = "dinov2_reg" if family == "dinov2" and kwargs.get("reg_tokens") else family
    names = ([str(labels.get(str(i), labels.get(i, i))) for i in range(n_labels)]
             if head in ("classifier", "dinov2_linear") else [])
    return HFSpec(folder=folder, architecture=arch, family=family, head=head, prefix=prefix, config=vision,
                  timm_name=TIMM_BASE[base], kwargs=kwargs,
                  norm_eps=float(vision["layer_norm_eps"]),
                  act=ACTIVATIONS[act], data=_data_config(folder, kwargs["img_size"]), label_names=names)
