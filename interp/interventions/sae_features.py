"""``SAEFeatureAblation``: remove chosen sparse-autoencoder features from a block's output, keeping the SAE's error.

At ``blocks.{l}.hook_resid_post`` (the hook the SAE was trained on; ``stages.{s}.blocks.{j}.hook_resid_post`` in
a pyramid) every selected token ``x`` becomes

    x - sum_{f in F} (a_f(x) - m_f) * d_f

with ``a_f(x)`` the feature's code, ``d_f`` its decoder row in the hook's units (the normalisation's scale
undone) and ``m_f`` 0 (``mode="zero"``), the feature's mean code (``mode="mean"``) or its code on the same token
of another image (``mode="resample"``: a derangement of the batch, seeded). What the SAE does not reconstruct (its
error ``x - x_hat``) stays in ``x``: only the features' share of the reconstruction moves.

Example (not run as a doctest: it needs a trained SAE)::

    sae = interp.sae.load("runs/sae")                              # trained on blocks.3.hook_resid_post
    with model.intervene(SAEFeatureAblation(sae, [12, 40])):
        logits = model(images)

:class:`SparseCodes` is the SAE's encoder in plain torch (no ``overcomplete`` needed to apply or export it);
``interp.sae`` uses it too, so the codes an ablation subtracts are the codes ``interp.sae.load(...).encode``
reports.
"""
from __future__ import annotations

import numbers
from dataclasses import dataclass, field
from typing import Any, Callable, Dict, List, Optional, Sequence

import torch
from torch import nn

from ..errors import InterpError
from ..models.layout import TOKEN_SELECTIONS, selected_rows
from ..values import SAE_ARCHS
from .base import NEURON, EditContext, Intervention, check_choice
from .edits import ABLATION_MODES, Donors

ARCHS = SAE_ARCHS  # the architectures interp trains (interp.sae.modules registers one class per name)
FEATURE_TOKENS = tuple(TOKEN_SELECTIONS)  # the token kinds an SAE is trained on (--tokens)
# tensors of an SAE's encoder (w_enc [n, d], b_enc [n], mean [d], scale [1]) and, per code rule, its threshold
# (batchtopk: one [1]; jumprelu: one per feature [n], already exponentiated)
ENCODER_TENSORS = ("w_enc", "b_enc", "mean", "scale")


class CodeRule:
    """How an SAE sparsifies ``relu(x W^T + b)`` at inference (one class per rule, registered in
    :data:`CODE_RULES` under its ``name``; an architecture of ``interp.sae.modules`` names the rule it encodes
    with). A ``signed`` rule sparsifies ``x W^T + b`` itself (no ReLU first)."""

    name = ""
    needs_k = False
    needs_threshold = False
    signed = False

    def __call__(self, codes: torch.Tensor, k: Optional[int], threshold: Optional[torch.Tensor]) -> torch.Tensor:
        raise NotImplementedError


class ReluCodes(CodeRule):
    """Every positive code (a ReLU SAE trained with an L1 penalty)."""

    name = "relu"

    def __call__(self, codes, k, threshold):
        return codes


class TopKCodes(CodeRule):
    """The ``k`` largest codes of each token (TopK, archetypal and Matryoshka SAEs)."""

    name, needs_k = "topk", True

    def __call__(self, codes, k, threshold):
        top = torch.topk(codes, min(k, codes.shape[-1]), dim=-1)
        return torch.zeros_like(codes).scatter(-1, top.indices, top.values)


class SignedTopKCodes(TopKCodes):
    """The ``k`` largest pre-activations of each token as they are, negative ones included (saev's TopK:
    ``topk(x)``'s positions kept, no ReLU): imported saev TopK SAEs."""

    name, signed = "topk_signed", True


class BatchThresholdCodes(CodeRule):
    """Codes at or above one global threshold (BatchTopK's running threshold at inference)."""

    name, needs_threshold = "batchtopk", True

    def __call__(self, codes, k, threshold):
        return codes * (codes >= threshold)


class JumpCodes(CodeRule):
    """Codes above each feature's own threshold (JumpReLU)."""

    name, needs_threshold = "jumprelu", True

    def __call__(self, codes, k, threshold):
        return codes * (codes > threshold)


CODE_RULES: Dict[str, CodeRule] = {rule.name: rule for rule in (ReluCodes(), TopKCodes(), SignedTopKCodes(),
                                                                  BatchThresholdCodes(), JumpCodes())}
# patch files written before the rules were named carry the architecture: an archetypal SAE encodes with TopK
LEGACY_ARCH_RULES = {"archetypal": "topk"}


class SparseCodes(nn.Module):
    """An SAE encoder: activations in the hook's units [..., d] -> codes [..., n].

    ``x`` is normalised as in training (``(x - mean) / scale``), then ``relu(x W^T + b)`` is sparsified by the
    code rule ``rule`` (:data:`CODE_RULES`): the ``k`` largest per token (topk), codes at or above the running
    batch threshold (batchtopk), codes above each feature's threshold (jumprelu), none (relu); topk_signed keeps
    the ``k`` largest of ``x W^T + b`` without the ReLU (saev's TopK).
    """

    def __init__(self, rule: str, tensors: Dict[str, torch.Tensor], k: Optional[int] = None):
        super().__init__()
        check_choice("code rule", rule, tuple(CODE_RULES))
        self.rule = CODE_RULES[rule]
        missing = [name for name in ENCODER_TENSORS if name not in tensors]
        if self.rule.needs_threshold and "threshold" not in tensors:
            missing.append("threshold")
        if missing:
            raise InterpError(f"the SAE's encoder lacks tensor(s) {missing}")
        if self.rule.needs_k and not (isinstance(k, int) and k > 0):
            raise InterpError(f"a {rule} SAE needs k >= 1, got {k!r}")
        self.k = k
        for name in (*ENCODER_TENSORS, "threshold"):
            if name in tensors:
                self.register_buffer(name, torch.as_tensor(tensors[name], dtype=torch.float32).clone())
        if "threshold" not in tensors:
            self.threshold = None
        n, d = self.w_enc.shape
        if self.b_enc.shape != (n,) or self.mean.shape != (d,) or self.scale.numel() != 1:
            raise InterpError(f"the SAE's encoder tensors do not fit together (w_enc {tuple(self.w_enc.shape)}, "
                              f"b_enc {tuple(self.b_enc.shape)}, mean {tuple(self.mean.shape)})")

    @property
    def d(self) -> int:
        return int(self.w_enc.shape[1])

    @property
    def n_features(self) -> int:
        return int(self.w_enc.shape[0])

    def normalise(self, x: torch.Tensor) -> torch.Tensor:
        return (x.float() - self.mean) / self.scale

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if x.shape[-1] != self.d:
            raise InterpError(f"the SAE reads vectors of width {self.d}; these activations have width {x.shape[-1]}")
        pre = self.normalise(x) @ self.w_enc.T + self.b_enc
        return self.rule(pre if self.rule.signed else torch.relu(pre), self.k, self.threshold)


class FeatureRemoval(nn.Module):
    """Block output [b, t, d] (or a plain Swin block's [b, h, w, d]) -> the same with the chosen features'
    contribution replaced on the rows ``rows`` (the SAE's token selection, ``TokenLayout.rows_of``): by
    ``means`` [|F|], or with ``donors`` (resample) by the codes of the rows ``donors(rows)`` returns."""

    def __init__(self, codes: SparseCodes, features: List[int], directions: torch.Tensor, means: torch.Tensor,
                 rows: slice, donors: Optional[Callable[[torch.Tensor], torch.Tensor]] = None):
        super().__init__()
        self.codes, self.features, self.rows, self.donors = codes, list(features), rows, donors
        self.register_buffer("directions", directions.float())  # [|F|, d], hook units
        self.register_buffer("means", means.float())  # [|F|]

    def _delta(self, rows: torch.Tensor) -> torch.Tensor:
        a = self.codes(rows)[..., self.features]  # [b, t', |F|]
        fill = self.means if self.donors is None else self.codes(self.donors(rows))[..., self.features]
        return ((a - fill) @ self.directions).to(rows.dtype)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if x.dim() == 4:  # a plain timm Swin block's output [b, h, w, d]: its tokens in row-major order
            return self.forward(x.reshape(x.shape[0], -1, x.shape[-1])).reshape(x.shape)
        out = x.clone()
        out[:, self.rows] = x[:, self.rows] - self._delta(x[:, self.rows])
        return out


@dataclass(eq=False)
class SAEFeatureAblation(Intervention):
    """Remove SAE features at the block output the SAE was trained on (see the module docstring).

    Args:
        sae: an SAE from ``interp.sae.load(DIR)`` (anything with ``ablation_state()``), or None when the
            tensors come from a patch file.
        features: feature indices to remove.
        mode: ``"zero"`` (``m_f = 0``), ``"mean"`` (``m_f`` = the feature's mean code on the SAE's
            training tokens, stored with the SAE) or ``"resample"`` (the feature's code on the same token of
            another image of the batch; a batch of one reads the previous batch).
        seed: the resampling's generator seed.
        tokens: the token kind edited: ``"all"``, ``"patches"`` (CLS, registers and test-time registers
            untouched), ``"cls"`` or ``"registers"`` (the model's trained registers); None: the kind the SAE was
            trained on (an SAE is only meaningful on the tokens it saw).
        prefix: with ``tokens`` cls or registers, the model's token layout ``{"cls_index", "n_registers"}``
            (taken from the SAE, which records it at training).
        layer, block, codes, k, state: what a patch file restores (``layer``: the block's index, or ``block``: a
            pyramid's block prefix such as ``stages.1.blocks.0``, found in the model when the edit is made;
            ``codes``: the SAE's rule in :data:`CODE_RULES`).
    """

    sae: Any = field(default=None, repr=False)
    features: Sequence[int] = ()
    mode: str = "zero"
    seed: int = 0
    tokens: Optional[str] = None
    prefix: Optional[Dict[str, Any]] = None
    layer: Optional[int] = None
    block: Optional[str] = None
    codes: Optional[str] = None
    k: Optional[int] = None
    state: Optional[Dict[str, torch.Tensor]] = field(default=None, repr=False)

    kind = "SAEFeatureAblation"
    stage = NEURON

    def __post_init__(self):
        check_choice("mode", self.mode, ABLATION_MODES)
        self._donors = Donors(self.seed)  # resample's draws, over every forward
        if self.sae is not None:
            info = self.sae.ablation_state()
            self.layer, self.codes, self.k, self.state = info["layer"], info["codes"], info["k"], info["tensors"]
            self.block = info.get("block")
            if self.tokens is None:
                self.tokens = info["tokens"] or "patches"
            if self.prefix is None:
                self.prefix = info.get("prefix")
            self.sae = None  # the tensors are kept; the object is not needed any more
        if self.state is None or (self.layer is None) == (self.block is None):
            raise ValueError("give the SAE (interp.sae.load(DIR)) whose features to remove")
        self.tokens = self.tokens or "patches"
        check_choice("tokens", self.tokens, FEATURE_TOKENS)
        if self.tokens in ("cls", "registers"):
            self._rows(0)  # refuse a missing layout now, not at the first forward
        given = self.features.tolist() if isinstance(self.features, torch.Tensor) else self.features
        if isinstance(given, (str, bytes, dict)) or not all(
                isinstance(f, numbers.Integral) and not isinstance(f, bool) for f in given):
            raise ValueError(f"features must be a list of whole feature indices such as [12, 40], got {given!r}")
        self.features = [int(f) for f in given]
        self._codes = SparseCodes(self.codes, self.state, self.k)
        n = self._codes.n_features
        if not self.features or len(set(self.features)) != len(self.features):
            raise ValueError(f"features must be distinct SAE feature indices, got {self.features}")
        if min(self.features) < 0 or max(self.features) >= n:
            raise ValueError(f"feature {max(self.features)} does not exist: the SAE has {n} features (0..{n - 1})")

    def _layer(self, ctx: EditContext) -> int:
        """The edited block's index in forward order: ``layer``, or a pyramid's block found by its prefix."""
        if self.block is not None:
            if self.block not in ctx.blocks:
                shown = f"{ctx.blocks[0]} .. {ctx.blocks[-1]}" if ctx.blocks else "none"
                raise InterpError(f"the SAE reads {self.block}.hook_resid_post; this model's blocks are {shown}")
            return ctx.blocks.index(self.block)
        if self.layer >= ctx.n_layers:
            raise InterpError(f"the SAE reads block {self.layer}; the model has blocks 0..{ctx.n_layers - 1}")
        return self.layer

    def _removal(self, ctx: EditContext) -> FeatureRemoval:
        idx = torch.tensor(self.features)
        directions = self.state["dictionary"][idx] * self.state["scale"].reshape(())
        means = self.state["feature_means"][idx] if self.mode == "mean" else torch.zeros(len(idx))
        donors = (lambda rows: self._donors.draw("rows", rows)) if self.mode == "resample" else None
        return FeatureRemoval(self._codes, self.features, directions, means, self._rows(ctx.n_prefix), donors)

    def _rows(self, n_prefix: int) -> slice:
        """The rows the SAE's token selection reads when ``n_prefix`` prefix tokens precede the patches."""
        prefix = self.prefix or {}
        if self.tokens in ("cls", "registers") and "n_registers" not in prefix:
            raise InterpError(f"an SAE ablation on the {self.tokens} token(s) needs the model's token layout "
                              "(cls_index, n_registers), which the SAE records when trained; train it again")
        return selected_rows(self.tokens, n_prefix=n_prefix, n_registers=int(prefix.get("n_registers") or 0),
                             cls_index=prefix.get("cls_index"))

    def resid_edits(self, ctx: EditContext) -> Dict[int, nn.Module]:
        return {self._layer(ctx): self._removal(ctx)}

    # ------------------------------------------------------------------ serialisation
    def params(self) -> Dict[str, Any]:
        where = {"layer": self.layer} if self.block is None else {"block": self.block}
        return {"features": self.features, "mode": self.mode, "tokens": self.tokens, "prefix": self.prefix,
                **where, "codes": self.codes, "k": self.k, **({"seed": self.seed} if self.mode == "resample" else {})}

    def tensors(self) -> Dict[str, torch.Tensor]:
        return dict(self.state)

    @classmethod
    def from_params(cls, params, tensors):
        params = dict(params)
        if "arch" in params:  # a patch file written before code rules were named
            arch = params.pop("arch")
            params["codes"] = LEGACY_ARCH_RULES.get(arch, arch)
        return cls(**params, state=dict(tensors))
