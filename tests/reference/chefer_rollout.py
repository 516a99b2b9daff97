"""Attention rollout and gradient-weighted relevance as Chefer's code computes them, transcribed as a test oracle
(never imported by interp).

Rollout: hila-chefer/Transformer-Explainability, ``baselines/ViT/ViT_explanation_generator.py`` (commit
7cf1edb4639f68c261fcaf3c2daf48f2bc3fcfcc): ``compute_rollout_attention`` (identity added to every block's
matrix, rows renormalised, ``joint = A_i.bmm(joint)`` from ``start_layer``) on ``generate_rollout``'s head means
(``attn.sum(dim=1) / attn.shape[1]``).

Relevance: hila-chefer/Transformer-MM-Explainability, ``Transformer_MM_explainability_ViT.ipynb`` (commit
feb29b5829c7bc12a7d24188908ff99241315fb1): ``avg_heads`` (rule 5: ``(grad * cam).clamp(min=0).mean(dim=0)``),
``apply_self_attention_rules`` (rule 6: ``cam @ R``) and ``generate_relevance`` (``R = eye``, ``R += rule6(R,
rule5(cam, grad))`` per block; ``grad`` the gradient of ``sum(one_hot * output)``), one image at a time as there.
"""
from __future__ import annotations

from typing import List

import torch


def compute_rollout_attention(all_layer_matrices: List[torch.Tensor], start_layer: int = 0) -> torch.Tensor:
    num_tokens = all_layer_matrices[0].shape[1]
    batch_size = all_layer_matrices[0].shape[0]
    eye = torch.eye(num_tokens).expand(batch_size, num_tokens, num_tokens).to(all_layer_matrices[0].device)
    all_layer_matrices = [all_layer_matrices[i] + eye for i in range(len(all_layer_matrices))]
    matrices_aug = [all_layer_matrices[i] / all_layer_matrices[i].sum(dim=-1, keepdim=True)
                    for i in range(len(all_layer_matrices))]
    joint_attention = matrices_aug[start_layer]
    for i in range(start_layer + 1, len(matrices_aug)):
        joint_attention = matrices_aug[i].bmm(joint_attention)
    return joint_attention


def generate_rollout(attentions: List[torch.Tensor], start_layer: int = 0) -> torch.Tensor:
    """The CLS row over every other token [b, t - 1] from each block's pattern [b, h, t, t]."""
    avg = [(a.sum(dim=1) / a.shape[1]).detach() for a in attentions]
    return compute_rollout_attention(avg, start_layer=start_layer)[:, 0, 1:]


def avg_heads(cam: torch.Tensor, grad: torch.Tensor) -> torch.Tensor:
    cam = cam.reshape(-1, cam.shape[-2], cam.shape[-1])
    grad = grad.reshape(-1, grad.shape[-2], grad.shape[-1])
    cam = grad * cam
    return cam.clamp(min=0).mean(dim=0)


def apply_self_attention_rules(R_ss: torch.Tensor, cam_ss: torch.Tensor) -> torch.Tensor:
    return torch.matmul(cam_ss, R_ss)


def generate_relevance(attentions: List[torch.Tensor], grads: List[torch.Tensor]) -> torch.Tensor:
    """One image's CLS relevance row [t - 1] from its patterns [h, t, t] and their gradients."""
    num_tokens = attentions[0].shape[-1]
    R = torch.eye(num_tokens, num_tokens)
    for cam, grad in zip(attentions, grads):
        R += apply_self_attention_rules(R, avg_heads(cam, grad))
    return R[0, 1:]
