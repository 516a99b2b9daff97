"""Progress bars of the library (``progress=True``): a tqdm bar only where someone can see it drawn.

- stderr is a terminal: tqdm's text bar;
- a Jupyter notebook: tqdm's widget when ``ipywidgets`` is importable, else the text bar (never the red
  "IProgress not found" box that ``tqdm.auto`` shows without ipywidgets);
- anything else (a pipe, a log file, CI): no bar.

``progress=False`` (``disable=True``) is never drawn. Use :func:`tqdm` as ``tqdm.auto.tqdm``.
"""
from __future__ import annotations

import sys


def in_notebook() -> bool:
    """Whether this runs in a Jupyter kernel (IPython's ZMQ shell)."""
    ipython = sys.modules.get("IPython")
    shell = getattr(ipython, "get_ipython", lambda: None)() if ipython else None
    return type(shell).__name__ == "ZMQInteractiveShell"


def bar_class():
    """The tqdm class for this place: the notebook widget (with ipywidgets) or the text bar."""
    if in_notebook():
        try:
            import ipywidgets  # noqa: F401  (tqdm.notebook needs it to draw the widget)
        except ImportError:
            pass
        else:
            from tqdm.notebook import tqdm as notebook_bar

            return notebook_bar
    from tqdm.std import tqdm as text_bar

    return text_bar


def visible(stream=None) -> bool:
    """Whether a bar on ``stream`` (default stderr) would be seen: a terminal, or a notebook's output."""
    if in_notebook():
        return True
    stream = sys.stderr if stream is None else stream
    isatty = getattr(stream, "isatty", None)
    try:
        return bool(isatty and isatty())
    except ValueError:  # a closed stream
        return False


def tqdm(iterable=None, *args, disable: bool = False, **kwargs):
    """``tqdm.auto.tqdm(...)``, drawn only where :func:`visible` (see the module docstring)."""
    return bar_class()(iterable, *args, disable=disable or not visible(kwargs.get("file")), **kwargs)


def write(text: str, file=None, end: str = "\n") -> None:
    """Print a line without breaking a bar that is being drawn (``tqdm.write``)."""
    bar_class().write(text, file=file, end=end)


tqdm.write = write  # callers use tqdm.write(...) as with tqdm's class
