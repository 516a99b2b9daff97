"""Fault battery for interp.cache: damaged files (truncated, flipped bytes, bad attributes), a killed writer's
file cut short, a full disk, a read-only folder, two writers, a reader during a writer, a failed overwrite.

Every damaged cache must be refused by ``interp cache --resume`` with one ``interp: error:`` line (no
traceback), exit status 1, the file left byte for byte as it was (never marked complete), and the reader
must raise :class:`CacheError` for it (on open or when reading its rows)."""
from __future__ import annotations

import hashlib
import os
import resource
import shutil
import signal
from pathlib import Path

import h5py
import numpy as np
import pytest
import torch

import interp.cache
from conftest import make_model
from forked import Forked
from forked import cli as forked_cli
from interp.cache import integrity
from interp.cache.format import weights_source
from interp.cache.lock import WriterLock
from interp.cache.store import CacheFile
from interp.errors import CacheError
from test_cache import write_images

HOOKS = ["blocks.*.hook_resid_post"]
N_IMAGES = 12
BATCH = 4


@pytest.fixture(scope="module")
def setup(tmp_path_factory):
    """A depth-2 ViT saved as a weights file, 12 small images, a complete cache and a killed writer's file."""
    root = tmp_path_factory.mktemp("faults")
    model = make_model("vit")
    weights = root / "w.pth"
    torch.save(model.timm_model.state_dict(), weights)
    folder = write_images(root / "imgs", N_IMAGES, size=(24, 24))
    complete = root / "complete.h5"
    interp.cache.write(model, folder, hooks=HOOKS, path=complete, batch_size=BATCH, progress=False)
    killed = root / "killed.h5"
    killed_writer(weights, folder, killed, after_batches=2)
    return {"root": root, "model": model, "weights": weights, "folder": folder, "complete": complete,
            "killed": killed}


def killed_writer(weights: Path, folder: Path, out: Path, after_batches: int, overwrite: bool = False) -> None:
    """Run a writer in a child process that dies (``os._exit``, like ``kill -9``: no HDF5 close) while
    committing batch ``after_batches + 1``, leaving ``after_batches`` committed batches."""
    def dying_writer():
        original, calls = CacheFile.append, []

        def dying_append(self, batch):
            calls.append(1)
            if len(calls) > after_batches:
                os._exit(9)
            original(self, batch)

        CacheFile.append = dying_append
        model = interp.load("vit_small_patch16_224", pretrained=False, weights=weights, depth=2)
        interp.cache.write(model, folder, hooks=HOOKS, path=out, batch_size=BATCH, progress=False, overwrite=overwrite)

    with Forked(dying_writer, capture=True) as child:
        _, err = child.communicate()
        assert child.returncode == 9, err[-2000:]


def cli(setup, out: Path, *extra: str):
    """``interp cache`` in this process -> (exit status, stderr lines)."""
    from interp.cli import main

    argv = ["cache", "vit_small_patch16_224", "--weights", str(setup["weights"]), "--depth", "2",
            "--images", str(setup["folder"]), "--hooks", *HOOKS, "--out", str(out), "--batch-size", str(BATCH),
            "--no-progress", *extra]
    return main(argv)


def digest(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def assert_refused(setup, path: Path, capsys, match: str = "") -> str:
    """``--resume`` on ``path`` exits 1 with one error line and leaves the file unchanged; the reader refuses it."""
    before = digest(path)
    capsys.readouterr()
    rc = cli(setup, path, "--resume")
    err = capsys.readouterr().err
    lines = [line for line in err.splitlines() if line.strip()]
    assert rc == 1, err
    assert len(lines) == 1 and lines[0].startswith("interp: error: "), err
    assert "Traceback" not in err and match in lines[0], err
    assert digest(path) == before, "a refused resume changed the file"
    assert not [p for p in path.parent.iterdir() if ".tmp-" in p.name]
    with pytest.raises(CacheError):
        with _no_check():
            with interp.cache.open(path) as cache:
                for hook in cache.hooks:
                    cache[hook][:]
    return lines[0]


class _no_check:
    def __enter__(self):
        import warnings

        self._ctx = warnings.catch_warnings()
        self._ctx.__enter__()
        warnings.simplefilter("ignore")

    def __exit__(self, *exc):
        self._ctx.__exit__(*exc)
        return False


def copy_of(setup, name: str, tmp_path: Path, which: str = "complete") -> Path:
    path = tmp_path / f"{name}.h5"
    shutil.copyfile(setup[which], path)
    return path


# ---------------------------------------------------------------------------------------------- truncated
@pytest.mark.parametrize("which", ["complete", "killed"])
@pytest.mark.parametrize("cut", ["1k", "10%", "50%", "90%", "-100k", "-1"])
def test_truncated_cache_is_refused_never_marked_complete(setup, which, cut, tmp_path, capsys, monkeypatch):
    # HDF5's metadata retries under SWMR (30: about 1 s per open of a file cut inside its metadata) are for a
    # live writer's flush; they decide nothing here (the next test runs the default in a child of its own).
    monkeypatch.setattr(integrity, "_SWMR_READ_ATTEMPTS", 4)
    path = copy_of(setup, "cut", tmp_path, which)
    size = path.stat().st_size
    new_size = {"1k": 1024, "10%": size // 10, "50%": size // 2, "90%": size * 9 // 10, "-100k": size - 100_000,
                "-1": size - 1}[cut]
    os.truncate(path, new_size)
    line = assert_refused(setup, path, capsys, "damaged")
    assert "without --resume" in line
    if which == "complete":
        assert "truncated" in line


def test_resume_of_a_cache_cut_to_1k_ends_quickly_in_a_fresh_process(setup, tmp_path):
    """The SWMR read of a killed writer's file cut short used to spin in HDF5's retry loop for minutes."""
    path = copy_of(setup, "cut", tmp_path, "killed")
    os.truncate(path, 1024)
    # bounded retries end in seconds; unbounded ones spin far beyond the child's safety net
    with Forked(forked_cli, "cache", "vit_small_patch16_224", "--weights", setup["weights"], "--depth", "2",
                "--images", setup["folder"], "--hooks", *HOOKS, "--out", path, "--resume", "--no-progress",
                capture=True) as child:
        _, err = child.communicate()
    assert child.returncode == 1 and err.count("\n") == 1 and "is damaged" in err, err


# ---------------------------------------------------------------------------------------------- flipped bytes
def _data_offset(path: Path, row_in_chunk: int = 1) -> int:
    """Byte offset of row ``row_in_chunk`` of the second chunk of the first hook (raw, uncompressed data)."""
    with integrity.open_for_read(path) as h5:
        ds = h5["acts/blocks.1.hook_resid_post"]
        info = ds.id.get_chunk_info(1)
        return info.byte_offset + row_in_chunk * int(np.prod(ds.shape[1:])) * ds.dtype.itemsize + 100


@pytest.mark.parametrize("where", ["superblock", "root header", "data", "data, killed writer", "last byte"])
def test_flipped_bytes_are_refused(setup, where, tmp_path, capsys):
    which = "killed" if "killed" in where else "complete"
    path = copy_of(setup, "flip", tmp_path, which)
    offset = {"superblock": 20, "root header": 60, "last byte": path.stat().st_size - 1}.get(where)
    if offset is None:
        offset = _data_offset(path)
    data = bytearray(path.read_bytes())
    data[offset] ^= 0xFF
    path.write_bytes(bytes(data))
    assert_refused(setup, path, capsys, "damaged")


# ---------------------------------------------------------------------------------------------- bad attributes
def _edit(path: Path, fn) -> None:
    with h5py.File(path, "r+") as h5:
        fn(h5)


BAD_FILES = {
    "n_written missing": (lambda h5: h5.attrs.__delitem__("n_written"), "'n_written' is missing"),
    "layout not JSON": (lambda h5: h5.attrs.__setitem__("layout", "{not json"), "'layout' is not valid JSON"),
    "hooks not JSON": (lambda h5: h5.attrs.__setitem__("hooks", "[\"blocks.0"), "'hooks' is not valid JSON"),
    "batch_size 0": (lambda h5: h5.attrs.__setitem__("batch_size", 0), "'batch_size' is 0"),
    "n_written negative": (lambda h5: h5.attrs.__setitem__("n_written", -3), "'n_written' is -3"),
    "n_written too large": (lambda h5: h5.attrs.__setitem__("n_written", 99), "exceeds n_images"),
    "format_version text": (lambda h5: h5.attrs.__setitem__("format_version", "abc"), "'format_version' is 'abc'"),
    "ids shortened": (lambda h5: h5["ids"].resize(5, axis=0), "/ids has 5 rows"),
    "index shuffled": (lambda h5: h5["index"].__setitem__(slice(0, 2), [1, 0]), "/index is not an increasing"),
    "ids changed": (lambda h5: h5["ids"].__setitem__(3, "elsewhere.png"), "id or index of row 3"),
    "checksums missing": (lambda h5: h5.__delitem__("checksums"), "/checksums is missing"),
    "a hook missing": (lambda h5: h5.__delitem__("acts/blocks.0.hook_resid_post"), "blocks.0.hook_resid_post is missing"),
    "row values changed": (lambda h5: h5["acts/blocks.0.hook_resid_post"].__setitem__(7, 0), "row 7 of blocks.0"),
}


@pytest.mark.parametrize("case", list(BAD_FILES))
def test_malformed_cache_is_one_clear_line_for_resume_and_reader(setup, case, tmp_path, capsys):
    path = copy_of(setup, "bad", tmp_path)
    edit, match = BAD_FILES[case]
    _edit(path, edit)
    assert_refused(setup, path, capsys, match)


# damaged attributes, structure or index: refused before the model loads (the ids and rows need the run's
# settings first: a file written with other settings says so before its checksums are read)
BEFORE_THE_MODEL = ["n_written missing", "layout not JSON", "format_version text", "ids shortened", "index shuffled",
                    "a hook missing"]


def test_a_damaged_file_to_resume_is_refused_before_the_model_loads(setup, tmp_path, capsys, monkeypatch):
    import interp.commands.cache as cache_command

    def no_model(*args, **kwargs):
        raise AssertionError("the model was loaded before the damaged file was refused")

    monkeypatch.setattr(cache_command, "load_model", no_model)
    for case in BEFORE_THE_MODEL:
        path = copy_of(setup, case.replace(" ", "_"), tmp_path)
        edit, match = BAD_FILES[case]
        _edit(path, edit)
        assert_refused(setup, path, capsys, match)
    with pytest.raises(AssertionError, match="the model was loaded"):  # a sound file goes on to load the model
        cli(setup, copy_of(setup, "sound", tmp_path, "killed"), "--resume")


def test_other_version_and_foreign_files_are_refused(setup, tmp_path, capsys):
    path = copy_of(setup, "v99", tmp_path)
    _edit(path, lambda h5: h5.attrs.__setitem__("format_version", 99))
    line = assert_refused(setup, path, capsys, "format version 99")
    assert "--overwrite" in line
    other = tmp_path / "other.h5"
    with h5py.File(other, "w") as h5:
        h5["x"] = np.zeros(3)
    assert_refused(setup, other, capsys, "not an interp activation cache")
    text = tmp_path / "text.h5"
    text.write_text("hello " * 20)
    assert_refused(setup, text, capsys, "not an HDF5 file")


def test_reader_fails_on_a_shortened_ids_dataset_instead_of_using_fewer_rows(setup, tmp_path):
    path = copy_of(setup, "ids", tmp_path)
    _edit(path, lambda h5: h5["ids"].resize(5, axis=0))
    with pytest.raises(CacheError, match=r"/ids has 5 rows but the file records 12 written"):
        interp.cache.open(path)


def test_other_model_says_how_to_load_seeded_random_weights(setup, tmp_path):
    path = tmp_path / "random.h5"
    model = setup["model"]
    x = torch.randn(2, 3, 224, 224)
    interp.cache.write(model, x, hooks="blocks.0.hook_resid_post", path=path, progress=False,
                       weights_source=weights_source(pretrained=False, seed=3))
    other = make_model("vit", seed=1)
    with pytest.raises(CacheError, match=r"random weights, seed 3: rerun with --no-pretrained --seed 3"):
        interp.cache.write(other, x, hooks="blocks.0.hook_resid_post", path=path, resume=True, progress=False)
    with pytest.raises(CacheError, match=r"weights differ.*--no-pretrained --seed 3"):
        interp.cache.open(path, model=other)
    with interp.cache.open(path) as cache:
        assert cache.meta["weights_source"] == {"pretrained": False, "weights": None, "seed": 3}


def test_cli_records_where_the_weights_came_from(setup, tmp_path, capsys):
    out = tmp_path / "cli.h5"
    assert cli(setup, out) == 0
    with interp.cache.open(out) as cache:
        assert cache.meta["weights_source"] == {"pretrained": False, "weights": str(setup["weights"]), "seed": None}
        assert cache.model_depth == 2
    # Seeded random weights: a resume with another seed says which seed the file was written with.
    from interp.cli import main

    base = ["cache", "vit_small_patch16_224", "--no-pretrained", "--depth", "1", "--images", str(setup["folder"]),
            "--hooks", "blocks.0.hook_resid_post", "--tokens", "cls", "--out", str(tmp_path / "seeded.h5"),
            "--no-progress"]
    assert main(base + ["--seed", "5"]) == 0
    capsys.readouterr()
    assert main(base + ["--seed", "6", "--resume"]) == 1
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "rerun with --no-pretrained --seed 5" in err, err
    assert main(base + ["--seed", "5", "--resume"]) == 0


# ---------------------------------------------------------------------------------------------- disk full
def test_disk_full_before_a_batch_keeps_committed_rows_and_resumes(setup, tmp_path, monkeypatch, capsys):
    out = tmp_path / "full.h5"
    real, calls = integrity.free_bytes, []

    def filling_disk(folder):
        calls.append(1)
        return real(folder) if len(calls) <= 2 else 1000  # room for two batches, then the disk is full

    monkeypatch.setattr(integrity, "free_bytes", filling_disk)
    rc = cli(setup, out)
    err = capsys.readouterr().err
    assert rc == 1 and err.count("\n") == 1 and "not enough free disk space" in err and "8 rows committed" in err, err
    assert not [p for p in tmp_path.iterdir() if ".tmp-" in p.name]
    monkeypatch.setattr(integrity, "free_bytes", real)
    with _no_check():
        with interp.cache.open(out) as cache:
            assert len(cache) == 8 and not cache.complete
    assert cli(setup, out, "--resume") == 0


def test_write_error_from_hdf5_is_one_line_and_resumable(setup, tmp_path, monkeypatch, capsys):
    out = tmp_path / "enospc.h5"
    original, calls = CacheFile._write_rows, []

    def enospc(self, ds, start, values):
        calls.append(1)
        if len(calls) == 3:
            raise OSError(28, "No space left on device")
        original(self, ds, start, values)

    monkeypatch.setattr(CacheFile, "_write_rows", enospc)
    assert cli(setup, out) == 1
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "No space left on device" in err and "Traceback" not in err
    monkeypatch.setattr(CacheFile, "_write_rows", original)
    assert cli(setup, out, "--resume") == 0


def test_recovery_copy_checks_free_space_first_and_leaves_no_temp_file(setup, tmp_path, monkeypatch, capsys):
    path = copy_of(setup, "k", tmp_path, "killed")
    before = digest(path)
    monkeypatch.setattr(integrity, "free_bytes", lambda folder: 1000)
    assert cli(setup, path, "--resume") == 1
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "not enough free disk space" in err and "left unchanged" in err, err
    assert digest(path) == before and not [p for p in tmp_path.iterdir() if ".tmp-" in p.name]
    monkeypatch.undo()
    with pytest.warns(UserWarning, match="copied its 8 committed rows"):
        assert cli(setup, path, "--resume") == 0


def test_real_write_failure_from_a_file_size_limit(setup, tmp_path):
    """A child limited to 2 MB files (RLIMIT_FSIZE, SIGXFSZ ignored: writes fail with EFBIG as on a full
    disk) gets real HDF5 write errors: one line, no crash, the committed rows readable, resume completes."""
    out = tmp_path / "limited.h5"

    def limit_file_size():
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
        resource.setrlimit(resource.RLIMIT_FSIZE, (2_000_000, 2_000_000))

    with Forked(forked_cli, "cache", "vit_small_patch16_224", "--weights", setup["weights"], "--depth", "2",
                "--images", setup["folder"], "--hooks", *HOOKS, "--out", out, "--batch-size", "4", "--no-progress",
                capture=True, before=limit_file_size) as child:
        _, err = child.communicate()
    assert child.returncode == 1, err[-3000:]
    assert err.count("\n") == 1 and err.startswith("interp: error: "), err
    assert not [p for p in tmp_path.iterdir() if ".tmp-" in p.name]
    with _no_check():
        with interp.cache.open(out) as cache:
            n = len(cache)
            assert 0 < n < N_IMAGES and not cache.complete
            cache.verify()
    summary = interp.cache.write(setup["model"], setup["folder"], hooks=HOOKS, path=out, batch_size=BATCH,
                                 resume=True, progress=False)
    assert summary.complete and summary.new_rows == N_IMAGES - n


# ---------------------------------------------------------------------------------------------- folders, writers
def test_read_only_folder_is_one_line(setup, tmp_path, monkeypatch, capsys):
    folder = tmp_path / "ro"
    folder.mkdir()
    if os.geteuid() != 0:
        folder.chmod(0o555)
    else:  # root ignores permission bits: refuse the lock file as a read-only filesystem would
        real_open = os.open

        def read_only(path, flags, *args):
            if str(path).startswith(str(folder)) and flags & (os.O_CREAT | os.O_WRONLY | os.O_RDWR):
                raise PermissionError(13, "Permission denied", str(path))
            return real_open(path, flags, *args)

        monkeypatch.setattr(os, "open", read_only)
    try:
        assert cli(setup, folder / "x.h5") == 1
        with pytest.raises(CacheError, match=r"Permission denied.*folder you can write to"):  # the API's own check
            interp.cache.write(setup["model"], torch.randn(1, 3, 224, 224), hooks="hook_embed", path=folder / "y.h5",
                               progress=False)
    finally:
        folder.chmod(0o755)
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "Permission denied" in err and "Traceback" not in err, err
    assert not list(folder.iterdir())


def test_second_writer_through_a_symlink_is_refused(setup, tmp_path, capsys):
    path = copy_of(setup, "live", tmp_path)
    link = tmp_path / "link.h5"
    link.symlink_to(path)
    with WriterLock(path):
        assert cli(setup, link, "--resume") == 1
    assert "being written by another process" in capsys.readouterr().err
    assert link.is_symlink()


def test_glob_characters_in_out_never_delete_other_temp_files(setup, tmp_path):
    other = tmp_path / "run1.h5.tmp-123"
    other.write_text("someone else's file")
    stale = tmp_path / "run[1].h5.tmp-999999"
    stale.write_text("left by a killed writer of run[1].h5")
    out = tmp_path / "run[1].h5"
    interp.cache.write(setup["model"], torch.randn(2, 3, 224, 224), hooks="hook_embed", path=out, progress=False)
    assert other.read_text() == "someone else's file" and not stale.exists() and out.exists()


def test_a_reader_opened_before_a_writers_next_commits_reads_every_row_it_counts(setup, tmp_path, monkeypatch):
    """A SWMR reader's view of the file ends where the file ended when HDF5 opened it, while attributes are
    read as they are now. Here a running writer commits 9 batches between the reader's open and its reading
    ``n_written``; their ids fill a new HDF5 string heap past the reader's view (long file names), which
    HDF5 refuses to read ("address of object past end of allocation") unless the reader reopens."""
    folder = tmp_path / "many"
    folder.mkdir()
    for i, image in enumerate(sorted(setup["folder"].iterdir()) * 3):
        shutil.copy(image, folder / f"{i:03d}-{'long-file-name-' * 8}{image.suffix}")
    out = tmp_path / "live.h5"
    (ready_r, ready_w), (go_r, go_w) = os.pipe(), os.pipe()

    def gated_writer():  # tells the parent after its first and its ninth commit, then waits for it
        os.close(ready_r)
        os.close(go_w)  # so that the parent closing its end is the end of the pipe
        original, calls = CacheFile.append, []

        def gated(self, batch):
            original(self, batch)
            calls.append(1)
            if len(calls) in (1, 9):
                os.write(ready_w, b"%d\n" % len(calls))
                os.read(go_r, 1)

        CacheFile.append = gated
        model = interp.load("vit_small_patch16_224", pretrained=False, weights=setup["weights"], depth=2)
        interp.cache.write(model, folder, hooks=HOOKS, path=out, batch_size=4, progress=False)

    original, opens = integrity.open_read_only, []

    def open_then_let_the_writer_commit(path):
        opened = original(path)
        opens.append(opened[1])
        if len(opens) == 1:
            os.write(go_w, b"g")
            assert os.read(ready_r, 8) == b"9\n"
        return opened

    with Forked(gated_writer, capture=True) as writer:
        try:
            assert os.read(ready_r, 8) == b"1\n"
            monkeypatch.setattr(integrity, "open_read_only", open_then_let_the_writer_commit)
            with _no_check():
                with interp.cache.open(out) as cache:
                    assert opens[0] and len(cache) == len(cache.ids) == 36 and not cache.complete
                    assert cache["blocks.1.hook_resid_post"][:].shape[0] == 36
                    cache.verify()
        finally:
            os.close(go_w)  # lets the writer finish
        _, err = writer.communicate()
        assert writer.returncode == 0, err[-2000:]
    for fd in (ready_r, ready_w, go_r):
        os.close(fd)
    with interp.cache.open(out) as cache:
        assert cache.complete and len(cache) == 3 * N_IMAGES
        cache.verify()


# ---------------------------------------------------------------------------------------------- overwrite
def test_failed_overwrite_keeps_the_old_file(setup, tmp_path, monkeypatch, capsys):
    path = copy_of(setup, "old", tmp_path)
    before = digest(path)
    original, calls = CacheFile.append, []

    def failing(self, batch):
        calls.append(1)
        if len(calls) == 2:
            raise OSError(28, "No space left on device")
        original(self, batch)

    monkeypatch.setattr(CacheFile, "append", failing)
    assert cli(setup, path, "--overwrite") == 1
    assert "No space left" in capsys.readouterr().err
    assert digest(path) == before and not [p for p in tmp_path.iterdir() if ".tmp-" in p.name]


def test_killed_overwrite_keeps_the_old_file_and_the_next_run_cleans_up(setup, tmp_path):
    path = copy_of(setup, "old", tmp_path)
    before = digest(path)
    killed_writer(setup["weights"], setup["folder"], path, after_batches=1, overwrite=True)
    assert digest(path) == before
    assert [p.name for p in tmp_path.iterdir() if ".tmp-" in p.name]  # the dead writer's half file
    with interp.cache.open(path) as cache:
        assert cache.complete and len(cache) == N_IMAGES
    summary = interp.cache.write(setup["model"], setup["folder"], hooks=HOOKS, path=path, batch_size=BATCH,
                                 overwrite=True, progress=False)
    assert summary.complete and not [p for p in tmp_path.iterdir() if ".tmp-" in p.name]


# ---------------------------------------------------------------------------------------------- the killed file
def test_killed_writers_file_resumes_to_the_complete_file(setup, tmp_path):
    path = copy_of(setup, "k", tmp_path, "killed")
    with pytest.warns(UserWarning, match="copied its 8 committed rows"):
        summary = interp.cache.write(setup["model"], setup["folder"], hooks=HOOKS, path=path, batch_size=BATCH,
                                     resume=True, progress=False)
    assert summary.complete and summary.new_rows == 4
    with interp.cache.open(setup["complete"]) as a, interp.cache.open(path) as b:
        a.verify(), b.verify()
        np.testing.assert_array_equal(a["blocks.1.hook_resid_post"][:], b["blocks.1.hook_resid_post"][:])
        assert a.ids == b.ids


# ---------------------------------------------------------------------------------------------- sizes, images
def test_decompression_bomb_is_skipped_and_recorded_and_resume_goes_past_it(setup, tmp_path, monkeypatch):
    from PIL import Image

    folder = write_images(tmp_path / "imgs", 4, size=(24, 24))
    Image.new("L", (256, 256)).save(folder / "img001.jpg")  # 65536 px: a "bomb" under a 30000-px limit
    monkeypatch.setattr(Image, "MAX_IMAGE_PIXELS", 30_000)  # PIL refuses more than 2x this (the 224-px crops pass)
    out = tmp_path / "bomb.h5"
    with pytest.warns(UserWarning, match="img001.jpg"):
        summary = interp.cache.write(setup["model"], folder, hooks="hook_embed", path=out, batch_size=2,
                                     progress=False)
    assert summary.complete and summary.n_skipped == 1 and summary.n_written == 3
    with interp.cache.open(out) as cache:
        assert [s[0] for s in cache.skipped] == [1] and "too large" in cache.skipped[0][2]
    summary = interp.cache.write(setup["model"], folder, hooks="hook_embed", path=out, batch_size=2, resume=True,
                                 progress=False)
    assert summary.complete and summary.new_rows == 0


def test_huge_batch_size_allocates_buffers_for_the_images_there_are(setup, tmp_path, monkeypatch):
    from interp.cache import extract

    sizes = []
    original = extract.BufferPool.__init__

    def spy(self, shapes, dtype, batch_size):
        sizes.append(batch_size)
        original(self, shapes, dtype, batch_size)

    monkeypatch.setattr(extract.BufferPool, "__init__", spy)
    import interp.cache.file_writer as fw

    monkeypatch.setattr(fw, "BufferPool", extract.BufferPool)
    out = tmp_path / "big.h5"
    summary = interp.cache.write(setup["model"], setup["folder"], hooks=HOOKS, path=out, batch_size=100_000,
                                 progress=False)
    assert summary.complete and sizes == [N_IMAGES]
    with h5py.File(out, "r") as h5:
        assert h5["acts/blocks.0.hook_resid_post"].chunks[0] == N_IMAGES


def test_small_cache_is_not_larger_than_its_data_and_the_real_size_is_reported(setup, tmp_path, capsys):
    out = tmp_path / "small.h5"
    from interp.cli import main

    argv = ["cache", "vit_small_patch16_224", "--weights", str(setup["weights"]), "--depth", "2", "--images",
            str(setup["folder"]), "--hooks", *HOOKS, "--out", str(out), "--batch-size", "32"]
    assert main(argv) == 0  # stderr is no terminal: no bar, the summary line only
    data_bytes = N_IMAGES * 2 * 197 * 384 * 2  # 12 images, 2 hooks, [197, 384] float16
    size = out.stat().st_size
    assert size < 1.1 * data_bytes, (size, data_bytes)  # 32-row chunks for 12 images made it 2.7x
    err = capsys.readouterr().err
    assert f"file {size / 1e6:.1f} MB" in err and f"{data_bytes / 1e6:.1f} MB of activations" in err, err


def test_model_depth_is_recorded_and_derived_for_format_1_files(setup, tmp_path):
    out = tmp_path / "depth.h5"
    interp.cache.write(setup["model"], torch.randn(2, 3, 224, 224), hooks="blocks.0.hook_resid_post", path=out,
                       progress=False)
    with interp.cache.open(out) as cache:
        assert cache.model_depth == 2  # the model's depth, though only block 0 was cached
        assert cache.blocks == setup["model"].block_names  # every block's name, as the model spells it
    with h5py.File(out, "r+") as h5:  # what a format-1 writer left
        h5.attrs["format_version"] = 1
        del h5.attrs["model_depth"], h5.attrs["weights_source"], h5["checksums"], h5.attrs["blocks"]
    with interp.cache.open(out) as cache:
        assert cache.model_depth == 1 and len(cache) == 2  # lower bound: blocks up to the deepest cached hook
        assert cache.blocks.prefixes == ("blocks.0",)
        cache.verify()  # no checksums in format 1: nothing to compare, no error
    with pytest.raises(CacheError, match="format version 1.*resumes version 2.*--overwrite"):
        interp.cache.write(setup["model"], torch.randn(2, 3, 224, 224), hooks="blocks.0.hook_resid_post", path=out,
                           resume=True, progress=False)
