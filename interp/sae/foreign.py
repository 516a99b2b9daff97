"""SAEs trained elsewhere, converted to interp's files (``interp sae import``): SAELens, saev and ViT-Prisma.

Each format is read from its own files (no package of the other project needed) and written as an interp SAE
folder (``sae.json`` + ``sae.safetensors``), so ``sae-features``, ``study ablate --sae`` and ``patch export --sae``
run on it. The three share one arithmetic: ``z = act((x - b_pre) @ W_enc + b_enc)``, ``x_hat = z @ W_dec +
b_dec`` with ``W_enc [d, n]``, ``W_dec [n, d]``; interp's is ``z = rule(relu(((x - mean) / scale) @ w_enc.T +
b_enc))``, ``x_hat = mean + scale * z @ dictionary``. The conversion: ``scale = 1``, ``mean = b_dec``,
``w_enc = W_enc.T``, ``dictionary = W_dec`` and, when the format does not subtract ``b_dec`` before encoding,
``b_enc + b_dec @ W_enc`` as the encoder bias (the same pre-activations).

============ =========================================== ============================================================
format       files (the project's saving code)            read
============ =========================================== ============================================================
saelens      ``DIR/cfg.json`` + ``DIR/sae_weights         SAELens 6.18 (``SAE.save_model``): architecture standard
             .safetensors``                               (relu), topk (k), jumprelu (threshold [n]);
                                                          apply_b_dec_to_input; metadata.hook_name
saev         ``FILE.pt``: one JSON header line, then      saev (``nn.modeling.dump``, schema 2): cfg.activation Relu,
             ``torch.save(state_dict)``                    TopK / BatchTopK (per-token top_k at inference); encodes x
                                                          without subtracting b_dec; no hook recorded (--hook)
vit_prisma   ``DIR/config.json`` + a ``.pt`` state dict   ViT-Prisma (``SparseAutoencoder.load_from_pretrained``'s
                                                          separate config): activation_fn_str relu / topk
                                                          (activation_fn_kwargs.k); subtracts b_dec; hook_point
============ =========================================== ============================================================

Formats that normalise activations at run time with a factor not stored in these files (SAELens
``normalize_activations`` other than ``none``, ViT-Prisma's ``normalize_activations``), gated SAEs and SAELens'
``rescale_acts_by_decoder_norm`` are refused in one line. An imported SAE has no mean codes (``feature_means``
are 0: ``--mode mean`` equals zero ablation) and no training metrics; ``sae.json`` records ``imported_from``.
"""
from __future__ import annotations

import io
import json
from pathlib import Path
from typing import Any, Dict, Optional, Tuple

import torch

from ..cache.format import model_fingerprints
from ..errors import InterpError
from ..hooks.names import block_hook
from .model import save

FORMATS = ("saelens", "saev", "vit_prisma")


def _bad(path, why: str) -> InterpError:
    return InterpError(f"{str(path)!r} is not a readable SAE file of that format ({why})")


def _json(path: Path) -> Dict[str, Any]:
    try:
        data = json.loads(Path(path).read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, ValueError, RecursionError) as e:
        raise _bad(path, type(e).__name__) from None
    if not isinstance(data, dict):
        raise _bad(path, "not a JSON object")
    return data


def _weights(path: Path) -> Dict[str, torch.Tensor]:
    if str(path).endswith(".safetensors"):
        from safetensors.torch import load_file

        try:
            return load_file(str(path))
        except Exception as e:  # safetensors raises its own error types
            raise _bad(path, type(e).__name__) from None
    try:
        state = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as e:  # a pickled object of the other project, or a damaged file
        raise _bad(path, f"{type(e).__name__}: a plain tensor state dict is needed") from None
    if isinstance(state, dict) and "state_dict" in state:
        state = state["state_dict"]
    return state


def _saelens(source: Path) -> Tuple[Dict[str, torch.Tensor], Dict[str, Any]]:
    cfg = _json(source / "cfg.json")
    arch = cfg.get("architecture", "standard")
    if cfg.get("normalize_activations", "none") not in ("none", None):
        raise _bad(source, f"normalize_activations {cfg['normalize_activations']!r}: its scaling factor is not in "
                           "these files; only 'none' is read")
    if cfg.get("rescale_acts_by_decoder_norm"):
        raise _bad(source, "rescale_acts_by_decoder_norm is not read")
    kinds = {"standard": "relu", "topk": "topk", "jumprelu": "jumprelu"}
    if arch not in kinds:
        raise _bad(source, f"architecture {arch!r}; read: {sorted(kinds)}")
    meta = cfg.get("metadata") or {}
    k = cfg.get("k") or (cfg.get("activation_fn_kwargs") or {}).get("k")
    return _weights(source / "sae_weights.safetensors"), {
        "arch": kinds[arch], "k": k, "subtract_b_dec": bool(cfg.get("apply_b_dec_to_input", True)),
        "hook": meta.get("hook_name") or cfg.get("hook_name"), "model_name": meta.get("model_name")}


def _saev(source: Path) -> Tuple[Dict[str, torch.Tensor], Dict[str, Any]]:
    try:
        with open(source, "rb") as fd:
            header = json.loads(fd.readline())
            buffer = io.BytesIO(fd.read())
        state = torch.load(buffer, map_location="cpu", weights_only=True)
    except Exception as e:  # not a saev dump
        raise _bad(source, f"{type(e).__name__}: saev writes a JSON header line then a state dict") from None
    cfg = header.get("cfg", header) if isinstance(header, dict) else {}
    activation = cfg.get("activation") or {"cls": "Relu", "params": {}}
    name = activation.get("cls") if isinstance(activation, dict) else "Relu"
    kinds = {"Relu": "relu", "TopK": "topk", "BatchTopK": "topk"}  # saev's BatchTopK keeps top_k per token
    if name not in kinds:
        raise _bad(source, f"activation {name!r}; read: {sorted(kinds)}")
    k = (activation.get("params") or {}).get("top_k") if kinds[name] == "topk" else None
    return state, {"arch": kinds[name], "k": k, "subtract_b_dec": False, "hook": None, "model_name": None}


def _vit_prisma(source: Path) -> Tuple[Dict[str, torch.Tensor], Dict[str, Any]]:
    folder = source if source.is_dir() else source.parent
    cfg = _json(folder / "config.json")
    weights = source if source.is_file() else next(iter(sorted(folder.glob("*.pt"))), None)
    if weights is None:
        raise _bad(folder, "no .pt weights file beside config.json")
    if cfg.get("architecture", "standard") != "standard":
        raise _bad(source, f"architecture {cfg.get('architecture')!r}; read: standard")
    if cfg.get("normalize_activations") not in (None, "none"):
        raise _bad(source, f"normalize_activations {cfg['normalize_activations']!r} is not read")
    kinds = {"relu": "relu", "topk": "topk"}
    fn = cfg.get("activation_fn_str", "relu")
    if fn not in kinds:
        raise _bad(source, f"activation_fn_str {fn!r}; read: {sorted(kinds)}")
    hook = cfg.get("hook_point")
    if hook is None and cfg.get("hook_point_layer") is not None:
        hook = block_hook(cfg["hook_point_layer"], cfg.get("layer_subtype", "hook_resid_post"))
    return _weights(weights), {"arch": kinds[fn], "k": (cfg.get("activation_fn_kwargs") or {}).get("k"),
                               "subtract_b_dec": True, "hook": hook, "model_name": cfg.get("model_name")}


READERS = {"saelens": _saelens, "saev": _saev, "vit_prisma": _vit_prisma}


def convert(fmt: str, source, model, *, hook: Optional[str] = None, tokens: str = "patches") -> Tuple[Dict, Dict]:
    """(interp ``sae.json`` content, tensors) of the foreign SAE ``source`` for ``model``; ``hook`` overrides
    (saev: required) the one the files name."""
    if fmt not in READERS:
        raise InterpError(f"format must be one of {list(FORMATS)}, got {fmt!r}")
    source = Path(source)
    if not source.exists():
        raise InterpError(f"{str(source)!r} does not exist")
    state, info = READERS[fmt](source)
    missing = [n for n in ("W_enc", "b_enc", "W_dec", "b_dec") if n not in state]
    if info["arch"] == "jumprelu" and "threshold" not in state:
        missing.append("threshold")
    if missing:
        raise _bad(source, f"missing tensor(s) {missing}")
    w_enc, b_enc = state["W_enc"].float(), state["b_enc"].float()
    w_dec, b_dec = state["W_dec"].float(), state["b_dec"].float()
    d, n = w_enc.shape
    if w_dec.shape != (n, d) or b_enc.shape != (n,) or b_dec.shape != (d,):
        raise _bad(source, f"shapes W_enc {tuple(w_enc.shape)}, W_dec {tuple(w_dec.shape)} do not fit")
    if info["arch"] in ("topk",) and not isinstance(info["k"], int):
        raise _bad(source, "a TopK SAE without its k")
    hook = hook or info["hook"]
    if not hook:
        raise InterpError(f"the {fmt} files name no hook: give --hook (e.g. blocks.9.hook_resid_post)")
    model.resolve_hooks([hook])
    if d != model.d_model:
        raise InterpError(f"the SAE reads vectors of width {d}; {model.model_name} has width {model.d_model}")
    # interp subtracts `mean` before encoding: keep the same pre-activations when the format does not
    bias = b_enc if info["subtract_b_dec"] else b_enc + b_dec @ w_enc
    tensors = {"w_enc": w_enc.T.contiguous(), "b_enc": bias, "dictionary": w_dec.contiguous(), "mean": b_dec,
               "scale": torch.ones(1), "feature_means": torch.zeros(n)}
    if info["arch"] == "jumprelu":
        tensors["threshold"] = state["threshold"].float()
    layout = model.layout
    config = {"arch": info["arch"], "k": info["k"] if info["arch"] == "topk" else None, "n_features": n, "d": d,
              "hook": hook, "model": model_fingerprints(model), "tokens": tokens, "high_norm": "include",
              "layout": {"cls_index": layout.cls_index, "n_registers": layout.n_registers},
              "imported_from": {"format": fmt, "path": str(source), "model_name": info["model_name"],
                                "feature_means": "unknown: zeros (--mode mean equals zero ablation)"},
              "metrics": {}, "warnings": []}
    return config, tensors


def import_sae(fmt: str, source, out, model, *, hook: Optional[str] = None, tokens: str = "patches") -> Path:
    """Convert ``source`` (:func:`convert`) and write it as an interp SAE folder ``out``."""
    config, tensors = convert(fmt, source, model, hook=hook, tokens=tokens)
    Path(out).mkdir(parents=True, exist_ok=True)
    return save(out, config, tensors)
