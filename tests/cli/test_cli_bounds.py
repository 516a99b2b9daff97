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
