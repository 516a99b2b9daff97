"""The SAE architectures and losses, from ``overcomplete`` (the optional extra ``interp[sae]``).

=========== ======================================= ======================================
``arch``    module                                  loss
=========== ======================================= ======================================
topk        ``TopKSAE(top_k=k)``                     ``top_k_auxiliary_loss`` (MSE + AuxK)
batchtopk   ``BatchTopKSAE(top_k=k * batch)``        ``top_k_auxiliary_loss``
jumprelu    ``JumpSAE``                              ``mse_l1``
relu        ``SAE`` (linear encoder + ReLU)          ``mse_l1``
archetypal  ``RATopKSAE(points=sample, top_k=k)``    ``top_k_auxiliary_loss``
=========== ======================================= ======================================

overcomplete's BatchTopK keeps the ``top_k`` largest codes of a whole batch: ``k * batch`` keeps ``k`` per
token on average. :func:`encoder_tensors` turns a trained module into the plain tensors that
``interp.interventions.sae_features.SparseCodes`` encodes with (tested equal to the module's ``encode``).
"""
from __future__ import annotations

from functools import partial
from typing import Callable, Dict, Optional

import torch

from ..errors import InterpError
from ..interventions.sae_features import ARCHS

INSTALL_HINT = "pip install 'interp[sae]'"


def _matplotlib_alias() -> None:
    """overcomplete 0.3.0 imports its visualisation package on import, which calls ``matplotlib.cm.get_cmap``,
    removed in Matplotlib 3.9; give that name back (an alias of ``matplotlib.colormaps.get_cmap``) when missing."""
    import matplotlib
    import matplotlib.cm

    if not hasattr(matplotlib.cm, "get_cmap"):
        matplotlib.cm.get_cmap = matplotlib.colormaps.get_cmap


def overcomplete():
    """The ``overcomplete.sae`` module, or a one-line error naming the extra to install."""
    _matplotlib_alias()
    try:
        import overcomplete.sae as sae_mod
    except ImportError:
        raise InterpError(f"training sparse autoencoders needs the optional dependency overcomplete: "
                          f"{INSTALL_HINT}") from None
    return sae_mod


def build(arch: str, d: int, n_features: int, k: int, batch_size: int,
          points: Optional[torch.Tensor] = None) -> torch.nn.Module:
    """A fresh overcomplete SAE (weights from the current torch RNG)."""
    oc = overcomplete()
    if arch == "topk":
        return oc.TopKSAE(d, n_features, top_k=k)
    if arch == "batchtopk":
        return oc.BatchTopKSAE(d, n_features, top_k=k * batch_size)
    if arch == "jumprelu":
        return oc.JumpSAE(d, n_features)
    if arch == "relu":
        return oc.SAE(d, n_features)
    if arch == "archetypal":
        if points is None:
            raise InterpError("an archetypal SAE needs candidate points (a sample of the normalised tokens)")
        return oc.RATopKSAE(d, n_features, points=points, top_k=k)
    raise InterpError(f"arch must be one of {ARCHS}, got {arch!r}")


def criterion(arch: str, aux_penalty: float, l1_penalty: float) -> Callable:
    """overcomplete's loss for ``arch``: (x, x_hat, pre_codes, codes, dictionary) -> scalar."""
    losses = overcomplete().losses
    if arch in ("topk", "batchtopk", "archetypal"):
        return partial(losses.top_k_auxiliary_loss, penalty=aux_penalty)
    return partial(losses.mse_l1, penalty=l1_penalty)


def running_threshold(module) -> Optional[torch.Tensor]:
    """BatchTopK's inference threshold (a plain attribute in overcomplete, not a buffer), else None."""
    value = getattr(module, "running_threshold", None)
    return None if value is None else torch.as_tensor(value).detach().reshape(1).float()


@torch.no_grad()
def encoder_tensors(module, arch: str) -> Dict[str, torch.Tensor]:
    """w_enc [n, d], b_enc [n], dictionary [n, d] (normalised units) and the arch's threshold, as float32."""
    linear = module.encoder.final_block[0]
    was_training = module.training
    module.eval()  # fuses the dictionary (archetypal: C, W, Relax and multiplier) as overcomplete does
    out = {"w_enc": linear.weight.detach().float().clone(), "b_enc": linear.bias.detach().float().clone(),
           "dictionary": module.get_dictionary().detach().float().clone()}
    module.train(was_training)
    if arch == "batchtopk":
        threshold = running_threshold(module)
        if threshold is None:
            raise InterpError("the BatchTopK SAE has no running threshold yet (no training step was taken)")
        out["threshold"] = threshold
    elif arch == "jumprelu":
        out["threshold"] = torch.exp(module.thresholds.detach()).float().clone()
    return out
