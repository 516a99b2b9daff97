"""``interp.explore``: a live page over one model's artifacts; every edit re-runs the edited forward.

>>> ex = interp.explore.start(model, photos)   # in Jupyter the page shows inline (an IFrame to a local server)
>>> ex.url.startswith("http://127.0.0.1:")     # http://127.0.0.1:PORT/?token=...
True
>>> ex.run(0, [{"kind": "NeuronAblation", "neurons": {"2": [17, 101, 402, 655]}}])["outlier_count"]
0
>>> ex.stop()                                  # also done when the kernel (the Python process) exits

The command line is ``interp explore [MODEL]`` (:mod:`interp.commands.explore`).
"""
from __future__ import annotations

import weakref
from typing import Any, Optional, Union

from ..detection.spec import DetectionSpec, refuse_loose_fields
from ..errors import InterpWarning

__all__ = ["start", "Explorer"]


class Explorer:
    """A running explorer: ``url``, ``session`` (:class:`~interp.explore.session.ExploreSession`), ``stop()``;
    shown in Jupyter as the page in an IFrame."""

    def __init__(self, session, server, height: int = 900):
        self.session, self.server, self.height = session, server, height
        self._finalizer = weakref.finalize(self, server.stop)  # also run at exit (the kernel's), as finalize does

    @property
    def url(self) -> str:
        return self.server.url

    def run(self, image: int, interventions=(), threshold: Optional[float] = None) -> dict:
        """What ``POST /api/run`` answers, without HTTP."""
        return self.session.run(image, list(interventions), threshold)

    def stop(self) -> None:
        """Stop the server (idempotent)."""
        self._finalizer()

    @property
    def running(self) -> bool:
        return self._finalizer.alive

    def _repr_html_(self) -> str:
        if not self.running:
            return "<p>interp explorer stopped.</p>"
        return (f'<iframe src="{self.url}" width="100%" height="{self.height}" style="border:1px solid #ccc" '
                f'title="interp explorer"></iframe><p><a href="{self.url}" target="_blank">open in a new tab</a></p>')

    def __repr__(self) -> str:
        return f"Explorer({self.session.model.model_name}, {len(self.session.source)} images, {self.url})"


def start(model: Union[str, Any] = "planted_vit", images=None, *, neurons=None,
          detection: DetectionSpec = DetectionSpec(), top_k: int = 10, classifier=None, max_images: int = 64,
          max_seconds: float = 600.0, host: str = "127.0.0.1", port: int = 0, height: int = 900,
          **loose: Any) -> Explorer:
    """Start the explorer on ``model`` (a ``HookedViT`` or a name for ``interp.load``) over ``images``
    (default: the bundled sample photos) in a background thread, and return it (Jupyter shows the page).

    Args:
        neurons: register neurons to list ({layer: [neuron]}); default: ranked by the neurons study on start.
        detection: what counts as a high-norm token (threshold, block, preset), as in the studies
            (default "auto", the block chosen where the artifacts are); its threshold is the page's default,
            which the page may change per request. ``threshold=``, ``detect_layer=`` or ``preset=`` given loose
            are refused (one line naming ``detection=DetectionSpec(...)``).
        classifier: a classifier file (path, dict or :func:`interp.load_classifier`) for the readout's class
            logits, as the studies' ``classifier=``; default: the model's own head
            (:mod:`interp.studies.core.behaviour`).
        max_images: more images are refused (they are held in memory and re-run for each edit's readout).
        max_seconds: a request's model work stops after this many seconds (``RequestTooLarge``, HTTP 413).
        host, port: where to listen (default 127.0.0.1, any free port).
    """
    from ..errors import InterpError
    from .server import LOCAL_HOSTS, ExploreServer, require_extra
    from .session import ExploreOptions, ExploreSession

    refuse_loose_fields("interp.explore.start", loose)
    if loose:
        raise TypeError(f"interp.explore.start() got an unexpected keyword argument {next(iter(loose))!r}")
    require_extra()
    if host not in LOCAL_HOSTS:
        import warnings

        warnings.warn(f"the explorer listens on {host}: anyone who can reach it and has the token can run the model",
                      InterpWarning, stacklevel=2)
    if isinstance(model, str):
        from ..hooks.load import load

        model = load(model)
    if not hasattr(model, "intervene"):
        raise InterpError("interp.explore.start() takes a HookedViT (interp.load(...)) or a model name")
    if images is None:
        from ..models.inputs.samples import sample_image_paths

        images = sample_image_paths()
    options = ExploreOptions(detection=detection, top_k=top_k, neurons=neurons, classifier=classifier,
                             max_images=max_images, max_seconds=max_seconds)
    session = ExploreSession(model, images, options)
    return Explorer(session, ExploreServer(session, host=host, port=port).start(), height=height)
