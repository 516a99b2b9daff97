"""Progress bars of the Python API: drawn on a terminal, never into a pipe or a log, and in a notebook without
ipywidgets as text (not tqdm.auto's red "IProgress not found" box)."""
from __future__ import annotations

import io
import sys
import types
import warnings

import pytest

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


# ------------------------------------------------------------- one convention for long runs (issue 52, item 7)
def test_where_no_bar_is_drawn_a_long_run_prints_lines_and_a_short_one_nothing(monkeypatch):
    monkeypatch.setattr(sys, "stderr", io.StringIO())
    before = _progress.show_lines(True)
    try:
        list(_progress.tqdm(range(3), desc="short"))  # well under LINE_INTERVAL: silent
        assert sys.stderr.getvalue() == ""
        monkeypatch.setattr(_progress, "LINE_INTERVAL", 0.0)
        _progress.line_bar_class.cache_clear()
        for _ in _progress.tqdm(range(3), desc="SAE topk @ blocks.5.hook_resid_post", total=3):
            pass
        lines = sys.stderr.getvalue().splitlines()
        assert lines and all(line.startswith("interp: SAE topk @ blocks.5.hook_resid_post: ") for line in lines)
        assert lines[-1].split(": ")[2].startswith("3/3") and "\r" not in sys.stderr.getvalue()
        sys.stderr = io.StringIO()
        list(_progress.tqdm(range(3), desc="off", disable=True))  # progress=False stays quiet
        assert sys.stderr.getvalue() == ""
    finally:
        _progress.show_lines(before)
        _progress.line_bar_class.cache_clear()


class _Stop(Exception):
    pass


@pytest.mark.parametrize("argv, target", [
    (["sae", "train", "planted_vit", "--hook", "blocks.4.hook_resid_post", "--images", "PHOTOS", "--data-shards",
      "1", "--out", "OUT"], ("interp.sae", "train")),
    (["reassess", "planted_vit", "--no-probes", "--out", "OUT"], ("interp.report.reassessment", "reassess_models")),
])
@pytest.mark.parametrize("quiet", [False, True])
def test_long_commands_ask_for_progress_on_a_pipe_and_not_under_quiet(tmp_path, monkeypatch, argv, target, quiet):
    """`interp sae train` and `interp reassess` ran minutes silent into a pipe: they now ask the library for
    progress (lines where no bar is drawn, :func:`_progress.tqdm`) unless --quiet."""
    import importlib

    from interp.cli import main
    from interp.errors import InterpError
    from interp.models import sample_image_paths

    asked = {}

    def fake(*args, **kwargs):  # progress: a keyword (sae train) or the settings object's (reassess)
        progress = kwargs["progress"] if "progress" in kwargs else args[2].progress
        asked["progress"], asked["lines"] = progress, _progress._lines
        raise InterpError("stopped by the test")

    monkeypatch.setattr(importlib.import_module(target[0]), target[1], fake)
    monkeypatch.setattr(sys, "stderr", io.StringIO())  # a pipe: no terminal
    argv = [str(sample_image_paths()[0].parent) if a == "PHOTOS" else str(tmp_path / "o") if a == "OUT" else a
            for a in argv]
    assert main(argv + (["--quiet"] if quiet else [])) == 1
    assert asked == {"progress": not quiet, "lines": not quiet}
    assert _progress._lines is False  # reset once the command is done
