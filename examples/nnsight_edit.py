"""Edit a register-candidate MLP neuron inside an nnsight trace of a HookedViT, and check it against
the same edit made with a transformer-lens hook.

    python examples/nnsight_edit.py
"""
import torch
from nnsight import NNsight

import interp

torch.manual_seed(0)
model = interp.load("vit_small_patch16_224", pretrained=False, depth=4)  # random weights: runs offline
x = torch.randn(2, 3, 224, 224)
layer, neuron = 2, 42

nn_model = NNsight(model)
with nn_model.trace(x):
    before = nn_model.blocks[layer].mlp.hook_post.output[..., neuron].clone().save()
    nn_model.blocks[layer].mlp.hook_post.output[..., neuron] = 0  # zero the neuron on every token
    edited = nn_model.output.save()


def zero_neuron(act, hook):
    act = act.clone()
    act[..., neuron] = 0
    return act


reference = model.run_with_hooks(x, fwd_hooks=[(f"blocks.{layer}.mlp.hook_post", zero_neuron)])
print(f"neuron {layer}:{neuron} mean |activation| before the edit: {before.abs().mean():.4f}")
print(f"nnsight edit vs hook edit, max |diff|: {(edited - reference).abs().max():.2e}")
print(f"edit changed the logits by up to:      {(edited - model(x)).abs().max():.2e}")
