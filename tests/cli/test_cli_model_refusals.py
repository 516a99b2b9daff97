"""Refusals about models and hook names (issue 52, items 9, 12, 13): one line under ~200 characters, exit 2 for
a bad value on every family, a "did you mean" for interp's own planted names, and a model given twice to
``compare`` / ``reassess`` refused or told apart by where its weights come from."""
from __future__ import annotations

import pytest

from interp import _model_names
from interp.cli import main
from interp.commands.groups import column_labels
from interp.errors import UnknownModelError, UnsupportedModelError, UsageError
from interp.models import sample_image_paths

PHOTOS = str(sample_image_paths()[0].parent)


def _one_line(err: str) -> str:
    assert err.count("\n") == 1 and err.startswith("interp: error: "), err
    assert len(err) < 220, f"{len(err)} characters: {err}"
    return err


def test_a_mistyped_planted_name_gets_did_you_mean(tmp_path, capsys):
    assert main(["study", "norms", "planted_vti", "--images", PHOTOS, "--out", str(tmp_path / "o")]) == 2
    assert "Did you mean: planted_vit" in _one_line(capsys.readouterr().err)


def test_the_check_after_import_offers_planted_names_too():
    from interp.models.loading import check_model_name

    with pytest.raises(UnknownModelError, match="Did you mean: planted_swin"):
        check_model_name("planted_swn")


def test_a_model_of_no_family_is_refused_in_one_short_line():
    with pytest.raises(UnsupportedModelError) as fast:
        _model_names.check_model_name_fast("resnet50")
    message = str(fast.value)
    assert len(message) < 200 and "VisionTransformer, Eva, PyramidVisionTransformerV2" in message


@pytest.mark.parametrize("model", ["planted_vit", "planted_dinov3", "planted_pvt", "planted_swin"])
def test_a_mistyped_hook_is_a_bad_value_on_every_family(tmp_path, capsys, model):
    argv = ["cache", model, "--images", PHOTOS, "--hooks", "blocks.0.hook_resid_pots", "--out", str(tmp_path / "a.h5")]
    assert main(argv) == 2
    err = _one_line(capsys.readouterr().err)
    # a flat model lists close matches; a pyramid, which names its blocks by stage, the staged name meant
    assert ("matches no hook point" in err and "Close matches:" in err) or "by stage; did you mean" in err
    assert "hook_resid_post" in err
    assert not (tmp_path / "a.h5").exists()


def test_a_model_given_twice_is_refused_before_any_model_loads(tmp_path, capsys, monkeypatch):
    import interp.hooks.load

    monkeypatch.setattr(interp.hooks.load, "load", lambda *a, **k: pytest.fail("a model was loaded"))
    for command in ("reassess", "compare"):
        assert main([command, "planted_vit", "planted_vit", "--out", str(tmp_path / command)]) == 2
        assert "given twice (positions 1 and 2)" in _one_line(capsys.readouterr().err)


def test_columns_say_where_their_weights_come_from():
    assert column_labels(["planted_vit", "planted_vit"], [None, "w/p.safetensors"], True) == [
        "planted_vit (planted)", "planted_vit (p.safetensors)"]
    assert column_labels(["vit_t", "vit_t"], [None, None], False, [224, 112]) == ["vit_t (random, 224 px)",
                                                                           "vit_t (random, 112 px)"]
    assert column_labels(["vit_t", "vit_t", "planted_vit"], [None, "a.pt", None], True) == [
        "vit_t (hub weights)", "vit_t (a.pt)", "planted_vit"]
    with pytest.raises(UsageError, match="given twice"):
        column_labels(["vit_t", "vit_t"], ["a/w.pt", "b/w.pt"], True)
