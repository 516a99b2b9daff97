"""Fitting a built timm model to a weight file before its state dict loads: the position grid the file was
trained for, its register-token count (the kwargs to rebuild with), its head's width, and the RoPE periods an original DINOv3 file carries.
"""
from __future__ import annotations

import inspect
import math
import re
import warnings
from typing import Dict, Optional, Tuple

import torch
from timm.models import is_model
from torch import nn

from ...errors import InterpWarning, ModelLoadError
from ..families import family_of
from ..families.positions import positions_of

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
    ``n_pos_prefix`` is the number of prefix tokens that carry a position: the model's own
    (:attr:`~interp.models.families.positions.Positions.n_prefix`) for a timm-format file; original DINOv2 files (``mask_token`` key) give one to CLS
    only, registers included. None when there is no position embedding or no square grid fits.
    """
    positions = positions_of(model)
    timm_prefix = positions.n_prefix if positions is not None else 1
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


def fit_to_weights(model: nn.Module, state_dict: dict, name: str, label: str) -> None:
    """Set ``model``'s input size to the grid ``state_dict`` was trained for (timm ``set_input_size``),
    and say so in one warning line (once per process). Called only when the user asked for no ``img_size``.

    Raises:
        ModelLoadError: the grid has more than ``MAX_WEIGHTS_GRID`` patches per side (a crafted or foreign
            file would build a model too large for memory); an explicit ``img_size`` is then needed.
    """
    grid, positions = weights_grid(state_dict, model), positions_of(model)
    if grid is None or positions is None or not positions.resizable:  # no position table (PVTv2, Swin-v2)
        return
    if grid == positions.grid:
        return
    patch = positions.patch_size
    size = (grid[0] * patch[0], grid[1] * patch[1])
    old = positions.img_size
    if max(grid) > MAX_WEIGHTS_GRID:
        raise ModelLoadError(
            f"{label} holds a {grid[0]}x{grid[1]} position grid ({size[0]} px input): larger than the "
            f"{MAX_WEIGHTS_GRID}x{MAX_WEIGHTS_GRID} grid interp builds on a file's word; pass img_size=... (CLI "
            f"--img-size {old[0]}) to resample the position embedding to the size you want")
    positions.resize(size)
    shown = f"{size[0]}" if size[0] == size[1] else f"{size[0]}x{size[1]}"
    key = (name, label, grid)
    if key in _GRID_WARNINGS_SHOWN:
        return
    _GRID_WARNINGS_SHOWN.add(key)
    warnings.warn(
        f"{label} holds a {grid[0]}x{grid[1]} position grid: building {name} at {shown} px, not its default "
        f"{old[0]}x{old[1]}; pass img_size={size[0]} (CLI --img-size {size[0]}) to keep this size without "
        f"this warning, or img_size={old[0]} (--img-size {old[0]}) to resample", InterpWarning,
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


REGISTER_ARGS = ("reg_tokens", "num_reg_tokens")  # the register count's argument: timm VisionTransformer's, Eva's


def _architecture_fit(name: str, held: int) -> str:
    """The timm name of ``name``'s architecture with ``held`` register tokens (``*_reg4_*`` <-> plain), or ``name``."""
    base = name.split(".")[0]
    if held == 0:
        return re.sub(r"_reg\d+", "", base)
    return base.replace("_dinov2", f"_reg{held}_dinov2") if "_reg" not in base else re.sub(r"_reg\d+", f"_reg{held}",
                                                                                            base)


def _no_embed_class(model: nn.Module, state_dict: dict, held: int, label: str) -> Optional[bool]:
    """Whether the file's position table leaves the prefix tokens (CLS, ``held`` registers) without a position
    (timm ``no_embed_class``), read from its rows; None when the file has no ``pos_embed`` (RoPE).

    An original DINOv2 file (``mask_token`` key) is laid out by timm's conversion: CLS and registers without a
    position when it has registers (the DINOv2-reg layout), CLS with one otherwise. A timm-layout table of T rows
    is ``no_embed_class`` when T is a square grid, else it holds one row per prefix token (the model's layout is
    tried first where both fit).

    Raises:
        ModelLoadError: neither layout fits the table's rows.
    """
    pos = state_dict.get("pos_embed")
    if not isinstance(pos, torch.Tensor) or pos.dim() < 2:
        return None
    if "mask_token" in state_dict:
        return held > 0
    rows, cls = int(pos.shape[-2]), int(family_of(model).layout().cls_index is not None)
    positions = positions_of(model)
    own = positions is not None and positions.n_prefix == 0  # the model's table has no prefix rows
    for no_embed in (own, not own):
        patches = rows - (0 if no_embed else cls + held)
        if patches > 0 and math.isqrt(patches) ** 2 == patches:
            return no_embed
    raise ModelLoadError(f"{label} holds {held} register tokens and a {rows}-row position table, which is neither a "
                         f"square grid nor {cls + held} prefix rows and a square grid: the file is not a timm ViT's")


def register_fit(model: nn.Module, state_dict: dict, name: str, label: str,
                 timm_kwargs: dict) -> Optional[Tuple[Dict[str, object], str]]:
    """The timm kwargs that build ``name`` with the register tokens the file holds (timm ``reg_token`` [1, R, d],
    original DINOv2 ``register_tokens``, original DINOv3 ``storage_tokens``), and the line that says so; None when
    the model already has the file's count (or the format does not tell).

    The count is the class's own argument (VisionTransformer ``reg_tokens``, Eva ``num_reg_tokens``); with it
    ``no_embed_class`` where the position table says the prefix tokens carry no position (:func:`_no_embed_class`;
    DINOv2 with registers: neither CLS nor registers do).

    Raises:
        ModelLoadError: a class that takes no register count (naming the timm architecture that fits, where one
            does), a register count the caller fixed in ``timm_kwargs``, or a table that fits no layout.
    """
    have = family_of(model).layout().n_registers  # read from the model (timm's Eva has no num_reg_tokens)
    held = _register_count(state_dict)
    if held is None or held == have:
        return None
    params = inspect.signature(type(model).__init__).parameters
    arg = next((a for a in REGISTER_ARGS if a in params), None)
    fit = _architecture_fit(name, held)
    if arg is None or arg in timm_kwargs:
        why = (f"{type(model).__name__} takes no register count" if arg is None else
               f"{arg}={timm_kwargs[arg]} was asked for")
        hint = f"load it into {fit!r}" if fit != name.split(".")[0] and is_model(fit) else (
            f"load it into an architecture with {held} register tokens")
        raise ModelLoadError(f"{label} holds {'no' if held == 0 else held} register tokens but {name!r} has "
                             f"{have or 'none'} and {why}: {hint}")
    kwargs: Dict[str, object] = {arg: held}
    no_embed = _no_embed_class(model, state_dict, held, label)
    if no_embed is not None:
        kwargs["no_embed_class"] = no_embed
    built = ", ".join(f"{k}={v}" for k, v in kwargs.items())
    like = f", as timm's {fit}" if fit != name.split(".")[0] and is_model(fit) else ""
    return kwargs, f"holds {held or 'no'} register tokens: built {name} with {built} (its own: {have}){like}"


def fit_head_to_weights(model: nn.Module, state_dict: dict) -> None:
    """Size the head to an OpenAI/open_clip checkpoint's image projection ``visual.proj`` [width, D], which timm's
    conversion makes the head: a CLIP name's default tag may be a 1000-class fine-tune (vit_base_patch16_clip_224)."""
    for key in ("visual.proj", "module.visual.proj"):
        proj = state_dict.get(key)
        if isinstance(proj, torch.Tensor) and proj.dim() == 2:
            if int(model.num_classes) != int(proj.shape[1]) and hasattr(model, "reset_classifier"):
                model.reset_classifier(int(proj.shape[1]))
            return


def check_dropped_qkv_biases(model: nn.Module, state_dict: dict, label: str) -> None:
    """Refuse an original DINOv3 file (``storage_tokens`` key) whose fused ``qkv.bias`` carries non-zero q or v
    biases when the target architecture has no q/v biases (``vit_*_dinov3`` without ``_qkvb``): timm's conversion
    drops the fused bias for such a model, which is right only when it is all zero (the distilled files).

    Raises:
        ModelLoadError: naming the keys and the architecture that has a place for them.
    """
    if "storage_tokens" not in state_dict:
        return
    names = {name for name, _ in model.named_parameters()}
    dropped = []
    for key, value in state_dict.items():
        if not key.endswith("attn.qkv.bias") or key.replace("qkv.bias", "q_bias") in names:
            continue
        if isinstance(value, torch.Tensor) and value.numel() and value.dim() == 1 and value.numel() % 3 == 0:
            q, _, v = value.chunk(3)  # the k third is fixed at 0 by the original's bias_mask
            if bool(q.any()) or bool(v.any()):
                dropped.append(key)
    if dropped:
        shown = ", ".join(dropped[:2]) + (f" and {len(dropped) - 2} more" if len(dropped) > 2 else "")
        raise ModelLoadError(f"{label} holds non-zero q/v biases ({shown}) that this architecture has no place for: "
                             "load it into the '_qkvb' variant (e.g. vit_small_patch16_dinov3_qkvb)")


def check_floating_weights(model: nn.Module, state_dict: dict, label: str) -> None:
    """Refuse a (converted) state dict that gives a floating-point tensor of ``model`` integer or boolean values
    (an int64 file would load, cast silently).

    Raises:
        ModelLoadError: naming the keys and their dtype.
    """
    targets = model.state_dict()
    bad = [k for k, v in state_dict.items() if isinstance(v, torch.Tensor) and not v.is_floating_point()
           and k in targets and targets[k].is_floating_point()]
    if bad:
        shown = ", ".join(bad[:3]) + (f" and {len(bad) - 3} more" if len(bad) > 3 else "")
        raise ModelLoadError(f"{label} holds {state_dict[bad[0]].dtype} values where the model has float weights "
                             f"({len(bad)} tensor(s): {shown}); give a file of floating-point weights")


ORIGINAL_ROPE_PERIODS_KEY = "rope_embed.periods"  # facebookresearch/dinov3's persistent RoPE buffer


def keep_file_rope_periods(model: nn.Module, state_dict: dict, label: str) -> Optional[str]:
    """Rotate with the RoPE periods an original DINOv3 file carries, as the original code does.

    The original keeps ``rope_embed.periods`` [head_dim // 4] as a persistent buffer, stored rounded to bfloat16
    in the released checkpoints; timm's conversion drops it and recomputes the periods in float32, which moves
    sin/cos by up to ~0.008 (docs/methods.md, *RoPE*). The file's values are copied, in float32, into the timm
    model's ``rope.periods`` (the only input of its table other than the grid). Returns ``"file"`` when they were,
    None when the file has none (timm hub files, other families)."""
    periods, positions = state_dict.get(ORIGINAL_ROPE_PERIODS_KEY), positions_of(model)
    target = None if positions is None else positions.rope_periods()
    if periods is None or target is None:
        return None
    if periods.shape != target.shape:
        raise ModelLoadError(f"{label} holds {periods.numel()} RoPE periods ({ORIGINAL_ROPE_PERIODS_KEY}) but this "
                             f"architecture has {target.numel()} (head_dim / 4): pass the architecture the file was "
                             f"trained with")
    if not torch.isfinite(periods).all() or not (periods > 0).all():
        raise ModelLoadError(f"{label}: {ORIGINAL_ROPE_PERIODS_KEY} holds non-positive or non-finite periods; the file "
                             f"is damaged: download or export it again")
    positions.set_rope_periods(periods)  # a cached table (fixed-size models) follows the new periods
    return "file"
