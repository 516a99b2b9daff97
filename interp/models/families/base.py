"""``Family``: the adapter that says what one timm model class is and how interp runs it with hook points.

One subclass per timm class, one module each (``vit.py`` for ``VisionTransformer``, ...), registered by defining
it (``Family.registry``) and imported by ``families/__init__.py``; a family defined outside the package (a user's
script) is added with :func:`interp.register_family`. A model gets the family registered for its exact class (or
its nearest registered base class), never the first ``isinstance`` match. An adapter is bound to one timm module and
answers everything the layers above ask of a model, so nothing else reads a timm class's attributes:

* what it is: the timm entry-point modules that build it (``timm_modules``, checked from a name before anything
  is built), the variants interp instruments (:meth:`Family.check`), its blocks in forward order with their
  hook-name prefixes (their module paths in timm: ``blocks.3``, ``stages.2.blocks.0``), its token layout for an
  input size, block sizes, each MLP neuron's write direction (linearised at the data's operating point where a norm sits between
  the neuron and the residual stream);
* how it runs: the hooked forward (:meth:`Family.residual_stream`, :meth:`Family.forward_features`,
  :meth:`Family.forward_head`), reproducing timm's arithmetic op for op with hook points, honouring the structural
  edits of an :class:`~interp.hooks.edit_state.EditState` it supports (test-time tokens, extra key/values, a
  pooling override) and refusing the others in one line (:meth:`Family.check_edits`);
* how a plain timm model of the family takes an edit (patch files): the ``plain_*`` methods.

The hooked root module (:class:`~interp.hooks.hooked_vit.HookedViT`) passes itself as ``hooked`` to the forward
methods: it carries the root hook points (``hook_embed``, ``hook_norm_final``, ...), the edit state and
``force_patterns``.
"""
from __future__ import annotations

from typing import Any, ClassVar, Dict, List, Optional, Sequence, Tuple

import torch
from torch import nn

from ..._model_names import SUPPORTED_MODELS_PAGE, families_in_short
from ...errors import ImageError, InterpError, UnsupportedModelError
from ..layout import TokenLayout
from .norm_writes import mean_jacobian
from .parts import BLOCK_HOOK_ORDER, QkvRows, fused_qkv_rows, install, is_gated


def supported_families() -> str:
    """The registered families' timm classes in one short clause, for one-line error messages."""
    return families_in_short([f.title for f in Family.registry])


class Family:
    """Base adapter. Subclasses set ``name``, ``title``, ``timm_modules`` and implement the methods below.

    Attributes:
        module: the timm model this adapter is bound to.
    """

    name: ClassVar[str] = ""
    title: ClassVar[str] = ""  # what users call it, with the timm names that build it (error messages, docs)
    timm_modules: ClassVar[Tuple[str, ...]] = ()  # modules of the timm entry points that build this class
    registry: ClassVar[List[type]] = []
    # Structural edits the hooked forward honours, and why not where it does not (one line, shown to users).
    extra_tokens_refusal: ClassVar[Optional[str]] = None
    extra_kv_refusal: ClassVar[Optional[str]] = None
    # Whether timm's constructor takes ``img_size``; where it does not (a convolutional stem that takes any size),
    # the loader records an ``img_size`` as the model's input size (``pretrained_cfg["input_size"]``) instead.
    takes_img_size: ClassVar[bool] = True
    # A pyramid's attribute holding its stages (each with ``.blocks``); None: one plain stack ``module.blocks``.
    stages_attr: ClassVar[Optional[str]] = None

    def __init_subclass__(cls, **kwargs):
        super().__init_subclass__(**kwargs)
        if cls.name and cls.__module__.startswith(__package__ + "."):  # interp's own; a user's: register_family
            Family.registry.append(cls)

    def __init__(self, module: nn.Module):
        self.module = module

    # ------------------------------------------------------------------ identity
    @classmethod
    def timm_class(cls) -> type:
        """The timm class this family instruments."""
        raise NotImplementedError

    def check(self) -> None:
        """Raise :class:`~interp.errors.UnsupportedModelError` for a variant of the class the hooked forward
        does not reproduce (checked when a model is instrumented)."""

    def refuse_overrides(self, base: type, methods: Sequence[str], example: str = "") -> None:
        """Refuse a subclass of ``base`` that overrides one of ``methods``: the hooked forward reproduces
        ``base``'s own (``example``: a known case, said in the message)."""
        for method in methods:
            if getattr(type(self.module), method) is not getattr(base, method):
                raise self.unsupported(f"it overrides {base.__name__}.{method}{example}")

    def unsupported(self, problem: str) -> UnsupportedModelError:
        return UnsupportedModelError(f"{type(self.module).__name__}: {problem}, a variant interp does not "
                                     f"instrument (supported: {SUPPORTED_MODELS_PAGE})")

    # ------------------------------------------------------------------ anatomy
    def blocks(self) -> List[Tuple[str, nn.Module]]:
        """(hook-name prefix, block) of every block in forward order; the prefix is its module path in timm.
        One plain stack, ``module.blocks`` (ViT, Eva), unless ``stages_attr`` names the pyramid's list of stages
        (``module.<stages_attr>[s].blocks[j]``: prefix ``<stages_attr>.s.blocks.j``)."""
        if self.stages_attr is None:
            return [(f"blocks.{i}", block) for i, block in enumerate(self.module.blocks)]
        return [(f"{self.stages_attr}.{s}.blocks.{j}", block) for s, stage in enumerate(self.stages())
                for j, block in enumerate(stage.blocks)]

    def stages(self) -> List[nn.Module]:
        """The pyramid's stages in forward order (``module.<stages_attr>``); a plain stack has none."""
        return [] if self.stages_attr is None else list(getattr(self.module, self.stages_attr))

    def block_stages(self) -> Tuple[int, ...]:
        """The stage of each block, in forward order (empty for a plain stack)."""
        return tuple(s for s, stage in enumerate(self.stages()) for _ in stage.blocks)

    def block(self, layer: int) -> nn.Module:
        return self.blocks()[layer][1]

    def stage_norm(self, stage: int) -> Optional[nn.Module]:
        """The norm that ends stage ``stage`` [d_s] (PVTv2's ``stages.{s}.norm``; the last stage's is the model's
        final norm), None where the stage has none."""
        return None

    def downsampling(self, stage: int) -> Optional[Tuple[nn.Module, nn.Module]]:
        """(projection, norm [d_s]) of the downsampling that starts stage ``stage``, None where it has none (a
        first stage, a plain stack). The projection reads the previous stage's [h, w, d_{s-1}] map: a strided
        ``nn.Conv2d`` [d_s, d_{s-1}, k, k] (PVTv2: 3x3, stride 2, padding 1) or an ``nn.Linear`` [d_s, 4 d_{s-1}]
        over each 2x2 cell's 4 tokens concatenated (Swin-v2's patch merging)."""
        return None

    def layout(self, img_size: Optional[Tuple[int, int]] = None) -> TokenLayout:
        """The token layout for inputs of ``img_size`` (default: the model's own), without test-time registers."""
        raise NotImplementedError

    def patch_proj(self) -> nn.Conv2d:
        """The patch embedding's convolution (timm ``patch_embed.proj``): weight [d, C, kh, kw], bias [d]; its
        stride is the patch size (PVTv2's overlapping 7x7 kernel: stride 4, padding 3)."""
        return self.module.patch_embed.proj

    def patch_norm(self) -> Optional[nn.Module]:
        """The norm on the patch embedding's output [d] (the pyramids' LayerNorm), None where it has none."""
        norm = getattr(self.module.patch_embed, "norm", None)
        return None if isinstance(norm, (nn.Identity, type(None))) else norm

    def prefix_tokens(self) -> List[nn.Parameter]:
        """The learned tokens before the patches, in token order (CLS [1, 1, d], then registers [1, r, d]), those
        the model has; none for a model without prefix tokens."""
        return []

    @property
    def img_size(self) -> Tuple[int, int]:
        """The (H, W) the model was built for."""
        return tuple(int(s) for s in self.module.patch_embed.img_size)

    @property
    def dynamic_size(self) -> bool:
        """Whether the model was built to take other input sizes than :attr:`img_size` (timm ``dynamic_img_size``)."""
        return bool(getattr(self.module, "dynamic_img_size", False))

    @property
    def in_chans(self) -> int:
        return int(self.patch_proj().in_channels)

    @property
    def patch_size(self) -> Tuple[int, int]:
        """(ph, pw): input pixels per token of the first blocks' grid."""
        return tuple(int(p) for p in self.module.patch_embed.patch_size)

    def d_model(self, layer: int = -1) -> int:
        """Width of the residual stream at block ``layer`` (the last block's by default)."""
        return int(self.mlp_out_proj(layer).out_features)

    def d_mlp(self, layer: int = 0) -> int:
        """MLP neurons (the inputs ``fc2`` reads) of block ``layer``."""
        return int(self.mlp_out_proj(layer).in_features)

    def n_heads(self, layer: int = 0) -> int:
        return int(self.block(layer).attn.num_heads)

    def mlp(self, layer: int) -> nn.Module:
        """The MLP of block ``layer``; its ``fc2`` reads the neurons (``mlp.hook_post``)."""
        return self.block(layer).mlp

    def mlp_in_proj(self, layer: int) -> nn.Linear:
        """The MLP's input linear (timm ``fc1``): weight [d_mlp, d], bias [d_mlp]; its output row n is what neuron n
        activates on (through PVTv2's depthwise convolution, :meth:`mlp_token_conv`).

        Raises:
            InterpError: a gated MLP (``GluMlp``, ``SwiGLU``), whose neuron is the product of two rows.
        """
        mlp = self.mlp(layer)
        if is_gated(mlp):
            raise InterpError(f"block {layer}'s MLP is gated ({type(mlp).__name__}): a neuron is the product of two "
                              "input rows, not one")
        return mlp.fc1

    def mlp_out_proj(self, layer: int) -> nn.Linear:
        """The MLP's output linear (timm ``fc2``): weight [d, d_mlp] (column n: neuron n's write), bias [d]."""
        return self.mlp(layer).fc2

    def mlp_token_conv(self, layer: int) -> Optional[nn.Conv2d]:
        """The convolution the MLP runs over the token grid between its input linear and the activation
        (PVTv2's depthwise ``dwconv``: weight [d_mlp, 1, k, k], bias [d_mlp]), None where each token's neurons
        read that token only."""
        return None

    def mlp_gain(self, layer: int) -> Optional[torch.Tensor]:
        """The block's LayerScale on the MLP branch [d] (``gamma_2``/``ls2.gamma``), None when it has none."""
        return None

    def attn_in_proj(self, layer: int) -> QkvRows:
        """Block ``layer``'s attention input projections (q, k, v weights and biases) as views of its parameters
        (:class:`~.parts.QkvRows`; timm's fused ``qkv`` by default, PVTv2's ``q`` and ``kv``)."""
        return fused_qkv_rows(self.block(layer).attn)

    def attn_out_proj(self, layer: int) -> nn.Linear:
        """Block ``layer``'s attention output projection (timm ``proj``): weight [d, h * dh], bias [d]."""
        return self.block(layer).attn.proj

    def attn_norm(self, layer: int) -> nn.Module:
        """Block ``layer``'s norm of the attention branch (timm ``norm1``) [d]: on the branch's input in a pre-norm
        block, on its output in a post-norm block (Swin-v2, EVA02-E; the MLP's: ``write_norms(layer)[1]``)."""
        return self.block(layer).norm1

    def attn_head_norm(self, layer: int) -> Optional[nn.Module]:
        """The norm on block ``layer``'s attention heads' output, before :meth:`attn_out_proj` (EVA's
        ``scale_norm``) [h * dh], None where there is none."""
        norm = getattr(self.block(layer).attn, "norm", None)
        return None if isinstance(norm, (nn.Identity, type(None))) else norm

    def mlp_norm(self, layer: int) -> nn.Module:
        """Block ``layer``'s norm of the MLP branch (timm ``norm2``) [d]: on the branch's input in a pre-norm block,
        on its output in a post-norm block (:meth:`write_norms`)."""
        return self.block(layer).norm2

    def attn_gain(self, layer: int) -> Optional[torch.Tensor]:
        """The block's LayerScale on the attention branch [d] (``gamma_1``/``ls1.gamma``), None when it has none."""
        return None

    def attends_to_tokens(self, layer: int) -> bool:
        """Whether every query of block ``layer`` attends to the same keys, the stage's tokens themselves (not
        windows of them, not a spatially reduced grid)."""
        return True

    def write_norms(self, layer: int) -> Tuple[Optional[nn.Module], Optional[nn.Module]]:
        """The norms between block ``layer``'s neurons and the residual stream: (between the neurons and ``fc2``:
        timm ``Mlp.norm``, EVA02's ``scale_mlp``; between ``fc2`` and the residual: a post-norm block's
        ``norm2``), None where there is none."""
        norm = getattr(self.mlp(layer), "norm", None)
        return (None if norm is None or isinstance(norm, nn.Identity) else norm), None

    def write_note(self, layer: int) -> Optional[str]:
        """None where block ``layer``'s neurons write linearly (fc2 column times LayerScale: exact), else what
        :meth:`neuron_writes` reports there."""
        names = [name for name, norm in zip(("the MLP's inner norm", "the block's post-norm norm2"),
                                            self.write_norms(layer)) if norm is not None]
        return None if not names else (f"linearised at the data's operating point: {' and '.join(names)} sits "
                                       "between the neurons and the residual stream")

    def neuron_writes(self, layer: int, acts: Optional[torch.Tensor] = None) -> torch.Tensor:
        """What each MLP neuron of block ``layer`` adds to the residual stream per unit of activation:
        Tensor[d_model, d_mlp], ``fc2``'s columns times the block's LayerScale where it has one. Detached float32.

        Where a LayerNorm sits between the neurons and the residual (:meth:`write_norms`), the write is not
        linear: it is linearised at the operating point ``acts`` (the neurons' activations ``mlp.hook_post``
        [..., d_mlp] on the tokens to average over; :mod:`.norm_writes`), ``fc2 @ mean J(h)`` or
        ``mean J(fc2(h)) @ fc2`` (both norms: the two averages composed).

        Raises:
            InterpError: a norm between without ``acts``, or a norm other than LayerNorm.
        """
        fc2 = self.mlp_out_proj(layer)
        w = fc2.weight.detach().double()
        inner, outer = self.write_norms(layer)
        if (inner is not None or outer is not None) and acts is None:
            raise InterpError(f"block {layer}'s neurons write through a norm ({self.write_note(layer)}): their "
                              "write direction needs the activations at mlp.hook_post (the operating point)")
        if inner is not None or outer is not None:
            with torch.no_grad():
                h = acts.detach().reshape(-1, acts.shape[-1]).to(fc2.weight)
                if inner is not None:
                    w = w @ mean_jacobian(inner, h)
                    h = inner(h)
                if outer is not None:
                    w = mean_jacobian(outer, fc2(h)) @ w
        gain = self.mlp_gain(layer)
        w = w.float()
        return w if gain is None else w * gain.detach().float()[:, None]

    def received_attention(self, layer: int, pattern: torch.Tensor,
                           img_size: Optional[Tuple[int, int]] = None) -> torch.Tensor:
        """The attention each token of block ``layer`` receives, averaged over heads and over the queries that
        can attend to it (the reassessment's measure for a model without CLS): Tensor[b, t] from the block's
        ``attn.hook_pattern`` [b, h, t, t] (a key grid of its own is refused by the families that have one)."""
        if pattern.ndim != 4 or pattern.shape[-1] != pattern.shape[-2]:
            raise InterpError(f"block {layer}'s attention pattern {tuple(pattern.shape)} is not [b, h, t, t]: its "
                              "keys are not its tokens")
        return pattern.float().mean(1).mean(1)

    def final_readout(self):
        """The readout after the last block, split around its norms
        (:class:`~interp.models.families.readout.FinalReadout`): what the logit lens and direct logit attribution
        read; a one-line refusal for a model whose stages change the token grid."""
        raise InterpError(f"no logit lens or logit decomposition for {type(self.module).__name__}: its stages merge "
                          "patches and change width, so earlier blocks are not in the head's space")

    def head_writes(self, layer: int) -> Tuple[torch.Tensor, torch.Tensor]:
        """What each attention head of block ``layer`` writes into the residual stream per unit of its output
        ``attn.hook_z``: (Tensor[h, dh, d] the ``proj`` columns of each head times the block's LayerScale, the
        ``proj`` bias times LayerScale [d]). Detached float32; a one-line refusal where the heads do not add up
        linearly into the residual stream."""
        raise InterpError(f"per-head writes are not defined for {self.title}")

    def check_input(self, x: torch.Tensor, model_name: str) -> None:
        """Raise :class:`~interp.errors.ImageError` unless ``x`` is a Tensor[b, C, H, W] this model can take."""
        if not isinstance(x, torch.Tensor) or x.ndim != 4:
            raise ImageError(f"expected an image batch Tensor[B, C, H, W], got {getattr(x, 'shape', type(x))}; "
                             "use interp.load_images(paths, model) to read files")
        if x.shape[1] != self.in_chans:
            raise ImageError(f"model takes {self.in_chans}-channel images, got {x.shape[1]} channels "
                             "(interp.load_images converts grayscale/RGBA files to RGB)")

    def check_patch_grid_size(self, x: torch.Tensor, model_name: str, dynamic: bool, how: str) -> None:
        """For a plain patch-grid model: ``(H, W)`` must be the model's own size, or with ``dynamic`` any multiple
        of the patch size (any size with ``dynamic_img_pad``); ``how`` says what a dynamic model does at another
        size (the message's last words)."""
        pe = self.module.patch_embed
        hw = tuple(x.shape[-2:])
        if dynamic:
            ph, pw = pe.patch_size
            if not getattr(pe, "dynamic_img_pad", False) and (hw[0] % ph or hw[1] % pw):
                raise ImageError(f"image size {hw} is not a multiple of the patch size {(ph, pw)}")
            return
        size = self.img_size
        if hw != size:
            raise ImageError(
                f"model {model_name} takes {size[0]}x{size[1]} images, got {hw[0]}x{hw[1]}. Resize with "
                "interp.load_images(paths, model) (the model's own preprocessing), or load the model with "
                f"dynamic_img_size=True to {how}.")

    # ------------------------------------------------------------------ hook points
    def hook_leaves(self, layer: int) -> Tuple[str, ...]:
        """The hook names of block ``layer`` relative to its prefix, in firing order."""
        return BLOCK_HOOK_ORDER

    def install(self) -> None:
        """Add the hook points to every block (idempotent; no ``state_dict`` key changes)."""
        for _, block in self.blocks():
            install(block)

    # ------------------------------------------------------------------ hooked forward
    def residual_stream(self, hooked, x: torch.Tensor, n_blocks: Optional[int] = None) -> torch.Tensor:
        """Images [b, C, H, W] -> the residual stream [b, t, d] after blocks ``[0, n_blocks)`` (all by default),
        through the root's embedding hooks and every block's hook points."""
        raise NotImplementedError

    def forward_features(self, hooked, x: torch.Tensor) -> torch.Tensor:
        """Images -> the final normed tokens [b, t, d] (through ``hooked.hook_norm_final``)."""
        raise NotImplementedError

    def forward_head(self, hooked, tokens: torch.Tensor, pre_logits: bool = False) -> torch.Tensor:
        """Final tokens [b, t, d] -> logits [b, n_classes] through ``hook_pooled`` and ``hook_logits`` (the pooled
        vector [b, d'] with ``pre_logits``)."""
        raise NotImplementedError

    def check_edits(self, state) -> None:
        """Refuse, in one line, structural edits this family's forward cannot honour (an
        :class:`~interp.hooks.edit_state.EditState`)."""
        if state.n_extra_tokens and self.extra_tokens_refusal:
            raise InterpError(f"test-time registers are not defined for {self.title}: {self.extra_tokens_refusal}")
        if state.extra_kv and self.extra_kv_refusal:
            raise InterpError(f"an attention bias is not defined for {self.title}: {self.extra_kv_refusal}")

    # ------------------------------------------------------------------ plain timm models (patch files)
    def plain_mlp_edits(self, layer: int, edits: Sequence[nn.Module]) -> None:
        """Make block ``layer`` of the plain model apply ``edits`` (in order) to its MLP activation, the input
        of ``fc2`` (``mlp.hook_post`` in the hooked model)."""
        raise InterpError(f"patch files cannot edit the MLP neurons of {self.title} yet")

    def plain_extra_tokens(self, n_extra: int) -> None:
        """Make the plain model insert ``n_extra`` zero tokens after its prefix tokens (test-time registers)."""
        raise InterpError(f"test-time registers are not defined for {self.title}: {self.extra_tokens_refusal}")

    def plain_extra_kv(self, layer: int, kv: Tuple[torch.Tensor, torch.Tensor]) -> None:
        """Make block ``layer``'s attention append (k', v') [h, m, dh] as extra key/value columns."""
        raise InterpError(f"an attention bias is not defined for {self.title}: {self.extra_kv_refusal}")

    def plain_pool(self, pool: nn.Module) -> None:
        """Make the plain model pool with ``pool`` (tokens [b, t, d] -> [b, d]) instead of its own pooling."""
        raise InterpError(f"patch files cannot replace the pooling of {self.title} yet")

    def pool_skip(self, n_extra: int) -> int:
        """How many leading token rows a replacement pooling receives and must skip in the plain model."""
        return 0

    def describe(self) -> Dict[str, Any]:
        """A few facts for ``repr`` and ``interp hooks``."""
        return {"family": self.name}
