"""Sizes beyond what a model or the data holds are refused in one line with status 2 (issue 35): before, they
ended in a raw traceback or ran until memory or time ran out."""
from __future__ import annotations

import pytest

from conftest import one_error_line
from interp.cli import main
from interp.errors import UsageError
from interp.studies.artifacts.ablate import random_controls


def test_report_top_k_beyond_the_model_is_refused_before_the_studies(tmp_path, capsys):
    assert main(["report", "--top-k", "100000000", "--out", str(tmp_path / "r"), "--no-progress"]) == 2
    line = one_error_line(capsys.readouterr().err)
    assert "--top-k 100000000" in line and "give --top-k <= 384" in line, line
    assert not (tmp_path / "r").exists()


def test_controls_that_cannot_be_drawn_are_one_line():
    with pytest.raises(UsageError, match="too few for controls of 3"):
        random_controls({2: [0, 1, 2]}, 5, n_controls=1, seed=0)
    assert random_controls({2: [0, 1, 2]}, 5, n_controls=0, seed=0) == []
    assert len(random_controls({2: [0, 1]}, 4, n_controls=2, seed=0)) == 2


def test_arguments_the_config_refutes_are_refused_before_torch(tmp_path):
    """--detect-layer 9 on a 6-block model, a hook of block 9, --features 999 of a 384-feature SAE, an SAE folder
    another run trains into: refused in a fresh interpreter without importing torch (they arrived after 10-15 s
    of model loading)."""
    import json
    import subprocess
    import sys

    from interp.models import sample_image_paths

    image = str(sample_image_paths()[0])
    sae = tmp_path / "sae"
    sae.mkdir()
    (sae / "sae.json").write_text(json.dumps({"hook": "blocks.3.hook_resid_post", "n_features": 384}))
    argvs = [
        ["study", "norms", "planted_vit", "--images", image, "--detect-layer", "9", "--out", str(tmp_path / "a")],
        ["study", "norms", "vit_small_patch16_224", "--depth", "2", "--images", image, "--detect-layer", "2",
         "--out", str(tmp_path / "b")],
        ["sae", "train", "planted_vit", "--images", image, "--hook", "blocks.9.hook_resid_post",
         "--out", str(tmp_path / "c")],
        ["study", "ablate", "planted_vit", "--images", image, "--sae", str(sae), "--features", "3,999",
         "--out", str(tmp_path / "d")],
        ["sae", "train", "planted_vit", "--images", image, "--hook", "blocks.3.hook_resid_post",
         "--out", str(tmp_path / "busy")],
    ]
    from interp.cache.lock import WriterLock

    (tmp_path / "busy").mkdir()
    held = WriterLock(tmp_path / "busy" / "sae.json").acquire()  # another run trains into busy/
    probe = ("import sys\nfrom interp.cli import main\n"
             f"codes = [main(a) for a in {argvs!r}]\n"
             "print(codes, 'torch' in sys.modules)\n")
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True)
    held.release()
    assert out.stdout.strip() == "[2, 2, 2, 2, 1] False", (out.stdout, out.stderr)
    err = out.stderr.strip().splitlines()
    assert "planted_vit has 6 blocks" in err[0] and "has 2 blocks" in err[1] and "blocks.9" in err[2], err
    assert "feature 999 does not exist" in err[3] and "384 features" in err[3], err
    assert "being trained into by another interp run" in err[4], err


@pytest.mark.parametrize("where, status, words", [
    ("file", 2, "is a file"), ("under a file", 2, "lies under"), ("/proc/x", 1, "in '/proc'"),
])
def test_sae_train_out_that_cannot_be_a_folder_is_one_line(tmp_path, capsys, where, status, words):
    """`sae train --out` an existing file, a path under a file, /proc/x: raw tracebacks before."""
    from interp.models import sample_image_paths

    (tmp_path / "f").write_text("mine")
    out = {"file": tmp_path / "f", "under a file": tmp_path / "f" / "sub", "/proc/x": "/proc/x"}[where]
    argv = ["sae", "train", "planted_vit", "--images", str(sample_image_paths()[0]), "--hook",
            "blocks.3.hook_resid_post", "--out", str(out), "--overwrite"]
    assert main(argv) == status
    assert words in one_error_line(capsys.readouterr().err)
    assert (tmp_path / "f").read_text() == "mine"


def test_sae_train_defaults_on_a_handful_of_photos_say_what_to_change_at_once(capsys):
    """With its defaults on the 4 sample photos `sae train` failed after 15 s ("cannot fill 8 data shards")."""
    from interp.models import sample_image_paths

    folder = str(sample_image_paths()[0].parent)
    argv = ["sae", "train", "planted_vit", "--images", folder, "--hook", "blocks.3.hook_resid_post", "--out", "x"]
    assert main(argv) == 2
    line = one_error_line(capsys.readouterr().err)
    assert "fewer than --data-shards 8" in line and "--data-shards 1" in line, line
