"""Open an activation source: a live model over images, or a cache file."""
from __future__ import annotations

from pathlib import Path
from typing import Optional, Sequence, Union

from .. import cache as cache_mod
from ..errors import InterpError
from ..models.inputs.preprocessing import TransformSpec, eval_transform
from .cache_source import CacheSource
from ..models.inputs.preprocessing import ImagesSpec
from .live_source import LiveSource
from .source import ActivationSource


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
        source = CacheSource(cache_mod.open(cache, model=model), model)
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
