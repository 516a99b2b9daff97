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
saev         ``FILE.pt``: one JSON header line, then      saev (``nn.modeling.dump``, schemas 2-5): cfg.activation
             ``torch.save(state_dict)``                    {cls, params} Relu, TopK (params.top_k; its top-k kept
                                                          signed: codes topk_signed) or BatchTopK with
                                                          its inference threshold ``activation.threshold``; encodes
                                                          x without subtracting b_dec; no hook recorded (--hook)
vit_prisma   ``DIR/config.json`` + a ``.pt`` state dict   ViT-Prisma (``SparseAutoencoder.load_from_pretrained``'s
                                                          separate config): activation_fn_str relu / topk
                                                          (activation_fn_kwargs.k); subtracts b_dec; hook_point
============ =========================================== ============================================================

saev's BatchTopK keeps, in eval, every pre-activation strictly above its one running threshold (all positive ones
when the threshold is <= 0): imported as ``arch`` batchtopk with ``codes`` jumprelu (strict ``>``) and that
threshold; a BatchTopK file without it (saev before Nov 2025, whose eval was a top-k over the whole batch), a
schema other than 2-5 and a state dict with other tensors are refused.

Every file is opened through :func:`interp.paths.check_input_path` (no FIFO, device or socket) and JSON
configurations are read up to :data:`interp.paths.MAX_CONFIG_BYTES`; every refusal of the files is one
:class:`~interp.errors.UsageError` line (exit status 2). The converted SAE passes the loader's own checks
(:func:`interp.sae.model.loader_problem`) before anything is written.

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
from ..errors import InterpError, UsageError
from ..hooks.names import block_hook
from ..paths import MAX_CONFIG_BYTES, check_input_path, read_config_json
from .model import save_problem

FORMATS = ("saelens", "saev", "vit_prisma")
SAEV_SCHEMAS = (2, 3, 4, 5)  # saev's dump: cfg.activation is {"cls", "params"} (saev's load reads 2-5 alike)
SAEV_THRESHOLD = "activation.threshold"  # BatchTopKActivation's buffer: the inference threshold (Nov 2025 on)
_TYPE_NAMES = {str: "a string", int: "a whole number", bool: "true/false", dict: "an object", float: "a number",
               type(None): "null"}


def _bad(path, why: str) -> UsageError:
    return UsageError(f"{str(path)!r} is not a readable SAE file of that format ({why})")


def _field(cfg: Dict[str, Any], key: str, kinds: tuple, default, path) -> Any:
    """``cfg[key]`` (``default`` when absent) if it is one of the JSON ``kinds``; a one-line refusal otherwise
    (true/false is never read as a number)."""
    value = cfg.get(key, default)
    if isinstance(value, bool) and bool not in kinds or not isinstance(value, kinds):
        wanted = " or ".join(_TYPE_NAMES.get(k, k.__name__) for k in kinds)
        raise _bad(path, f"{key} is {json.dumps(value)[:40]}, not {wanted}")
    return value


def _json(path: Path) -> Dict[str, Any]:
    try:
        return read_config_json(path, "the SAE configuration")
    except UsageError as e:
        if not Path(path).exists():
            raise _bad(path, "missing") from None
        raise e from None


def _tensors(state, path) -> Dict[str, torch.Tensor]:
    if not isinstance(state, dict) or not all(isinstance(k, str) and isinstance(v, torch.Tensor)
                                              for k, v in state.items()):
        raise _bad(path, f"{type(state).__name__}, not a state dict of named tensors")
    return state


def _weights(path: Path) -> Dict[str, torch.Tensor]:
    check_input_path(path, "the SAE weights")
    if not Path(path).is_file():
        raise _bad(path, "missing weights file")
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
    return _tensors(state, path)


def _saelens(source: Path) -> Tuple[Dict[str, torch.Tensor], Dict[str, Any]]:
    path = source / "cfg.json"
    cfg = _json(path)
    arch = _field(cfg, "architecture", (str,), "standard", path)
    if _field(cfg, "normalize_activations", (str, type(None)), "none", path) not in ("none", None):
        raise _bad(source, f"normalize_activations {cfg['normalize_activations']!r}: its scaling factor is not in "
                           "these files; only 'none' is read")
    if _field(cfg, "rescale_acts_by_decoder_norm", (bool, type(None)), False, path):
        raise _bad(source, "rescale_acts_by_decoder_norm is not read")
    kinds = {"standard": "relu", "topk": "topk", "jumprelu": "jumprelu"}
    if arch not in kinds:
        raise _bad(source, f"architecture {arch!r}; read: {sorted(kinds)}")
    meta = _field(cfg, "metadata", (dict, type(None)), None, path) or {}
    kwargs = _field(cfg, "activation_fn_kwargs", (dict, type(None)), None, path) or {}
    k = _field(cfg, "k", (int, type(None)), None, path)
    k = _field(kwargs, "k", (int, type(None)), None, path) if k is None else k
    hook = _field(meta, "hook_name", (str, type(None)), None, path) or _field(cfg, "hook_name", (str, type(None)),
                                                                              None, path)
    return _weights(source / "sae_weights.safetensors"), {
        "arch": kinds[arch], "k": k, "subtract_b_dec": _field(cfg, "apply_b_dec_to_input", (bool,), True, path),
        "hook": hook, "model_name": _field(meta, "model_name", (str, type(None)), None, path)}


def _saev_file(source: Path) -> Tuple[Dict[str, Any], Any]:
    """(header, state) of saev's dump: one JSON line (bounded), then ``torch.save(state_dict)``."""
    check_input_path(source, "the saev file")
    try:
        with open(source, "rb") as fd:
            line = fd.readline(MAX_CONFIG_BYTES + 1)
            header = json.loads(line) if line.endswith(b"\n") else None
            buffer = io.BytesIO(fd.read())
        state = torch.load(buffer, map_location="cpu", weights_only=True) if isinstance(header, dict) else None
    except Exception as e:  # not a saev dump
        raise _bad(source, f"{type(e).__name__}: saev writes a JSON header line then a state dict") from None
    if not isinstance(header, dict):
        raise _bad(source, "no JSON object on its first line: saev writes a JSON header line then a state dict")
    return header, state


def _saev(source: Path) -> Tuple[Dict[str, torch.Tensor], Dict[str, Any]]:
    header, state = _saev_file(source)
    schema = header.get("schema")
    if isinstance(schema, bool) or schema not in SAEV_SCHEMAS:
        raise _bad(source, f"saev schema {json.dumps(schema)[:20]}; this interp reads schemas "
                           f"{SAEV_SCHEMAS[0]}-{SAEV_SCHEMAS[-1]}: load and dump it with a current saev")
    cfg = _field(header, "cfg", (dict,), None, source)
    activation = _field(cfg, "activation", (dict,), None, source)
    name = _field(activation, "cls", (str,), None, source)
    params = _field(activation, "params", (dict,), None, source)
    kinds = {"Relu": "relu", "TopK": "topk", "BatchTopK": "batchtopk"}
    if name not in kinds:
        raise _bad(source, f"activation {name!r}; read: {sorted(kinds)}")
    k = _field(params, "top_k", (int,), None, source) if name != "Relu" else None
    state = _tensors(state, source)
    known = {"W_enc", "b_enc", "W_dec", "b_dec"} | ({SAEV_THRESHOLD} if name == "BatchTopK" else set())
    if set(state) - known:
        raise _bad(source, f"tensor(s) {sorted(set(state) - known)} that a saev {name} does not hold")
    if name == "BatchTopK" and SAEV_THRESHOLD not in state:
        raise _bad(source, f"a BatchTopK without {SAEV_THRESHOLD} (saev before its inference threshold, Nov 2025: "
                           "its eval was a top-k over the whole batch, which no per-token rule reproduces)")
    if name == "BatchTopK" and state[SAEV_THRESHOLD].numel() != 1:
        raise _bad(source, f"{SAEV_THRESHOLD} has shape {list(state[SAEV_THRESHOLD].shape)}, not one number")
    info = {"arch": kinds[name], "k": k, "subtract_b_dec": False, "hook": None, "model_name": None}
    if name == "TopK":  # keeps topk(x)'s positions as they are: negative ones too when fewer than k are positive
        info["codes"] = "topk_signed"
    if name == "BatchTopK":  # eval: x where x > threshold (> 0 when threshold <= 0), strictly: jumprelu's rule
        info.update(codes="jumprelu", threshold=state[SAEV_THRESHOLD].float().reshape(1))
    return state, info


def _vit_prisma(source: Path) -> Tuple[Dict[str, torch.Tensor], Dict[str, Any]]:
    folder = source if source.is_dir() else source.parent
    path = folder / "config.json"
    cfg = _json(path)
    weights = source if not source.is_dir() else next(iter(sorted(folder.glob("*.pt"))), None)
    if weights is None:
        raise _bad(folder, "no .pt weights file beside config.json")
    arch = _field(cfg, "architecture", (str,), "standard", path)
    if arch != "standard":
        raise _bad(source, f"architecture {arch!r}; read: standard")
    if _field(cfg, "normalize_activations", (str, type(None)), None, path) not in (None, "none"):
        raise _bad(source, f"normalize_activations {cfg['normalize_activations']!r} is not read")
    kinds = {"relu": "relu", "topk": "topk"}
    fn = _field(cfg, "activation_fn_str", (str,), "relu", path)
    if fn not in kinds:
        raise _bad(source, f"activation_fn_str {fn!r}; read: {sorted(kinds)}")
    hook = _field(cfg, "hook_point", (str, type(None)), None, path)
    layer = _field(cfg, "hook_point_layer", (int, type(None)), None, path)
    if hook is None and layer is not None:
        hook = block_hook(layer, _field(cfg, "layer_subtype", (str,), "hook_resid_post", path))
    kwargs = _field(cfg, "activation_fn_kwargs", (dict, type(None)), None, path) or {}
    return _weights(weights), {"arch": kinds[fn], "k": _field(kwargs, "k", (int, type(None)), None, path),
                               "subtract_b_dec": True, "hook": hook,
                               "model_name": _field(cfg, "model_name", (str, type(None)), None, path)}


READERS = {"saelens": _saelens, "saev": _saev, "vit_prisma": _vit_prisma}


def _matrices(state: Dict[str, torch.Tensor], info: Dict[str, Any], source) -> Tuple[torch.Tensor, ...]:
    """W_enc [d, n], b_enc [n], W_dec [n, d], b_dec [d] as float32, or a one-line refusal."""
    missing = [n for n in ("W_enc", "b_enc", "W_dec", "b_dec") if n not in state]
    if info["arch"] == "jumprelu" and "threshold" not in state:
        missing.append("threshold")
    if missing:
        raise _bad(source, f"missing tensor(s) {missing}")
    ints = [f"{name} ({str(t.dtype).replace('torch.', '')})" for name, t in state.items() if not t.is_floating_point()]
    if ints:
        raise _bad(source, f"tensor(s) {', '.join(ints)} are not floating point; SAE weights are floats")
    w_enc, b_enc = state["W_enc"].float(), state["b_enc"].float()
    w_dec, b_dec = state["W_dec"].float(), state["b_dec"].float()
    if w_enc.ndim != 2:
        raise _bad(source, f"W_enc has shape {list(w_enc.shape)}, not [d, n_features]")
    d, n = w_enc.shape
    if w_dec.shape != (n, d) or b_enc.shape != (n,) or b_dec.shape != (d,):
        raise _bad(source, f"shapes W_enc {list(w_enc.shape)}, b_enc {list(b_enc.shape)}, W_dec "
                           f"{list(w_dec.shape)}, b_dec {list(b_dec.shape)} do not fit")
    return w_enc, b_enc, w_dec, b_dec


def convert(fmt: str, source, model, *, hook: Optional[str] = None, tokens: str = "patches") -> Tuple[Dict, Dict]:
    """(interp ``sae.json`` content, tensors) of the foreign SAE ``source`` for ``model``; ``hook`` overrides
    (saev: required) the one the files name.

    Raises:
        UsageError (one line): files that are not the format's, or that convert into an SAE interp's loader
            refuses (non-finite weights, a k or threshold that does not fit); InterpError: no hook, another width.
    """
    if fmt not in READERS:
        raise InterpError(f"format must be one of {list(FORMATS)}, got {fmt!r}")
    source = Path(source)
    check_input_path(source, "the SAE source", folder_ok=True)
    if not source.exists():
        raise InterpError(f"{str(source)!r} does not exist")
    state, info = READERS[fmt](source)
    w_enc, b_enc, w_dec, b_dec = _matrices(_tensors(state, source), info, source)
    d, n = w_enc.shape
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
    if "threshold" in info:
        tensors["threshold"] = info["threshold"]
    layout = model.layout
    config = {"arch": info["arch"], "k": info["k"] if info["arch"] in ("topk", "batchtopk") else None,
              "n_features": n, "d": d, "hook": hook, "model": model_fingerprints(model), "tokens": tokens,
              "high_norm": "include", "layout": {"cls_index": layout.cls_index, "n_registers": layout.n_registers},
              "imported_from": {"format": fmt, "path": str(source), "model_name": info["model_name"],
                                "feature_means": "unknown: zeros (--mode mean equals zero ablation)"},
              "metrics": {}, "warnings": []}
    if "codes" in info:
        config["codes"] = info["codes"]
    check_loadable(config, tensors, source)
    return config, tensors


def check_loadable(config: Dict[str, Any], tensors: Dict[str, torch.Tensor], source) -> None:
    """Refuse (one line) a converted SAE that :func:`interp.sae.load` would refuse once written
    (:func:`interp.sae.model.save_problem`)."""
    problem = save_problem(config, tensors)
    if problem:
        raise _bad(source, f"interp's loader would refuse it: {problem}")
