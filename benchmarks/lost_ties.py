"""How often LOST's box depends on the order of tied degrees (docs/methods.md section 5, "Where it differs").

Model: DINO ViT-S/16 (``vit_small_patch16_224.dino``), random weights (seed 0), keys of the last block, k = 100,
under ``protocol="lost"`` (full resolution). Images: the 4 bundled sample photos and 16 smooth random images of
VOC/COCO sizes (500x375, 375x500, 500x333, 640x480; seed 0). Per image:

* whether the lowest degree (the seed) is tied, and whether degrees tie across the k = 100 boundary;
* ``ties="torch"`` (LOST's own unstable ``torch.argsort``, on this machine's device) vs ``ties="index"``
  (stable, the default): does the box differ?
* 20 random orders among equal degrees (seeded): does any give another box?

Usage: python benchmarks/lost_ties.py [--images 16]   (a minute or two on a CPU)
"""
from __future__ import annotations

import argparse
import shutil
import tempfile
from pathlib import Path

import numpy as np
import torch
from PIL import Image

import interp
from interp.models.inputs.samples import SAMPLES_DIR
from interp.studies import open_source
from interp.studies.objects.lost_core import key_features, lost_one, seed_component
from interp.studies.objects.lost_protocol import lost_protocol_features

SIZES = [(500, 375), (375, 500), (500, 333), (640, 480)]


def write_images(folder: Path, n: int) -> None:
    rng = np.random.default_rng(0)
    for p in sorted(Path(SAMPLES_DIR).glob("*.jpg"))[:4]:
        shutil.copy(p, folder / p.name)
    for i in range(n):
        w, h = SIZES[i % len(SIZES)]
        base = rng.integers(0, 255, (h // 32, w // 32, 3), dtype=np.uint8)
        Image.fromarray(base).resize((w, h), Image.BICUBIC).save(folder / f"s{i:02d}.png")


def box_for_order(features: torch.Tensor, grid, order: torch.Tensor, k: int = 100):
    """LOST's steps 4-5 (interp.studies.objects.lost_core.lost_one) for a given patch order."""
    h, w = grid
    f = features.double()
    affinity = f @ f.T
    seed = int(order[0])
    candidates = order[:k]
    similar = candidates[affinity[seed, candidates] > 0]
    component = seed_component((affinity[similar].sum(0) > 0).reshape(h, w), divmod(seed, w))
    rows, cols = component.nonzero(as_tuple=True)
    return [int(cols.min()), int(rows.min()), int(cols.max()) + 1, int(rows.max()) + 1]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--images", type=int, default=16, help="synthetic images besides the 4 photos")
    args = parser.parse_args()
    folder = Path(tempfile.mkdtemp())
    write_images(folder, args.images)
    torch.manual_seed(0)
    model = interp.load("vit_small_patch16_224.dino", pretrained=False, seed=0)
    source = open_source(model, images=folder)
    hook = f"blocks.{model.n_layers - 1}.attn.hook_k"
    gen = torch.Generator().manual_seed(1)
    counts = {"images": 0, "seed_tied": 0, "tie_at_k": 0, "torch_box_differs": 0, "some_order_box_differs": 0}
    for image_id, (features, grid, _) in zip(source.ids, lost_protocol_features(source, hook, key_features)):
        stable, unstable = lost_one(features, grid, 100, "index"), lost_one(features, grid, 100, "torch")
        degrees = stable.degrees
        ranked = torch.sort(degrees).values
        changed = False
        for _ in range(20):
            noise = torch.rand(len(degrees), generator=gen).numpy()
            order = torch.from_numpy(np.lexsort((noise, degrees.numpy())))
            changed |= box_for_order(features, grid, order) != stable.box_cells
        counts["images"] += 1
        counts["seed_tied"] += int((degrees == degrees.min()).sum() > 1)
        counts["tie_at_k"] += int(len(ranked) > 100 and bool(ranked[99] == ranked[100]))
        counts["torch_box_differs"] += int(unstable.box_cells != stable.box_cells)
        counts["some_order_box_differs"] += int(changed)
        print(f"{Path(image_id).name:14s} grid {grid}  box {stable.box_cells}  torch {unstable.box_cells}"
              f"{'  (another tie order changes it)' if changed else ''}")
    print(counts, f"(torch {torch.__version__}, {next(model.parameters()).device})")


if __name__ == "__main__":
    main()
