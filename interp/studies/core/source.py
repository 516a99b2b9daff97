"""One small interface for studies to read activations: a live HookedViT over images, or a cache file.

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

Not to be confused with ``interp/cache/sources.py``: those are the *image* sources the cache writer reads
(files or a tensor); these are the *activation* sources studies read.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Dict, Iterator, List, Optional, Sequence, Set, Tuple, Union

import torch

from ...errors import ImageError, InterpError
from ...hooks.names import block_of
from ...models.fingerprint import weights_fingerprint
from ...models.layout import TokenLayout
from .forward import Reducers, run_hooks, run_layout
from ...models.preprocessing import data_config as model_data_config
from ...models.preprocessing import (TransformSpec, eval_transform, list_images, load_images, readable_images,
                                     tensor_image_id, transform_name)

ImagesSpec = Union[str, Path, Sequence[Union[str, Path]], torch.Tensor]


def token_norms(acts: torch.Tensor) -> torch.Tensor:
    """Reducer: per-token L2 norms [b, t] of [b, t, d] activations (what norm-only caches store)."""
    return acts.float().norm(dim=-1)


@dataclass
class Batch:
    """Activations of ``len(ids)`` consecutive images, starting at image ``start`` of the source.

    Attributes:
        acts: hook name -> float32 CPU tensor [b, ...] (norm-only cache hooks hold [b, t] norms).
        layout: token layout of the rows on the token axis.
        images: the forward's inputs [b, 3, H, W] float32 CPU, when a reader of a shared pass asked for them
            (:class:`~interp.studies.core.passes.Reader`), else None.
    """

    ids: List[str]
    start: int
    acts: Dict[str, torch.Tensor]
    layout: TokenLayout
    norms_only: Set[str] = field(default_factory=set)
    images: Optional[torch.Tensor] = None

    def __len__(self) -> int:
        return len(self.ids)

    def norms(self, hook: str) -> torch.Tensor:
        """Per-token L2 norms [b, t] of a [b, t, d] hook (as stored for norm-only caches)."""
        a = self.acts[hook]
        return a if hook in self.norms_only else a.norm(dim=-1)


HOLD_LIMIT = 256  # images a source decodes once and holds in memory (held_if_small); more are streamed


def n_batches(source: "ActivationSource", batch_size: Optional[int]) -> int:
    """Number of batches of ``batch_size`` (default: the source's) over the source, for progress bars."""
    bs = batch_size or source.batch_size
    return -(-len(source) // bs)


def folder_labels(paths: Sequence[Path], root: Optional[Path]) -> Tuple[Optional[List[int]], List[str]]:
    """Class labels from an image-folder layout ``root/<class>/img``; (None, []) when not that layout."""
    if root is None or not paths:
        return None, []
    try:
        classes = [p.relative_to(root).parts for p in paths]
    except ValueError:
        return None, []
    if any(len(parts) != 2 for parts in classes):
        return None, []
    names = sorted({parts[0] for parts in classes})
    if len(names) < 2:
        return None, []
    index = {n: i for i, n in enumerate(names)}
    return [index[parts[0]] for parts in classes], names


class ActivationSource:
    """Base of :class:`LiveSource` and :class:`CacheSource`."""

    model_name: str
    fingerprint: str
    layout: TokenLayout
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
    def is_live(self) -> bool:
        """True when the source runs a model (studies that re-run it with an edit need this)."""
        return False

    def data_config(self) -> dict:
        """timm's data config (input_size, mean, std, crop...) the images were preprocessed with."""
        raise NotImplementedError

    @property
    def preprocess(self) -> str:
        """The preprocessing the images went through: ``"model"`` (timm's own) or an eval transform's name
        (``"resize256-crop224"``, :class:`~interp.models.preprocessing.EvalTransform`)."""
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
        blocks = [b for b in (block_of(h) for h in self.hook_names) if b is not None]
        return max(blocks) + 1 if blocks else 0

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
                function ``layout -> {hook: fn}`` instead of the dict (see :func:`~.forward.run_hooks`).
            interventions: applied (after the source's own) to this call's forwards; live sources only.
        """
        raise NotImplementedError


class LiveSource(ActivationSource):
    """Runs a HookedViT over images batch by batch (no gradients) and yields the requested hooks.

    Args:
        model: the HookedViT.
        interventions: run every forward under these (``model.intervene``); ``layout`` and each batch's
            layout count their test-time registers.
        images: a directory (an image-folder layout ``DIR/<class>/img`` gives labels), a list file,
            paths, or a Tensor[N, 3, H, W] already preprocessed.
        strict: stop at the first unreadable file. Otherwise unreadable files (truncated ones included) are
            found up front (decoded once, JPEGs at 1/8 scale), left out of ``ids`` and listed in ``skipped`` as
            (path, reason), one warning each.
        preprocess: decode files with a paper's eval transform (:class:`~interp.models.preprocessing.EvalTransform`
            or its name, ``"resize256-crop224"``) instead of timm's own; not for a tensor (already preprocessed).
    """

    def __init__(self, model, images: ImagesSpec, batch_size: int = 16, strict: bool = False,
                 interventions: Sequence = (), preprocess: TransformSpec = None):
        self.model = model
        self.transform = eval_transform(preprocess)
        if self.transform is not None and isinstance(images, torch.Tensor):
            raise InterpError(f"preprocess={self.transform.name!r} decodes image files; a tensor is already "
                              "preprocessed: give image paths, or preprocess the tensor yourself")
        self.interventions = tuple(interventions)
        self.batch_size = batch_size
        self.model_name = model.model_name
        self.fingerprint = weights_fingerprint(model)
        self.hook_names = model.hook_names()
        self.labels: Optional[List[int]] = None
        self.class_names: List[str] = []
        self._config: Optional[dict] = None
        if isinstance(images, torch.Tensor):
            self._tensor, self._paths = images, None
            self.ids = [tensor_image_id(i) for i in range(images.shape[0])]
        else:
            self._tensor = None
            self.skipped = []
            self._paths = readable_images(list_images(images), strict=strict, skipped=self.skipped)
            self.ids = [str(p) for p in self._paths]
            root = Path(images) if isinstance(images, (str, Path)) and Path(images).is_dir() else None
            self.labels, self.class_names = folder_labels(self._paths, root)

    @property
    def layout(self) -> TokenLayout:
        """Token layout of this source's forwards: its input size under its interventions (and any the model
        has active right now), computed when asked, never remembered from an earlier forward."""
        return run_layout(self.model, self._image_size(), self.interventions)

    @property
    def n_layers(self) -> int:
        return self.model.n_layers

    def _image_size(self) -> Tuple[int, int]:
        if self._tensor is not None:
            return tuple(self._tensor.shape[-2:])
        return tuple(self.data_config()["input_size"][1:])

    @property
    def is_live(self) -> bool:
        return True

    def data_config(self) -> dict:
        if self._config is None:
            self._config = model_data_config(self.model, self.transform)
        return dict(self._config)

    @property
    def image_size(self) -> Tuple[int, int]:
        return tuple(int(v) for v in self._image_size())

    @property
    def patch_size(self) -> Tuple[int, int]:
        return tuple(int(p) for p in self.model.patch_embed.patch_size)

    def display_images(self, limit: int = 8) -> torch.Tensor:
        cfg = self.data_config()
        mean = torch.tensor(cfg["mean"], dtype=torch.float32).view(1, 3, 1, 1)
        std = torch.tensor(cfg["std"], dtype=torch.float32).view(1, 3, 1, 1)
        _, x = next(self.image_batches(limit))
        return (x.detach().float().cpu() * std + mean).clamp(0, 1)

    @property
    def reads_files(self) -> bool:
        """True when the images are files decoded per pass (not a tensor given or held in memory)."""
        return self._paths is not None and self._tensor is None

    def with_preprocess(self, preprocess: TransformSpec) -> "LiveSource":
        """This source (same files, ids and labels) decoding them with ``preprocess`` instead."""
        if not self.reads_files:
            raise InterpError("another preprocessing needs the image files: this source holds decoded pixels")
        copy = object.__new__(LiveSource)
        copy.__dict__.update(self.__dict__)
        copy.transform, copy._config = eval_transform(preprocess), None
        copy.data_config()  # a transform the model cannot take is refused now
        return copy

    def with_interventions(self, *interventions) -> "LiveSource":
        """This source (same images, ids and labels) running its forwards under ``interventions`` too."""
        copy = object.__new__(LiveSource)
        copy.__dict__.update(self.__dict__)
        copy.interventions = self.interventions + tuple(interventions)
        return copy

    def held_if_small(self, limit: Optional[int] = None) -> "LiveSource":
        """:meth:`held` when the source has at most ``limit`` images (default :data:`HOLD_LIMIT`), else itself:
        a small image set is decoded once for every pass; a large one is streamed per pass (bounded memory)."""
        return self.held() if len(self) <= (HOLD_LIMIT if limit is None else limit) else self

    def held(self) -> "LiveSource":
        """This source with every image decoded once and kept in memory (CPU Tensor[N, 3, H, W]): the same ids,
        labels and model, but no file is read again however many passes the studies make. For small image
        sets (N * 3 * H * W floats are held); a source over a tensor is returned as it is."""
        if self._tensor is not None:
            return self
        pixels = torch.cat([x.cpu() for _, x in self.image_batches()]) if self.ids else torch.zeros(0, 3, 1, 1)
        copy = LiveSource(self.model, pixels, batch_size=self.batch_size, interventions=self.interventions)
        copy.ids, copy.labels, copy.class_names = list(self.ids), self.labels, list(self.class_names)
        copy.transform = self.transform  # what the held pixels went through (data_config below says it too)
        copy.skipped = list(self.skipped)
        copy._config = self._config
        return copy

    def image_batches(self, batch_size: Optional[int] = None) -> Iterator[Tuple[int, torch.Tensor]]:
        """(start index, preprocessed images [b, 3, H, W] on the model's device)."""
        bs = batch_size or self.batch_size
        device = next(self.model.parameters()).device
        dtype = next(self.model.parameters()).dtype
        for start in range(0, len(self.ids), bs):
            if self._tensor is not None:
                x = self._tensor[start:start + bs]
            else:
                x = self._decode(self._paths[start:start + bs])
            yield start, x.to(device=device, dtype=dtype)

    def _decode(self, paths: Sequence[Path]) -> torch.Tensor:
        """Decode files that passed the up-front decode check (a truncated file is skipped there). One that
        fails now changed on disk since: it stops the run, as dropping it here would shift every later image
        against the source's ids."""
        try:
            return load_images(paths, self.model, strict=True, preprocess=self.transform)
        except ImageError as e:
            raise ImageError(f"{e.__cause__ or e} (it decoded when the run started: was it changed "
                             "while the run was going?)") from e

    def batches(self, hooks: Sequence[str], batch_size: Optional[int] = None,
                reduce: Reducers = None, interventions: Sequence = ()) -> Iterator[Batch]:
        hooks = self.model.resolve_hooks(list(hooks))
        edits = self.interventions + tuple(interventions)
        for start, x in self.image_batches(batch_size):
            run = run_hooks(self.model, x, hooks, reduce, edits)
            yield Batch(self.ids[start:start + len(x)], start, run.acts, run.layout)


def live_model(source: ActivationSource, study: str):
    """The HookedViT of a live source; a clear error for a cache source (``study`` re-runs the model)."""
    if not (isinstance(source, ActivationSource) and source.is_live):
        raise InterpError(f"the {study} re-runs the model: give a live source "
                          "(open_source(model=..., images=...); CLI --images), not a cache")
    return source.model


def open_source(model=None, images: Optional[ImagesSpec] = None, cache: Union[str, Path, None] = None,
                batch_size: int = 16, strict: bool = False, interventions: Sequence = (),
                preprocess: TransformSpec = None) -> ActivationSource:
    """A live source (``model`` + ``images``) or a cache source (``cache``, checked against ``model`` if given).

    ``strict``: a live source stops at the first unreadable image instead of skipping and recording it.
    ``interventions``: a live source runs every forward under them (a cache cannot).
    ``preprocess``: a paper's eval transform (``"resize256-crop224"``, an ``EvalTransform``) instead of timm's
    own; a cache written with another preprocessing is refused, naming both (None: whatever it was written with)."""
    if (images is None) == (cache is None):
        raise InterpError("give exactly one of images= (live run) or cache= (an interp cache file)")
    if cache is not None:
        if interventions:
            raise InterpError("a cache holds the activations of one run; interventions need images= and model=")
        from ... import cache as cache_mod

        from .cache_source import CacheSource

        source = CacheSource(cache_mod.open(cache, model=model))
        asked = eval_transform(preprocess)
        if preprocess is not None and source.preprocess != (asked.name if asked else "model"):
            raise InterpError(f"the cache {str(cache)!r} was written with the {source.preprocess!r} preprocessing, "
                              f"not the {asked.name if asked else 'model'!r} one asked for: write a cache with that "
                              "preprocessing or leave it out")
        return source
    if model is None:
        raise InterpError("a live run needs model=")
    return LiveSource(model, images, batch_size=batch_size, strict=strict, interventions=interventions,
                      preprocess=preprocess)
