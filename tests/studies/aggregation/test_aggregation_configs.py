"""The lazy-aggregation studies' declarations (interp/studies/aggregation/configs.py): the command line is
generated from them, their checks refuse what the old commands refused, and the Python functions take the same
options as keywords (positional box files became ``boxes=``)."""
from __future__ import annotations

import subprocess
import sys

import pytest

from interp.errors import InterpError, UsageError
from interp.detection.spec import DetectionSpec
from interp.studies.aggregation.configs import (Bootstrap, MaskingConfig, MaskingDetection, ObjectBoxes,
                                               PatchScoreConfig, PatchScoreSettings, PiBConfig, SelectiveCLSConfig,
                                               SelectiveCLSSettings)
from interp.studies.catalog import declared, required_hooks


def test_the_four_studies_are_declared_torch_free():
    code = ("import sys, interp.studies.catalog as d; names = d.declared(); "
            "print(sorted(set(names) & {'patch-score', 'pib', 'masking', 'selective-cls'}), 'torch' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout.split()
    assert out[-1] == "False"
    assert declared()["selective-cls"] is SelectiveCLSConfig and declared()["pib"] is PiBConfig


def test_cache_hooks_follow_the_patch_score_options():
    assert required_hooks("pib", 4) == ["hook_norm_final"]
    assert required_hooks("patch-score", 4, {"reference": "pooled"}) == ["hook_norm_final", "hook_pooled"]
    assert required_hooks("patch-score", 4, {"hook": "blocks.1.hook_resid_post"}) == [
        "blocks.1.hook_resid_post", "hook_norm_final"]
    with pytest.raises(InterpError, match="re-runs the model"):
        required_hooks("masking", 4)


def test_option_combinations_are_refused_in_the_config():
    with pytest.raises(UsageError, match="--boxes or --masks, not both"):
        PatchScoreConfig(boxes="b.csv", masks="m")
    with pytest.raises(UsageError, match="--fractions or --steps, not both"):
        MaskingConfig(fractions=(0.0, 0.5), steps=7)


def test_masking_detects_at_p98_unless_told_otherwise():
    assert MaskingConfig().detection.resolved() == DetectionSpec(threshold="p98")
    assert MaskingConfig(detection=MaskingDetection(preset="darcet")).detection.resolved().threshold == 150.0
    assert MaskingConfig(detection=MaskingDetection(threshold="12")).detection.resolved().threshold == 12.0


def test_the_selective_cls_options_build_one_edit():
    config = SelectiveCLSConfig.build(sigma=3.0, score="paper", fft="rfft", eps=1e-5)
    assert config.selective_cls.params(7) == {"k": 7, "sigma": 3.0, "score": "paper", "fft": "rfft", "eps": 1e-5}
    assert config.ks == (1, 7, 98) and config.objects.single_object and config.objects.max_box_fraction == 0.25
    assert PatchScoreConfig().max_box_fraction is None and not PatchScoreConfig().single_object
    score = PatchScoreConfig.build(selective_k=5, eps=1e-5).patch_score   # a group inside a group
    assert score.selective_params() == {"k": 5, "sigma": None, "score": "code", "fft": "shift", "eps": 1e-5}


def test_the_configs_hold_their_groups_as_fields_and_take_them_flat_or_whole():
    config = PiBConfig.build(boxes="b.csv", n_boot=200, reference="pooled", single_object=False)
    assert (config.objects.boxes, config.objects.single_object) == ("b.csv", False)
    assert (config.bootstrap, config.patch_score.reference) == (Bootstrap(n_boot=200), "pooled")
    assert PiBConfig.build(bootstrap=Bootstrap(level=0.9)).bootstrap.n_boot == 1000
    assert config.with_options(level=0.9).bootstrap == Bootstrap(n_boot=200, level=0.9)   # the rest kept
    with pytest.raises(TypeError, match="bootstrap= or its options"):
        PiBConfig.build(bootstrap=Bootstrap(), n_boot=10)
    with pytest.raises(UsageError, match="score='bad'"):
        SelectiveCLSConfig.build(score="bad")     # checked in its group
    assert [type(g) for g in PiBConfig().parts()[1:]] == [ObjectBoxes, PatchScoreSettings, SelectiveCLSSettings,
                                                         Bootstrap]


def test_the_command_line_fills_the_config():
    from interp.cli import build_parser

    args = build_parser().parse_args(["study", "selective-cls", "m", "--images", ".", "--out", "o", "--boxes",
                                      __file__, "--k", "1", "16", "--all-objects", "--protocol", "last"])
    config = SelectiveCLSConfig.from_args(args)
    assert config.ks == (1, 16) and config.objects.single_object is False and config.objects.protocol == "last"
    args = build_parser().parse_args(["study", "masking", "m", "--images", ".", "--out", "o",
                                      "--outlier-threshold", "p97", "--orders", "top", "random"])
    config = MaskingConfig.from_args(args)
    assert config.detection.threshold == "p97" and config.orders == ("top", "random")


def test_pib_study_needs_boxes_and_takes_a_selective_object(tmp_path):
    import torch

    from conftest import make_model
    from interp.interventions.selective_cls import SelectiveCLS
    from interp.studies.aggregation.pib import pib_study
    from interp.studies import open_source

    source = open_source(model=make_model("vit", depth=1), images=torch.rand(2, 3, 224, 224))
    with pytest.raises(UsageError, match="boxes="):
        pib_study(source, progress=False)
    with pytest.raises(TypeError, match="pass options by keyword"):
        pib_study(source, "boxes.csv", progress=False)
    from interp.studies.aggregation.patch_score import patch_score_study

    edit = SelectiveCLS(k=5, sigma=2.0)
    result = patch_score_study(source, reference="selective", selective=edit, progress=False)
    assert result.selective == edit.params()
    assert patch_score_study(source, reference="selective", selective_k=5, sigma=2.0, progress=False).maps == \
        result.maps
