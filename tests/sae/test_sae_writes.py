"""The register neurons' write directions the SAE features are compared with include LayerScale."""
from __future__ import annotations

import torch

from conftest import make_model
from interp.sae.features import write_directions


def test_write_direction_is_the_measured_write_on_a_layerscale_block():
    """On a DINOv2 block with a spread LayerScale, the reported direction of neuron n is what the block's MLP
    branch adds per unit of that neuron (ls2(fc2(e_n)) - ls2(fc2(0))): cos = 1 (fc2's column alone: < 0.9)."""
    model = make_model("dinov2")
    block = model.timm_model.blocks[1]
    with torch.no_grad():
        block.ls2.gamma.copy_(torch.rand(block.ls2.gamma.shape, generator=torch.Generator().manual_seed(0)) ** 4)
    neurons = [3, 17]
    reported = write_directions(model, {1: neurons})
    d_mlp = block.mlp.fc2.weight.shape[1]
    for n in neurons:
        e = torch.zeros(d_mlp)
        e[n] = 1.0
        with torch.no_grad():
            measured = block.ls2(block.mlp.fc2(e)) - block.ls2(block.mlp.fc2(torch.zeros(d_mlp)))
        cos = torch.nn.functional.cosine_similarity(reported[f"1:{n}"], measured, dim=0)
        assert float(cos) > 1 - 1e-5
        plain = torch.nn.functional.cosine_similarity(block.mlp.fc2.weight[:, n].detach(), measured, dim=0)
        assert float(plain) < 0.9  # the test can tell a direction without LayerScale
