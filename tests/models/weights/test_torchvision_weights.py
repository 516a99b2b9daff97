"""A torchvision ViT state dict (``torchvision.models.vit_b_16`` ...) given as ``weights=`` to the matching timm
name is converted and equals torchvision's own forward block by block; another shape is refused naming the timm
name that fits; LaSt's reference model (torchvision's ``vit_b_16``) runs ``interp study pib --protocol last``."""
from __future__ import annotations

import json

import numpy as np
import pytest
import torch
from PIL import Image
from torchvision.models.vision_transformer import VisionTransformer

import interp
from interp.cli import main
from interp.errors import ModelLoadError
from interp.models import data_config

from conftest import images


def torchvision_vit(seed: int = 0, image_size: int = 64, patch: int = 16, layers: int = 2, heads: int = 2,
                    width: int = 32, classes: int = 10) -> VisionTransformer:
    """torchvision's ViT with every parameter random (LayerNorms around 1, a position table that is not smooth)."""
    torch.manual_seed(seed)
    model = VisionTransformer(image_size=image_size, patch_size=patch, num_layers=layers, num_heads=heads,
                              hidden_dim=width, mlp_dim=4 * width, num_classes=classes).eval()
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            is_ln_weight = ".ln" in name and name.endswith("weight") or name == "encoder.ln.weight"
            p.copy_((1.0 if is_ln_weight else 0.0) + 0.1 * torch.randn(p.shape, generator=g))
    return model


def torchvision_blocks(model: VisionTransformer, x: torch.Tensor):
    """The residual stream [b, t, d] after each encoder layer, and the logits, of torchvision's own forward."""
    outs = []
    handles = [layer.register_forward_hook(lambda m, i, o: outs.append(o)) for layer in model.encoder.layers]
    with torch.no_grad():
        logits = model(x)
    for h in handles:
        h.remove()
    return outs, logits


def relative(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a - b).abs().max() / b.abs().max())


@pytest.mark.parametrize("legacy", [False, True], ids=["mlp.0", "mlp.linear_1"])
def test_a_torchvision_file_is_torchvisions_forward(legacy, tmp_path):
    tv = torchvision_vit()
    sd = tv.state_dict()
    if legacy:  # the MLP key names of torchvision's older files (MLPBlock version 1)
        sd = {k.replace("mlp.0.", "mlp.linear_1.").replace("mlp.3.", "mlp.linear_2."): v for k, v in sd.items()}
    torch.save(sd, tmp_path / "vit.pth")
    model = interp.load("vit_base_patch16_224", weights=str(tmp_path / "vit.pth"), img_size=64, embed_dim=32,
                        depth=2, num_heads=2)
    x = images(3, size=64, seed=1)
    reference, logits = torchvision_blocks(tv, x)
    with torch.no_grad():
        ours, cache = model.run_with_cache(x, names_filter="blocks.*.hook_resid_post")
    assert len(reference) == 2 and ours.shape == logits.shape == (3, 10)  # the head sized to the file's
    for i, ref in enumerate(reference):
        assert relative(cache[f"blocks.{i}.hook_resid_post"], ref) <= 1e-5
    assert relative(ours, logits) <= 1e-5
    assert data_config(model)["mean"] == (0.485, 0.456, 0.406)  # torchvision's normalisation, not timm's 0.5


def test_another_shape_is_refused_naming_the_timm_name(tmp_path):
    sd = {"class_token": torch.zeros(1, 1, 1024), "encoder.pos_embedding": torch.zeros(1, 197, 1024),
          "conv_proj.weight": torch.zeros(1024, 3, 16, 16)}
    sd.update({f"encoder.layers.encoder_layer_{i}.ln_1.weight": torch.ones(1024) for i in range(24)})
    torch.save(sd, tmp_path / "vit_l_16.pth")
    with pytest.raises(ModelLoadError, match=r"holds torchvision's vit_l_16 \(width 1024, 24 blocks, patch 16\) "
                                             r"but 'vit_base_patch16_224' has width 768, 12 blocks, patch 16: "
                                             r"load it into 'vit_large_patch16_224'"):
        interp.load("vit_base_patch16_224", weights=str(tmp_path / "vit_l_16.pth"))


def test_an_unknown_torchvision_shape_names_the_timm_arguments(tmp_path):
    torch.save(torchvision_vit().state_dict(), tmp_path / "small.pth")
    with pytest.raises(ModelLoadError, match=r"a torchvision ViT of width 32, 2 blocks, patch 16 but .*: load it "
                                             r"into a timm ViT of that shape \(e.g. vit_base_patch16_224 with "
                                             r"embed_dim=32, depth=2"):
        interp.load("vit_base_patch16_224", weights=str(tmp_path / "small.pth"), depth=2)


def test_lasts_model_runs_pib_protocol_last(tmp_path, capsys):
    """torchvision's vit_b_16 shape (one block, to stay small) through the CLI: loaded with --weights into
    vit_base_patch16_224 and PiB under LaSt's protocol end to end."""
    tv = torchvision_vit(image_size=224, layers=1, heads=12, width=768, classes=1000)
    torch.save(tv.state_dict(), tmp_path / "vit_b_16.pth")
    rng = np.random.default_rng(0)
    folder = tmp_path / "imgs"
    folder.mkdir()
    rows = ["image,x0,y0,x1,y1,width,height"]
    for i, (w, h) in enumerate([(500, 375), (375, 500), (300, 300)]):
        Image.fromarray(rng.integers(0, 256, (h, w, 3), dtype=np.uint8)).save(folder / f"im{i}.png")
        rows.append(f"im{i}.png,{w // 4},{h // 4},{w // 2},{h // 2},{w},{h}")
    (tmp_path / "boxes.csv").write_text("\n".join(rows) + "\n")
    out = tmp_path / "out"
    assert main(["study", "pib", "vit_base_patch16_224", "--weights", str(tmp_path / "vit_b_16.pth"), "--depth", "1",
                 "--images", str(folder), "--boxes", str(tmp_path / "boxes.csv"), "--protocol", "last",
                 "--out", str(out), "--no-progress", "--quiet"]) == 0
    result = json.loads((out / "pib.json").read_text())
    assert result["params"]["protocol"] == "last" and result["n_used"] == 3 and result["grid"] == [14, 14]
