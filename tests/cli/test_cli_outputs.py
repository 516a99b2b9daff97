"""Outputs of the CLI are written whole or not at all, by one run at a time, and every way the destination
can fail is one line: a full disk mid-write (simulated ENOSPC), a read-only folder, a second run on the same
folder, a staging folder left by a killed run, Ctrl-C during a run and after it."""
from __future__ import annotations

import errno
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from conftest import sigint_as_default
from forked import Forked

from interp.cli import main
from interp.commands import output
from interp.commands.output import STAGING_PREFIX, atomic_output_dir
from interp.errors import OutputError
from interp.models import sample_image_paths
from interp.studies import catalog, declaration
from interp.studies.artifacts.configs import NormsConfig

IMAGE = str(sample_image_paths()[0])


def _snapshot(folder: Path) -> dict:
    """The results in ``folder`` (interp's own lock and staging entries left out: see _no_leftovers)."""
    return {p.name: p.read_bytes() for p in sorted(folder.iterdir()) if p.is_file() and not output.ours(p.name)}


def _no_leftovers(folder: Path) -> bool:
    return not any(p.name.startswith(STAGING_PREFIX) or p.name.endswith(".lock") for p in folder.iterdir())


def _old_report(folder: Path) -> dict:
    """A report folder as ``interp report`` leaves it (its marker lists its files), plus a file of the user's."""
    folder.mkdir()
    (folder / "report.json").write_text(json.dumps({"files": {"index": "index.html", "results": ["norms.json"],
                                                              "figures": ["old_figure.png"]}}))
    for name in ("index.html", "norms.json", "old_figure.png"):
        (folder / name).write_text(f"old {name}")
    (folder / "notes.txt").write_text("mine")
    return _snapshot(folder)


# ------------------------------------------------------------------------------------------ the staging helper
def test_a_complete_result_replaces_the_old_one_and_nothing_else(tmp_path):
    out = tmp_path / "out"
    before = _old_report(out)
    with atomic_output_dir(out, "report.json", replaces=["index.html", "norms.json", "old_figure.png"]) as staging:
        assert staging.parent == out and staging.name.startswith(STAGING_PREFIX)
        assert _snapshot(out) == before  # nothing moves before the result is complete
        (staging / "norms.json").write_text("new")
        (staging / "report.json").write_text("{}")
    assert _snapshot(out) == {"norms.json": b"new", "notes.txt": b"mine", "report.json": b"{}"}
    assert _no_leftovers(out)


@pytest.mark.parametrize("fault", ["disk full", "read-only", "interrupt", "bug"])
def test_a_failed_write_leaves_the_old_result_whole(tmp_path, fault):
    out = tmp_path / "out"
    before = _old_report(out)
    raised = {"disk full": OSError(errno.ENOSPC, "No space left on device"),
              "read-only": OSError(errno.EROFS, "Read-only file system", str(out / "x.png")),
              "interrupt": KeyboardInterrupt(), "bug": ZeroDivisionError()}[fault]
    expected = {"disk full": OutputError, "read-only": OutputError, "interrupt": KeyboardInterrupt,
                "bug": ZeroDivisionError}[fault]
    with pytest.raises(expected) as info:
        with atomic_output_dir(out, "report.json", replaces=["norms.json"], what="report") as staging:
            (staging / "norms.json").write_text('{"cut mid-wr')  # half written when the fault hits
            raise raised
    if fault == "disk full":
        assert "no space left" in str(info.value) and "is unchanged" in str(info.value)
    if fault == "read-only":
        assert "cannot write the report" in str(info.value)
    assert _snapshot(out) == before and _no_leftovers(out)


def test_a_folder_created_for_a_failed_result_is_removed(tmp_path):
    with pytest.raises(OutputError):
        with atomic_output_dir(tmp_path / "new", "norms.json"):
            raise OSError(errno.ENOSPC, "No space left on device")
    assert not (tmp_path / "new").exists()


def test_a_staging_folder_left_by_a_killed_run_does_not_block_the_next(tmp_path, capsys):
    out = tmp_path / "report"
    out.mkdir()
    left = out / f"{STAGING_PREFIX}report-99999"  # what kill -9 in the middle of writing leaves
    left.mkdir()
    (left / "norms.json").write_text('{"half')
    from interp.commands.saving import prepare_report_dir

    assert prepare_report_dir(out, overwrite=False) == []  # the folder counts as empty: no --overwrite needed
    with atomic_output_dir(out, "report.json") as staging:
        (staging / "report.json").write_text("{}")
    assert sorted(p.name for p in out.iterdir()) == ["report.json"]


def test_a_kill_inside_the_swap_leaves_the_old_result_for_the_next_run(tmp_path):
    """Killed after the old files moved to the backup, before the new marker was placed: the next run puts the
    old result back (it must not delete the backup with the staging folder)."""
    out = tmp_path / "report"
    before = _old_report(out)
    backup = out / f"{STAGING_PREFIX}report-old-99999"
    backup.mkdir()
    for name in ("report.json", "index.html"):
        os.replace(out / name, backup / name)
    (out / f"{STAGING_PREFIX}report-99999").mkdir()
    with pytest.raises(RuntimeError):
        with atomic_output_dir(out, "report.json", replaces=["index.html", "norms.json", "old_figure.png"]):
            raise RuntimeError("the next run fails too")
    assert _snapshot(out) == before and _no_leftovers(out)


def test_a_study_result_from_a_killed_overwrite_is_still_the_old_one(tmp_path):
    """kill -9 during the swap's first half leaves the old files in a backup folder: the next run removes
    only interp's own folders of that result."""
    out = tmp_path / "o"
    out.mkdir()
    (out / "norms.json").write_text("old")
    (out / f"{STAGING_PREFIX}neurons-4242").mkdir()  # another result's staging: not ours to clear
    with atomic_output_dir(out, "norms.json", replaces=["norms.json"]) as staging:
        (staging / "norms.json").write_text("new")
    assert (out / "norms.json").read_text() == "new" and (out / f"{STAGING_PREFIX}neurons-4242").is_dir()


# ------------------------------------------------------------------------------------------ through the CLI
def test_study_overwrite_survives_a_full_disk_mid_json(tmp_path, capsys, monkeypatch):
    out = tmp_path / "o"
    args = ["study", "norms", "planted_vit", "--images", IMAGE, "--out", str(out)]
    assert main(args) == 0
    before = _snapshot(out)
    real_write_text = Path.write_text

    def full_disk(self, data, *a, **k):
        if self.name == "norms.json":  # half of the JSON reaches the disk, then it is full
            real_write_text(self, data[: len(data) // 2], *a, **k)
            raise OSError(errno.ENOSPC, "No space left on device")
        return real_write_text(self, data, *a, **k)

    monkeypatch.setattr(Path, "write_text", full_disk)
    capsys.readouterr()
    assert main([*args, "--overwrite"]) == 1
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("interp: error: no space left") and "Traceback" not in err
    assert _snapshot(out) == before and _no_leftovers(out)
    json.loads((out / "norms.json").read_text())  # still whole
    monkeypatch.setattr(Path, "write_text", real_write_text)
    assert main([*args, "--overwrite"]) == 0  # the failed run blocks nothing


def test_report_overwrite_survives_a_full_disk_between_figures(tmp_path, capsys, monkeypatch):
    import interp.report

    out = tmp_path / "report"
    before = _old_report(out)

    def battery_on_a_full_disk(model, images, out_dir, **kwargs):
        out_dir = Path(out_dir)
        (out_dir / "norms.json").write_text("{}")
        (out_dir / "norm_profile.png").write_bytes(b"\x89PNG half")
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(interp.report, "run_report", battery_on_a_full_disk)
    assert main(["report", "--out", str(out), "--overwrite", "--no-progress"]) == 1
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "no space left" in err and "Traceback" not in err
    assert _snapshot(out) == before and _no_leftovers(out)


def test_a_second_run_on_the_same_output_is_refused_in_one_line(tmp_path, capsys, monkeypatch):
    from interp.cache.lock import WriterLock

    import interp.hooks.load

    monkeypatch.setattr(interp.hooks.load, "load", lambda *a, **k: pytest.fail("the refused run built a model"))
    out = tmp_path / "report"
    before = _old_report(out)
    with WriterLock(out / "report.json"):  # a first `interp report --out report` still running
        assert main(["report", "--out", str(out), "--overwrite"]) == 1
        err = capsys.readouterr().err
        assert err.count("\n") == 1 and "is being written by another interp run (pid " in err
        study_out = tmp_path / "o"
        with WriterLock(study_out / "norms.json"):
            assert main(["study", "norms", "planted_vit", "--images", IMAGE, "--out", str(study_out)]) == 1
            assert "another interp run" in capsys.readouterr().err
    assert _snapshot(out) == before


def test_a_read_only_destination_is_refused_before_any_work(tmp_path, capsys, monkeypatch):
    import interp.hooks.load

    monkeypatch.setattr(interp.hooks.load, "load", lambda *a, **k: pytest.fail("the model was built"))
    locked = tmp_path / "locked"
    locked.mkdir()
    if os.geteuid() == 0:  # root writes through permissions: make the folder refuse as a read-only mount does
        real_open = os.open

        def read_only(path, *a, **k):
            if str(path).startswith(str(locked)):
                raise OSError(errno.EROFS, "Read-only file system", str(path))
            return real_open(path, *a, **k)

        monkeypatch.setattr(output.os, "open", read_only)
    else:
        locked.chmod(0o555)
    for argv in (["study", "norms", "planted_vit", "--images", IMAGE, "--out", str(locked / "o")],
                 ["report", "--out", str(locked)],
                 ["cache", "planted_vit", "--images", IMAGE, "--for", "norms", "--out", str(locked / "a.h5")],
                 ["compare", "planted_vit", "--out", str(locked)]):
        assert main(argv) == 1, argv
        err = capsys.readouterr().err
        assert err.count("\n") == 1 and "cannot write in" in err and "choose a writable location" in err, err
    locked.chmod(0o755)
    assert list(locked.iterdir()) == []


# ------------------------------------------------------------------------------------------ Ctrl-C
# The scripts below wait in short sleeps: SIGINT may be delivered to another thread (torch's pool), and then a
# long time.sleep in the main thread would run to its end before Python raises KeyboardInterrupt.
WAIT_FOREVER = "while True:\n        time.sleep(0.05)\n"
SAFETY_NET_S = 1800  # only so that a hung child cannot hang the suite; the tests wait for events, not for time


def _interrupt(argv, wait_for: str, cwd: Path) -> subprocess.CompletedProcess:
    """Run ``python ARGV``, send SIGINT once ``wait_for`` shows on stderr, return the result."""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in sys.path if p)}
    proc = subprocess.Popen([sys.executable, *argv], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            cwd=cwd, env=env, preexec_fn=sigint_as_default)
    seen = ""
    while wait_for not in seen:
        line = proc.stderr.readline()  # blocks until the child writes a line, or returns "" when it has ended
        if not line:
            break
        seen += line
    proc.send_signal(signal.SIGINT)
    try:
        out, err = proc.communicate(timeout=SAFETY_NET_S)
    except subprocess.TimeoutExpired:
        proc.kill()
        out, err = proc.communicate()
        pytest.fail(f"the child ignored SIGINT: {seen + err}")
    return subprocess.CompletedProcess(argv, proc.returncode, out, seen + err)


def test_ctrl_c_during_a_study_exits_130_and_leaves_the_old_result(tmp_path):
    out = tmp_path / "o"
    out.mkdir()
    (out / "norms.json").write_text('{"old": true}')

    def working(*args, **kwargs):  # the study's work, made long enough to be interrupted in the middle of it
        print("working", file=sys.stderr, flush=True)
        while True:
            time.sleep(0.05)

    def study_with_a_long_function():
        catalog.study_function(NormsConfig)  # imports the study's module, which binds its function
        declaration._FUNCTIONS[NormsConfig] = working  # the function the runner calls (in the child only)
        return main(["study", "norms", "planted_vit", "--images", IMAGE, "--out", str(out), "--overwrite"])

    with Forked(study_with_a_long_function, capture=True) as child:
        seen = ""
        while "working" not in seen:
            line = child.stderr.readline()  # blocks until the child writes a line, or "" when it has ended
            if not line:
                break
            seen += line
        child.send_signal(signal.SIGINT)
        _, err = child.communicate()
    err = seen + err
    assert child.returncode == 130 and "interp: interrupted" in err and "Traceback" not in err, err
    assert (out / "norms.json").read_text() == '{"old": true}' and _no_leftovers(out)


def test_ctrl_c_after_the_command_is_done_exits_130_without_a_traceback(tmp_path):
    """Python's exit handlers run after the summary line; a Ctrl-C there used to print an atexit traceback."""
    code = ("import atexit, sys, time\n"
            "def handler():  # an exit handler that takes a while (h5py, tqdm threads...)\n"
            f"    {WAIT_FOREVER}"
            "atexit.register(handler)\n"
            "from interp.cli import main\n"
            "rc = main()\n"
            "print('summary line', file=sys.stderr, flush=True)\n"
            "sys.exit(rc)\n")
    script = tmp_path / "run.py"
    script.write_text(code)
    run = _interrupt([str(script), "hooks", "--help"], "summary line", tmp_path)
    assert run.returncode == 130 and "Traceback" not in run.stderr and "KeyboardInterrupt" not in run.stderr
