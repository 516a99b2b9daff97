"""The activation runtime, between the cache and the studies: where a study's activations come from.

``source`` (the :class:`~interp.runtime.source.ActivationSource` interface and its :class:`~interp.runtime.source.Batch`),
``live_source`` (a HookedViT run over images), ``cache_source`` (a cache file read lazily), ``open`` (``open_source``:
either one), ``forward`` (the forward primitive, ``run_hooks``) and ``passes`` (several readers fed from one pass
over a source; the unedited baseline pass of the causal studies).
"""
