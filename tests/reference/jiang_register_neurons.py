"""Test oracle: Jiang et al.'s register-neuron search and per-layer tracking, transcribed from their code.

Follows repo ``nickjiang2378/test-time-registers``:

* ``shared/algorithms.py`` at commit ``248dbaa08b39339f088516e3699d2387140728e7``: ``find_register_neurons``
  (the per-image loop, the outlier positions, the per-image sparsity filter, the mean over images, the sort);
* ``shared/utils.py`` at commit ``fd81fd22d64511b827ac2fa0ce109625551aad73``: ``filter_layers`` (note:
  ``highest_layer=-1`` there means "no upper limit", not "the last layer");
* ``register_neurons.ipynb`` at commit ``0e055f47fd02fecee04d6945b3aad1e8e6dfcd39``, cell "Identify where
  outliers & attention sinks appear": per layer, the mean over images of each image's max patch norm of the
  block output and of its max head-mean CLS->patch attention.

The reference runs one image at a time through hooks that store, per image, the MLP activations of every
layer ``[L, t, m]`` and the block outputs ``[L, t, d]`` (t = all tokens, CLS first). Here those arrays are
arguments; everything else is the reference's arithmetic, op for op, in the input's dtype. The reference's
final ``torch.sort(descending=True)`` is not stable: its order among equal scores is unspecified (on CPU it
scrambles ties). Used ONLY as a test oracle, never by the library.
"""
from __future__ import annotations

from typing import List, Sequence, Tuple

import torch


def find_register_neurons(
    neuron_acts: Sequence[torch.Tensor],
    layer_outputs: Sequence[torch.Tensor],
    register_norm_threshold: float = 30,
    detect_outliers_layer: int = -1,
    apply_sparsity_filter: bool = False,
    sparsity_frac_threshold: float = 0.5,
    sparsity_activation_threshold: float = 0.5,
) -> List[Tuple[int, int, float]]:
    """``find_register_neurons`` on given hook values.

    Args:
        neuron_acts: per image, the MLP activations of every layer [L, t, m].
        layer_outputs: per image, the block outputs of every layer [L, t, d].

    Returns:
        ``[(layer, neuron, score)]`` over all L * m neurons, sorted by score, descending.
    """
    num_layers, _, num_neurons = neuron_acts[0].shape
    neuron_scores = torch.zeros((len(neuron_acts), num_layers, num_neurons), dtype=neuron_acts[0].dtype)
    image_count = 0
    for acts, outputs in zip(neuron_acts, layer_outputs):
        norm_map = torch.norm(outputs[detect_outliers_layer], dim=1)
        filtered_norms = norm_map.clone()
        filtered_norms[filtered_norms < register_norm_threshold] = 0
        register_locations = torch.where(filtered_norms > register_norm_threshold)[0]
        if len(register_locations) == 0:
            continue
        for layer in range(num_layers):
            act_layer = acts[layer]  # [t, m]
            register_values = torch.abs(act_layer[register_locations])
            if apply_sparsity_filter:
                sparse_neurons = (torch.sum(act_layer < sparsity_activation_threshold, dim=0)
                                  >= sparsity_frac_threshold * act_layer.shape[0])
                if not torch.any(sparse_neurons):
                    continue
                neuron_scores[image_count, layer] = register_values.mean(dim=0) * sparse_neurons.float()
            else:
                neuron_scores[image_count, layer] = register_values.mean(dim=0)
        image_count += 1
    assert image_count > 0, "No images processed"
    return sort_scores(neuron_scores[:image_count].mean(dim=0))


def sort_scores(mean_neuron_scores: torch.Tensor) -> List[Tuple[int, int, float]]:
    """The reference's last step: scores [L, m] -> ``[(layer, neuron, score)]`` by an unstable descending sort."""
    num_neurons = mean_neuron_scores.shape[1]
    sorted_values, sorted_indices = torch.sort(mean_neuron_scores.flatten(), descending=True)
    return [(int(i) // num_neurons, int(i) % num_neurons, float(v)) for v, i in zip(sorted_values, sorted_indices)]


def mean_neuron_scores(neuron_acts, layer_outputs, **kwargs) -> torch.Tensor:
    """The score table [L, m] behind :func:`find_register_neurons` (its sorted list, put back in place)."""
    num_layers, _, num_neurons = neuron_acts[0].shape
    table = torch.zeros(num_layers, num_neurons, dtype=torch.float64)
    for layer, neuron, score in find_register_neurons(neuron_acts, layer_outputs, **kwargs):
        table[layer, neuron] = score
    return table


def filter_layers(register_norms, highest_layer: int = -1, lowest_layer: int = 0):
    """``shared/utils.py`` ``filter_layers``: keep entries with lowest_layer <= layer <= highest_layer
    (``highest_layer == -1``: no upper limit)."""
    if highest_layer == -1:
        return [norm for norm in register_norms if norm[0] >= lowest_layer]
    return [norm for norm in register_norms if lowest_layer <= norm[0] <= highest_layer]


def top_register_neurons(register_norms, highest_layer: int, top_k: int):
    """The notebook's selection: ``filter_layers(...)[:top_k]`` as ``[(layer, neuron, score)]``."""
    return filter_layers(register_norms, highest_layer=highest_layer)[:top_k]


def emergence_curves(layer_outputs: Sequence[torch.Tensor], attention_maps: Sequence[torch.Tensor],
                     n_patches: int) -> Tuple[List[float], List[float]]:
    """The notebook's per-layer tracking over images.

    Args:
        layer_outputs: per image [L, t, d] (CLS at index 0, patches at 1..n_patches).
        attention_maps: per image [L, h, t, t] attention probabilities.

    Returns:
        (max_patch_norms [L], max_attn_norms [L]): per layer, the mean over images of the image's max patch
        norm, and of the max over patches of the head-mean CLS->patch attention.
    """
    num_layers = layer_outputs[0].shape[0]
    max_patch_norms = [0.0] * num_layers
    max_attn_norms = [0.0] * num_layers
    for outputs, attn in zip(layer_outputs, attention_maps):
        patch_norms = torch.linalg.norm(outputs[:, 1:n_patches + 1], dim=2).max(dim=1).values
        attn_norms = attn[:, :, 0, 1:n_patches + 1].mean(dim=1).max(dim=1).values
        for j in range(num_layers):
            max_attn_norms[j] += float(attn_norms[j])
            max_patch_norms[j] += float(patch_norms[j])
    n = len(layer_outputs)
    return [x / n for x in max_patch_norms], [x / n for x in max_attn_norms]
