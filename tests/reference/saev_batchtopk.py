"""saev's current SAE file and its eval forward, transcribed as a test oracle for interp.sae.foreign (never
imported by interp).

Reference: OSU-NLP-Group/saev, ``src/saev/nn/modeling.py`` at commit 3d73f1f7122738563404e4c50a98d897aa18a7d0
(March 2026; the inference threshold came in ce1add2f, Nov 2025):

- ``dump``: one JSON line ``{"schema": 5, "cfg": {d_model, d_sae, activation: {"cls", "params"}, reinit_blend,
  reinit_enc_dec_tranpose, remove_parallel_grads, normalize_w_dec}, "commit", "lib"}`` (``SCHEMA_VERSION = 5``;
  ``_serialize_dataclass`` writes every field of the activation's dataclass, nested ones as ``{cls, params}``),
  then ``torch.save(sae.state_dict())`` into the same file. The state dict holds ``W_dec [d_sae, d_model]``,
  ``b_dec [d_model]``, ``W_enc [d_model, d_sae]``, ``b_enc [d_sae]`` and, for BatchTopK, the activation's buffer
  ``activation.threshold`` (a 0-dim tensor).
- ``load``: schemas absent, 1, 2-4 and 5 are read; any other raises "Unknown schema version".
- ``SparseAutoencoder.encode``: ``h_x = x @ W_enc + b_enc``, ``f_x = activation(h_x)``; ``decode`` with no
  prefixes: ``f_x @ W_dec + b_dec``.
- ``BatchTopKActivation.forward`` in eval (``not self.training``): ``threshold <= 0`` -> ``where(x > 0, x, 0)``,
  else ``where(x > threshold, x, 0)``, each element on its own (no top-k at all).
- ``TopKActivation.forward``: ``topk(x, min(top_k, d_sae))``'s positions kept as they are (``mask * x``),
  ``ReluActivation``: ``relu(x)``.
"""
from __future__ import annotations

import json
from pathlib import Path

import torch

SCHEMA_VERSION = 5


def _params(activation: str, top_k: int) -> dict:
    """``_serialize_dataclass`` of saev's activation config (Relu / TopK / BatchTopK with their defaults)."""
    aux = {"cls": "AuxK", "params": {"key": "auxk", "k_aux": 512, "alpha": 1 / 32}}
    none = {"cls": "NoSparsity", "params": {"key": "no-sparsity"}}
    if activation == "Relu":
        return {"key": "relu", "sparsity": {"cls": "L1Sparsity", "params": {"key": "l1-sparsity", "coeff": 4e-4}},
                "aux": {"cls": "NoAux", "params": {"key": "no-aux"}}}
    if activation == "TopK":
        return {"key": "top-k", "top_k": top_k, "sparsity": none, "aux": aux}
    return {"key": "batch-top-k", "top_k": top_k, "sparsity": none, "momentum": 0.1, "aux": aux}


def write_saev(path, w, activation: str = "BatchTopK", top_k: int = 8, threshold=None, schema=SCHEMA_VERSION,
               header_edits=None) -> Path:
    """``dump`` of an SAE with weights ``w`` (W_enc, b_enc, W_dec, b_dec); BatchTopK's buffer
    ``activation.threshold`` is ``threshold`` (left out when None, as files before Nov 2025)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    d, n = w["W_enc"].shape
    cfg = {"d_model": d, "d_sae": n, "activation": {"cls": activation, "params": _params(activation, top_k)},
           "reinit_blend": 0.8, "reinit_enc_dec_tranpose": True, "remove_parallel_grads": True,
           "normalize_w_dec": True}
    header = {"schema": schema, "cfg": cfg, "commit": "3d73f1f7", "lib": "1.2.0", **(header_edits or {})}
    state = {name: w[name] for name in ("W_dec", "b_dec", "W_enc", "b_enc")}
    if threshold is not None:
        state["activation.threshold"] = torch.tensor(float(threshold))
    with open(path, "wb") as fd:
        fd.write((json.dumps(header) + "\n").encode("utf-8"))
        torch.save(state, fd)
    return path


def eval_forward(w, x, activation: str, top_k: int = 8, threshold: float = 0.0):
    """(codes, reconstruction) of saev's ``SparseAutoencoder`` in eval mode."""
    h = x @ w["W_enc"] + w["b_enc"]
    if activation == "Relu":
        f = torch.relu(h)
    elif activation == "TopK":
        _, idxs = torch.topk(h, min(top_k, h.shape[-1]), dim=-1, sorted=False)
        f = torch.zeros_like(h).scatter(-1, idxs, 1.0) * h
    elif threshold <= 0:
        f = torch.where(h > 0, h, torch.zeros_like(h))
    else:
        f = torch.where(h > threshold, h, torch.zeros_like(h))
    return f, f @ w["W_dec"] + w["b_dec"]
