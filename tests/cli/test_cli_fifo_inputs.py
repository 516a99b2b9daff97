"""A FIFO (or another entry that is neither a regular file nor a folder) given as an INPUT is refused in one line,
exit status 2, before it is opened and before any model loads: opening a FIFO for reading waits for a writer,
forever (issue 35). Every reading option of every command is tried; a guard unblocks a read that slipped
through and fails the test instead of hanging the suite."""
from __future__ import annotations

import os
import signal
import threading
import time

import pytest

from conftest import character_device, one_error_line
from interp.cli import main
from interp.models import sample_image_paths

IMAGE = str(sample_image_paths()[0])
HOOK = "blocks.3.hook_resid_post"
SAE_JSON = "sae/sae.json"  # a FIFO as the sae.json of an --sae folder
GUARD_S = 20  # a refusal takes well under a second; a blocked read is released after this


def _study(name, *extra):
    return lambda t: ["study", name, "planted_vit", "--images", IMAGE, *extra, "--out", str(t / "o")]


def _classes(tmp_path) -> str:
    path = tmp_path / "classes.txt"
    path.write_text("cat\ndog\n")
    return str(path)


# case -> (the FIFO's path in the test folder, argv given the test folder and the FIFO's path)
CASES = {
    "cache --images": ("imgs", lambda t, f: ["cache", "planted_vit", "--images", f, "--hooks", HOOK,
                                             "--out", str(t / "a.h5")]),
    "cache --image-list": ("list.txt", lambda t, f: ["cache", "planted_vit", "--image-list", f, "--hooks", HOOK,
                                                     "--out", str(t / "a.h5")]),
    "cache --weights": ("w.safetensors", lambda t, f: ["cache", "planted_vit", "--weights", f, "--images", IMAGE,
                                                       "--hooks", HOOK, "--out", str(t / "a.h5")]),
    "hooks --weights": ("w.pth", lambda t, f: ["hooks", "planted_vit", "--weights", f]),
    "study norms --images": ("imgs", lambda t, f: ["study", "norms", "planted_vit", "--images", f,
                                                   "--out", str(t / "o")]),
    "study norms --cache": ("acts.h5", lambda t, f: ["study", "norms", "planted_vit", "--cache", f,
                                                     "--out", str(t / "o")]),
    "study segment --masks": ("masks", lambda t, f: _study("segment", "--masks", f)(t)),
    "study segment --neurons": ("neurons.json", lambda t, f: _study("segment", "--masks", str(t), "--neurons", f)(t)),
    "study patch-score --masks": ("masks", lambda t, f: _study("patch-score", "--masks", f)(t)),
    "study patch-score --boxes": ("boxes.csv", lambda t, f: _study("patch-score", "--boxes", f)(t)),
    "study pib --boxes": ("boxes.json", lambda t, f: _study("pib", "--boxes", f)(t)),
    "study lost --boxes": ("boxes.json", lambda t, f: _study("lost", "--boxes", f)(t)),
    "study lost --neurons": ("neurons.json", lambda t, f: _study("lost", "--neurons", f)(t)),
    "study ablate --neurons": ("neurons.json", lambda t, f: _study("ablate", "--neurons", f)(t)),
    "study relocate --neurons": ("n.json", lambda t, f: _study("relocate", "--neurons", f)(t)),
    "study ablate --classifier": ("head.pt", lambda t, f: _study("ablate", "--neurons", "2:1", "--classifier", f)(t)),
    "study ablate --sae": ("sae", lambda t, f: _study("ablate", "--sae", f, "--features", "0")(t)),
    "study ablate --sae sae.json": (SAE_JSON, lambda t, f: _study("ablate", "--sae", str(t / "sae"),
                                                                      "--features", "0")(t)),
    "study ablate --features": ("features.json", lambda t, f: _study("ablate", "--sae", str(t), "--features", f)(t)),
    "study sae-features --sae sae.json": (SAE_JSON, lambda t, f: _study("sae-features", "--sae",
                                                                            str(t / "sae"))(t)),
    "study probes --split": ("split.txt", lambda t, f: _study("probes", "--split", f)(t)),
    "study probes --test-images": ("test", lambda t, f: _study("probes", "--test-images", f)(t)),
    "patch export --interventions": ("spec.json", lambda t, f: ["patch", "export", "planted_vit", "--interventions",
                                                                f, "--out", str(t / "p.safetensors")]),
    "patch export --features": ("features.json", lambda t, f: ["patch", "export", "planted_vit", "--sae", str(t),
                                                               "--features", f, "--out", str(t / "p.safetensors")]),
    "patch export --sae sae.json": (SAE_JSON, lambda t, f: ["patch", "export", "planted_vit", "--sae",
                                                                str(t / "sae"), "--features", "0",
                                                                "--out", str(t / "p.safetensors")]),
    "patch export --calibration-images": ("cal", lambda t, f: ["patch", "export", "planted_vit", "--interventions",
                                                               IMAGE, "--calibration-images", f,
                                                               "--out", str(t / "p.safetensors")]),
    "patch apply PATCH": ("p.safetensors", lambda t, f: ["patch", "apply", "planted_vit", f]),
    "patch apply --check-images": ("imgs", lambda t, f: ["patch", "apply", "planted_vit", IMAGE,
                                                         "--check-images", f]),
    "patch show PATCH": ("p.safetensors", lambda t, f: ["patch", "show", f]),
    "classifier zeroshot --classes": ("classes.txt", lambda t, f: [
        "classifier", "zeroshot", "--open-clip", "ViT-B-16", "--pretrained", "x", "--classes", f,
        "--out", str(t / "c.pt")]),
    "classifier zeroshot --checkpoint": ("ck.bin", lambda t, f: [
        "classifier", "zeroshot", "--open-clip", "ViT-B-16", "--checkpoint", f, "--classes", _classes(t),
        "--out", str(t / "c.pt")]),
    "compare --images": ("imgs", lambda t, f: ["compare", "planted_vit", "--images", f]),
    "compare --weights": ("w.pth", lambda t, f: ["compare", "planted_vit", "--images", IMAGE, "--weights", f]),
    "reassess --weights": ("w.pth", lambda t, f: ["reassess", "planted_vit", "--images", IMAGE, "--weights", f]),
    "reassess --classifier": ("head.pt", lambda t, f: ["reassess", "planted_vit", "--images", IMAGE,
                                                       "--classifier", f]),
    "report --images": ("imgs", lambda t, f: ["report", "--images", f, "--out", str(t / "r")]),
    "report --classifier": ("head.pt", lambda t, f: ["report", "--classifier", f, "--out", str(t / "r")]),
    "report --sae sae.json": (SAE_JSON, lambda t, f: ["report", "--sae", str(t / "sae"), "--out", str(t / "r")]),
    "explore --images": ("imgs", lambda t, f: ["explore", "--images", f, "--port", "0"]),
    "explore --neurons": ("neurons.json", lambda t, f: ["explore", "--neurons", f, "--port", "0"]),
    "explore --sae sae.json": (SAE_JSON, lambda t, f: ["explore", "--sae", str(t / "sae"), "--port", "0"]),
    "sae train --cache": ("acts.h5", lambda t, f: ["sae", "train", "planted_vit", "--cache", f, "--hook", HOOK,
                                                   "--out", str(t / "s")]),
    "sae train --images": ("imgs", lambda t, f: ["sae", "train", "planted_vit", "--images", f, "--hook", HOOK,
                                                 "--out", str(t / "s")]),
    "sae import SOURCE": ("sae.pt", lambda t, f: ["sae", "import", "planted_vit", "saev", f, "--hook", HOOK,
                                                  "--out", str(t / "s")]),
}


def _release(fifo: str, done: threading.Event, released: threading.Event) -> None:
    """After :data:`GUARD_S`, open and close the FIFO's writing end until the test ends: a reader blocked on it
    gets end-of-file and the test fails on its assertions instead of hanging. A non-blocking open for writing
    succeeds only while a reader holds the FIFO open, so ``released`` is set exactly when a reader was there."""
    if done.wait(GUARD_S):
        return
    while not done.is_set():
        try:
            os.close(os.open(fifo, os.O_WRONLY | os.O_NONBLOCK))
            released.set()
        except OSError:  # no reader waiting (yet)
            pass
        time.sleep(0.05)


class _Blocked(Exception):
    """Raised by the alarm when a command still runs long after its FIFO was released."""


@pytest.fixture
def guarded_fifo(tmp_path):
    """``make(relative path) -> str``: a FIFO in the test folder; the test is failed, not hung, if a command
    blocks on it (a releasing thread, then ``signal.alarm`` as the last resort). ``make.released`` is set when
    the thread found a reader holding one of the FIFOs open (something opened it)."""
    done, released = threading.Event(), threading.Event()
    threads = []

    def make(name: str) -> str:
        path = tmp_path / name
        path.parent.mkdir(parents=True, exist_ok=True)
        os.mkfifo(path)
        thread = threading.Thread(target=_release, args=(str(path), done, released), daemon=True)
        thread.start()
        threads.append(thread)
        return str(path)

    def blocked(signum, frame):
        raise _Blocked(f"still blocked {2 * GUARD_S} s after the start: the FIFO was opened")

    make.released = released
    old = signal.signal(signal.SIGALRM, blocked)
    signal.alarm(2 * GUARD_S)
    try:
        yield make
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, old)
        done.set()
        for thread in threads:
            thread.join()


@pytest.mark.parametrize("case", list(CASES))
def test_a_fifo_given_as_an_input_is_refused_before_it_is_opened(tmp_path, capsys, guarded_fifo, case):
    name, argv = CASES[case]
    fifo = guarded_fifo(name)
    code = main(argv(tmp_path, fifo))
    line = one_error_line(capsys.readouterr().err)
    assert code == 2 and "FIFO" in line and repr(fifo) in line, (code, line)
    assert not guarded_fifo.released.is_set(), "the FIFO was opened: refused only after the guard released it"


def test_a_symlink_to_a_device_as_an_input_is_refused(tmp_path, capsys):
    """A device (here through a symlink: ``/dev/zero`` streams forever) is refused as a FIFO is."""
    os.symlink(character_device(), tmp_path / "list.txt")
    assert main(["cache", "planted_vit", "--image-list", str(tmp_path / "list.txt"), "--hooks", HOOK,
                 "--out", str(tmp_path / "a.h5")]) == 2
    assert "symlink to a character device" in one_error_line(capsys.readouterr().err)


def _reader(module: str, name: str):
    """``module.name`` imported when the test runs (some readers' modules import torch)."""
    import importlib

    return getattr(importlib.import_module(module), name)


# reader of the Python API -> (the FIFO's path, its module, its name, the error it raises); sae.json is read
# through its folder
READERS = {
    "read_boxes": ("boxes.csv", "interp.formats.box_files", "InputPathError"),
    "list_images": ("list.txt", "interp.formats.image_files", "ImageError"),
    "open_image": ("a.png", "interp.models.inputs.preprocessing", "ImageError"),
    "read_state_dict": ("w.pth", "interp.models.loading", "InputPathError"),
    "load_classifier": ("head.pt", "interp.models.classifiers.classifier", "InputPathError"),
    "neuron_set": ("n.json", "interp.interventions.neuron_sets", "InputPathError"),
    "interventions_from_spec": ("spec.json", "interp.interventions.spec", "InputPathError"),
    "read_spec": ("p.safetensors", "interp.interventions.export", "InputPathError"),
    "open_read_only": ("a.h5", "interp.cache.integrity", "InputPathError"),
    "read_split": ("split.txt", "interp.studies.probes.split_file", "InputPathError"),
    "load": (SAE_JSON, "interp.sae.model", "InputPathError"),
    "sae_hook": (SAE_JSON, "interp.studies.sae.configs", "InputPathError"),
}


@pytest.mark.parametrize("reader", list(READERS))
def test_the_python_readers_refuse_a_fifo_too(guarded_fifo, reader):
    """What the command line refuses at parse time, the readers refuse for a Python caller (an unreadable image
    as an ImageError: a run skips it and lists it, as a broken file)."""
    import importlib

    import interp.errors

    name, module, error = READERS[reader]
    fifo = guarded_fifo(name)
    function = getattr(importlib.import_module(module), reader)
    with pytest.raises(getattr(interp.errors, error)) as info:
        function(os.path.dirname(fifo) if name == SAE_JSON else fifo)
    assert "FIFO" in str(info.value) and repr(fifo) in str(info.value)
