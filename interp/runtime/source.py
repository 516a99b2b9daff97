"""One small interface for studies to read activations: a live HookedViT over images, or a cache file.

>>> from interp.runtime.open import open_source
>>> src = open_source(model=model, images=photos)            # runs the model batch by batch
>>> summary = interp.cache.write(model, photos, hooks="blocks.5.hook_resid_post", path="acts.h5", progress=False)
>>> src = open_source(cache="acts.h5", model=model)           # reads a cache lazily (fingerprint checked)
>>> for batch in src.batches(["blocks.5.hook_resid_post"], batch_size=2):
...     norms = batch.norms("blocks.5.hook_resid_post")        # [b, t]; batch.layout: the rows' layout
>>> norms.shape
torch.Size([2, 197])
>>> from interp.interventions import TestTimeRegister
>>> edited = open_source(model=model, images=photos, interventions=[TestTimeRegister({2: [17]})])
>>> next(iter(edited.batches(["blocks.5.hook_resid_post"]))).layout.n_prefix   # CLS + the test-time register
2

Interventions are explicit: a live source runs the model under the interventions it was given (and those
passed to one ``batches`` call); each batch carries the layout of the forward that produced it (input size
and the edits in force), which is what every study slices tokens with.

A source also answers what studies ask about the images and the model (``is_live``, ``patch_size``,
``image_size``, ``data_config()``, ``display_images()``), so no study reaches into the model itself.
Memory stays bounded: one batch of activations at a time, whatever the number of images
(``LiveSource.held()`` trades that for decoding each image once, for small image sets such as the report's).

The base types live here; :class:`~interp.runtime.live_source.LiveSource` runs a model,
:class:`~interp.runtime.cache_source.CacheSource` reads a cache file and :func:`~interp.runtime.open.open_source`
opens either.

Not to be confused with ``interp/cache/sources.py``: those are the *image* sources the cache writer reads
(files or a tensor); these are the *activation* sources studies read.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Dict, Iterator, List, Optional, Sequence, Set, Tuple

import torch

from ..errors import InterpError
from ..hooks.names import BlockNames
from ..models.layout import TokenLayout
from ..models.inputs.preprocessing import transform_name
from .forward import Reducers


def token_norms(acts: torch.Tensor) -> torch.Tensor:
    """Reducer: per-token L2 norms [b, t] of [b, t, d] activations (what norm-only caches store)."""
    return acts.float().norm(dim=-1)


def split_tokens(tokens: torch.Tensor, layout: TokenLayout) -> Tuple[Optional[torch.Tensor], torch.Tensor]:
    """(CLS row [b, d] or None, patch rows [b, n, d]) of tokens [b, t, d] (all rows, or patch rows only as a
    cache written with ``tokens="patches"`` stores them)."""
    t = tokens.shape[1]
    if t == layout.n_tokens:
        cls = tokens[:, layout.cls_index] if layout.cls_index is not None else None
        return cls, tokens[:, layout.patch_slice]
    if t == layout.n_patches:
        return None, tokens
    raise InterpError(f"tokens have {t} rows, but the layout has {layout.n_tokens} tokens ({layout.n_patches} "
                      "patches); cache the hook with tokens='all'")


@dataclass
class Batch:
    """Activations of ``len(ids)`` consecutive images, starting at image ``start`` of the source.

    Attributes:
        acts: hook name -> float32 CPU tensor [b, ...] (norm-only cache hooks hold [b, t] norms).
        layout: token layout of the rows on the token axis (of the last blocks' grid in a pyramid model: see
            :meth:`layout_of`).
        blocks: the source's block names (so :meth:`layout_of` knows each hook's block).
        images: the forward's inputs [b, 3, H, W] float32 CPU, when a fold of a shared pass asked for them
            (:class:`~interp.runtime.passes.Fold`), else None.
    """

    ids: List[str]
    start: int
    acts: Dict[str, torch.Tensor]
    layout: TokenLayout
    norms_only: Set[str] = field(default_factory=set)
    images: Optional[torch.Tensor] = None
    blocks: Optional[BlockNames] = None

    def layout_of(self, hook: str) -> TokenLayout:
        """The layout of ``hook``'s token rows (its block's grid: pyramid stages differ)."""
        return self.layout if self.blocks is None else self.blocks.layout_of(self.layout, hook)

    def __len__(self) -> int:
        return len(self.ids)

    def norms(self, hook: str) -> torch.Tensor:
        """Per-token L2 norms [b, t] of a [b, t, d] hook (as stored for norm-only caches)."""
        a = self.acts[hook]
        return a if hook in self.norms_only else a.norm(dim=-1)


def n_batches(source: "ActivationSource", batch_size: Optional[int]) -> int:
    """Number of batches of ``batch_size`` (default: the source's) over the source, for progress bars."""
    bs = batch_size or source.batch_size
    return -(-len(source) // bs)


class ActivationSource:
    """Base of :class:`LiveSource` and :class:`CacheSource`."""

    model_name: str
    fingerprint: str
    layout: TokenLayout
    blocks: BlockNames  # the hook-name prefix of every block of the source's model
    hook_names: List[str]
    ids: List[str]
    model = None  # a HookedViT for live sources
    batch_size: int = 16
    labels: Optional[List[int]] = None  # class labels from an image-folder layout (live sources)
    class_names: List[str] = []
    norms_only: bool = False  # a cache that stores token norms [b, t] instead of [b, t, d] activations
    skipped: List[Tuple[str, str]] = []  # (image id, reason) of unreadable images left out of ``ids``

    def __len__(self) -> int:
        return len(self.ids)

    @property
    def weights_model(self):
        """The model whose weights made the activations, when the source has it (a live source's model; a cache
        opened with ``model=``, which was checked against it); None otherwise. For studies that read weights (an
        MLP's write directions), not to run it."""
        return self.model

    @property
    def is_live(self) -> bool:
        """True when the source runs a model (studies that re-run it with an edit need this)."""
        return False

    @property
    def shows_images(self) -> bool:
        """True when :meth:`display_images` has images to give (a live source; a cache whose image files are
        here)."""
        return self.is_live

    def data_config(self) -> dict:
        """timm's data config (input_size, mean, std, crop...) the images were preprocessed with."""
        raise NotImplementedError

    @property
    def preprocess(self) -> str:
        """The preprocessing the images went through: ``"model"`` (timm's own) or an eval transform's name
        (``"resize256-crop224"``, :class:`~interp.models.inputs.preprocessing.EvalTransform`)."""
        return transform_name(self.data_config())

    @property
    def image_size(self) -> Tuple[int, int]:
        """(H, W) of the model input in pixels."""
        return tuple(int(v) for v in self.data_config()["input_size"][-2:])

    @property
    def patch_size(self) -> Tuple[int, int]:
        """(ph, pw): patch size in input pixels."""
        h, w = self.image_size
        gh, gw = self.layout.grid
        if not gh or not gw:
            raise InterpError("cannot tell the patch size of this source: it holds no patch rows")
        return h // gh, w // gw

    def display_images(self, limit: int = 8) -> torch.Tensor:
        """The first ``limit`` images as the model saw them (resized, cropped), normalisation undone, in 0..1:
        Tensor[n, 3, H, W] for overlay figures. Live sources only."""
        raise InterpError("this source has no images to show (a cache); give a live source for image overlays")

    @property
    def n_layers(self) -> int:
        """Blocks of the source's model (so ``-1`` is its last block for a cache as for a live model)."""
        return len(self.blocks)

    def layout_of(self, hook: str) -> TokenLayout:
        """The layout of ``hook``'s token rows in this source's forwards (its block's grid)."""
        return self.blocks.layout_of(self.layout, hook)

    def head(self):
        """What the model's head is (:class:`~interp.models.classifiers.heads.Head`); live sources only."""
        require_live(self, "behaviour readout")

    def bind_classifier(self, classifier):
        """``classifier`` bound to this source's model; live sources only."""
        require_live(self, "behaviour readout")

    def d_mlp(self, layer: int) -> int:
        """MLP neurons of block ``layer`` of the source's model (pyramid stages differ)."""
        return self._weights("the MLP width").family.d_mlp(self.blocks.index(layer))

    def neuron_writes(self, layer: int) -> torch.Tensor:
        """What each MLP neuron of block ``layer`` writes into the residual stream per unit of activation,
        LayerScale included: Tensor[d_model, d_mlp] (``HookedViT.neuron_writes``). Where a LayerNorm sits between
        the neurons and the residual (``write_note``), linearised at this source's operating point: the
        ``mlp.hook_post`` activations of every token of its first ``OPERATING_IMAGES`` images (a cache must hold
        that hook)."""
        model = self._weights("the neurons' write directions")
        if model.write_note(layer) is None:
            return model.neuron_writes(layer)
        hook = self.blocks.hook(self.blocks.index(layer), "mlp.hook_post")
        self.require([hook])
        acts, seen = [], 0
        for b in self.batches([hook], min(self.batch_size, OPERATING_IMAGES)):
            a = b.acts[hook][:OPERATING_IMAGES - seen]  # [b, t, d_mlp]
            acts.append(a.float().reshape(-1, a.shape[-1]))
            seen += len(a)
            if seen >= OPERATING_IMAGES:
                break
        return model.neuron_writes(layer, torch.cat(acts))

    def write_note(self, layer: int) -> Optional[str]:
        """None where block ``layer``'s write directions are exact, else how :meth:`neuron_writes` linearises them."""
        return self._weights("the neurons' write directions").write_note(layer)

    def _weights(self, what: str):
        model = self.weights_model
        if model is None:
            raise InterpError(f"{what} comes from the model's weights: open the cache with the model "
                              "(open_source(cache=..., model=...); the CLI does)")
        return model

    def has(self, hook: str) -> bool:
        return hook in self.hook_names

    def require(self, hooks: Sequence[str]) -> None:
        missing = [h for h in hooks if not self.has(h)]
        if missing:
            raise InterpError(
                f"this study needs hooks {missing} that the source does not provide; "
                f"write a cache with --hooks {' '.join(missing)} or run on a live model with --images"
            )

    def batches(self, hooks: Sequence[str], batch_size: int = 16,
                reduce: Reducers = None, interventions: Sequence = ()) -> Iterator[Batch]:
        """Yield the hooks' activations for consecutive images.

        Args:
            reduce: hook -> function applied to each batch's activation before it is kept (e.g. a norm
                or one attention row), so a live run never holds the full tensor longer than the hook call.
                A reducer that slices the token axis must use the layout of the batch it reduces: pass a
                function ``layout -> {hook: fn}`` instead of the dict (see :func:`~interp.runtime.forward.run_hooks`).
            interventions: applied (after the source's own) to this call's forwards; live sources only.
        """
        raise NotImplementedError


OPERATING_IMAGES = 16  # images whose tokens are the operating point of a write through a norm


def require_live(source, what: str) -> None:
    """Raise a clear error unless ``source`` is a live activation source (``what`` re-runs the model: a causal
    study, an edit), not a cache."""
    if not (isinstance(source, ActivationSource) and source.is_live):
        raise InterpError(f"the {what} re-runs the model: give a live source "
                          "(open_source(model=..., images=...); CLI --images), not a cache")
