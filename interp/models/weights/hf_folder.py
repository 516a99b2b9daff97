"""Load a Hugging Face ``transformers`` folder (or a hub id in the local cache) as the timm model that computes the
same thing: ``interp.load("path/to/folder")``, ``--weights path/to/folder``.

The folder's ``config.json`` decides the architecture (:mod:`interp.models.weights.hf_config`), its weights are renamed to
timm's keys with every tensor accounted for (:mod:`interp.models.weights.hf_weights`) and loaded strictly, its
``preprocessor_config.json`` becomes the model's data config and ``id2label`` its head's ``label_names``. One
warning line says what was read and what the file held that the outputs do not read. ``transformers`` itself is
never imported: the files are read directly.
"""
from __future__ import annotations

import json
import warnings
from functools import partial
from pathlib import Path
from typing import Any, Dict, Optional, Tuple, Union

import torch
from torch import nn

from ...errors import InterpWarning, ModelLoadError
from .hf_config import HFSpec, hf_spec, is_hf_folder, looks_like_hub_id, weight_file
from .hf_weights import convert_hf_state_dict
from .pos_table import POS_RESAMPLE_CHOICES, resample_pos_table
from ..families.positions import positions_of
from ..loading import _hub_reachable, _resolve_dtype, build_architecture, check_finite, read_state_dict

HUB_FILES = ("config.json", "preprocessor_config.json", "model.safetensors", "model.safetensors.index.json",
             "pytorch_model.bin", "pytorch_model.bin.index.json")


def resolve_hf_source(name: Union[str, Path]) -> Optional[Path]:
    """The local folder of ``name`` when it is a ``transformers`` folder or a hub id (``org/name``): the id's
    snapshot in the local Hugging Face cache, downloaded when the hub is reachable; None when ``name`` is
    neither (a timm name). Fails in one line, before anything is built, for an id offline and not cached."""
    if is_hf_folder(name):
        return Path(name)
    if not isinstance(name, str) or not looks_like_hub_id(name):
        return None
    try:
        from huggingface_hub import snapshot_download, try_to_load_from_cache
    except ImportError:
        raise ModelLoadError(f"{name!r} looks like a Hugging Face hub id, and huggingface_hub is not installed: "
                             "pip install huggingface_hub, or pass a local transformers folder") from None
    cached = try_to_load_from_cache(name, "config.json")
    if isinstance(cached, str):
        return Path(cached).parent
    if not _hub_reachable():
        raise ModelLoadError(f"{name!r}: no local copy of this hub id and the Hugging Face hub is unreachable; "
                             "download it where there is a network (huggingface-cli download "
                             f"{name}) or pass its saved folder")
    try:
        return Path(snapshot_download(name, allow_patterns=list(HUB_FILES)))
    except Exception as e:
        raise ModelLoadError(f"cannot download {name!r} from the Hugging Face hub: {type(e).__name__}: "
                             f"{str(e).splitlines()[0] if str(e).strip() else 'no detail'}") from None


def check_weights_name(name: str, folder: Path) -> None:
    """``--weights FOLDER`` with a MODEL name: the name must build the folder's timm family (its config.json, not
    the name, decides the sizes)."""
    from timm.models import is_model, model_entrypoint

    spec = hf_spec(folder)
    base = str(name).split(".")[0]
    if is_hf_folder(name) or str(name) == str(folder):
        return
    want = model_entrypoint(spec.timm_name).__module__
    if not is_model(base) or model_entrypoint(base).__module__ != want:
        raise ModelLoadError(f"--weights {str(folder)!r} is a transformers {spec.architecture}, a timm "
                             f"{want.rsplit('.', 1)[-1]} model like {spec.timm_name}, not {name!r}: pass the folder "
                             "as MODEL (interp.load(folder))")


def timm_args(spec: HFSpec) -> Tuple[str, Dict[str, Any]]:
    """(timm name, ``timm.create_model`` kwargs) of a folder: the spec's kwargs with its layer-norm epsilon and
    activation as timm's ``norm_layer``/``act_layer``.

    Raises:
        ModelLoadError: an activation timm's Eva (DINOv3) does not offer (GELU, or SiLU in the gated MLP).
    """
    kwargs = dict(spec.kwargs, norm_layer=partial(nn.LayerNorm, eps=spec.norm_eps))
    if spec.family == "dinov3":
        want = "silu" if kwargs["swiglu_mlp"] else "gelu"
        if spec.act != want:
            raise ModelLoadError(f"{str(spec.folder)!r}: a DINOv3 {'gated ' if want == 'silu' else ''}MLP with "
                                 f"hidden_act {spec.config.get('hidden_act')!r}; timm's Eva computes {want} there")
        return spec.timm_name, kwargs
    kwargs["act_layer"] = spec.act
    if spec.family == "dinov2" and spec.config.get("use_swiglu_ffn"):
        from timm.layers import SwiGLUPacked

        kwargs["mlp_layer"] = SwiGLUPacked
    return spec.timm_name, kwargs


def read_folder_weights(folder: Path) -> Tuple[Dict[str, torch.Tensor], str]:
    """The folder's state dict (one file, or every shard a ``*.index.json`` names) and its label."""
    path = weight_file(folder)
    if not path.name.endswith(".index.json"):
        return read_state_dict(path), f"{folder.name}/{path.name}"
    try:
        shards = sorted(set(json.loads(path.read_text())["weight_map"].values()))
    except (OSError, ValueError, KeyError, AttributeError) as e:
        raise ModelLoadError(f"cannot read the shard index {str(path)!r}: {e}") from None
    state_dict: Dict[str, torch.Tensor] = {}
    for shard in shards:
        state_dict.update(read_state_dict(folder / shard))
    return state_dict, f"{folder.name}/{path.name}"


def hf_classifier(folder: Union[str, Path]) -> Dict[str, Any]:
    """The classifier file (:mod:`interp.models.classifiers.classifier`, kind ``dinov2_linear``) of a
    ``Dinov2ForImageClassification`` or ``Dinov2WithRegistersForImageClassification`` folder: its ``classifier``
    [C, 2d] reads the last block's normed CLS and the mean of its normed patch tokens (registers left out),
    concatenated, as DINOv2's released linear heads do with ``n_blocks=1, avgpool=True``; the class names are its
    ``id2label``. ``interp.load(folder)`` is the backbone this classifier binds to.

    Raises:
        ModelLoadError: another class (its head is the model's own), or a file without ``classifier.weight``.
    """
    folder = Path(folder)
    spec = hf_spec(folder)
    if spec.head != "dinov2_linear":
        raise ModelLoadError(f"{str(folder)!r} is a transformers {spec.architecture}: its head (if any) is the "
                             "model's own (interp.load(folder)); a classifier file is read from a "
                             "Dinov2(WithRegisters)ForImageClassification folder")
    state_dict, label = read_folder_weights(folder)
    weight, bias = state_dict.get("classifier.weight"), state_dict.get("classifier.bias")
    if weight is None or bias is None:
        raise ModelLoadError(f"{label} (a {spec.architecture}) holds no classifier.weight and classifier.bias: "
                             "save the model with save_pretrained")
    return {"interp_classifier": 1, "kind": "dinov2_linear", "weight": weight, "bias": bias, "n_blocks": 1,
            "avgpool": True, "class_names": list(spec.label_names),
            "source": f"transformers {spec.architecture} ({folder.name})"}


RESAMPLE_WORDS = {"transformers": "bicubic, not antialiased, as transformers", "dinov2_reg": "bicubic, antialiased, as "
                  "transformers' Dinov2WithRegisters", "timm": "timm's bicubic, antialiased",
                  "dinov2": "DINOv2's bicubic with the 0.1 offset"}


def describe(spec: HFSpec, name: str, size: Tuple[int, int], method: Optional[str]) -> str:
    k = spec.kwargs
    own = (k["img_size"], k["img_size"])
    shown = f"{size[0]} px" if size[0] == size[1] else f"{size[0]}x{size[1]} px"
    if size != own:
        shown += f" (config.json: {own[0]} px" + (f"; position table resampled {RESAMPLE_WORDS[method]})" if method
                                                  else ")")
    parts = [f"{k['depth']} blocks", f"width {k['embed_dim']}", f"{k['num_heads']} heads", f"patch {k['patch_size']}",
             shown]
    if spec.n_registers:
        parts.append(f"{spec.n_registers} registers")
    if k.get("num_classes"):
        parts.append(f"{k['num_classes']} {'outputs' if spec.head == 'projection' else 'classes'}")
    return f"a transformers {spec.architecture} as timm {name} ({', '.join(parts)})"


def input_size(spec: HFSpec, timm_kwargs: dict) -> Tuple[int, int]:
    """The (H, W) a folder is built at: its config's image size, or ``img_size`` (any multiple of its patch).

    Raises:
        ModelLoadError: another kwarg (the config.json decides the architecture), or a size that is not a
            positive multiple of the patch.
    """
    own, patch = spec.kwargs["img_size"], spec.kwargs["patch_size"]
    other = sorted(set(timm_kwargs) - {"img_size"})
    if other:
        raise ModelLoadError(f"{str(spec.folder)!r} is a transformers {spec.architecture}, built as its config.json "
                             f"says ({own} px, {spec.kwargs['depth']} blocks): {', '.join(other)} cannot change it "
                             "(img_size can: its position table is resampled as transformers does)")
    size = timm_kwargs.get("img_size") or own
    pair = (int(size), int(size)) if isinstance(size, int) else tuple(int(s) for s in size)
    if len(pair) != 2 or any(s < patch or s % patch for s in pair):
        raise ModelLoadError(f"img_size {size} for {str(spec.folder)!r}: give a multiple of its {patch}-px patch "
                             f"(e.g. {max(1, round(pair[0] / patch)) * patch}); transformers would drop the "
                             "remainder's pixels")
    return pair


def resize_to(model: nn.Module, spec: HFSpec, size: Tuple[int, int], choice: str) -> Optional[str]:
    """Build ``model`` (loaded at its config's size) for inputs of ``size``: its position table resampled once
    as the class's ``interpolate_pos_encoding`` resamples it at every forward of that size (``choice`` "auto":
    :attr:`HFSpec.pos_resample`; else that method of :mod:`interp.models.weights.pos_table`), a DINOv3 (RoPE,
    no table) rebuilt for the grid. Returns the method used, None when no table was resampled."""
    positions = positions_of(model)
    if tuple(size) == positions.img_size:
        return None
    table = positions.table
    if table is None:  # DINOv3: RoPE coordinates are normalised per grid, in transformers as in timm
        positions.resize(size)
        return None
    method = spec.pos_resample if choice == "auto" else choice
    patch = positions.patch_size
    grid = (size[0] // patch[0], size[1] // patch[1])
    resampled = resample_pos_table(table.detach(), grid, positions.n_prefix, method)
    positions.resize(size)
    with torch.no_grad():
        positions.table.copy_(resampled)
    return method


def load_hf_folder(folder: Union[str, Path], *, device: Union[str, torch.device] = "cpu", dtype=None,
                   pos_resample: str = "auto", **timm_kwargs) -> nn.Module:
    """The timm model of a ``transformers`` folder, its weights loaded (eval mode, on ``device``/``dtype``).

    Args:
        pos_resample: with ``img_size`` other than the config's, how the position table is resampled: ``"auto"``
            (the class's own arithmetic, :attr:`HFSpec.pos_resample`) or a method of
            :data:`~interp.models.weights.pos_table.POS_RESAMPLE_METHODS`; kept as ``interp_pos_resample``.
        **timm_kwargs: ``img_size`` only (a multiple of the patch); the config.json decides the rest.

    Raises:
        UnsupportedModelError: a class interp does not convert (the supported ones named).
        ModelLoadError: kwargs that would change the folder's architecture, or weights that do not fit it.
    """
    folder = Path(folder)
    spec = hf_spec(folder)
    if pos_resample not in POS_RESAMPLE_CHOICES:
        raise ModelLoadError(f"unknown pos_resample {pos_resample!r}; use one of {', '.join(POS_RESAMPLE_CHOICES)}")
    size = input_size(spec, timm_kwargs)
    name, kwargs = timm_args(spec)
    state_dict, label = read_folder_weights(folder)
    with warnings.catch_warnings():  # timm's note on the kwargs of the named config: this build sets them all
        warnings.simplefilter("ignore")
        model = build_architecture(name, 0, initialise=False, **kwargs)
    converted, dropped, filled = convert_hf_state_dict(spec, state_dict, model.state_dict(), label)
    model.load_state_dict(converted, strict=True)
    check_finite(model, label)
    method = resize_to(model, spec, size, pos_resample)
    cfg = dict(getattr(model, "pretrained_cfg", None) or {})
    cfg.update(spec.data, architecture=name, hf_architecture=spec.architecture, num_classes=spec.kwargs["num_classes"],
               input_size=(spec.kwargs["in_chans"], *size))
    cfg.pop("hf_hub_id", None)
    if spec.label_names and spec.head == "classifier":
        cfg["label_names"] = list(spec.label_names)
    model.pretrained_cfg = model.default_cfg = cfg
    model.interp_init_seed = None
    model.interp_pos_resample = method
    model.interp_rope_periods = None
    model.interp_source = describe(spec, name, size, method)
    note = (f"; not read by its outputs: {', '.join(dropped)}" if dropped else "") + (
        f"; zero biases (none in the file): {', '.join(filled)}" if filled else "") + (
        f"; its {len(spec.label_names)}-class classifier reads [CLS, patch mean], which no timm head computes: "
        f"pass classifier=interp.load_classifier({str(folder)!r}) for its class logits"
        if spec.head == "dinov2_linear" else "")
    warnings.warn(f"{label}: {model.interp_source}{note}", InterpWarning, stacklevel=3)
    return model.eval().to(device=device, dtype=_resolve_dtype(dtype))
