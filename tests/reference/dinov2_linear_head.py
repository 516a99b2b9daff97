"""Test oracle: the input and logits of DINOv2's linear classification heads, transcribed from the DINOv2
repository.

Follows repo ``facebookresearch/dinov2``:

* ``dinov2/eval/linear.py`` (commit ``05c66df0cfa837710197d4769158c87e36afad2c``), ``create_linear_input``:
  the class tokens of the last ``use_n_blocks`` blocks concatenated, then (``use_avgpool``) the mean over the
  last block's patch tokens; ``LinearClassifier`` applies one ``nn.Linear`` to it;
* ``dinov2/models/vision_transformer.py`` (commit ``112792f1667374eb2253cc82bca19d101655356f``),
  ``get_intermediate_layers(x, n, return_class_token=True, norm=True)``: the outputs of the last n blocks, each
  through the final ``self.norm``; class token ``out[:, 0]``; patch tokens ``out[:, 1 + num_register_tokens:]``
  (registers excluded);
* ``dinov2/hub/classifiers.py`` (commit ``16ac75ce990057be9ed602cf0f2a0dcf9fa593f7``): the released heads are
  ``nn.Linear((1 + layers) * embed_dim, 1000)`` with layers 1 or 4, always with the patch mean.

Here the backbone is timm's DINOv2 port (same token order: CLS, registers, patches), run block by block from
the timm module directly. Used ONLY as a test oracle, never by the library.
"""
from __future__ import annotations

from typing import List, Tuple

import torch


@torch.no_grad()
def get_intermediate_layers(timm_model, x: torch.Tensor, n: int) -> List[Tuple[torch.Tensor, torch.Tensor]]:
    """(patch tokens [b, P, d], class token [b, d]) of each of the last ``n`` blocks, after the final norm."""
    h = timm_model.norm_pre(timm_model._pos_embed(timm_model.patch_embed(x)))
    outputs = []
    for i, blk in enumerate(timm_model.blocks):
        h = blk(h)
        if i >= len(timm_model.blocks) - n:
            outputs.append(h)
    outputs = [timm_model.norm(out) for out in outputs]
    num_register_tokens = timm_model.num_prefix_tokens - 1
    class_tokens = [out[:, 0] for out in outputs]
    outputs = [out[:, 1 + num_register_tokens:] for out in outputs]
    return list(zip(outputs, class_tokens))


def create_linear_input(x_tokens_list, use_n_blocks: int, use_avgpool: bool) -> torch.Tensor:
    intermediate_output = x_tokens_list[-use_n_blocks:]
    output = torch.cat([class_token for _, class_token in intermediate_output], dim=-1)
    if use_avgpool:
        output = torch.cat((output, torch.mean(intermediate_output[-1][0], dim=1)), dim=-1)
        output = output.reshape(output.shape[0], -1)
    return output.float()


def linear_head_logits(timm_model, x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor, n_blocks: int,
                       avgpool: bool = True) -> torch.Tensor:
    """The DINOv2 linear head's logits [b, C] on images ``x``."""
    features = create_linear_input(get_intermediate_layers(timm_model, x, n_blocks), n_blocks, avgpool)
    return torch.nn.functional.linear(features, weight, bias)
