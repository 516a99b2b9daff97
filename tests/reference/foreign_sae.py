"""Writers of SAE files in three other projects' formats, following each one's saving code, and their own forward
passes; test oracles for interp.sae.foreign (never imported by interp).

- SAELens 6.18.0 (jbloomAus/SAELens commit 91ca16cc, ``sae_lens/saes/sae.py`` ``SAE.save_model``):
  ``DIR/sae_weights.safetensors`` (the state dict: W_enc [d_in, d_sae], b_enc, W_dec [d_sae, d_in], b_dec,
  threshold for jumprelu) and ``DIR/cfg.json`` (``SAEConfig.to_dict``: d_in, d_sae, dtype, device,
  apply_b_dec_to_input, normalize_activations, reshape_activations, metadata {hook_name, model_name},
  architecture, k for topk). Encode: ``(x - b_dec * apply_b_dec_to_input) @ W_enc + b_enc``, then relu / top-k /
  ``relu(h) * (h > threshold)``; decode ``z @ W_dec + b_dec``.
- saev (OSU-NLP-Group/saev commit 86033456, ``src/saev/nn/modeling.py`` ``dump``): one JSON line ``{"schema": 2,
  "cfg": {..., "activation": {"cls", "params"}}, "commit", "lib"}`` then ``torch.save(state_dict)`` in the same
  file. Encode ``act(x @ W_enc + b_enc)`` (no b_dec subtraction), decode ``z @ W_dec + b_dec``.
- ViT-Prisma (soniajoseph/ViT-Prisma commit 6c19417, ``src/vit_prisma/sae/sae.py`` ``load_from_pretrained``
  with a separate ``config.json``; ``encode_standard``): the state dict in a ``.pt`` file beside ``config.json``
  (d_in, d_sae, architecture, activation_fn_str, activation_fn_kwargs, hook_point_layer, layer_subtype,
  model_name). Encode ``act((x - b_dec) @ W_enc + b_enc)``, decode ``z @ W_dec + b_dec``.
"""
from __future__ import annotations

import json
from pathlib import Path

import torch


def random_weights(d: int, n: int, seed: int = 0, threshold: bool = False):
    g = torch.Generator().manual_seed(seed)
    w = {"W_enc": torch.randn(d, n, generator=g) / d ** 0.5, "b_enc": torch.randn(n, generator=g) * 0.1,
         "W_dec": torch.nn.functional.normalize(torch.randn(n, d, generator=g), dim=1),
         "b_dec": torch.randn(d, generator=g)}
    if threshold:
        w["threshold"] = torch.rand(n, generator=g) * 0.2
    return w


def write_saelens(folder, w, architecture: str, hook: str, k: int = 8, apply_b_dec_to_input: bool = True):
    from safetensors.torch import save_file

    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    save_file({name: t.contiguous() for name, t in w.items()}, str(folder / "sae_weights.safetensors"))
    cfg = {"d_in": w["W_enc"].shape[0], "d_sae": w["W_enc"].shape[1], "dtype": "float32", "device": "cpu",
           "apply_b_dec_to_input": apply_b_dec_to_input, "normalize_activations": "none",
           "reshape_activations": "none", "metadata": {"hook_name": hook, "model_name": "planted_vit"},
           "architecture": architecture}
    if architecture == "topk":
        cfg.update(k=k, rescale_acts_by_decoder_norm=False)
    (folder / "cfg.json").write_text(json.dumps(cfg))
    return folder


def write_saev(path, w, activation: str = "Relu", top_k: int = 8):
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    d, n = w["W_enc"].shape
    params = {"top_k": top_k} if activation != "Relu" else {}
    header = {"schema": 2, "cfg": {"d_vit": d, "exp_factor": n // d, "n_reinit_samples": 1024,
                                   "remove_parallel_grads": True, "normalize_w_dec": True, "seed": 0,
                                   "activation": {"cls": activation, "params": params}},
              "commit": "unknown", "lib": "1.0.0"}
    with open(path, "wb") as fd:
        fd.write((json.dumps(header) + "\n").encode("utf-8"))
        torch.save({name: w[name] for name in ("W_enc", "b_enc", "W_dec", "b_dec")}, fd)
    return path


def write_vit_prisma(folder, w, layer: int, activation: str = "relu", k: int = 8):
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    torch.save({name: w[name] for name in ("W_enc", "b_enc", "W_dec", "b_dec")}, folder / "weights.pt")
    cfg = {"d_in": w["W_enc"].shape[0], "d_sae": w["W_enc"].shape[1], "architecture": "standard",
           "activation_fn_str": activation, "activation_fn_kwargs": {"k": k} if activation == "topk" else {},
           "hook_point_layer": layer, "layer_subtype": "hook_resid_post", "model_name": "planted_vit"}
    (folder / "config.json").write_text(json.dumps(cfg))
    return folder / "weights.pt"


def forward(w, x, kind: str, subtract_b_dec: bool, k: int = 8):
    """(codes, reconstruction) the way the three projects compute them."""
    h = (x - w["b_dec"] if subtract_b_dec else x) @ w["W_enc"] + w["b_enc"]
    if kind == "relu":
        z = torch.relu(h)
    elif kind == "topk":
        top = torch.topk(h, k, dim=-1)
        z = torch.zeros_like(h).scatter(-1, top.indices, torch.relu(top.values))
    else:  # jumprelu
        z = torch.relu(h) * (h > w["threshold"])
    return z, z @ w["W_dec"] + w["b_dec"]
