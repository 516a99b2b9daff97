"""Shared fixtures: small random-init timm ViTs of every supported family (never downloaded weights)."""
from __future__ import annotations

import contextlib
import copy
import io
import json
import os
import signal
import stat
import tempfile
import sys
import time
import warnings
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch

import interp
from interp.cli import main

import early
from built_once import built_once, remove_shared_root, shared_root
import notebook_helpers

TESTS = Path(__file__).resolve().parent  # the tests folder (its helpers: conftest, sae_helpers, reference)
REPO = TESTS.parent  # the repository root


def sigint_as_default() -> None:
    """``preexec_fn`` of a child the test interrupts: Ctrl-C handled as an interactive shell would. A shell
    running the suite as a background job (``cmd &``, nohup) makes its children ignore SIGINT, and Python then
    keeps ignoring it: the child would never see the test's Ctrl-C."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def one_error_line(err: str) -> str:
    """The one line of a command's refusal on stderr (``interp: error: ...``, no traceback)."""
    lines = [l for l in err.strip().splitlines() if l.strip()]
    assert len(lines) == 1 and lines[0].startswith("interp: error: ") and "Traceback" not in err, err
    return lines[0]


def character_device() -> str:
    """A character device a test may point a symlink at: as root, a node with /dev/zero's numbers made in a fresh
    temporary folder, so that a regression which replaced the link's target replaces that node, never the system's
    /dev/zero (it happened once: /dev/null and /dev/zero became regular files); otherwise /dev/zero itself, which a
    user cannot replace."""
    if os.geteuid() != 0:
        return "/dev/zero"
    node = os.path.join(tempfile.mkdtemp(prefix="interp-test-device-"), "zero")
    os.mknod(node, stat.S_IFCHR | 0o600, os.makedev(1, 5))
    return node


# name -> timm kwargs for a small but structurally faithful config (fewer blocks, 224 px; the CLIP towers at
# ViT-S width: what makes them CLIP (pre-norm, QuickGELU, the projection head) does not depend on it, and ViT-B's
# 768 made their tests a tenth of the suite's forward passes).
FAMILIES = {
    "vit": ("vit_small_patch16_224", dict(depth=2)),
    "deit3": ("deit3_small_patch16_224", dict(depth=2)),
    "dinov2": ("vit_small_patch14_dinov2", dict(depth=2, img_size=224)),
    "dinov2_reg": ("vit_small_patch14_reg4_dinov2", dict(depth=2, img_size=224)),
    "clip": ("vit_base_patch16_clip_224", dict(depth=2, embed_dim=384, num_heads=6)),
    "clip_quickgelu": ("vit_base_patch16_clip_quickgelu_224", dict(depth=2, embed_dim=384, num_heads=6)),
}


_BUILT: dict = {}  # (family, seed, overrides) -> the model built first; tests get copies of it


def make_model(family: str = "vit", seed: int = 0, **overrides) -> "interp.HookedViT":
    """A random-init HookedViT of ``family`` with a fixed seed (float32, eval mode): a fresh copy of the one
    built the first time (building initialises every weight, a copy is several times faster), with the global
    RNG seeded as building leaves it (``interp.load`` forks the RNG, so that state is ``manual_seed(seed)``)."""
    key = (family, seed, repr(sorted(overrides.items())))
    torch.manual_seed(seed)
    if key not in _BUILT:
        name, kwargs = FAMILIES[family]
        model = interp.load(name, pretrained=False, seed=seed, **{**kwargs, **overrides})
        # LayerScale in DINOv2/DeiT-III starts at 1e-5/1e-6; make blocks matter so tests can see edits.
        with torch.no_grad():
            for block in model.timm_model.blocks:
                for ls in (block.ls1, block.ls2):
                    if hasattr(ls, "gamma"):
                        ls.gamma.fill_(0.5)
        _BUILT[key] = model
    return copy.deepcopy(_BUILT[key])


def images(n: int = 2, size: int = 224, seed: int = 0) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    return torch.randn(n, 3, size, size, generator=g)


@pytest.fixture(params=list(FAMILIES))
def family(request):
    return request.param


@pytest.fixture
def vit():
    return make_model("vit")


@pytest.fixture
def reg_vit():
    return make_model("dinov2_reg")


@pytest.fixture
def shown_warnings():
    """Warnings printed on ``sys.stderr`` as a plain interpreter prints them (Python's default filter: once per
    place), for in-process CLI tests (``interp.cli.main`` with ``capsys``); pytest otherwise records them."""
    def show(message, category, filename, lineno, file=None, line=None):
        sys.stderr.write(warnings.formatwarning(message, category, filename, lineno, line))

    with warnings.catch_warnings():  # restores pytest's filters and showwarning afterwards
        warnings.resetwarnings()
        warnings.simplefilter("default")
        warnings.showwarning = show
        yield


@pytest.fixture
def one_thread():
    """One torch thread for the test (tiny probes run faster so on 2 shared cores); restored afterwards."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


def photo_variants(root, n_per_photo: int = 4, classes: bool = False):
    """``4 * n_per_photo`` distinct images from the bundled photos (flips and rotations) in ``root``
    (``classes``: an image-folder layout ``root/<a|b>/img``, two photos per class) -> root."""
    from PIL import Image

    from interp.models import sample_image_paths

    edits = [lambda im: im, lambda im: im.transpose(Image.FLIP_LEFT_RIGHT),
             lambda im: im.transpose(Image.FLIP_TOP_BOTTOM), lambda im: im.transpose(Image.ROTATE_180)]
    for i, path in enumerate(sample_image_paths()):
        folder = root / "ab"[i // 2] if classes else root
        folder.mkdir(parents=True, exist_ok=True)
        with Image.open(path) as im:
            for j in range(n_per_photo):
                edits[j % len(edits)](im.convert("RGB")).save(folder / f"{path.stem}_{j}.png")
    return root


@pytest.fixture(scope="session")
def photos16(tmp_path_factory):
    """16 images (the bundled photos, flipped and rotated): enough for probe scores (probes.MIN_IMAGES)."""
    return photo_variants(tmp_path_factory.mktemp("photos16"))


@pytest.fixture(scope="session")
def labelled16(tmp_path_factory):
    """The 16 images of ``photos16`` in an image-folder layout of two classes (DIR/<class>/img)."""
    return photo_variants(tmp_path_factory.mktemp("labelled16"), classes=True)


@pytest.fixture(scope="session")
def default_report():
    """``interp report --out DIR`` on the bundled default (planted_vit, the bundled photos), run once per test run
    in-process (shared by the xdist workers: tests read it, never change it): a namespace with ``out`` (the
    folder), ``stdout``, ``stderr``, ``seconds``, ``rc``, ``page`` (the index.html text), ``report``
    (report.json) and ``image_forwards`` (images the run fed through a patch embedding: forwards x images)."""
    def build(folder):
        from timm.layers import PatchEmbed

        stdout, stderr = io.StringIO(), io.StringIO()
        seen = [0]

        def count(module, inputs):
            if isinstance(module, PatchEmbed):
                seen[0] += len(inputs[0])

        counting = torch.nn.modules.module.register_module_forward_pre_hook(count)
        start = time.monotonic()
        try:
            with contextlib.redirect_stdout(stdout), contextlib.redirect_stderr(stderr):
                rc = main(["report", "--out", str(folder / "report")])
        finally:
            counting.remove()
        run = {"stdout": stdout.getvalue(), "stderr": stderr.getvalue(), "seconds": time.monotonic() - start, "rc": rc,
               "image_forwards": seen[0]}
        (folder / "run.json").write_text(json.dumps(run))

    folder = built_once("default-report", build)
    out = folder / "report"
    return SimpleNamespace(out=out, **json.loads((folder / "run.json").read_text()),
                           page=(out / "index.html").read_text(encoding="utf-8"),
                           report=json.loads((out / "report.json").read_text()))


@pytest.fixture(scope="session")
def executed_notebook():
    """The example notebook and the explorer's notebook cells, executed once in one kernel (an early launch:
    tests that use it are marked ``early("notebook")``)."""
    return notebook_helpers.executed()


def pytest_configure(config):
    """The main process (not an xdist worker) makes the folder of the data built once per run (tests/built_once.py)
    before the workers start, so that they share it, and removes it when the run ends."""
    if not hasattr(config, "workerinput"):
        shared_root()


def pytest_unconfigure(config):
    if not hasattr(config, "workerinput"):
        remove_shared_root()


def pytest_xdist_auto_num_workers(config):
    """``-n auto``: one worker per core, at most 4 (each builds the session's shared models and SAE once)."""
    return max(1, min(4, os.cpu_count() or 1))


def pytest_collection_finish(session):
    """Queue the early launches (tests/early.py) of the tests about to run."""
    if not session.config.option.collectonly:
        early.queue_for(session.items)


def pytest_runtest_setup(item):
    early.advance()


def pytest_sessionfinish(session):
    early.stop_all()

