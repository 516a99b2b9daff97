"""Progress bars of the library (``progress=True``): a tqdm bar only where someone can see it drawn.

- stderr is a terminal: tqdm's text bar;
- a Jupyter notebook: tqdm's widget when ``ipywidgets`` is importable, else the text bar (never the red
  "IProgress not found" box that ``tqdm.auto`` shows without ipywidgets);
- anything else (a pipe, a log file, CI): no bar; under the command line (:func:`show_lines`, on unless
  ``--quiet`` / ``--no-progress``), a plain line every :data:`LINE_INTERVAL` seconds instead
  (``interp: SAE topk @ blocks.5.hook_resid_post: 200/1000 [00:31<02:04]``) and one when it ends, so a long run
  is never silent in a log while a run of a few seconds prints nothing.

``progress=False`` (``disable=True``) is never drawn. Use :func:`tqdm` as ``tqdm.auto.tqdm``.
"""
from __future__ import annotations

import sys
from functools import lru_cache

LINE_INTERVAL = 10.0  # seconds between two progress lines where no bar can be drawn
LINE_FORMAT = "{desc}: {n_fmt}/{total_fmt} [{elapsed}<{remaining}]{postfix}"
_lines = False


def show_lines(on: bool) -> bool:
    """Whether a bar that cannot be drawn prints progress lines instead (the command line turns this on for
    one run); returns the previous setting."""
    global _lines
    before, _lines = _lines, bool(on)
    return before


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


@lru_cache(maxsize=1)
def line_bar_class():
    """The tqdm class that prints a line every :data:`LINE_INTERVAL` seconds (none before), and a last one
    when it closes if it printed any."""
    from tqdm.std import tqdm as text_bar

    class LineBar(text_bar):
        def __init__(self, *args, **kwargs):
            self._line_n = None
            self._lines_shown = 0
            kwargs.pop("mininterval", None)
            super().__init__(*args, mininterval=LINE_INTERVAL, **kwargs)

        def _line(self) -> None:
            self._line_n, self._lines_shown = self.n, self._lines_shown + 1
            text = self.format_meter(**{**self.format_dict, "bar_format": LINE_FORMAT})
            self.fp.write(f"interp: {text}\n")
            self.fp.flush()

        def display(self, msg=None, pos=None) -> bool:
            started = getattr(self, "start_t", None)  # None while tqdm's __init__ draws the first refresh
            if started is not None and self.n != self._line_n and self._time() - started >= LINE_INTERVAL:
                self._line()
            return True

        def close(self) -> None:
            if getattr(self, "disable", True):
                return
            if self._lines_shown and self.n != self._line_n:
                self._line()
            self.disable = True
            self._decr_instances(self)

    return LineBar


def tqdm(iterable=None, *args, disable: bool = False, **kwargs):
    """``tqdm.auto.tqdm(...)``, drawn only where :func:`visible`, else progress lines where :func:`show_lines`
    asked for them (see the module docstring)."""
    hidden = not visible(kwargs.get("file"))
    if hidden and _lines and not disable and kwargs.get("file") is None and not in_notebook():
        return line_bar_class()(iterable, *args, file=sys.stderr, **kwargs)
    return bar_class()(iterable, *args, disable=disable or hidden, **kwargs)


def write(text: str, file=None, end: str = "\n") -> None:
    """Print a line without breaking a bar that is being drawn (``tqdm.write``)."""
    bar_class().write(text, file=file, end=end)


tqdm.write = write  # callers use tqdm.write(...) as with tqdm's class
