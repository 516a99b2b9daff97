"""Build a timm ViT by name, with hub weights or a local weight file.

Offline, ``pretrained=True`` first looks in the local Hugging Face cache; when the weights are not
there it fails at once with a message saying how to pass ``weights=`` or ``pretrained=False``.
"""
from __future__ import annotations

import contextlib
import io
import math
import os
import socket
import threading
import warnings
from pathlib import Path
from typing import Optional, Tuple, Union

import torch
from torch import nn

from ..errors import ModelLoadError, UnknownModelError, UnsupportedModelError, close_matches
from .pos_table import POS_RESAMPLE_CHOICES, resample_positions
from .families import family_of, family_of_entry_module
from .torchvision_format import adopt_torchvision_config, convert_torchvision_vit, is_torchvision_vit

def _resolve_dtype(dtype) -> Optional[torch.dtype]:
    if dtype is None or isinstance(dtype, torch.dtype):
        return dtype
    try:
        return {"float32": torch.float32, "fp32": torch.float32, "float16": torch.float16,
                "fp16": torch.float16, "bfloat16": torch.bfloat16, "bf16": torch.bfloat16}[str(dtype)]
    except KeyError:
        raise ValueError(f"unknown dtype {dtype!r}; use float32, float16 or bfloat16") from None


def check_model_name(name: str) -> None:
    """Raise a clear error for an unknown timm name or a timm model of a family interp does not instrument."""
    import timm
    from timm.models import is_model, model_entrypoint

    base = name.split(".")[0]
    if not is_model(base):
        hints = close_matches(base, timm.list_models(), n=5)
        hint = f" Did you mean: {', '.join(hints)}?" if hints else ""
        raise UnknownModelError(f"unknown timm model {name!r}.{hint}")
    try:
        family_of_entry_module(model_entrypoint(base).__module__)
    except UnsupportedModelError as e:
        raise UnsupportedModelError(f"{name!r}: {e}") from None


def read_state_dict(path: Union[str, Path]) -> dict:
    """Read a state dict from ``.safetensors``, ``.pth``/``.pt`` or ``.bin`` (unwrapping ``state_dict``/``model`` keys)."""
    path = Path(path)
    if not path.is_file():
        raise ModelLoadError(f"weight file {str(path)!r} does not exist")
    try:
        if path.suffix == ".safetensors":
            from safetensors.torch import load_file

            sd = load_file(str(path), device="cpu")
        else:
            sd = torch.load(str(path), map_location="cpu", weights_only=True)
    except Exception as e:  # corrupt or foreign file
        size = path.stat().st_size
        reason = ("the file is empty (0 bytes)" if size == 0 else
                  f"{type(e).__name__}: {str(e).splitlines()[0] if str(e).strip() else 'no detail'}")
        raise ModelLoadError(f"could not read weight file {str(path)!r} ({size} bytes): {reason}; it is not a "
                             f"complete {path.suffix or 'weight'} state dict: download or export it again") from e
    for key in ("state_dict", "model", "module", "teacher"):
        if isinstance(sd, dict) and key in sd and isinstance(sd[key], dict):
            sd = sd[key]
    if not isinstance(sd, dict):
        raise ModelLoadError(f"{str(path)!r} does not hold a state dict")
    return sd


def load_weights_file(model: nn.Module, path: Union[str, Path, dict], entry_module: Optional[str] = None,
                      label: Optional[str] = None) -> None:
    """Load a local state dict (a file path, or a dict already read from ``label``) into ``model``, applying
    timm's ``checkpoint_filter_fn`` conversions (original DINOv2, OpenAI/OpenCLIP checkpoints, resized
    position embeddings)."""
    import importlib

    sd = path if isinstance(path, dict) else read_state_dict(path)
    where = label or (str(path) if not isinstance(path, dict) else "state dict")
    module = importlib.import_module(entry_module or "timm.models.vision_transformer")
    filter_fn = getattr(module, "checkpoint_filter_fn", None)
    if filter_fn is not None:
        # timm's Eva filter prints one line per block when it drops a DINOv3 file's all-zero qkv biases for a
        # model without them (the intended conversion, not a problem): keep that off the user's terminal
        quiet = contextlib.redirect_stdout(io.StringIO()) if module.__name__ == "timm.models.eva" else (
            contextlib.nullcontext())
        try:
            with quiet:
                sd = filter_fn(dict(sd), model)
        except Exception as e:
            raise ModelLoadError(f"timm could not convert {where!r} for this architecture: {e}") from e
    hint = ("Pass the timm name of the architecture these weights were trained with, and timm kwargs "
            "such as num_classes=0 or img_size=... if the head or resolution differs.")
    try:
        result = model.load_state_dict(sd, strict=False)
    except RuntimeError as e:  # shape mismatches
        first = str(e).splitlines()[1:3]
        raise ModelLoadError(f"{where!r} does not match this architecture: {' '.join(first)}. {hint}") from e
    missing, unexpected = list(result.missing_keys), list(result.unexpected_keys)
    if missing or unexpected:
        raise ModelLoadError(
            f"{where!r} does not match this architecture: {len(missing)} missing keys "
            f"(e.g. {missing[:3]}), {len(unexpected)} unexpected keys (e.g. {unexpected[:3]}). {hint}"
        )


# Where each checkpoint format keeps its absolute position embedding, and how many prefix tokens
# (CLS) carry a position in that format: None = as the timm model itself does.
_POS_EMBED_KEYS = (
    ("pos_embed", None),                              # timm, and original DINOv2 (see weights_grid)
    ("visual.trunk.pos_embed", None),                 # OpenCLIP with a timm trunk
    ("module.visual.trunk.pos_embed", None),
    ("visual.positional_embedding", 1),               # OpenAI CLIP: [1 + h*w, d], CLS has a position
    ("module.visual.positional_embedding", 1),
)


def weights_grid(state_dict: dict, model: nn.Module) -> Optional[Tuple[int, int]]:
    """The square patch grid ``(h, w)`` a checkpoint's position embedding was trained for, or None.

    The embedding is ``[1, n_pos_prefix + h*w, d]`` (OpenAI CLIP: ``[n_pos_prefix + h*w, d]``), where
    ``n_pos_prefix`` is the number of prefix tokens that carry a position: timm models read it from
    ``no_embed_class``/``num_prefix_tokens``; original DINOv2 files (``mask_token`` key) give one to CLS
    only, registers included. None when there is no position embedding or no square grid fits.
    """
    timm_prefix = 0 if getattr(model, "no_embed_class", False) else int(getattr(model, "num_prefix_tokens", 1))
    for key, fmt_prefix in _POS_EMBED_KEYS:
        pos = state_dict.get(key)
        if not isinstance(pos, torch.Tensor) or pos.dim() < 2:
            continue
        n_tokens = int(pos.shape[-2])
        if fmt_prefix is None:
            fmt_prefix = 1 if "mask_token" in state_dict else timm_prefix
        side = math.isqrt(max(n_tokens - fmt_prefix, 0))
        return (side, side) if side > 0 and side * side == n_tokens - fmt_prefix else None
    return None


MAX_WEIGHTS_GRID = 100  # patches per side a weight file may set on its own (100x100 = 1600 px at patch 16)
_GRID_WARNINGS_SHOWN: set = set()  # the position-grid warning is shown once per process and file


def _fit_to_weights(model: nn.Module, state_dict: dict, name: str, label: str) -> None:
    """Set ``model``'s input size to the grid ``state_dict`` was trained for (timm ``set_input_size``),
    and say so in one warning line (once per process). Called only when the user asked for no ``img_size``.

    Raises:
        ModelLoadError: the grid has more than ``MAX_WEIGHTS_GRID`` patches per side (a crafted or foreign
            file would build a model too large for memory); an explicit ``img_size`` is then needed.
    """
    grid = weights_grid(state_dict, model)
    if grid is None or not hasattr(model, "set_input_size"):  # no position table (PVTv2, Swin-v2)
        return
    current = tuple(int(g) for g in model.patch_embed.grid_size)
    if grid == current:
        return
    patch = tuple(int(p) for p in model.patch_embed.patch_size)
    size = (grid[0] * patch[0], grid[1] * patch[1])
    old = tuple(int(s) for s in model.patch_embed.img_size)
    if max(grid) > MAX_WEIGHTS_GRID:
        raise ModelLoadError(
            f"{label} holds a {grid[0]}x{grid[1]} position grid ({size[0]} px input): larger than the "
            f"{MAX_WEIGHTS_GRID}x{MAX_WEIGHTS_GRID} grid interp builds on a file's word; pass img_size=... (CLI "
            f"--img-size {old[0]}) to resample the position embedding to the size you want")
    model.set_input_size(img_size=size)
    shown = f"{size[0]}" if size[0] == size[1] else f"{size[0]}x{size[1]}"
    key = (name, label, grid)
    if key in _GRID_WARNINGS_SHOWN:
        return
    _GRID_WARNINGS_SHOWN.add(key)
    warnings.warn(
        f"{label} holds a {grid[0]}x{grid[1]} position grid: building {name} at {shown} px, not its default "
        f"{old[0]}x{old[1]}; pass img_size={size[0]} (CLI --img-size {size[0]}) to keep this size without "
        f"this warning, or img_size={old[0]} (--img-size {old[0]}) to resample",
        stacklevel=4,
    )


def _register_count(state_dict: dict) -> Optional[int]:
    """Register tokens a checkpoint holds (timm ``reg_token``, original DINOv2 ``register_tokens`` or original
    DINOv3 ``storage_tokens``), 0 when it is a DINOv2-style file without them, None when the format does not tell."""
    for key in ("reg_token", "register_tokens", "storage_tokens"):
        t = state_dict.get(key)
        if isinstance(t, torch.Tensor):
            return int(t.shape[1]) if t.dim() == 3 else int(t.shape[0])
    return 0 if ("mask_token" in state_dict or "cls_token" in state_dict) else None


def check_register_tokens(model: nn.Module, state_dict: dict, name: str, label: str) -> None:
    """A clear error when a file with(out) register tokens meets a model without (with) them, naming the
    timm architecture that fits (``*_reg4_*`` <-> plain), instead of a reshape error deep in timm."""
    import re

    from timm.models import is_model

    have = family_of(model).layout().n_registers  # read from the model (timm's Eva has no num_reg_tokens)
    held = _register_count(state_dict)
    if held is None or held == have:
        return
    base = name.split(".")[0]
    if held == 0:
        fit = re.sub(r"_reg\d+", "", base)
    else:
        fit = base.replace("_dinov2", f"_reg{held}_dinov2") if "_reg" not in base else re.sub(
            r"_reg\d+", f"_reg{held}", base)
    hint = f"load it into {fit!r}" if fit != base and is_model(fit) else (
        f"load it into an architecture with {held} register tokens")
    raise ModelLoadError(
        f"{label} holds {'no' if held == 0 else held} register tokens but {name!r} has {have or 'none'}: "
        f"{hint} (or pass weights trained with registers = {have})")


def _fit_head_to_weights(model: nn.Module, state_dict: dict) -> None:
    """Size the head to an OpenAI/open_clip checkpoint's image projection ``visual.proj`` [width, D], which timm's
    conversion makes the head: a CLIP name's default tag may be a 1000-class fine-tune (vit_base_patch16_clip_224)."""
    for key in ("visual.proj", "module.visual.proj"):
        proj = state_dict.get(key)
        if isinstance(proj, torch.Tensor) and proj.dim() == 2:
            if int(model.num_classes) != int(proj.shape[1]) and hasattr(model, "reset_classifier"):
                model.reset_classifier(int(proj.shape[1]))
            return


def check_finite(model: nn.Module, label: str) -> None:
    """Raise when loaded weights hold NaN or infinite values (a damaged file), naming the tensors."""
    bad = [n for n, t in model.state_dict().items() if t.is_floating_point() and not bool(torch.isfinite(t).all())]
    if bad:
        shown = ", ".join(bad[:3]) + (f" and {len(bad) - 3} more" if len(bad) > 3 else "")
        raise ModelLoadError(f"{label} holds NaN or infinite values in {len(bad)} tensor(s): {shown}; the file "
                             "is damaged: download or export it again")


def _hub_reachable(host: str = "huggingface.co", timeout: float = 3.0) -> bool:
    if os.environ.get("HF_HUB_OFFLINE", "0") not in ("0", "", "false", "False"):
        return False
    ok = []

    def probe():
        try:
            socket.getaddrinfo(host, 443)
            with socket.create_connection((host, 443), timeout=timeout):
                ok.append(True)
        except OSError:
            pass

    t = threading.Thread(target=probe, daemon=True)
    t.start()
    t.join(timeout + 0.5)
    return bool(ok)


def _cached_hub_file(model: nn.Module) -> Optional[str]:
    cfg = getattr(model, "pretrained_cfg", None) or {}
    repo = cfg.get("hf_hub_id")
    if not repo:
        return None
    try:
        from huggingface_hub import try_to_load_from_cache
    except ImportError:
        return None
    for filename in ("model.safetensors", "open_clip_model.safetensors", "pytorch_model.bin",
                     "open_clip_pytorch_model.bin"):
        found = try_to_load_from_cache(repo, filename)
        if isinstance(found, str):
            return found
    return None


def _offline_message(name: str) -> str:
    return (
        f"cannot download pretrained weights for {name!r}: the Hugging Face hub is unreachable and the "
        "weights are not in the local cache. Either pass a local file, "
        f"interp.load({name!r}, weights='path/to/model.safetensors') "
        "(CLI: --weights FILE; .safetensors/.pth/.bin; original DINOv2, OpenAI CLIP and torchvision ViT files are "
        "converted), "
        f"or use random weights with interp.load({name!r}, pretrained=False) (CLI: --no-pretrained)."
    )


def create_timm_vit(
    name: str,
    *,
    pretrained: bool = True,
    weights: Union[str, Path, None] = None,
    device: Union[str, torch.device] = "cpu",
    dtype=None,
    seed: Optional[int] = None,
    pos_resample: str = "auto",
    **timm_kwargs,
) -> nn.Module:
    """Build the timm ViT ``name`` in eval mode with the requested weights.

    Args:
        name: timm model name, optionally with a pretrained tag (``vit_small_patch14_dinov2.lvd142m``).
        pretrained: load hub weights (from the local HF cache when offline). Ignored when ``weights`` is given.
        weights: local ``.safetensors``/``.pth``/``.bin`` state dict for this architecture. Without an
            ``img_size`` kwarg, the model takes the input size the file's position embedding was trained
            for (one warning line says so), e.g. 224-px DINOv2 weights are not resampled to 518 px.
        device, dtype: where and in which float type the model lives.
        seed: seed of the random weights when there are no weights to load (``pretrained=False``, no
            ``weights``); default 0, so the same call builds the same model in every run. Recorded as the
            module's ``interp_init_seed`` (None when weights were loaded). The global RNG is left as it was.
        pos_resample: how a position table trained for another grid is resampled to the model's:
            ``"auto"`` (DINOv2's own arithmetic for an original DINOv2 file, timm's otherwise), ``"timm"``,
            ``"dinov2"`` or ``"dinov2_reg"`` (see :mod:`interp.models.pos_table`). The method used is recorded
            as the module's ``interp_pos_resample`` (None when the table was not resampled).
        **timm_kwargs: passed to ``timm.create_model`` (``img_size``, ``dynamic_img_size``, ``num_classes``, ``depth``...).
    """
    import timm
    from timm.models import model_entrypoint

    from .planted import PLANTED_BUILDERS

    if name in PLANTED_BUILDERS:  # a synthetic ground-truth model: its weights are its construction
        if weights is not None:
            raise ModelLoadError(f"{name} is built by construction; it takes no weight file")
        with torch.random.fork_rng(devices=[]):
            model = PLANTED_BUILDERS[name](**timm_kwargs, **({} if seed is None else {"seed": seed}))
        return model.to(device=device, dtype=_resolve_dtype(dtype))
    check_model_name(name)
    if pos_resample not in POS_RESAMPLE_CHOICES:
        raise ModelLoadError(f"unknown pos_resample {pos_resample!r}; use one of {', '.join(POS_RESAMPLE_CHOICES)}")
    random_init = weights is None and not pretrained
    init_seed = (0 if seed is None else int(seed)) if random_init else None
    input_size = None
    if "img_size" in timm_kwargs and not family_of_entry_module(model_entrypoint(name.split(".")[0]).__module__
                                                                ).takes_img_size:
        timm_kwargs = dict(timm_kwargs)
        size = timm_kwargs.pop("img_size")
        input_size = (int(size), int(size)) if isinstance(size, int) else tuple(int(s) for s in size)
    try:
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(0 if init_seed is None else init_seed)
            model = timm.create_model(name, pretrained=False, **timm_kwargs)
    except Exception as e:
        raise ModelLoadError(f"timm could not build {name!r} with {timm_kwargs}: {e}") from e
    if input_size is not None:  # a model that takes any size: the size it is run and preprocessed at
        cfg = dict(model.pretrained_cfg)
        cfg["input_size"] = (cfg.get("input_size", (3,))[0], *input_size)
        model.pretrained_cfg = cfg
        if hasattr(model, "default_cfg"):
            model.default_cfg = cfg
    model.interp_init_seed = init_seed
    model.interp_pos_resample = None
    family_of(model)  # a variant interp does not instrument is refused before any weight is read
    entry_module = model_entrypoint(name.split(".")[0]).__module__
    local, reachable = weights, None
    if local is None and pretrained:
        reachable = _hub_reachable()
        local = _cached_hub_file(model) if not reachable else None
        if local is None and not reachable:
            raise ModelLoadError(_offline_message(name))
    if local is not None:
        state_dict = read_state_dict(local)
        label = f"weight file {Path(local).name!r}"
        if is_torchvision_vit(state_dict):  # torchvision's keys and transform, as timm's filter does for others
            state_dict = convert_torchvision_vit(state_dict, model, name, label)
            adopt_torchvision_config(model, state_dict, fit_head="num_classes" not in timm_kwargs)
        check_register_tokens(model, state_dict, name, label)
        if "num_classes" not in timm_kwargs:  # the file's head, unless the user asked for one
            _fit_head_to_weights(model, state_dict)
        if "img_size" not in timm_kwargs:  # the file's resolution, unless the user asked for one
            _fit_to_weights(model, state_dict, name, label)
        state_dict, model.interp_pos_resample = resample_positions(
            model, state_dict, weights_grid(state_dict, model), pos_resample, label)
        load_weights_file(model, state_dict, entry_module, label=str(local))
        check_finite(model, label)
    elif reachable:
        try:
            from timm.models import load_pretrained

            timm_filter = getattr(__import__(entry_module, fromlist=["x"]), "checkpoint_filter_fn", None)

            def hub_filter(sd, module):  # the position table first (its method recorded), then timm's conversion
                sd, module.interp_pos_resample = resample_positions(
                    module, sd, weights_grid(sd, module), pos_resample, f"the hub weights of {name!r}")
                return timm_filter(sd, module) if timm_filter is not None else sd

            load_pretrained(model, pretrained_cfg=model.pretrained_cfg, num_classes=model.num_classes,
                            filter_fn=hub_filter)
        except Exception as e:
            raise ModelLoadError(_offline_message(name) + f" (hub error: {e})") from e
        check_finite(model, f"the hub weights of {name!r}")
    model.eval()
    model.to(device=device, dtype=_resolve_dtype(dtype))
    model.interp_rope_periods = None
    if local is not None:  # after the cast: timm recomputes float32 periods when a cast lowers them
        model.interp_rope_periods = keep_file_rope_periods(model, state_dict, label)
    return model


ORIGINAL_ROPE_PERIODS_KEY = "rope_embed.periods"  # facebookresearch/dinov3's persistent RoPE buffer


def keep_file_rope_periods(model: nn.Module, state_dict: dict, label: str) -> Optional[str]:
    """Rotate with the RoPE periods an original DINOv3 file carries, as the original code does.

    The original keeps ``rope_embed.periods`` [head_dim // 4] as a persistent buffer, stored rounded to bfloat16
    in the released checkpoints; timm's conversion drops it and recomputes the periods in float32, which moves
    sin/cos by up to ~0.008 (docs/methods.md, *RoPE*). The file's values are copied, in float32, into the timm
    model's ``rope.periods`` (the only input of its table other than the grid). Returns ``"file"`` when they were,
    None when the file has none (timm hub files, other families)."""
    periods = state_dict.get(ORIGINAL_ROPE_PERIODS_KEY)
    rope = getattr(model, "rope", None)
    target = getattr(rope, "periods", None)
    if periods is None or not isinstance(target, torch.Tensor):
        return None
    if periods.shape != target.shape:
        raise ModelLoadError(f"{label} holds {periods.numel()} RoPE periods ({ORIGINAL_ROPE_PERIODS_KEY}) but this "
                             f"architecture has {target.numel()} (head_dim / 4): pass the architecture the file was "
                             f"trained with")
    if not torch.isfinite(periods).all() or not (periods > 0).all():
        raise ModelLoadError(f"{label}: {ORIGINAL_ROPE_PERIODS_KEY} holds non-positive or non-finite periods; the file "
                             f"is damaged: download or export it again")
    with torch.no_grad():
        target.copy_(periods.to(dtype=target.dtype, device=target.device))
    if getattr(rope, "pos_embed_cached", None) is not None and getattr(rope, "feat_shape", None) is not None:
        rope._cache_embed(list(rope.feat_shape))  # a cached table (fixed-size models) follows the new periods
    return "file"
