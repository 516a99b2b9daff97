"""SAE feature ablation on a pyramid (issue 53): an SAE trained on ``stages.S.blocks.J.hook_resid_post`` of a small
random PVTv2 (pvt_v2_b0 at 64 px) is ablated at that block and no other, by the hooked model, by `interp study
ablate --sae` / `interp patch export --sae` (refused before with a misleading "blocks.N" message), and the exported
patch reproduces the edit on plain timm."""
from __future__ import annotations

import pytest
import timm
import torch

import interp
from interp.cli import main
from interp.interventions import SAEFeatureAblation
from sae_helpers import needs_overcomplete

pytestmark = [needs_overcomplete, pytest.mark.filterwarnings("ignore:the SAE in .*held-out explained variance")]
MODEL, SIZE, HOOK = "pvt_v2_b0", 32, "stages.1.blocks.0.hook_resid_post"  # block 2 of 8 in forward order
FEATURES = [1, 6, 40]


@pytest.fixture(scope="module")
def pyramid(tmp_path_factory):
    """(model, SAE folder, images): the random model as every command builds it (seed 0) and an SAE at HOOK."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        model = interp.load(MODEL, pretrained=False, img_size=SIZE)
        images = torch.randn(32, 3, SIZE, SIZE, generator=torch.Generator().manual_seed(0))
        folder = tmp_path_factory.mktemp("pvt") / "sae"
        interp.sae.train(model, HOOK, folder, images=images, progress=False, arch="topk", expansion=2, k=4,
                         steps=40, tokens_per_step=128, lr=3e-3, window_images=8, data_shards=2, holdout=0.125,
                         dead_window=100, checkpoint_every=1000)
    finally:
        torch.set_num_threads(before)
    return model, folder, images[:2]


def test_the_ablation_edits_its_own_block_of_the_pyramid_by_definition(pyramid):
    model, folder, x = pyramid
    sae = interp.sae.load(folder, model=model)
    ablation = SAEFeatureAblation(sae, FEATURES)
    assert ablation.block == "stages.1.blocks.0" and ablation.layer is None
    names = model.block_names
    read = [names.resid_post(i) for i in range(model.n_layers)]
    with torch.no_grad():
        _, clean = model.run_with_cache(x, names_filter=read)
        with model.intervene(ablation):
            _, edited = model.run_with_cache(x, names_filter=read)
    for i, hook in enumerate(read):
        if i < 2:  # the blocks before it are untouched
            assert torch.equal(edited[hook], clean[hook]), hook
    at = clean[HOOK]
    codes = sae.encode(at)
    expected = at - codes[..., FEATURES] @ sae.directions[FEATURES]
    assert (at - expected).abs().max() > 1e-3  # the features fire: the edit is not empty
    torch.testing.assert_close(edited[HOOK], expected, atol=1e-4, rtol=1e-4)
    assert (edited[read[-1]] - clean[read[-1]]).abs().max() > 1e-4  # and it reaches the later blocks


def test_the_exported_patch_reproduces_the_edit_on_plain_timm(pyramid, tmp_path, capsys):
    model, folder, x = pyramid
    out = tmp_path / "p.safetensors"
    argv = ["patch", "export", MODEL, "--no-pretrained", "--img-size", str(SIZE), "--sae", str(folder),
            "--features", ",".join(map(str, FEATURES)), "--out", str(out)]
    assert main(argv) == 0, capsys.readouterr().err
    (loaded,) = interp.patch.load(out)
    assert loaded.block == "stages.1.blocks.0"
    plain = timm.create_model(MODEL, pretrained=False).eval()
    plain.load_state_dict(model.timm_model.state_dict())
    with torch.no_grad():
        expected = model.run_with_interventions(x, [loaded])
        unedited = plain(x)
        patched = interp.patch.apply(plain, out)(x)
    assert (expected - unedited).abs().max() > 1e-4
    torch.testing.assert_close(patched, expected, atol=1e-4, rtol=1e-4)


def test_study_ablate_with_the_sae_runs_on_the_pyramid(pyramid, tmp_path, capsys):
    _, folder, x = pyramid
    images = tmp_path / "imgs"
    images.mkdir()
    for i in range(2):
        from PIL import Image

        Image.fromarray((torch.rand(SIZE, SIZE, 3, generator=torch.Generator().manual_seed(i)) * 255)
                        .byte().numpy()).save(images / f"{i}.png")
    argv = ["study", "ablate", MODEL, "--no-pretrained", "--img-size", str(SIZE), "--images", str(images),
            "--sae", str(folder), "--features", "1", "--controls", "0", "--out", str(tmp_path / "o"),
            "--no-progress"]
    code = main(argv)
    assert code == 0, capsys.readouterr().err
    assert (tmp_path / "o" / "ablate.json").exists()


def test_the_explorer_sae_panel_toggles_the_ablation_on_the_pyramid(pyramid):
    """The explorer's SAE panel: the sae-features study at the stage block (its detection block named in forward
    order) and the toggled edit the same SAEFeatureAblation."""
    from interp.explore.sae_panel import SaePanel
    from interp.runtime.live_source import LiveSource

    model, folder, x = pyramid
    source = LiveSource(model, x)
    panel = SaePanel(str(folder), source, None)
    assert panel.result.hook == HOOK and panel.result.detect_layer == 2
    edit = panel.ablation({"kind": "SAEFeatureAblation", "features": FEATURES})
    assert edit.block == "stages.1.blocks.0"


def _random_ablation(block: str) -> SAEFeatureAblation:
    g = torch.Generator().manual_seed(0)
    n, d = 16, 8
    state = {"w_enc": torch.randn(n, d, generator=g), "b_enc": torch.zeros(n), "mean": torch.zeros(d),
             "scale": torch.ones(1), "dictionary": torch.randn(n, d, generator=g), "feature_means": torch.rand(n)}
    return SAEFeatureAblation(features=[2, 5], codes="relu", state=state, block=block, tokens="all")


def test_a_plain_swin_blocks_grid_output_is_edited_as_its_tokens():
    """A plain timm Swin-v2 block returns [b, h, w, d] (the hooked one [b, h*w, d]): a patch's edit reshapes."""
    from interp.interventions.base import EditContext

    ctx = EditContext(base_prefix=0, n_prefix=0, extra_start=None, n_layers=3, d_mlp=32,
                      blocks=("layers.0.blocks.0", "layers.0.blocks.1", "layers.1.blocks.0"))
    (layer, edit), = _random_ablation("layers.0.blocks.1").resid_edits(ctx).items()
    x = torch.randn(2, 3, 4, 8, generator=torch.Generator().manual_seed(1))
    assert layer == 1
    torch.testing.assert_close(edit(x), edit(x.reshape(2, 12, 8)).reshape(x.shape), rtol=0, atol=0)
    assert (edit(x) - x).abs().max() > 1e-3
    with pytest.raises(interp.errors.InterpError, match=r"reads stages\.9\.blocks\.0\.hook_resid_post; this "
                                                        r"model's blocks are layers\.0\.blocks\.0 \.\. layers\.1"):
        _random_ablation("stages.9.blocks.0").resid_edits(ctx)
