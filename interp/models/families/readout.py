"""The readout after a plain-stack model's last block, split into what is linear and the norms around it: what the
logit lens reads an intermediate block through, and what direct logit attribution decomposes the logits along.

timm's ``VisionTransformer`` and ``Eva`` read their output the same way: ``norm`` on every token, ``pool`` (the CLS
row, ``"token"``, or the mean of the patch rows, ``"avg"``), ``fc_norm`` on the pooled vector (-> ``hook_pooled``),
then ``head`` (a ``Linear``, or ``Identity`` when the model has none). Pooling and head are linear, so once each
norm's scale is frozen from the full residual stream (TransformerLens's ``apply_ln_to_stack`` convention: a
component is centred, for a LayerNorm, and divided by the scale the whole stream had) the logits are a sum of
per-component terms plus one constant (the norms' biases and the head's bias).

>>> readout = final_readout(model.family)            # a ViT/Eva family; pyramids are refused in one line
>>> names, last = model.block_names, model.n_layers - 1
>>> parts_of = ["hook_embed"] + [h for i in range(model.n_layers) for h in (names.attn_out(i), names.mlp_out(i))]
>>> _, cache = model.run_with_cache(images, names_filter=parts_of + [names.resid_post(last)])
>>> stack, resid = torch.stack([cache[h] for h in parts_of]), cache[names.resid_post(last)]
>>> parts, bias = readout.decompose(stack, resid, n_prefix=1)   # stack [k, b, t, d] summing to resid [b, t, d]
>>> torch.allclose(parts.sum(0) + bias, readout.pooled(resid, 1), atol=1e-5)   # [b, d'] == hook_pooled
True
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Optional, Tuple

import torch
from torch import nn

from ...errors import InterpError


def _norm_kind(norm: nn.Module) -> Optional[str]:
    """"layer", "rms", None (identity); an error for a norm whose scale cannot be frozen."""
    if isinstance(norm, nn.Identity):
        return None
    if isinstance(norm, nn.LayerNorm):
        return "layer"
    if type(norm).__name__ in ("RmsNorm", "RMSNorm") and hasattr(norm, "eps"):
        return "rms"
    raise InterpError(f"the final norm is a {type(norm).__name__}: the logit decomposition freezes a LayerNorm's "
                      "or an RMSNorm's scale only")


def frozen_norm(norm: nn.Module, stack: torch.Tensor, full: torch.Tensor) -> Tuple[torch.Tensor, torch.Tensor]:
    """``norm`` applied to each component of ``stack`` [k, ..., d] with the scale ``full`` [..., d] (their sum) has:
    (components [k, ..., d], bias [..., d]) whose sum is ``norm(full)``. A LayerNorm centres each component and
    divides it by ``sqrt(var(full) + eps)``; an RMSNorm divides by ``sqrt(mean(full^2) + eps)``."""
    kind = _norm_kind(norm)
    if kind is None:
        return stack, torch.zeros_like(full)
    full = full.float()
    weight = norm.weight.detach().float() if getattr(norm, "weight", None) is not None else None
    bias = norm.bias.detach().float() if getattr(norm, "bias", None) is not None else None
    if kind == "layer":
        scale = (full.var(-1, keepdim=True, unbiased=False) + norm.eps).sqrt()
        parts = (stack - stack.mean(-1, keepdim=True)) / scale
    else:
        scale = (full.pow(2).mean(-1, keepdim=True) + norm.eps).sqrt()
        parts = stack / scale
    if weight is not None:
        parts = parts * weight
    return parts, (torch.zeros_like(full) if bias is None else bias.expand_as(full).clone())


@dataclass
class FinalReadout:
    """The readout after the last block (module doc).

    Attributes:
        token_norm: ``norm`` (per token), or None for an identity.
        pool: ``"token"`` (row ``cls_index``) or ``"avg"`` (mean of the rows after the prefix tokens).
        pooled_norm: ``fc_norm``, or None for an identity.
        head: the ``Linear`` head, or None (identity head: the output is the pooled vector).
    """

    token_norm: Optional[nn.Module]
    pool: str
    pooled_norm: Optional[nn.Module]
    head: Optional[nn.Linear]
    cls_index: int = 0

    @property
    def has_head(self) -> bool:
        return self.head is not None

    def _pool(self, tokens: torch.Tensor, n_prefix: int) -> torch.Tensor:
        """[..., t, d] -> [..., d]."""
        return tokens[..., self.cls_index, :] if self.pool == "token" else tokens[..., n_prefix:, :].mean(-2)

    def pooled(self, resid: torch.Tensor, n_prefix: int) -> torch.Tensor:
        """The vector the head reads (``hook_pooled``) [b, d'] of the residual stream ``resid`` [b, t, d] taken as
        the last block's output: the logit lens's pooled read of a block."""
        x = resid.float()
        if self.token_norm is not None:
            x = self.token_norm(x)
        x = self._pool(x, n_prefix)
        return x if self.pooled_norm is None else self.pooled_norm(x)

    def output(self, pooled: torch.Tensor) -> torch.Tensor:
        """The head's output of ``pooled`` [..., d'] (the vector itself without a head)."""
        return pooled if self.head is None else self.head(pooled)

    def token_output(self, resid: torch.Tensor) -> torch.Tensor:
        """Each token [b, t, d] read as if it were the pooled row: ``head(fc_norm(norm(token)))`` [b, t, C]."""
        x = resid.float()
        if self.token_norm is not None:
            x = self.token_norm(x)
        if self.pooled_norm is not None:
            x = self.pooled_norm(x)
        return self.output(x)

    def decompose(self, stack: torch.Tensor, resid: torch.Tensor, n_prefix: int) -> Tuple[torch.Tensor, torch.Tensor]:
        """Components ``stack`` [k, b, t, d] of the last residual stream ``resid`` [b, t, d] (their sum) through
        the readout with every norm's scale frozen from ``resid``: (parts [k, b, d'], bias [b, d']) with
        ``parts.sum(0) + bias`` equal to the pooled vector."""
        parts, bias = stack.float(), torch.zeros_like(resid, dtype=torch.float32)
        if self.token_norm is not None:
            parts, bias = frozen_norm(self.token_norm, parts, resid)
        parts, bias = self._pool(parts, n_prefix), self._pool(bias, n_prefix)
        if self.pooled_norm is not None:
            full = parts.sum(0) + bias
            both, last = frozen_norm(self.pooled_norm, torch.cat([parts, bias[None]]), full)
            parts, bias = both[:-1], both[-1] + last
        return parts, bias

    def class_directions(self, classes: torch.Tensor) -> Tuple[torch.Tensor, torch.Tensor]:
        """(direction [b, d'], bias [b]) of each image's output coordinate ``classes`` [b] (a head row and its
        bias); an error without a head."""
        if self.head is None:
            raise InterpError("the model has no head (its output is the pooled vector): there is no class logit to "
                              "attribute; the logit lens reports each block's pooled-vector cosine instead")
        w = self.head.weight.detach().float()[classes.to(self.head.weight.device)]
        b = (self.head.bias.detach().float()[classes.to(self.head.weight.device)] if self.head.bias is not None
             else torch.zeros(len(classes)))
        return w, b.to(w.device)


def final_readout(family) -> FinalReadout:
    """The :class:`FinalReadout` of a ViT or Eva family's model; an error naming the reason otherwise."""
    m = family.module
    if getattr(m, "attn_pool", None) is not None:
        raise InterpError(f"{type(m).__name__} pools with attention (attn_pool): the readout is not linear in the "
                          "residual stream, so there is no logit lens or logit decomposition")
    pool = getattr(m, "global_pool", "token")
    if pool not in ("token", "avg") or getattr(m, "pool_include_prefix", False):
        raise InterpError(f"pooling {pool!r} (prefix included: {getattr(m, 'pool_include_prefix', False)}): the "
                          "logit lens and decomposition take 'token' or 'avg' pooling over the patch rows")
    if pool == "token" and getattr(m, "cls_token", None) is None:
        raise InterpError("token pooling without a CLS token: nothing to read")
    _norm_kind(m.norm), _norm_kind(m.fc_norm)
    head = m.head if isinstance(m.head, nn.Linear) else None
    if head is None and not isinstance(m.head, nn.Identity):
        raise InterpError(f"head {type(m.head).__name__}: the logit decomposition takes a Linear head or none")
    return FinalReadout(None if isinstance(m.norm, nn.Identity) else m.norm, pool,
                        None if isinstance(m.fc_norm, nn.Identity) else m.fc_norm, head)
