"""Which images the probes are fitted on and which they are scored on.

By default the split is random and by image (seeded; ``test_fraction`` of the images held out). Explicit
sets replace it, e.g. ImageNet-1k train images for fitting and val images for scoring:

* ``test_images=`` (and optionally ``train_images=``): ids or paths of the source's images; without
  ``train_images`` every other image of the source trains;
* a split file (:func:`~interp.studies.probes.split_file.read_split`): one image per line, ``train PATH`` or ``test PATH`` (a comma or a tab
  may separate the two; ``#`` starts a comment), or JSON ``{"train": [...], "test": [...]}``; relative paths
  are relative to the file's folder;
* the command line: ``--images TRAIN --test-images TEST`` or ``--split FILE``.

Early stopping (``patience``) needs a validation set: ``val_fraction`` of the training images (seeded, by
image) are set aside from fitting and used only to decide when to stop.

>>> from interp.studies.probes.probes import probes_study
>>> from interp.studies.probes.split_file import read_split
>>> _ = open("split.txt", "w").write("train astronaut.jpg\\ntrain chelsea.jpg\\ntrain coffee.jpg\\ntest rocket.jpg\\n")
>>> train, test = read_split("split.txt")            # file names match the source's images by name
>>> result = probes_study(source, test_images=test, tasks=("position",), progress=False)
>>> result.split, [Path(i).name for i in result.test_ids], result.n_train_images
('given', ['rocket.jpg'], 3)
"""
from __future__ import annotations

from pathlib import Path
from typing import Dict, List, Optional, Sequence, Tuple, Union

import numpy as np
import torch

from ...formats.image_files import list_images
from ...errors import InterpError, UsageError
from ...models.inputs.preprocessing import decode_images, timm_transform
from .linear_probe import split_by_identity
from .tokens import TEST, TRAIN, VAL

PathLike = Union[str, Path]
DEFAULT_TEST_FRACTION = 0.25
DEFAULT_VAL_FRACTION = 0.1


def match_images(entries: Sequence[PathLike], ids: Sequence[str], what: str,
                 skipped: Sequence[str] = ()) -> List[int]:
    """Indices into ``ids`` of ``entries`` (image ids or paths; a path matches the id of the same file, and a
    bare file name matches when exactly one id has it). Entries naming a ``skipped`` image (unreadable, left
    out of the source) are dropped. Raises InterpError for an entry no image matches."""
    exact = {str(i): k for k, i in enumerate(ids)}
    by_path = {_resolved(i): k for k, i in enumerate(ids)}
    by_name: Dict[str, List[int]] = {}
    for k, i in enumerate(ids):
        by_name.setdefault(Path(str(i)).name, []).append(k)
    gone = {str(s) for s in skipped} | {_resolved(s) for s in skipped}
    out, missing = [], []
    for entry in entries:
        e = str(entry)
        k = exact.get(e, by_path.get(_resolved(e)))
        if k is None and len(by_name.get(Path(e).name, [])) == 1 and "/" not in e and "\\" not in e:
            k = by_name[Path(e).name][0]
        if k is not None:
            out.append(k)
        elif e not in gone and _resolved(e) not in gone:
            missing.append(e)
    if missing:
        raise InterpError(f"{what}: {len(missing)} of {len(entries)} images are not among the source's "
                          f"{len(ids)} (first: {missing[0]!r}); name them by the source's ids or paths")
    return out


def _resolved(value) -> str:
    try:
        return str(Path(str(value)).resolve())
    except (OSError, RuntimeError):
        return str(value)


def image_roles(ids: Sequence[str], *, test_images: Optional[Sequence[PathLike]] = None,
                train_images: Optional[Sequence[PathLike]] = None, test_fraction: Optional[float] = None,
                val_fraction: Optional[float] = None, seed: int = 0,
                skipped: Sequence[str] = ()) -> Tuple[torch.Tensor, str]:
    """(roles [N]: TRAIN, TEST or VAL per image, how the split was made: "random" or "given").

    ``test_images`` (+ ``train_images``): explicit sets (module docstring); else a seeded random split by
    image identity holding out ``test_fraction`` (default 0.25): the same images in another order give the same
    split (:func:`~interp.studies.probes.linear_probe.split_by_identity`). ``val_fraction`` (None: no validation set) of the
    training images become VAL."""
    n = len(ids)
    roles = torch.full((n,), TRAIN, dtype=torch.long)
    if test_images is None:
        if train_images is not None:
            raise InterpError("train_images= needs test_images= (the held-out set)")
        # one image cannot be split: it is held out and no probe is trained (the too-few rule gives the reason)
        fraction = DEFAULT_TEST_FRACTION if test_fraction is None else test_fraction
        held = split_by_identity(ids, fraction, seed=seed) if n >= 2 else torch.arange(n)
        roles[held] = TEST
        how = "random"
    else:
        if test_fraction is not None:
            raise InterpError("test_fraction applies to the random split only; with test_images= the held-out "
                              "set is given")
        test = match_images(test_images, ids, "test_images", skipped)
        roles[test] = TEST
        if train_images is not None:
            train = match_images(train_images, ids, "train_images", skipped)
            both = sorted(set(train) & set(test))
            if both:
                raise InterpError(f"{len(both)} images are in both the train and the test set (first: "
                                  f"{ids[both[0]]!r}); each image belongs to one")
            unlisted = sorted(set(range(n)) - set(train) - set(test))
            if unlisted:
                raise InterpError(f"{len(unlisted)} of the source's {n} images are in neither the train nor the "
                                  f"test set (first: {ids[unlisted[0]]!r}); list each one as train or test")
        how = "given"
    train_idx = torch.nonzero(roles == TRAIN).flatten()
    if val_fraction is not None and len(train_idx) >= 2:
        val = split_by_identity([ids[i] for i in train_idx.tolist()], val_fraction, seed=seed + 1)
        roles[train_idx[val]] = VAL
    return roles, how


def set_labels(ids: Sequence[str], roots: Sequence[PathLike]) -> Tuple[Optional[List[int]], List[str]]:
    """Class labels of images that come from several image-folder layouts (``root/<class>/img``), with one
    class index per class name across all of them (so train and test folders agree); (None, []) when an image
    is not in such a layout or fewer than 2 classes exist."""
    names: List[Optional[str]] = []
    resolved_roots = [Path(_resolved(r)) for r in roots if Path(r).is_dir()]
    for i in ids:
        path = Path(_resolved(i))
        name = None
        for root in resolved_roots:
            try:
                parts = path.relative_to(root).parts
            except ValueError:
                continue
            name = parts[0] if len(parts) == 2 else None
            break
        names.append(name)
    classes = sorted({c for c in names if c is not None})
    if any(c is None for c in names) or len(classes) < 2:
        return None, []
    index = {c: k for k, c in enumerate(classes)}
    return [index[c] for c in names], classes


def cache_images(source, images: PathLike) -> torch.Tensor:
    """The input images of a cache source, read from ``images`` (a folder or list file) in the cache's order and
    preprocessed as the cache's were (its recorded data config): Tensor[N, 3, H, W]. Every cached image must be
    among them."""
    given = {p.resolve(): p for p in list_images(images)}
    wanted = [Path(i).resolve() for i in source.ids]
    missing = [str(w) for w in wanted if w not in given]
    if missing:
        raise UsageError(f"--images {str(images)!r} lacks {len(missing)} of the cache's {len(wanted)} images "
                         f"(first: {missing[0]!r}); pass the images the cache was written from")
    config = {k: v for k, v in source.data_config().items() if k != "preprocess"}
    pixels, _, _ = decode_images([given[w] for w in wanted], timm_transform(config), strict=True)
    return torch.stack(pixels)


def split_summary(roles: torch.Tensor) -> Dict[str, int]:
    """Images per role: {"train", "val", "test"}."""
    counts = np.bincount(roles.numpy(), minlength=3)
    return {"train": int(counts[TRAIN]), "val": int(counts[VAL]), "test": int(counts[TEST])}
