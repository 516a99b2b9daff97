"""Progress bars of the Python API: drawn on a terminal, never into a pipe or a log, and in a notebook without
ipywidgets as text (not tqdm.auto's red "IProgress not found" box)."""
from __future__ import annotations

import io
import sys
import types
import warnings

from interp import _progress


class _Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


def test_no_bar_when_stderr_is_not_a_terminal(monkeypatch):
    monkeypatch.setattr(sys, "stderr", io.StringIO())
    assert list(_progress.tqdm(range(3), desc="work")) == [0, 1, 2]
    assert sys.stderr.getvalue() == ""


def test_a_bar_on_a_terminal_unless_disabled(monkeypatch):
    monkeypatch.setattr(sys, "stderr", _Terminal())
    list(_progress.tqdm(range(3), desc="work"))
    assert "work" in sys.stderr.getvalue() and "3/3" in sys.stderr.getvalue()
    monkeypatch.setattr(sys, "stderr", _Terminal())
    list(_progress.tqdm(range(3), desc="work", disable=True))
    assert sys.stderr.getvalue() == ""


def _fake_notebook(monkeypatch):
    class ZMQInteractiveShell:  # what get_ipython() returns in a Jupyter kernel
        pass

    monkeypatch.setitem(sys.modules, "IPython", types.SimpleNamespace(get_ipython=ZMQInteractiveShell))


def test_in_a_notebook_without_ipywidgets_the_bar_is_text_not_the_red_box(monkeypatch):
    from tqdm.std import tqdm as text_bar

    _fake_notebook(monkeypatch)
    monkeypatch.setitem(sys.modules, "ipywidgets", None)  # not installed: `import ipywidgets` fails
    assert _progress.in_notebook() and _progress.bar_class() is text_bar
    out = io.StringIO()  # a kernel's stderr is no terminal, and the bar is still drawn there
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # the IProgress fallback of tqdm.auto warns; the text bar does not
        list(_progress.tqdm(range(2), desc="work", file=out))
    assert "2/2" in out.getvalue()


def test_in_a_notebook_with_ipywidgets_the_widget(monkeypatch):
    from tqdm.notebook import tqdm as notebook_bar

    _fake_notebook(monkeypatch)
    monkeypatch.setitem(sys.modules, "ipywidgets", types.ModuleType("ipywidgets"))  # importable
    assert _progress.bar_class() is notebook_bar


def test_a_study_from_python_draws_no_bar_into_a_pipe(capsys):
    import interp
    from interp.models import sample_image_paths
    from interp.studies import open_source
    from interp.studies.artifacts.norms import norms_study

    source = open_source(model=interp.load("planted_vit"), images=sample_image_paths()[:1])
    norms_study(source, progress=True)
    err = capsys.readouterr().err
    assert "it/s" not in err and "%|" not in err
