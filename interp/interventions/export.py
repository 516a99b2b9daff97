"""Patch files: interventions saved with the model they were made for, and applied to plain timm models.

Also reachable as ``interp.patch`` (``interp.patch.save``, ``interp.patch.apply``...): the same module.

A patch is one ``.safetensors`` file. Its metadata key ``interp_patch`` holds a JSON spec (format name and
version, the interventions' kinds and parameters, the target model's name, architecture and weight
fingerprints, and a SHA-256 of the tensors); the tensors (means, masks, keys/values) are the body,
named ``"{position}.{name}"``.

>>> from interp.interventions import TestTimeRegister
>>> path = interp.patch.save([TestTimeRegister({2: [17, 101]})], "ttr.safetensors", model)
>>> plain = interp.patch.apply(interp.models.planted_vit(), "ttr.safetensors")   # a plain timm module
>>> edited = model.run_with_interventions(images, interp.patch.load("ttr.safetensors"))
>>> torch.allclose(plain(images), edited, atol=1e-4)
True

``apply`` swaps submodules of the timm model in place (no hook machinery, ``state_dict`` keys unchanged); where
each edit goes is the model family's business (``Family.plain_*``; in a ViT: MLP edits replace
``blocks[l].mlp.drop1``; test-time registers replace ``patch_drop`` (inserting zero tokens after the prefix) and
raise ``num_prefix_tokens``; attention biases replace ``blocks[l].attn`` with a module reusing its
``qkv``/``proj``; ``SelectiveCLS`` sets ``attn_pool``); block-output edits (``SAEFeatureAblation``) are forward
hooks on the block (no new submodule, so the state dict keeps its keys). Edits compose in the order of
``model.intervene`` (``interp.hooks.intervene``). Full-token ablations can instead be folded into the
weights (:func:`export_weights`), giving a plain state dict for ``timm.create_model``.
"""
from __future__ import annotations

import hashlib
import json
from collections import defaultdict
from pathlib import Path
from typing import Any, Dict, List, Sequence, Tuple, Union

import torch
from torch import nn

from .._version import __version__
from ..errors import InterpError, PatchError
from ..formats.patch_spec import FORMAT, FORMAT_VERSION, METADATA_KEY, describe, read_spec  # noqa: F401 (public)
from ..hooks.edit_state import merge_extra_kv
from ..hooks.intervene import composition_order
from ..models.fingerprint import architecture_fingerprint, weights_fingerprint
from ..models.families import family_of
from .base import Intervention, edit_context, model_device

PathLike = Union[str, Path]


def _timm_module(model: nn.Module) -> nn.Module:
    return getattr(model, "timm_model", model)


def _model_name(model: nn.Module) -> str:
    name = getattr(model, "model_name", None)
    if name:
        return name
    cfg = getattr(_timm_module(model), "pretrained_cfg", None) or {}
    return cfg.get("architecture") or type(_timm_module(model)).__name__


def _tensor_digest(tensors: Dict[str, torch.Tensor]) -> str:
    h = hashlib.sha256()
    for name in sorted(tensors):
        t = tensors[name].detach().cpu().contiguous()
        h.update(f"{name}:{t.dtype}:{tuple(t.shape)};".encode())
        h.update(t.view(torch.uint8).numpy().tobytes() if t.numel() else b"")
    return h.hexdigest()


# ---------------------------------------------------------------------------------------- writing
def save(interventions: Sequence[Intervention], path: PathLike, model: nn.Module) -> Path:
    """Write ``interventions`` for ``model`` (a ``HookedViT`` or timm ViT) into one ``.safetensors`` patch file.

    The interventions are checked against the model first (layers, neuron indices, compatibility).
    """
    from safetensors.torch import save_file

    interventions = list(interventions)
    timm_model = _timm_module(model)
    plan_swaps(timm_model, interventions)  # validation only: raises on bad indices or conflicts
    resid_edits(timm_model, interventions)
    entries, tensors = [], {}
    for i, iv in enumerate(interventions):
        own = {name: t.detach().cpu().contiguous() for name, t in iv.tensors().items()}
        entries.append({"kind": iv.kind, "params": iv.params(), "tensors": sorted(own)})
        tensors.update({f"{i}.{name}": t for name, t in own.items()})
    spec = {
        "format": FORMAT,
        "version": FORMAT_VERSION,
        "interp_version": __version__,
        "model_name": _model_name(model),
        "architecture_fingerprint": architecture_fingerprint(timm_model),
        "weights_fingerprint": weights_fingerprint(timm_model),
        "num_prefix_tokens": family_of(timm_model).layout().n_prefix,
        "interventions": entries,
        "tensor_sha256": _tensor_digest(tensors),
    }
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    save_file(tensors, str(path), metadata={METADATA_KEY: json.dumps(spec)})
    return path


# ---------------------------------------------------------------------------------------- reading
def load(path: PathLike) -> List[Intervention]:
    """The interventions stored in a patch file (tensors on the CPU).

    Raises:
        PatchError: unreadable, truncated or corrupted file (tensor checksum mismatch), unknown kind.
    """
    from safetensors.torch import load_file

    spec = read_spec(path)
    try:
        tensors = load_file(str(path), device="cpu")
    except Exception as e:
        raise PatchError(f"{str(path)!r}: cannot read the patch tensors (corrupt or truncated?): {e}") from e
    if _tensor_digest(tensors) != spec.get("tensor_sha256"):
        raise PatchError(f"{str(path)!r}: the patch tensors do not match their checksum; the file is corrupt")
    interventions = []
    for i, entry in enumerate(spec["interventions"]):
        cls = Intervention.registry.get(entry.get("kind"))
        if cls is None:
            raise PatchError(f"{str(path)!r}: unknown intervention kind {entry.get('kind')!r} "
                             f"(known: {sorted(Intervention.registry)}); upgrade interp")
        missing = [name for name in entry.get("tensors", []) if f"{i}.{name}" not in tensors]
        if missing:
            raise PatchError(f"{str(path)!r}: intervention entry {i} ({entry['kind']}) needs tensor(s) "
                             f"{[f'{i}.{n}' for n in missing]} that the file does not hold; the file is corrupt")
        own = {name: tensors[f"{i}.{name}"] for name in entry.get("tensors", [])}
        try:
            interventions.append(cls.from_params(dict(entry.get("params", {})), own))
        except Exception as e:  # any bad parameter of a crafted file: one line naming the entry
            raise PatchError(f"{str(path)!r}: invalid {entry.get('kind')} entry {i}: {e}") from None
    return interventions


# ---------------------------------------------------------------------------------------- applying
def plan_swaps(timm_model: nn.Module, interventions: Sequence[Intervention]) -> Tuple[
        Dict[int, List[nn.Module]], int, Dict[int, Tuple[torch.Tensor, torch.Tensor]], Any]:
    """The modules ``apply`` installs, in composition order: (MLP edits per block, extra tokens,
    extra key/values per block, pooling module or None). Raises :class:`PatchError` on conflicts."""
    ordered = composition_order(interventions)
    family = family_of(timm_model)
    base_prefix = family.layout().n_prefix
    n_extra = sum(iv.n_extra_tokens for iv in ordered)
    edits: Dict[int, List[nn.Module]] = defaultdict(list)
    extra_kv: Dict[int, Tuple[torch.Tensor, torch.Tensor]] = {}
    pool, start = None, base_prefix
    skip = family.pool_skip(n_extra)
    try:
        for iv in ordered:
            ctx = edit_context(family, base_prefix, base_prefix + n_extra, start if iv.n_extra_tokens else None)
            for layer, edit in iv.mlp_edits(ctx).items():
                edits[layer].append(edit)
            start += iv.n_extra_tokens
            extra_kv = merge_extra_kv(extra_kv, iv.extra_kv(), torch.device("cpu"))
            new_pool = iv.pool_module(skip=skip)
            if new_pool is not None:
                if pool is not None:
                    raise PatchError("two pooling interventions; a patch may hold one SelectiveCLS")
                pool = new_pool
    except PatchError:
        raise
    except InterpError as e:
        raise PatchError(f"the patch does not fit this model: {e}") from e
    return dict(edits), n_extra, extra_kv, pool


def apply_interventions(timm_model: nn.Module, interventions: Sequence[Intervention]) -> nn.Module:
    """Swap submodules of ``timm_model`` (in place) so its forward applies ``interventions``; returns it. Where
    each edit goes is the model family's business (``Family.plain_*``)."""
    from ..hooks.hooked_vit import HookedViT

    if isinstance(timm_model, HookedViT):
        raise PatchError("apply a patch to a plain timm model (timm.create_model(...)); a HookedViT applies "
                         "interventions with model.intervene(*interp.patch.load(path))")
    if getattr(timm_model, "interp_patch", None):
        raise PatchError("this model already has a patch applied; build a fresh model to apply another")
    edits, n_extra, extra_kv, pool = plan_swaps(timm_model, interventions)
    family, device = family_of(timm_model), model_device(timm_model)
    block_edits = resid_edits(timm_model, interventions)  # planned on the unpatched prefix count
    try:
        for layer, layer_edits in edits.items():
            family.plain_mlp_edits(layer, [edit.to(device) for edit in layer_edits])
        if n_extra:
            family.plain_extra_tokens(n_extra)
        for layer, kv in extra_kv.items():
            family.plain_extra_kv(layer, tuple(t.to(device) for t in kv))
        if pool is not None:
            family.plain_pool(pool.to(device))
    except InterpError as e:
        raise PatchError(f"the patch does not fit this model: {e}") from e
    for layer, edit in block_edits.items():
        family.block(layer).register_forward_hook(lambda module, args, out, edit=edit.to(device): edit(out))
    timm_model.interp_patch = [iv.kind for iv in composition_order(interventions)]
    return timm_model


def resid_edits(timm_model: nn.Module, interventions: Sequence[Intervention]) -> Dict[int, nn.Module]:
    """Block-output edits per block, composed in the order of ``model.intervene``."""
    family = family_of(timm_model)
    base_prefix = family.layout().n_prefix
    n_extra = sum(iv.n_extra_tokens for iv in interventions)
    ctx = edit_context(family, base_prefix, base_prefix + n_extra, None)
    by_layer: Dict[int, List[nn.Module]] = defaultdict(list)
    try:
        for iv in composition_order(interventions):
            for layer, edit in iv.resid_edits(ctx).items():
                by_layer[layer].append(edit)
    except InterpError as e:
        raise PatchError(f"the patch does not fit this model: {e}") from e
    return {layer: edits[0] if len(edits) == 1 else nn.Sequential(*edits) for layer, edits in by_layer.items()}


def apply(timm_model: nn.Module, path: PathLike, force: bool = False) -> nn.Module:
    """Apply the patch file ``path`` to a plain timm model (in place) and return it.

    Raises:
        PatchError: corrupt file, or a model of another architecture / other weights than the patch was
            made for (pass ``force=True`` to apply anyway).
    """
    spec = read_spec(path)
    interventions = load(path)
    if not force:
        arch = architecture_fingerprint(timm_model)
        if arch != spec.get("architecture_fingerprint"):
            raise PatchError(f"{str(path)!r} was made for {spec.get('model_name')} (architecture "
                             f"{spec.get('architecture_fingerprint')}), this model's architecture is {arch}; "
                             "load the same timm architecture (same depth, width, img_size, num_classes), "
                             "or pass force=True (CLI: --force)")
        weights = weights_fingerprint(timm_model)
        if weights != spec.get("weights_fingerprint"):
            raise PatchError(f"{str(path)!r} was made for other weights of {spec.get('model_name')} (weights "
                             f"{spec.get('weights_fingerprint')}, this model {weights}); calibrated values "
                             "would not fit. Load the weights the patch was made with, or pass force=True "
                             "(CLI: --force)")
    return apply_interventions(timm_model, interventions)


# ---------------------------------------------------------------------------------------- weight edits
def export_weights(interventions: Sequence[Intervention], model: nn.Module, path: PathLike) -> Path:
    """Fold full-token ablations into the weights and write a plain state dict (``.safetensors`` or ``.pth``).

    Setting neuron n of block l to a constant c on every token equals zeroing column n of ``fc2.weight``
    and adding ``c * fc2.weight[:, n]`` to ``fc2.bias``; the file loads into ``timm.create_model(name)``.

    Raises:
        PatchError: an intervention is not a pure weight edit (anything but ``NeuronAblation`` with
            ``tokens="all"``), or the MLP normalises its hidden layer before ``fc2``.
    """
    timm_model = _timm_module(model)
    constants: Dict[int, Dict[int, float]] = defaultdict(dict)  # block -> neuron -> value (last edit wins)
    for iv in composition_order(interventions):
        by_layer = iv.weight_constants()
        if by_layer is None:
            raise PatchError(f"{iv.kind} ({iv.params()}) is not a pure weight edit; only edits that set neurons "
                             "to constants on every token are (NeuronAblation with tokens='all'). Save it as a "
                             "patch with interp.patch.save instead")
        plan_swaps(timm_model, [iv])  # validates layers and neuron indices
        for layer, by_neuron in by_layer.items():
            constants[layer].update(by_neuron)
    state = {k: v.detach().cpu().clone() for k, v in timm_model.state_dict().items()}
    family = family_of(timm_model)
    prefixes = [prefix for prefix, _ in family.blocks()]
    for layer, by_neuron in constants.items():
        where = f"{prefixes[layer]}.mlp"
        if family.write_norms(layer)[0] is not None:
            raise PatchError(f"{where} normalises its hidden layer before fc2, so an ablation is not a "
                             "weight edit there; save it as a patch with interp.patch.save instead")
        weight = state[f"{where}.fc2.weight"]
        idx = torch.tensor(sorted(by_neuron))
        values = torch.tensor([by_neuron[n] for n in idx.tolist()], dtype=torch.float64)
        if values.abs().sum() > 0:
            bias_key = f"{where}.fc2.bias"
            if bias_key not in state:
                raise PatchError(f"{where}.fc2 has no bias to hold the mean of a mean ablation")
            state[bias_key] += (weight[:, idx].double() @ values).to(state[bias_key].dtype)
        weight[:, idx] = 0
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    note = json.dumps({"interp_weight_edit": [{"kind": iv.kind, **iv.params()} for iv in interventions],
                       "model_name": _model_name(model)})
    if path.suffix == ".safetensors":
        from safetensors.torch import save_file

        save_file(state, str(path), metadata={"format": "pt", "interp": note})
    else:
        torch.save(state, str(path))
    return path
