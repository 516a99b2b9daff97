"""Loss recovered: how much of the model's own output an SAE keeps when its reconstruction replaces the activations.

Three forwards per batch of images: clean; with the SAE's reconstruction ``x_hat = decode(encode(x))`` spliced
in at its hook on the tokens it was trained on (``sae.tokens``); with those tokens zero-ablated at the hook. With
``d`` the distance of an edited output to the clean one (the KL divergence of the softmax of the classifier's
logits, clean first, or the mean squared distance of the embedding for a model without a classifier head)::

    loss_recovered = 1 - d(spliced) / d(zero-ablated)

1 when the reconstruction changes nothing, 0 when it is as bad as removing the tokens (SAELens' and saev's
"loss recovered" / "CE loss score" on a classifier). A classification head of random weights (a planted model,
``pretrained=False``) classifies nothing, as every study says (:func:`~interp.models.classifiers.heads.classify_head`): its
KL would be a number about nothing, so ``d`` is then the mean squared distance of the pooled vector the head
reads (``hook_pooled``; ``distance`` "mse_pooled", and ``note`` says why).

Example (not run as a doctest: it needs a trained SAE)::

    interp.sae.evaluate.loss_recovered(sae, model, images)["loss_recovered"]   # e.g. 0.97
"""
from __future__ import annotations

from pathlib import Path
from typing import Any, Dict, List

import torch

from ..cache.image_feed import image_feed
from ..errors import InterpError
from ..models import data_config
from ..models.classifiers.heads import classify_head
from .data import CacheRows, LiveRows

def _distance(clean: torch.Tensor, edited: torch.Tensor, logits: bool) -> torch.Tensor:
    """Per image: KL(softmax(clean) || softmax(edited)) for logits, else the mean squared distance."""
    if logits:
        p = torch.log_softmax(clean.double(), -1)
        q = torch.log_softmax(edited.double(), -1)
        return (p.exp() * (p - q)).sum(-1)
    return (clean.double() - edited.double()).square().mean(-1)


@torch.no_grad()
def loss_recovered(sae, model, images, batch_size: int = 16) -> Dict[str, Any]:
    """The loss recovered of ``sae`` on ``model`` over ``images`` [N, C, H, W], or an iterable of such batches
    (module docstring). The SAE runs on the model's device.

    Returns:
        {"loss_recovered", "distance": "kl_logits" or "mse_embedding", "spliced", "zero_ablated" (mean
        distances), "n_images", "tokens"}.
    """
    sae.check_model(model)
    rows = model.layout.rows_of(sae.tokens)  # raises for a model without that kind of token
    logits = int(getattr(getattr(model, "timm_model", model), "num_classes", 0) or 0) > 0
    kind, why = classify_head(model, random_weights=getattr(model, "init_seed", None) is not None)
    pooled = logits and kind != "classifier"  # class logits of random weights mean nothing: read what they read
    logits = logits and not pooled
    spliced_sum = zero_sum = 0.0
    n = 0
    device = next(model.parameters()).device
    on_device = sae.to(device)

    def splice(act, hook=None):
        out = act.clone()
        out[:, rows] = on_device.decode(on_device.encode(act[:, rows])).to(act.dtype)
        return out

    def zero(act, hook=None):
        out = act.clone()
        out[:, rows] = 0
        return out

    batches = images
    if isinstance(images, torch.Tensor):
        batches = [images[i:i + batch_size] for i in range(0, len(images), batch_size)]
    def output(x, edit):
        """The model's output for ``x`` with ``edit`` at the SAE's hook (None: clean), or its pooled vector."""
        seen = {}
        hooks = [(sae.hook, edit)] if edit is not None else []
        if pooled:
            hooks.append(("hook_pooled", lambda act, hook=None: seen.__setitem__("pooled", act)))
        out = model.run_with_hooks(x, fwd_hooks=hooks)
        return seen["pooled"] if pooled else out

    for batch in batches:
        x = batch.to(device)
        clean, spliced, zeroed = output(x, None), output(x, splice), output(x, zero)
        spliced_sum += float(_distance(clean, spliced, logits).sum())
        zero_sum += float(_distance(clean, zeroed, logits).sum())
        n += len(x)
    if n == 0:
        raise InterpError("loss recovered needs at least one image")
    d_splice, d_zero = spliced_sum / n, zero_sum / n
    return {"loss_recovered": 1.0 - d_splice / d_zero if d_zero > 0 else None,
            "distance": "kl_logits" if logits else "mse_pooled" if pooled else "mse_embedding",
            "spliced": d_splice, "zero_ablated": d_zero, "n_images": n, "tokens": sae.tokens,
            **({"note": f"measured on the pooled vector, not the logits: {why}"} if pooled else {})}


MAX_HELD_OUT_IMAGES = 256  # loss recovered at the end of training: on at most this many held-out images


def _held_out_feed(rows, model, picked: List[int]):
    """The images behind activation rows, or (None, why): a live run's own images; a cache's when the ids of the
    ``picked`` rows are image files, decoded with the model's own preprocessing."""
    if isinstance(rows, LiveRows):
        return rows.source, None
    if not isinstance(rows, CacheRows):
        return None, "the activations come without their images"
    ids = rows.reader.ids
    if not all(Path(ids[i]).is_file() for i in picked):
        return None, "the cache's image ids are not image files here (a cache written from tensors, or moved)"
    recorded = rows.reader.meta.get("data_config")
    own = {k: (list(v) if isinstance(v, tuple) else v) for k, v in data_config(model).items()}
    if recorded is not None and recorded != own:
        return None, "the cache was written with another preprocessing than the model's own"
    return image_feed(list(ids), model), None


@torch.no_grad()
def held_out_loss_recovered(sae, model, rows, held_out, batch_size: int = 16) -> Dict[str, Any]:
    """:func:`loss_recovered` on the first ``MAX_HELD_OUT_IMAGES`` of the held-out images ``held_out`` (indices of
    ``rows``, an ``ActivationRows``), or ``{"loss_recovered": None, "note": why}`` when their images are not at
    hand (a cache of tensors) or none is held out."""
    picked = [int(i) for i in held_out[:MAX_HELD_OUT_IMAGES]]
    if not picked:
        return {"loss_recovered": None, "note": "no held-out image"}
    feed, why = _held_out_feed(rows, model, picked)
    if feed is None:
        return {"loss_recovered": None, "note": why}

    def batches():
        for i in range(0, len(picked), batch_size):
            pixels = [feed.load(j, j + 1).pixels for j in picked[i:i + batch_size]]
            pixels = [p for p in pixels if p is not None]  # an image gone unreadable since: left out
            if pixels:
                yield torch.cat(pixels)

    try:
        return loss_recovered(sae, model, batches())
    except InterpError as e:
        return {"loss_recovered": None, "note": str(e)}
