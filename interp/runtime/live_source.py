"""A live activation source: a HookedViT run over images batch by batch (no gradients)."""
from __future__ import annotations

from pathlib import Path
from typing import Iterator, List, Optional, Sequence, Tuple

import torch

from ..errors import ImageError, InterpError
from ..interventions import NeuronAblation
from ..models.classifiers.classifier import Classifier
from ..models.fingerprint import weights_fingerprint
from ..models.classifiers.heads import Head, read_head
from ..models.layout import TokenLayout
from ..models.weights.pos_table import input_grid
from ..models.inputs.preprocessing import data_config as model_data_config
from ..models.inputs.preprocessing import (ImagesSpec, TransformSpec, eval_transform, list_images, load_images,
                                           readable_images, tensor_image_id)
from ..models.families.readout import FinalReadout
from .forward import Reducers, Run, run_hooks, run_layout
from .gradients import GradRun, run_with_grads
from .source import ActivationSource, Batch




HOLD_LIMIT = 256  # images a source decodes once and holds in memory (held_if_small); more are streamed



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
        preprocess: decode files with a paper's eval transform (:class:`~interp.models.inputs.preprocessing.EvalTransform`
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
        self.blocks = model.block_names
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
        return tuple(int(p) for p in self.model.patch_size)  # the family's: a PVTv2's stride, not its 7x7 kernel

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

    def head(self) -> Head:
        """What the model's head is (a classifier or an embedding, its output width, its classes)."""
        return read_head(self.model)

    def bind_classifier(self, classifier: Classifier) -> Classifier:
        """``classifier`` bound to this source's model (its widths checked against the model's)."""
        return classifier.bind(self.model)

    def mean_ablation(self, neurons) -> "NeuronAblation":
        """A ``mode="mean"`` :class:`~interp.interventions.NeuronAblation` of ``neurons`` whose means are each
        neuron's average activation over this source's images (the unedited model's)."""
        return NeuronAblation.calibrate_means(self.model, (x for _, x in self.image_batches()), neurons)

    def calibrated(self, calibrate, *args, **kwargs):
        """An edit calibrated on this source's images: ``calibrate(model, image batches, *args, **kwargs)`` (e.g.
        ``AttentionBias.calibrate``, ``fix_reg_mean``, ``RegCache.calibrate``), the batches in the source's order."""
        return calibrate(self.model, (x for _, x in self.image_batches()), *args, **kwargs)

    def run(self, x: torch.Tensor, hooks: Sequence[str] = (), reduce: Reducers = None, interventions: Sequence = (),
            logits: bool = False) -> Run:
        """One forward of images ``x`` [b, 3, H, W] (from :meth:`image_batches`, or an edit of them: a corrupted
        input) under the source's interventions and ``interventions``: :func:`~interp.runtime.forward.run_hooks`."""
        return run_hooks(self.model, x, hooks, reduce, self.interventions + tuple(interventions), logits=logits)

    def run_with_grads(self, x: torch.Tensor, hooks: Sequence[str], objective, interventions: Sequence = ()) -> GradRun:
        """One forward and one backward of ``objective`` on images ``x`` under the source's interventions and
        ``interventions``: :func:`~interp.runtime.gradients.run_with_grads`."""
        return run_with_grads(self.model, x, hooks, objective, self.interventions + tuple(interventions))

    def final_readout(self) -> FinalReadout:
        """The model's readout after its last block, split around its norms (logit lens, logit attribution)."""
        return self.model.family.final_readout()

    def head_writes(self, layer: int) -> Tuple[torch.Tensor, torch.Tensor]:
        """What each attention head of block ``layer`` writes per unit of ``attn.hook_z``: (Tensor[h, dh, d],
        bias [d]), LayerScale included (``Family.head_writes``)."""
        return self.model.family.head_writes(self.blocks.index(layer))

    def run_at_grid(self, x: torch.Tensor, hooks: Sequence[str], grid: Tuple[int, int], offset: Optional[float],
                    antialias: bool) -> Run:
        """One forward of images ``x`` [b, 3, grid * patch] under the source's interventions, with the model's
        position table resampled to ``grid`` as DINO does (:func:`interp.models.weights.pos_table.input_grid`): LOST's
        full-resolution protocol."""
        with input_grid(self.model, grid, offset=offset, antialias=antialias):
            return run_hooks(self.model, x, hooks, interventions=self.interventions)

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
            yield Batch(self.ids[start:start + len(x)], start, run.acts, run.layout, blocks=self.blocks)
