"""The redundancy study (Darcet et al., Fig. 5a): neighbour similarity of the input patch embeddings, normal vs
high-norm tokens, on constructed embeddings and on the planted model whose high-norm tokens are flat patches."""
from __future__ import annotations

import json

import pytest
import torch

import interp
from interp.studies import open_source
from interp.studies.artifacts.redundancy import (MIN_GROUP_TOKENS, RedundancyResult, neighbour_similarity,
                                                 redundancy_study)
from interp.detection.detection import DetectionSpec
from interp.detection.detection import Detection
from interp.detection.thresholds import resolve_threshold
from interp.detection.detection import RunOptions


def test_neighbour_similarity_is_the_mean_cosine_over_the_grid_neighbours():
    v, u = torch.tensor([1.0, 0.0]), torch.tensor([0.0, 1.0])
    # 2 x 3 grid: row 0 = v v u, row 1 = v v v
    scales = torch.tensor([1.0, 1.0, 3.0, 2.0, 1.0, 5.0]).view(6, 1)
    e = (torch.stack([v, v, u, v, v, v]) * scales).unsqueeze(0)  # [1, 6, 2]
    sim = neighbour_similarity(e, (2, 3))[0]
    # corner (0,0): right v, down v -> 1; (0,1): left v, right u, down v -> 2/3; (0,2): left v, down v -> 0
    # (1,0): 1; (1,1): up v, left v, right v -> 1; (1,2): left v, up u -> 1/2   (scale never matters)
    torch.testing.assert_close(sim, torch.tensor([1.0, 2 / 3, 0.0, 1.0, 1.0, 0.5]))
    checker = torch.tensor([1.0, -1.0, 1.0, -1.0, 1.0, -1.0, 1.0, -1.0, 1.0]).view(1, 9, 1)
    torch.testing.assert_close(neighbour_similarity(checker, (3, 3)), -torch.ones(1, 9))
    with pytest.raises(interp.InterpError, match="do not fill"):
        neighbour_similarity(torch.zeros(1, 5, 2), (2, 3))


def _half_flat_images(n: int = 2) -> torch.Tensor:
    """Left half one flat colour (per image), right half noise: planted_vit's high-norm tokens are flat patches."""
    g = torch.Generator().manual_seed(0)
    x = torch.randn(n, 3, 224, 224, generator=g)
    x[..., :112] = torch.linspace(-0.5, 0.5, n).view(n, 1, 1, 1)
    return x


@pytest.fixture(scope="module")
def planted():
    model = interp.load("planted_vit")
    x = _half_flat_images()
    return model, x, open_source(model=model, images=x)


def test_planted_high_norm_tokens_sit_on_redundant_patches(planted):
    model, x, source = planted
    result = redundancy_study(source, progress=False)
    truth = interp.models.planted_truth(model).artifact_mask(model, x).reshape(len(x), -1)
    found = torch.tensor(result.outlier_maps, dtype=torch.bool).reshape(len(x), -1)
    assert result.artifacts_found and torch.equal(found, truth)  # the detection contract found the flat half
    high, normal = result.groups["high_norm"], result.groups["normal"]
    assert high["n_tokens"] == int(truth.sum()) and normal["n_tokens"] == truth.numel() - int(truth.sum())
    assert high["median"] > 0.99 and normal["median"] < 0.2      # flat patches equal their neighbours; noise does not
    assert result.difference == pytest.approx(high["mean"] - normal["mean"]) and result.difference > 0.5
    assert sum(high["histogram"]) == high["n_tokens"] and len(result.hist_edges) == len(high["histogram"]) + 1
    assert result.hook == "hook_patch_embed" and result.params["embedding"] == "patch"


def test_the_groups_are_the_detections_outliers(planted):
    """Handed a detection whose outliers are the textured patches, the order flips: the study reads the
    detection's outliers, nothing else."""
    model, x, source = planted
    textured = ~interp.models.planted_truth(model).artifact_mask(model, x).reshape(len(x), -1)
    norms = 1.0 + textured.float()   # textured patches at norm 2, flat ones at 1; threshold 1.5
    det = Detection(layer=model.n_layers - 1, spec=1.5, threshold=resolve_threshold(norms.numpy(), 1.5),
                    norms=norms, ids=tuple(source.ids), fingerprint=source.fingerprint)
    result = redundancy_study(source, detection=det, progress=False)
    assert result.groups["high_norm"]["n_tokens"] == int(textured.sum())
    assert result.groups["high_norm"]["mean"] < result.groups["normal"]["mean"]


def test_a_group_with_too_few_tokens_gets_no_number_and_says_why(planted):
    from interp.detection.detection import detect

    _, _, source = planted
    top = detect(source, DetectionSpec(threshold="auto"), RunOptions(progress=False)).norms.flatten().sort().values
    threshold = float((top[-4] + top[-5]) / 2)    # 4 tokens above it
    result = redundancy_study(source, detection=DetectionSpec(threshold=threshold), progress=False)
    high = result.groups["high_norm"]
    assert high["n_tokens"] == 4 < MIN_GROUP_TOKENS
    assert high["mean"] is None and high["median"] is None and result.difference is None
    assert "too few tokens (n=4)" in high["note"] and "too few tokens" in result.summary()
    assert result.groups["normal"]["mean"] is not None


def test_position_embedding_variant_and_detection_spec(planted):
    """``embedding="position"`` reads hook_embed (after the position embedding: planted_vit's constant anchor
    channels make every token alike there); a DetectionSpec is taken as the other studies take it."""
    _, _, source = planted
    after = redundancy_study(source, embedding="position", detection=DetectionSpec(preset="darcet"), progress=False)
    assert after.hook == "hook_embed" and after.preset == "darcet" and after.threshold == 150.0
    assert after.groups["normal"]["median"] > 0.99
    with pytest.raises(interp.InterpError, match="embedding="):
        redundancy_study(source, embedding="pixels", progress=False)


def test_result_round_trips_and_is_refused_as_another_study(planted):
    _, _, source = planted
    result = redundancy_study(source, progress=False)
    data = json.loads(result.to_json())
    again = RedundancyResult.from_dict(data)
    assert again.groups == data["groups"] and again.study == "redundancy"
    from interp.studies.artifacts.norms import NormsResult

    with pytest.raises(interp.InterpError, match="'redundancy' result"):
        NormsResult.from_dict(data)


def test_cache_gives_the_live_numbers_and_a_cache_without_the_hook_is_refused(tmp_path):
    from interp.studies import required_hooks

    model = interp.load("planted_vit")
    x = _half_flat_images()
    hooks = required_hooks("redundancy", model.n_layers)
    assert hooks == ["hook_patch_embed", f"blocks.{model.n_layers - 1}.hook_resid_post"]
    interp.cache.write(model, x, hooks=hooks, path=tmp_path / "a.h5", tokens="patches", progress=False)
    cached = redundancy_study(open_source(cache=tmp_path / "a.h5", model=model), progress=False)
    live = redundancy_study(open_source(model=model, images=x), progress=False)
    assert cached.groups["high_norm"]["n_tokens"] == live.groups["high_norm"]["n_tokens"]
    assert cached.groups["high_norm"]["mean"] == pytest.approx(live.groups["high_norm"]["mean"], abs=1e-5)
    interp.cache.write(model, x, hooks=hooks[1:], path=tmp_path / "b.h5", progress=False)
    with pytest.raises(interp.InterpError, match="hook_patch_embed"):
        redundancy_study(open_source(cache=tmp_path / "b.h5", model=model), progress=False)


def test_cli_writes_the_json_and_the_figure(tmp_path, capsys):
    from interp.cli import main
    from interp.models import sample_image_paths

    out = tmp_path / "red"
    assert main(["study", "redundancy", "planted_vit", "--images", str(sample_image_paths()[0].parent),
                 "--out", str(out), "--no-progress"]) == 0
    data = json.loads((out / "redundancy.json").read_text())
    assert data["study"] == "redundancy" and data["figure_files"] == ["neighbour_similarity.png"]
    assert data["groups"]["high_norm"]["mean"] > data["groups"]["normal"]["mean"]
    assert "high_norm: mean" in capsys.readouterr().out


def test_the_patch_embedding_caches_whole_under_every_tokens_mode(tmp_path):
    """hook_patch_embed has P rows (no prefix rows): every --tokens mode stores them whole, --norms-only per patch."""
    model = interp.load("vit_small_patch16_224", pretrained=False, depth=1)
    x = torch.randn(2, 3, 224, 224)
    for i, (tokens, norms_only) in enumerate((("all", False), ("cls", False), ("patches", True))):
        path = tmp_path / f"{i}.h5"
        interp.cache.write(model, x, hooks="hook_patch_embed", path=path, tokens=tokens, norms_only=norms_only,
                           progress=False)
        with interp.cache.open(path) as reader:
            assert reader["hook_patch_embed"][0:2].shape == ((2, 196) if norms_only else (2, 196, 384))
