"""A ``transformers`` state dict (the names ``save_pretrained`` writes) converted to the timm keys of the model
:mod:`interp.models.weights.hf_config` describes, every tensor accounted for.

Each family's renames are a table; q, k, v (separate in ``transformers``) are concatenated into timm's ``qkv``
in that order. What timm computes differently is folded into the weights where that is exact arithmetic
(DINOv2 with registers: the class token's position added to the class token, as timm's ``no_embed_class``
layout adds it at run time) and refused otherwise. Tensors a class saves that its forward does not read for the
outputs timm computes (ViT's tanh pooler, the masked-image ``mask_token``, the attention-pooling head of a SigLIP
classifier, the post-norm CLIP's classifier skips) are listed as dropped, and bias vectors the file lacks where
timm has one (CLIP's projection) are zeros; both are said in the load's note. Any other key, or a key timm expects
and the file lacks, is an error naming it.
"""
from __future__ import annotations

import re
from typing import Dict, List, Tuple

import torch

from ...errors import ModelLoadError
from .hf_config import HFSpec

_VIT_BLOCK = {"layernorm_before": "norm1", "layernorm_after": "norm2", "norm1": "norm1", "norm2": "norm2",
              "attention.output.dense": "attn.proj", "intermediate.dense": "mlp.fc1", "output.dense": "mlp.fc2",
              "mlp.fc1": "mlp.fc1", "mlp.fc2": "mlp.fc2", "mlp.weights_in": "mlp.fc1", "mlp.weights_out": "mlp.fc2",
              "layer_scale1": "ls1", "layer_scale2": "ls2"}
_VIT_QKV = {"attention.attention.query": "q", "attention.attention.key": "k", "attention.attention.value": "v"}
_CLIP_BLOCK = {"layer_norm1": "norm1", "layer_norm2": "norm2", "self_attn.out_proj": "attn.proj",
               "mlp.fc1": "mlp.fc1", "mlp.fc2": "mlp.fc2"}
_CLIP_QKV = {"self_attn.q_proj": "q", "self_attn.k_proj": "k", "self_attn.v_proj": "v"}
_DINOV3_BLOCK = {"norm1": "norm1", "norm2": "norm2", "attention.o_proj": "attn.proj", "layer_scale1": "gamma_1",
                 "layer_scale2": "gamma_2", "mlp.up_proj": "mlp.fc1", "mlp.down_proj": "mlp.fc2"}
_DINOV3_QKV = {"attention.q_proj": "q", "attention.k_proj": "k", "attention.v_proj": "v"}
_ROOTS = {
    "vit": {"embeddings.cls_token": "cls_token", "embeddings.position_embeddings": "pos_embed",
            "embeddings.patch_embeddings.projection.weight": "patch_embed.proj.weight",
            "embeddings.patch_embeddings.projection.bias": "patch_embed.proj.bias", "embeddings.register_tokens":
            "reg_token", "layernorm.weight": "norm.weight", "layernorm.bias": "norm.bias"},
    "clip": {"embeddings.class_embedding": "cls_token", "embeddings.position_embedding.weight": "pos_embed",
             "embeddings.patch_embedding.weight": "patch_embed.proj.weight", "embeddings.patch_embedding.bias":
             "patch_embed.proj.bias", "pre_layrnorm.weight": "norm_pre.weight", "pre_layrnorm.bias": "norm_pre.bias",
             "post_layernorm.weight": "norm.weight", "post_layernorm.bias": "norm.bias",
             "head.probe": "attn_pool.latent", "head.attention.out_proj.weight": "attn_pool.proj.weight",
             "head.attention.out_proj.bias": "attn_pool.proj.bias", "head.layernorm.weight": "attn_pool.norm.weight",
             "head.layernorm.bias": "attn_pool.norm.bias", "head.mlp.fc1.weight": "attn_pool.mlp.fc1.weight",
             "head.mlp.fc1.bias": "attn_pool.mlp.fc1.bias", "head.mlp.fc2.weight": "attn_pool.mlp.fc2.weight",
             "head.mlp.fc2.bias": "attn_pool.mlp.fc2.bias"},
    "dinov3": {"embeddings.cls_token": "cls_token", "embeddings.register_tokens": "reg_token",
               "embeddings.patch_embeddings.weight": "patch_embed.proj.weight",
               "embeddings.patch_embeddings.bias": "patch_embed.proj.bias", "norm.weight": "norm.weight",
               "norm.bias": "norm.bias"},
}
_BLOCK_RE = {"vit": re.compile(r"encoder\.layer\.(\d+)\.(.+)\.(weight|bias|lambda1)$"),
             "clip": re.compile(r"encoder\.layers\.(\d+)\.(.+)\.(weight|bias)$"),
             "dinov3": re.compile(r"(?:model\.)?layer\.(\d+)\.(.+)\.(weight|bias|lambda1)$")}
_TABLES = {"vit": (_VIT_BLOCK, _VIT_QKV), "clip": (_CLIP_BLOCK, _CLIP_QKV), "dinov3": (_DINOV3_BLOCK, _DINOV3_QKV)}


def _key(block, *parts: str) -> str:
    """timm's state-dict key of block ``block`` (a parameter's name, not a hook name)."""
    return ".".join(("blocks", str(block)) + parts)


def _layout(spec: HFSpec) -> str:
    return {"vit": "vit", "dinov2": "vit", "clip": "clip", "siglip": "clip", "dinov3": "dinov3"}[spec.family]


def _dropped(spec: HFSpec, key: str) -> bool:
    """Keys the class saves that its outputs interp reproduces do not read."""
    if key in ("embeddings.mask_token", "embeddings.position_ids") or key.startswith("pooler."):
        return True
    if spec.family == "dinov3" and key == "embeddings.register_tokens" and not spec.n_registers:
        return True  # the empty [1, 0, d] tensor of a DINOv3 without registers
    if spec.family == "siglip" and spec.head == "classifier" and key.startswith("head."):
        return True  # SiglipForImageClassification averages the tokens; its attention-pooling head is unused
    return spec.family == "clip" and spec.head == "classifier" and key.startswith("post_layernorm.")


def split_backbone(spec: HFSpec, state_dict: Dict[str, torch.Tensor]) -> Tuple[dict, dict]:
    """(backbone keys without the class's prefix, head keys) of the file's state dict."""
    backbone, head = {}, {}
    prefix = spec.prefix if any(k.startswith(spec.prefix) for k in state_dict) else ""  # CLIPVisionModel: none
    for key, value in state_dict.items():
        if key in ("classifier.weight", "classifier.bias", "visual_projection.weight"):
            head[key] = value
        elif key.startswith(prefix):
            backbone[key[len(prefix):]] = value
        else:
            head[key] = value  # reported as unknown below
    return backbone, head


def convert_hf_state_dict(spec: HFSpec, state_dict: Dict[str, torch.Tensor], expected: Dict[str, torch.Tensor],
                          label: str) -> Tuple[Dict[str, torch.Tensor], List[str], List[str]]:
    """timm keys for the file's ``state_dict``, the file's keys left out (not read by the outputs) and the timm
    biases filled with zeros (the file has none): for the load's note.

    Args:
        expected: the timm model's state dict (the keys and shapes to fill).

    Raises:
        ModelLoadError: a key that maps to nothing, a timm key the file lacks, a shape that differs, or a value
            timm's family cannot hold (a non-zero DINOv3 key bias), each named.
    """
    kind = _layout(spec)
    block_table, qkv_table = _TABLES[kind]
    backbone, head = split_backbone(spec, state_dict)
    out: Dict[str, torch.Tensor] = {}
    qkv: Dict[Tuple[int, str], Dict[str, torch.Tensor]] = {}
    dropped, unknown = [], []
    for key, value in backbone.items():
        m = _BLOCK_RE[kind].match(key)
        if _dropped(spec, key):
            dropped.append(spec.prefix + key)
        elif m and m.group(2) in qkv_table:
            qkv.setdefault((int(m.group(1)), m.group(3)), {})[qkv_table[m.group(2)]] = value
        elif m and m.group(2) in block_table:
            leaf = "gamma" if m.group(3) == "lambda1" and kind == "vit" else m.group(3)
            target = _key(m.group(1), block_table[m.group(2)])
            out[target if kind == "dinov3" and m.group(3) == "lambda1" else f"{target}.{leaf}"] = value
        elif m and kind == "dinov3" and m.group(2) == "mlp.gate_proj":
            out[_key(m.group(1), "mlp.gate", m.group(3))] = value  # packed with up_proj below
        elif key in _ROOTS[kind]:
            out[_ROOTS[kind][key]] = value
        elif key == "head.attention.in_proj_weight" or key == "head.attention.in_proj_bias":
            leaf = key.rsplit("_", 1)[1]
            width = value.shape[0] // 3
            out[f"attn_pool.q.{leaf}"], out[f"attn_pool.kv.{leaf}"] = value[:width], value[width:]
        else:
            unknown.append(spec.prefix + key)
    for key, value in head.items():
        if spec.head == "dinov2_linear" and key.startswith("classifier."):
            continue  # a classifier file, not timm's head (hf_folder.hf_classifier)
        if key.startswith(("classifier.", "visual_projection.")):
            out["head." + key.rsplit(".", 1)[1]] = value
        else:
            unknown.append(key)
    if unknown:
        raise ModelLoadError(f"{label} is a {spec.architecture} with keys interp cannot place in timm's "
                             f"{spec.timm_name}: {', '.join(unknown[:3])}" + (f" and {len(unknown) - 3} more"
                                                                            if len(unknown) > 3 else ""))
    _join_qkv(spec, qkv, out, label)
    _fold_family(spec, out)
    filled = _fill_zero_biases(spec, out, expected)
    _check_keys(spec, out, expected, label)
    return out, dropped, filled


def _join_qkv(spec: HFSpec, qkv: dict, out: dict, label: str) -> None:
    for (i, leaf), parts in sorted(qkv.items()):
        if spec.family == "dinov3" and leaf == "bias":  # Eva keeps q and v biases; its key bias is a zero buffer
            k = parts.pop("k", None)
            if k is not None and bool(k.any()):
                raise ModelLoadError(f"{label}: layer.{i}.attention.k_proj.bias is not zero, and timm's Eva has no "
                                     "key bias (it would only change hook_k: softmax ignores it)")
            for name, value in parts.items():
                out[_key(i, f"attn.{name}_bias")] = value
            continue
        if set(parts) != {"q", "k", "v"}:
            missing = sorted({"q", "k", "v"} - set(parts))
            raise ModelLoadError(f"{label}: block {i} has no {'/'.join(missing)} {leaf} while it has the others")
        out[_key(i, "attn.qkv", leaf)] = torch.cat([parts["q"], parts["k"], parts["v"]], dim=0)


def _fold_family(spec: HFSpec, out: dict) -> None:
    """The family's exact rewrites: CLIP's class embedding [d] and position table [t, d] as timm's [1, ., d]; a
    DINOv2 with registers' class position folded into the class token (timm's ``no_embed_class`` layout); DINOv3's
    gated MLP packed [gate; up] as timm's ``GluMlp``."""
    if "cls_token" in out and out["cls_token"].dim() == 1:
        out["cls_token"] = out["cls_token"].reshape(1, 1, -1)
    if "pos_embed" in out and out["pos_embed"].dim() == 2:
        out["pos_embed"] = out["pos_embed"].unsqueeze(0)
    if spec.family == "dinov2" and spec.n_registers and "pos_embed" in out:
        pos = out["pos_embed"]
        out["cls_token"] = out["cls_token"] + pos[:, :1]
        out["pos_embed"] = pos[:, 1:]
    for key in [k for k in out if ".mlp.gate." in k]:
        gate, up = out.pop(key), key.replace(".mlp.gate.", ".mlp.fc1.")
        if up in out:
            out[up] = torch.cat([gate, out[up]], dim=0)


def _bias_free(spec: HFSpec, key: str) -> bool:
    """Whether the class has no bias at timm key ``key`` by construction (its config says so), so zeros are its
    arithmetic: CLIP's bias-free projection, DINOv3's ``query_bias``/``value_bias``/``proj_bias``/``mlp_bias``."""
    if spec.head == "projection" and key == "head.bias":
        return True
    if spec.family != "dinov3":
        return False
    c = spec.config
    flags = {".attn.q_bias": "query_bias", ".attn.v_bias": "value_bias", ".attn.proj.bias": "proj_bias",
             ".mlp.fc1.bias": "mlp_bias", ".mlp.fc2.bias": "mlp_bias"}
    return any(key.endswith(end) and not c.get(flag, True) for end, flag in flags.items())


def _fill_zero_biases(spec: HFSpec, out: dict, expected: dict) -> List[str]:
    """Zeros for the biases timm's model has where the class has none (:func:`_bias_free`)."""
    filled = []
    for key, target in expected.items():
        if key not in out and _bias_free(spec, key):
            out[key] = torch.zeros(target.shape, dtype=target.dtype if target.is_floating_point() else torch.float32)
            filled.append(key)
    return filled


def _check_keys(spec: HFSpec, out: dict, expected: dict, label: str) -> None:
    missing = [k for k in expected if k not in out]
    extra = [k for k in out if k not in expected]
    if missing or extra:
        what = (f"lacks {', '.join(missing[:3])}" if missing else "") + (" and " if missing and extra else "") + (
            f"holds {', '.join(extra[:3])} which timm's model has no place for" if extra else "")
        raise ModelLoadError(f"{label} (a {spec.architecture}) {what}: its config.json does not describe its "
                             "weights")
    for key, value in out.items():
        if tuple(value.shape) != tuple(expected[key].shape):
            raise ModelLoadError(f"{label}: {key} is {list(value.shape)} in the file but {list(expected[key].shape)} "
                                 "in the model its config.json describes")
