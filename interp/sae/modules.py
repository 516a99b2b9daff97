"""The SAE architectures: one class per ``--arch``, registered in :data:`ARCHITECTURES`, each owning its module
(from ``overcomplete``, the optional extra ``interp[sae]``), its training loss and its inference code rule.

=========== ======================================= ============================================ ==========
``arch``    module (overcomplete)                   loss per token (normalised units)            codes
=========== ======================================= ============================================ ==========
topk        ``TopKSAE(top_k=k)``                     MSE + AuxK                                   topk
batchtopk   ``BatchTopKSAE(top_k=k * batch)``        MSE + AuxK                                   batchtopk
jumprelu    ``JumpSAE`` (rectangle kernel)           MSE + l0_penalty * L0 (straight-through)     jumprelu
relu        ``SAE`` (linear encoder + ReLU)          MSE + l1_penalty * sum_f z_f ||d_f||         relu
archetypal  ``RATopKSAE(points=sample, top_k=k)``    MSE + AuxK                                   topk
matryoshka  ``TopKSAE(top_k=k)``                     mean MSE of nested prefixes + AuxK           topk
=========== ======================================= ============================================ ==========

Every term is a mean over the batch's tokens of a per-token quantity, so a coefficient means the same at any
batch size and any number of DDP processes. The tokens are normalised to unit mean squared norm
(``interp.sae.data.Normalisation``), so the MSE per token ``||x - x_hat||^2`` is the fraction of variance left
unexplained: ``l1_penalty = 0.05`` weighs one unit of code (times its unit-norm dictionary row) like 5 % of the
tokens' variance; ``l0_penalty = 0.002`` weighs one active feature like 0.2 % of it.

JumpReLU (Rajamanoharan et al. 2024, "Jumping Ahead"): codes ``z * H(z - theta)`` with per-feature thresholds
``theta = exp(log_theta)``; L0 is ``sum_f H(z_f - theta_f)``, whose derivative in ``theta`` is the
straight-through estimate ``-(1/eps) K((z - theta)/eps)`` with the rectangle kernel ``K`` and bandwidth
``eps = JUMP_BANDWIDTH`` (overcomplete's ``heaviside``; the codes' own threshold derivative is overcomplete's
``jump_relu``, ``-(theta/eps) K``).

AuxK (Gao et al. 2024, "Scaling and evaluating sparse autoencoders"): the features that have not fired for
``dead_window`` steps (counted from the start) reconstruct the detached residual ``e = x - x_hat`` with their
``aux_k`` largest pre-activations; the term is ``||e - e_hat||^2 / ||e||^2`` over the batch, weighted by
``aux_penalty`` (1/32). It is zero while no feature is dead.

overcomplete's BatchTopK keeps the ``top_k`` largest codes of a whole batch: ``k * batch`` keeps ``k`` per
token on average. :func:`encoder_tensors` turns a trained module into the plain tensors that
``interp.interventions.sae_features.SparseCodes`` encodes with (tested equal to the module's ``encode``).
"""
from __future__ import annotations

import importlib
import importlib.util
import sys
import types
from typing import ClassVar, Dict, List, Optional, Tuple, Type

import torch

from ..errors import InterpError

INSTALL_HINT = "pip install 'interp[sae]'"
JUMP_BANDWIDTH = 1e-3  # the straight-through kernel's width, in normalised code units (the paper's 0.001)


def _sae_package():
    """``overcomplete.sae`` without running ``overcomplete/__init__.py``: that file imports overcomplete's
    visualisation package, which calls ``matplotlib.cm.get_cmap`` (removed in Matplotlib 3.9) and fails. The
    parent package is registered bare (its path only) while its ``sae`` subpackage is imported, then taken out
    of ``sys.modules`` again, so a later ``import overcomplete`` by the user runs the real ``__init__``
    (matplotlib is not touched). An ``overcomplete`` already imported is used as it is."""
    if "overcomplete.sae" in sys.modules and sys.modules["overcomplete.sae"] is not None:
        return sys.modules["overcomplete.sae"]
    if "overcomplete" in sys.modules:  # imported by the user already (or blocked: None)
        return importlib.import_module("overcomplete.sae")
    spec = importlib.util.find_spec("overcomplete")
    if spec is None or not spec.submodule_search_locations:
        raise ImportError("overcomplete")
    bare = types.ModuleType("overcomplete")
    bare.__path__ = list(spec.submodule_search_locations)
    bare.__spec__ = spec
    sys.modules["overcomplete"] = bare
    try:
        return importlib.import_module("overcomplete.sae")
    finally:
        if sys.modules.get("overcomplete") is bare:
            del sys.modules["overcomplete"]


def overcomplete():
    """The ``overcomplete.sae`` module, or a one-line error naming the extra to install."""
    try:
        return _sae_package()
    except ImportError:
        raise InterpError(f"training sparse autoencoders needs the optional dependency overcomplete: "
                          f"{INSTALL_HINT}") from None


def mse(x: torch.Tensor, x_hat: torch.Tensor) -> torch.Tensor:
    """Mean over tokens of ``||x - x_hat||^2`` (x [b, d] normalised: the unexplained share of the variance)."""
    return (x - x_hat).square().sum(-1).mean()


def auxk_loss(x: torch.Tensor, x_hat: torch.Tensor, pre_codes: torch.Tensor, dictionary: torch.Tensor,
              dead: torch.Tensor, k_aux: int) -> torch.Tensor:
    """Gao et al.'s AuxK term: the ``k_aux`` largest positive pre-activations among the ``dead`` features (Bool
    [n]) of each token reconstruct the detached residual; ``||e - e_hat||^2 / ||e||^2`` over the batch (0 when
    no feature is dead)."""
    n_dead = int(dead.sum())
    if n_dead == 0:
        return x.new_zeros(())
    residual = (x - x_hat).detach()
    pre = torch.relu(pre_codes).masked_fill(~dead, 0.0)
    top = pre.topk(min(k_aux, n_dead), dim=-1)
    codes = torch.zeros_like(pre).scatter(-1, top.indices, top.values)
    e_hat = codes @ dictionary
    return (residual - e_hat).square().sum() / residual.square().sum().clamp_min(1e-12)


def tied_init(module) -> torch.nn.Module:
    """Start the encoder at the dictionary's transpose (unit rows), as Gao et al. 2024 do: far fewer features
    die early than with independent random encoder and dictionary."""
    with torch.no_grad():
        rows = torch.nn.functional.normalize(module.dictionary._weights, dim=1)
        module.dictionary._weights.copy_(rows)
        module.encoder.final_block[0].weight.copy_(rows)
    return module


class Architecture:
    """One SAE architecture, for the training settings ``settings`` (``interp.sae.train.TrainSettings``).

    Class attributes: ``name`` (``--arch``), ``codes`` (its inference rule in
    ``interp.interventions.sae_features.CODE_RULES``), ``uses_k`` (``--k`` sets its sparsity), ``auxk`` (its loss
    has the AuxK term), ``needs_points`` (it is built on a sample of the normalised training tokens).
    """

    name: ClassVar[str] = ""
    codes: ClassVar[str] = ""
    uses_k: ClassVar[bool] = False
    auxk: ClassVar[bool] = False
    needs_points: ClassVar[bool] = False

    def __init__(self, settings):
        self.settings = settings

    @property
    def k(self) -> Optional[int]:
        """The per-token sparsity recorded in sae.json (None for an architecture that --k does not set)."""
        return int(self.settings.k) if self.uses_k else None

    def build(self, d: int, n_features: int, batch_size: int, points: Optional[torch.Tensor]) -> torch.nn.Module:
        """A fresh overcomplete module (weights from the current torch RNG); ``batch_size``: tokens per process."""
        raise NotImplementedError

    def sparsity(self, pre_codes: torch.Tensor, codes: torch.Tensor, module) -> Optional[torch.Tensor]:
        """The sparsity term of the loss (already weighted), or None (TopK-like: sparse by construction)."""
        return None

    def loss(self, x, pre_codes, codes, x_hat, module, dictionary, dead) -> Tuple[torch.Tensor, Dict[str, torch.Tensor]]:
        """(total, {"mse", "sparsity", "aux"}) for one batch; ``dead``: Bool [n] features dead for AuxK."""
        parts = {"mse": mse(x, x_hat)}
        sparse = self.sparsity(pre_codes, codes, module)
        if sparse is not None:
            parts["sparsity"] = sparse
        if self.auxk:
            parts["aux"] = self.settings.aux_penalty * auxk_loss(x, x_hat, pre_codes, dictionary, dead,
                                                                 self.aux_k(x.shape[-1]))
        return sum(parts.values()), parts

    def aux_k(self, d: int) -> int:
        """AuxK's k: ``aux_k`` of the settings, else half the width (Gao et al.'s ``d/2``)."""
        return int(self.settings.aux_k) if self.settings.aux_k else max(1, d // 2)

    def threshold(self, module) -> Optional[torch.Tensor]:
        """The inference threshold tensor the code rule needs (None when it needs none)."""
        return None


ARCHITECTURES: Dict[str, Type[Architecture]] = {}


def register(cls: Type[Architecture]) -> Type[Architecture]:
    ARCHITECTURES[cls.name] = cls
    return cls


@register
class TopK(Architecture):
    name, codes, uses_k, auxk = "topk", "topk", True, True

    def build(self, d, n_features, batch_size, points):
        return tied_init(overcomplete().TopKSAE(d, n_features, top_k=self.settings.k))


@register
class BatchTopK(Architecture):
    name, codes, uses_k, auxk = "batchtopk", "batchtopk", True, True

    def build(self, d, n_features, batch_size, points):
        return tied_init(overcomplete().BatchTopKSAE(d, n_features, top_k=self.settings.k * batch_size))

    def threshold(self, module):
        threshold = running_threshold(module)
        if threshold is None:
            raise InterpError("the BatchTopK SAE has no running threshold yet (no training step was taken)")
        return threshold


@register
class JumpReLU(Architecture):
    name, codes = "jumprelu", "jumprelu"

    def build(self, d, n_features, batch_size, points):
        return tied_init(overcomplete().JumpSAE(d, n_features, kernel="rectangle", bandwidth=JUMP_BANDWIDTH))

    def sparsity(self, pre_codes, codes, module):
        oc = overcomplete()
        active = oc.heaviside(torch.relu(pre_codes), torch.exp(module.thresholds), module.kernel_fn,
                              module.bandwidth)
        return self.settings.l0_penalty * active.sum(-1).mean()

    def threshold(self, module):
        return torch.exp(module.thresholds.detach()).float().clone()


@register
class ReLU(Architecture):
    name, codes = "relu", "relu"

    def build(self, d, n_features, batch_size, points):
        return tied_init(overcomplete().SAE(d, n_features))

    def sparsity(self, pre_codes, codes, module):
        norms = module.get_dictionary().norm(dim=-1)
        return self.settings.l1_penalty * (codes * norms).sum(-1).mean()


@register
class Archetypal(Architecture):
    name, codes, uses_k, auxk = "archetypal", "topk", True, True
    needs_points = True

    def build(self, d, n_features, batch_size, points):
        if points is None:
            raise InterpError("an archetypal SAE needs candidate points (a sample of the normalised tokens)")
        return overcomplete().RATopKSAE(d, n_features, points=points, top_k=self.settings.k)


def matryoshka_prefixes(n_features: int, levels: int = 5) -> List[int]:
    """The nested dictionary sizes of a Matryoshka SAE: n/16, n/8, n/4, n/2, n (each at least 1, distinct)."""
    return sorted({max(1, n_features >> i) for i in range(levels)})


@register
class Matryoshka(Architecture):
    """A TopK SAE whose nested prefixes of the dictionary must each reconstruct the token (Bussmann et al. 2025,
    Nabeshima 2024; saev's and SAELens' Matryoshka SAEs): the loss is the mean over the prefixes of
    :func:`matryoshka_prefixes` of ``||x - z[:m] @ D[:m]||^2`` (the last prefix is the whole dictionary), plus
    AuxK. The first features learn the coarse directions, later ones refine them, so features split less."""

    name, codes, uses_k, auxk = "matryoshka", "topk", True, True

    def build(self, d, n_features, batch_size, points):
        return tied_init(overcomplete().TopKSAE(d, n_features, top_k=self.settings.k))

    def loss(self, x, pre_codes, codes, x_hat, module, dictionary, dead):
        total, parts = super().loss(x, pre_codes, codes, x_hat, module, dictionary, dead)
        prefixes = matryoshka_prefixes(codes.shape[-1])
        nested = [mse(x, codes[:, :m] @ dictionary[:m]) for m in prefixes[:-1]] + [parts["mse"]]
        parts["matryoshka"] = sum(nested) / len(nested) - parts["mse"]  # the prefixes' share beyond the full MSE
        return total + parts["matryoshka"], parts


def architecture(name: str) -> Type[Architecture]:
    """The registered class of ``name`` (one-line error naming the choices)."""
    if name not in ARCHITECTURES:
        raise InterpError(f"arch must be one of {list(ARCHITECTURES)}, got {name!r}")
    return ARCHITECTURES[name]


def running_threshold(module) -> Optional[torch.Tensor]:
    """BatchTopK's inference threshold (a plain attribute in overcomplete, not a buffer), else None."""
    value = getattr(module, "running_threshold", None)
    return None if value is None else torch.as_tensor(value).detach().reshape(1).float()


@torch.no_grad()
def encoder_tensors(module, arch: Architecture) -> Dict[str, torch.Tensor]:
    """w_enc [n, d], b_enc [n], dictionary [n, d] (normalised units) and the arch's threshold, as float32."""
    linear = module.encoder.final_block[0]
    was_training = module.training
    module.eval()  # fuses the dictionary (archetypal: C, W, Relax and multiplier) as overcomplete does
    out = {"w_enc": linear.weight.detach().float().clone(), "b_enc": linear.bias.detach().float().clone(),
           "dictionary": module.get_dictionary().detach().float().clone()}
    module.train(was_training)
    threshold = arch.threshold(module)
    if threshold is not None:
        out["threshold"] = threshold
    return out

