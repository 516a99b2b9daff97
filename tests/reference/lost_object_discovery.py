"""Oracle: the arithmetic of LOST's reference code, transcribed for one image (torch + a plain BFS).

Source: ``valeoai/LOST`` ``object_discovery.py`` at commit c0ff67ba3baf807107447cc54d5f997cb358a383
(functions ``lost``, ``patch_scoring``, ``detect_box``); features as ``main_lost.py`` builds them (keys of the
last block, heads concatenated, the CLS row dropped). Two deliberate departures, both stated:

* ``torch.argsort`` is called with ``stable=True`` (the reference's call is unstable: its order among equal
  degrees is unspecified; stable means ties go to the lowest patch index).
* ``scipy.ndimage.label`` (default structure = 4-connectivity) is replaced by a breadth-first search from the
  seed over 4-neighbours, because scipy is not installed here; only the seed's component is used anyway.

Kept literally: the degree counts ``A > 0`` after zeroing the diagonal and clipping negatives (the diagonal
is not counted), seed expansion sums rows of the UNclipped A, the box is [xmin, ymin, xmax + 1, ymax + 1].
"""
from collections import deque

import torch


def patch_scoring(M, threshold=0.0):
    A = M.clone()
    A.fill_diagonal_(0)
    A[A < 0] = 0
    cent = -torch.sum(A > threshold, dim=1).type(torch.float32)
    sel = torch.argsort(cent, descending=True, stable=True)
    return sel, cent


def seed_component_bfs(binary, seed_rc):
    """Cells of the 4-connected component of ``binary`` (list of lists of bool) holding ``seed_rc``."""
    h, w = len(binary), len(binary[0])
    if not binary[seed_rc[0]][seed_rc[1]]:
        return set()
    seen, queue = {seed_rc}, deque([seed_rc])
    while queue:
        r, c = queue.popleft()
        for dr, dc in ((1, 0), (-1, 0), (0, 1), (0, -1)):
            rr, cc = r + dr, c + dc
            if 0 <= rr < h and 0 <= cc < w and binary[rr][cc] and (rr, cc) not in seen:
                seen.add((rr, cc))
                queue.append((rr, cc))
    return seen


def detect_box(M, seed, dims):
    """Cell box [xmin, ymin, xmax, ymax] (max exclusive) of the seed's component of M > 0."""
    rows, cols = dims
    correl = M.reshape(rows, cols).float()
    binary = (correl > 0.0).tolist()
    component = seed_component_bfs(binary, divmod(int(seed), cols))
    if not component:
        raise ValueError("The seed is in the background component.")
    ys = [r for r, _ in component]
    xs = [c for _, c in component]
    return [min(xs), min(ys), max(xs) + 1, max(ys) + 1]


def lost(feats, dims, k_patches=100):
    """feats [1, P, D] -> (cell box, seed, degree scores (negated degrees) [P])."""
    A = (feats @ feats.transpose(1, 2)).squeeze()
    sorted_patches, scores = patch_scoring(A)
    seed = sorted_patches[0]
    potentials = sorted_patches[:k_patches]
    similars = potentials[A[seed, potentials] > 0.0]
    M = torch.sum(A[similars, :], dim=0)
    box = detect_box(M, seed, dims)
    return box, int(seed), scores


def keys_as_reference(qkv_keys, n_prefix):
    """Keys [b, t, h, dh] as ``main_lost.py`` prepares them: heads concatenated, prefix rows dropped
    (the reference drops only the CLS row; it has no registers)."""
    b, t = qkv_keys.shape[:2]
    return qkv_keys.reshape(b, t, -1)[:, n_prefix:, :]
