"""Loss recovered: how much of the model's own output an SAE keeps when its reconstruction replaces the activations.

Three forwards per batch of images: clean; with the SAE's reconstruction ``x_hat = decode(encode(x))`` spliced
in at its hook on the tokens it was trained on (``sae.tokens``); with those tokens zero-ablated at the hook. With
``d`` the distance of an edited output to the clean one (the KL divergence of the softmax of the classifier's
logits, clean first, or the mean squared distance of the embedding for a model without a classifier head)::

    loss_recovered = 1 - d(spliced) / d(zero-ablated)

1 when the reconstruction changes nothing, 0 when it is as bad as removing the tokens (SAELens' and saev's
"loss recovered" / "CE loss score" on a classifier).

Example (not run as a doctest: it needs a trained SAE)::

    interp.sae.evaluate.loss_recovered(sae, model, images)["loss_recovered"]   # e.g. 0.97
"""
from __future__ import annotations

from typing import Any, Dict

import torch

from ..errors import InterpError

def _distance(clean: torch.Tensor, edited: torch.Tensor, logits: bool) -> torch.Tensor:
    """Per image: KL(softmax(clean) || softmax(edited)) for logits, else the mean squared distance."""
    if logits:
        p = torch.log_softmax(clean.double(), -1)
        q = torch.log_softmax(edited.double(), -1)
        return (p.exp() * (p - q)).sum(-1)
    return (clean.double() - edited.double()).square().mean(-1)


@torch.no_grad()
def loss_recovered(sae, model, images: torch.Tensor, batch_size: int = 16) -> Dict[str, Any]:
    """The loss recovered of ``sae`` on ``model`` over ``images`` [N, C, H, W] (module docstring).

    Returns:
        {"loss_recovered", "distance": "kl_logits" or "mse_embedding", "spliced", "zero_ablated" (mean
        distances), "n_images", "tokens"}.
    """
    sae.check_model(model)
    rows = model.layout.rows_of(sae.tokens)  # raises for a model without that kind of token
    logits = int(getattr(getattr(model, "timm_model", model), "num_classes", 0) or 0) > 0
    spliced_sum = zero_sum = 0.0
    device = next(model.parameters()).device

    def splice(act, hook=None):
        out = act.clone()
        x = act[:, rows].float().cpu()
        out[:, rows] = sae.decode(sae.encode(x)).to(act.dtype).to(act.device)
        return out

    def zero(act, hook=None):
        out = act.clone()
        out[:, rows] = 0
        return out

    for i in range(0, len(images), batch_size):
        x = images[i:i + batch_size].to(device)
        clean = model(x)
        spliced = model.run_with_hooks(x, fwd_hooks=[(sae.hook, splice)])
        zeroed = model.run_with_hooks(x, fwd_hooks=[(sae.hook, zero)])
        spliced_sum += float(_distance(clean, spliced, logits).sum())
        zero_sum += float(_distance(clean, zeroed, logits).sum())
    n = len(images)
    if n == 0:
        raise InterpError("loss recovered needs at least one image")
    d_splice, d_zero = spliced_sum / n, zero_sum / n
    return {"loss_recovered": 1.0 - d_splice / d_zero if d_zero > 0 else None,
            "distance": "kl_logits" if logits else "mse_embedding", "spliced": d_splice, "zero_ablated": d_zero,
            "n_images": n, "tokens": sae.tokens}
