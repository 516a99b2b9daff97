"""Build a timm ViT by name, with hub weights or a local weight file.

Offline, ``pretrained=True`` first looks in the local Hugging Face cache; when the weights are not
there it fails at once with a message saying how to pass ``weights=`` or ``pretrained=False``.
"""
from __future__ import annotations

import contextlib
import io
import os
import socket
import threading
import warnings
from pathlib import Path
from typing import Callable, Dict, Optional, Union

import torch
from torch import nn
from torch.overrides import TorchFunctionMode

from ..errors import InterpWarning, ModelLoadError, UnknownModelError, UnsupportedModelError, close_matches
from .._model_names import PLANTED_NAMES
from ..paths import check_input_path
from .weights.pos_table import POS_RESAMPLE_CHOICES, resample_positions
from .families import family_of, family_of_entry_module
from .weights.weight_fit import (check_dropped_qkv_biases, check_floating_weights, fit_head_to_weights,
                                 fit_to_weights, keep_file_rope_periods, register_fit, weights_grid)
from .weights.checkpoints import fit_head_classes, unwrap_checkpoint
from .weights.torchvision_format import adopt_torchvision_config, convert_torchvision_vit, is_torchvision_vit

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
        hints = close_matches(base, [*PLANTED_NAMES, *timm.list_models()], n=5)
        hint = f" Did you mean: {', '.join(hints)}?" if hints else ""
        raise UnknownModelError(f"unknown timm model {name!r}.{hint}")
    try:
        family_of_entry_module(model_entrypoint(base).__module__)
    except UnsupportedModelError as e:
        raise UnsupportedModelError(f"{name!r}: {e}") from None


def read_state_dict(path: Union[str, Path]) -> dict:
    """Read a state dict from ``.safetensors``, ``.pth``/``.pt`` or ``.bin``; a training run's checkpoint is unwrapped
    (``state_dict``/``model``/EMA containers, ``module.``/``_orig_mod.`` prefixes: :mod:`interp.models.weights.checkpoints`),
    with one warning line saying what was taken."""
    path = Path(path)
    check_input_path(path, "weight file")
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
    sd, note = unwrap_checkpoint(sd)
    if note:  # a training run's file: say which weights were taken
        warnings.warn(f"weight file {path.name!r}: {note}", InterpWarning, stacklevel=3)
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
    check_dropped_qkv_biases(model, sd, repr(where))
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
    check_floating_weights(model, sd, repr(where))
    misfit = state_dict_misfit(model.state_dict(), sd)
    if misfit:
        raise ModelLoadError(f"{Path(str(where)).name!r} does not fit this architecture: {misfit} tensors; give "
                             "the timm name it was trained with")
    model.load_state_dict(sd, strict=True)


def state_dict_misfit(own: Dict[str, torch.Tensor], given: Dict[str, torch.Tensor]) -> Optional[str]:
    """How a state dict ``given`` misses a model's own ``own``, in a few words (None: every key and shape fits):
    the counts of tensors of another shape, keys missing and keys unexpected, the first kind with an example."""
    shaped = [k for k in own if k in given and tuple(own[k].shape) != tuple(given[k].shape)]
    missing = [k for k in own if k not in given]
    unexpected = [k for k in given if k not in own]
    parts = []
    if shaped:
        k = shaped[0]
        parts.append(f"{len(shaped)} of another shape ({k}: {list(given[k].shape)} in the file, "
                     f"{list(own[k].shape)} here)")
    if missing:
        parts.append(f"{len(missing)} missing" + ("" if parts else f" ({missing[0]})"))
    if unexpected:
        parts.append(f"{len(unexpected)} unexpected" + ("" if parts else f" ({unexpected[0]})"))
    return ", ".join(parts) or None


# Where each checkpoint format keeps its absolute position embedding, and how many prefix tokens
# (CLS) carry a position in that format: None = as the timm model itself does.


def _all_finite(t: torch.Tensor) -> bool:
    """Whether every value of ``t`` is finite: from its min and max (NaN propagates into both, an infinity is one
    of them), one pass without the full-size mask of ``isfinite(t).all()`` (~15x faster on a large tensor)."""
    if t.numel() == 0:
        return True
    low, high = torch.aminmax(t)
    return bool(torch.isfinite(low)) and bool(torch.isfinite(high))


def check_finite(model: nn.Module, label: str) -> None:
    """Raise when loaded weights hold NaN or infinite values (a damaged file), naming the tensors."""
    bad = [n for n, t in model.state_dict().items() if t.is_floating_point() and not _all_finite(t)]
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


def build_architecture(name: str, seed: int = 0, *, initialise: bool = True, **timm_kwargs) -> nn.Module:
    """The timm model ``name`` shaped by ``timm_kwargs``, with timm's random init drawn under ``seed`` (the global
    RNG is left as it was) and no weights read: the construction a load (:func:`create_timm_vit`) and a skeleton
    (:func:`build_skeleton`) share. A family that takes any input size (PVTv2, Swin-v2) is built without
    ``img_size`` and records it as its pretrained_cfg's input size (the size it is run and preprocessed at).
    ``initialise=False`` leaves every parameter's memory as allocated (no initialiser of :data:`VALUE_FILLS` runs
    on a parameter) for a caller that overwrites them all; the buffers timm computes at construction (RoPE
    tables, Swin's masks) are built as usual.

    Raises:
        ModelLoadError: timm cannot build it with these kwargs.
        UnsupportedModelError: a variant interp does not instrument (before any weight is read).
    """
    import timm
    from timm.models import model_entrypoint

    input_size = None
    if "img_size" in timm_kwargs and not family_of_entry_module(model_entrypoint(name.split(".")[0]).__module__
                                                                ).takes_img_size:
        timm_kwargs = dict(timm_kwargs)
        size = timm_kwargs.pop("img_size")
        input_size = (int(size), int(size)) if isinstance(size, int) else tuple(int(s) for s in size)
    try:
        with torch.random.fork_rng(devices=[]), (contextlib.nullcontext() if initialise else
                                                 _SkipFills(lambda t: isinstance(t, nn.Parameter))):
            torch.manual_seed(seed)
            model = timm.create_model(name, pretrained=False, **timm_kwargs)
    except Exception as e:
        raise ModelLoadError(f"timm could not build {name!r} with {timm_kwargs}: {e}") from e
    if input_size is not None:
        cfg = dict(model.pretrained_cfg)
        cfg["input_size"] = (cfg.get("input_size", (3,))[0], *input_size)
        model.pretrained_cfg = cfg
        if hasattr(model, "default_cfg"):
            model.default_cfg = cfg
    family_of(model)
    return model


# In-place initialisers: on a meta tensor they change no shape and hold no value, so a skeleton skips them (timm's
# trunc_normal_ alone costs ~2.6 ms a tensor on meta: 0.5 s of a vit_large's 0.55 s skeleton).
VALUE_FILLS = frozenset({
    "uniform_", "normal_", "trunc_normal_", "erfinv_", "clamp_", "mul_", "add_", "sub_", "div_", "fill_", "zero_",
    "copy_", "exponential_", "constant_", "ones_", "zeros_", "eye_", "dirac_", "orthogonal_", "xavier_uniform_",
    "xavier_normal_", "kaiming_uniform_", "kaiming_normal_",
})


class _SkipFills(TorchFunctionMode):
    """An initialiser of :data:`VALUE_FILLS` on a tensor that ``skip(tensor)`` selects returns the tensor untouched;
    every other call runs as usual."""

    def __init__(self, skip: Callable[[torch.Tensor], bool]):
        super().__init__()
        self.skip = skip

    def __torch_function__(self, func, types, args=(), kwargs=None):
        first = args[0] if args else None
        if getattr(func, "__name__", "") in VALUE_FILLS and isinstance(first, torch.Tensor) and self.skip(first):
            return first
        return func(*args, **(kwargs or {}))


def build_skeleton(name: str, **timm_kwargs) -> nn.Module:
    """The timm model ``name`` of :func:`build_architecture` built on torch's meta device: its structure (blocks,
    widths, input grid) with tensors that hold no storage, no weight initialised or read (~0.03 s for
    vit_base_patch16_224 against 1.3 s of random init). Its warnings are left to the real build.

    Raises:
        Exception: whatever :func:`build_architecture` raises, or timm raises for a model it cannot build on meta.
    """
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        with torch.device("meta"), _SkipFills(lambda t: t.is_meta):
            return build_architecture(name, **timm_kwargs)


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
            ``"dinov2"``, ``"dinov2_reg"`` or ``"transformers"`` (see :mod:`interp.models.weights.pos_table`). The method used is recorded
            as the module's ``interp_pos_resample`` (None when the table was not resampled).
        **timm_kwargs: passed to ``timm.create_model`` (``img_size``, ``dynamic_img_size``, ``num_classes``, ``depth``...).
    """
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
    local, reachable, model = weights, None, None
    if local is None and pretrained:
        reachable = _hub_reachable()
        if not reachable:  # the local Hugging Face cache, found from the model's pretrained_cfg
            try:  # on a skeleton: nothing initialised before we know whether weights will replace it
                probe = build_skeleton(name, **timm_kwargs)
            except Exception:  # timm cannot build it on meta: ask the real model
                probe = model = build_architecture(name, 0, **timm_kwargs)
            local = _cached_hub_file(probe)
            if local is None:
                raise ModelLoadError(_offline_message(name))
    if model is None:
        # a weight file sets every parameter (a key it lacks is an error): timm's init of them would be thrown away
        model = build_architecture(name, 0 if init_seed is None else init_seed, initialise=local is None,
                                   **timm_kwargs)
    model.interp_init_seed = init_seed
    model.interp_pos_resample = None
    entry_module = model_entrypoint(name.split(".")[0]).__module__
    if local is not None:
        state_dict = read_state_dict(local)
        label = f"weight file {Path(local).name!r}"
        registers = register_fit(model, state_dict, name, label, timm_kwargs)
        if registers is not None:  # the file's register count: the model built again with it
            model = build_architecture(name, 0, initialise=False, **timm_kwargs, **registers[0])
            model.interp_init_seed, model.interp_pos_resample = None, None
            warnings.warn(f"{label} {registers[1]}", InterpWarning, stacklevel=3)
        if is_torchvision_vit(state_dict):  # torchvision's keys and transform, as timm's filter does for others
            state_dict = convert_torchvision_vit(state_dict, model, name, label)
            adopt_torchvision_config(model, state_dict, fit_head="num_classes" not in timm_kwargs)
        if "num_classes" not in timm_kwargs:  # the file's head, unless the user asked for one
            fit_head_to_weights(model, state_dict)
            fitted = fit_head_classes(model, state_dict)
            if fitted:
                warnings.warn(f"{label} {fitted}", InterpWarning, stacklevel=3)
        if "img_size" not in timm_kwargs:  # the file's resolution, unless the user asked for one
            fit_to_weights(model, state_dict, name, label)
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
