"""A ``transformers`` folder is an ordinary interp model end to end: one tiny random ``Dinov2WithRegistersModel``
saved once, and through the command line the aggregation studies (patch-score, masking), segment, the SAE path
(a cache, a few training steps, sae-features), an intervention exported as a patch file that loads onto the plain
timm model the folder is (equal outputs), and the explorer's session API. The numbers of each study are tested on
timm models elsewhere; here the point is that every path takes a folder."""
from __future__ import annotations

import json
import warnings
from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image

import interp
from interp.cli import main
from interp.models.weights.hf_folder import load_hf_folder

transformers = pytest.importorskip("transformers")

SAMPLES = Path(interp.__file__).parent / "data" / "samples"
HOOK = "blocks.1.hook_resid_post"


@pytest.fixture(scope="module")
def folder(tmp_path_factory):
    """A 2-block Dinov2WithRegistersModel (width 64, 2 registers, 32 px, a 4 x 4 grid), weights off their
    constants, saved with save_pretrained."""
    root = tmp_path_factory.mktemp("folder_studies") / "dinov2_reg"
    config = transformers.Dinov2WithRegistersConfig(hidden_size=64, num_hidden_layers=2, num_attention_heads=4,
                                                    mlp_ratio=2, image_size=32, patch_size=8, num_register_tokens=2)
    torch.manual_seed(0)
    model = transformers.Dinov2WithRegistersModel(config).eval()
    with torch.no_grad():
        for p in model.parameters():
            p.add_(0.1 * torch.randn_like(p))
    model.save_pretrained(root)
    return root


def _cli(*argv) -> None:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # the load's one line
        assert main([*argv, "--no-progress", "--quiet"] if argv[0] == "study" else list(argv)) == 0, argv


def _images(tmp_path, n: int) -> Path:
    """The first ``n`` sample images in a folder of their own (and, for segment, whole-image masks)."""
    out, masks = tmp_path / "images", tmp_path / "masks"
    out.mkdir()
    masks.mkdir()
    for path in sorted(SAMPLES.glob("*.jpg"))[:n]:
        (out / path.name).write_bytes(path.read_bytes())
        with Image.open(path) as im:
            Image.fromarray(np.full((im.height, im.width), 255, dtype=np.uint8)).save(masks / f"{path.stem}.png")
    return out


def test_aggregation_studies_and_segment_run_on_a_folder(folder, tmp_path):
    images = _images(tmp_path, 2)
    _cli("study", "patch-score", str(folder), "--images", str(images), "--out", str(tmp_path / "ps"), "--n-maps", "1")
    _cli("study", "masking", str(folder), "--images", str(images), "--out", str(tmp_path / "mask"),
         "--fractions", "0.25", "--orders", "top", "bottom")
    _cli("study", "segment", str(folder), "--images", str(images), "--masks", str(tmp_path / "masks"),
         "--out", str(tmp_path / "seg"), "--no-selective")
    scores = json.loads((tmp_path / "ps" / "patch_score.json").read_text())
    assert scores["model"] == str(folder) and scores["grid"] == [4, 4] and len(scores["ids"]) == 2
    assert json.loads((tmp_path / "mask" / "masking.json").read_text())["n_images"] == 2


def test_the_sae_path_runs_on_a_folder(folder, tmp_path):
    images = _images(tmp_path, 3)
    _cli("cache", str(folder), "--images", str(images), "--hooks", HOOK, "--out", str(tmp_path / "c.h5"),
         "--dtype", "float32", "--no-progress", "--quiet")
    _cli("sae", "train", str(folder), "--cache", str(tmp_path / "c.h5"), "--hook", HOOK, "--out", str(tmp_path / "sae"),
         "--expansion", "2", "--k", "2", "--steps", "4", "--tokens-per-step", "16", "--window-images", "3",
         "--data-shards", "1", "--holdout", "0", "--no-progress", "--quiet")
    _cli("study", "sae-features", str(folder), "--images", str(images), "--sae", str(tmp_path / "sae"),
         "--out", str(tmp_path / "feat"), "--detect-layer", "1")
    assert json.loads((tmp_path / "sae" / "sae.json").read_text())["hook"] == HOOK
    assert (tmp_path / "feat" / "sae_features.json").is_file()


def test_an_exported_patch_loads_onto_the_plain_timm_model(folder, tmp_path):
    spec = tmp_path / "spec.json"
    spec.write_text(json.dumps([{"kind": "NeuronAblation", "neurons": {"1": [3, 17]}, "mode": "zero"}]))
    _cli("patch", "export", str(folder), "--interventions", str(spec), "--out", str(tmp_path / "p.safetensors"))
    _cli("patch", "apply", str(folder), str(tmp_path / "p.safetensors"))  # exit 0: plain == hooked on the samples
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        hooked = interp.load(str(folder))
        plain = interp.patch.apply(load_hf_folder(folder), tmp_path / "p.safetensors")
    x = torch.randn(2, 3, 32, 32, generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        edited = hooked.run_with_interventions(x, interp.patch.load(tmp_path / "p.safetensors"))
        torch.testing.assert_close(plain(x), edited, atol=1e-5, rtol=1e-5)
        assert (edited - hooked(x)).abs().max() > 1e-4  # the ablation changes the output


def test_the_explorer_session_runs_on_a_folder(folder):
    pytest.importorskip("starlette", reason="the explore extra is not installed")
    from interp.explore.session import ExploreSession

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        model = interp.load(str(folder))
    session = ExploreSession(model, interp.models.sample_image_paths())
    info = session.info()
    assert info["grid"] == [4, 4] and info["has_cls"]
    out = session.run(0, [{"kind": "NeuronAblation", "neurons": {"1": [3]}}])
    assert [len(row) for row in out["norms"]] == [16, 16]
