"""Detection table: does ``--threshold auto`` find the outliers, and only where there are some?

Prints a markdown table (and writes ``results/detection_table.json``) of the automatic split
(:func:`interp.detection.norm_split.split_norms` through :func:`~interp.detection.thresholds.resolve_threshold`) on

* synthetic norms: a log-normal bulk (median 50, log-sigma 0.15 / 0.30 / 0.45) with 1 / 2 / 3 % outliers in a
  tight mode (log-sigma 0.10) at 3 / 5 / 8x the median, 100k tokens each: artifacts yes/no, precision and recall
  of the tokens above the cut against the planted outlier labels, and the same for the best cut chosen knowing
  the labels (how separable the two sets are at all);
* negatives without a separate mode (single log-normals, log-t, long right tails, gamma): artifacts must be "no";
* shapes of [images, patches] norms (:func:`shape_rows`): each image's scale varying (log-uniform x0.5..x2,
  artifacts scaling with it, or of fixed norm), two artifact modes (3x and 8x), a heavy-tailed bulk, 0.1-0.5 %
  shares, 1-4 images, 3 tokens in one image; and negatives of the same shapes (scaled bulks, no artifacts);
* the bundled ``planted_vit`` on the bundled photos: precision and recall against its planted mask
  (``planted_truth(model).artifact_mask``), with the cut the F1 rule alone gives (before the degenerate-bulk rule);
* ViTs with seeded random weights (``pretrained=False``: no weights can be downloaded here) on the bundled
  photos, whose norms have no artifact mode: artifacts must be "no". These are not the trained models.

Usage: ``python benchmarks/detection_table.py [--n 100000] [--no-models]``.
"""
from __future__ import annotations

import argparse
import json
import math
import time
from pathlib import Path

import numpy as np
from interp.detection.spec import DetectionSpec
from interp.detection.detection import RunOptions

MEDIAN = 50.0
OUTLIER_SIGMA = 0.10
SPREADS = (0.15, 0.30, 0.45)
RATIOS = (3, 5, 8)
SHARES = (0.01, 0.02, 0.03)
RESULTS = Path(__file__).resolve().parent / "results"


def planted_norms(share: float, sigma: float, ratio: float, n: int, seed: int = 0):
    """(norms [n], outlier labels [n] bool): log-normal bulk + a tight mode at ``ratio`` x the median."""
    rng = np.random.default_rng(seed)
    k = int(round(share * n))
    norms = np.concatenate([MEDIAN * np.exp(sigma * rng.standard_normal(n - k)),
                            ratio * MEDIAN * np.exp(OUTLIER_SIGMA * rng.standard_normal(k))])
    return norms, np.arange(n) >= n - k


def precision_recall(norms: np.ndarray, labels: np.ndarray, cut: float):
    """Precision and recall of the tokens above ``cut`` against ``labels`` (None when none is above)."""
    above = norms > cut
    tp = int((above & labels).sum())
    precision = tp / int(above.sum()) if above.any() else None
    return precision, tp / max(int(labels.sum()), 1)


def best_cut(norms: np.ndarray, labels: np.ndarray):
    """(precision, recall) of the cut with the best F1, chosen knowing the labels."""
    order = np.argsort(-norms)
    tp = np.cumsum(labels[order])
    k = np.arange(1, norms.size + 1)
    i = int(np.argmax(2 * tp / (k + labels.sum())))
    return float(tp[i] / k[i]), float(tp[i] / labels.sum())


def _skew_normal(rng, a, n):
    d = a / math.sqrt(1 + a * a)
    return d * np.abs(rng.standard_normal(n)) + math.sqrt(1 - d * d) * rng.standard_normal(n)


def _pareto_tail(rng, n):
    x = MEDIAN * np.exp(0.3 * rng.standard_normal(n))
    x[: n // 10] = MEDIAN * (1 + rng.pareto(3, n // 10))
    return x


NEGATIVES = {
    "log-normal 0.15": lambda rng, n: MEDIAN * np.exp(0.15 * rng.standard_normal(n)),
    "log-normal 0.30": lambda rng, n: MEDIAN * np.exp(0.30 * rng.standard_normal(n)),
    "log-normal 0.45": lambda rng, n: MEDIAN * np.exp(0.45 * rng.standard_normal(n)),
    "log-t df 3 (0.30)": lambda rng, n: MEDIAN * np.exp(0.3 * rng.standard_t(3, n)),
    "log-t df 5 (0.30)": lambda rng, n: MEDIAN * np.exp(0.3 * rng.standard_t(5, n)),
    "log-skew-normal (a=10, 0.45)": lambda rng, n: MEDIAN * np.exp(0.45 * _skew_normal(rng, 10, n)),
    "log-normal 0.30 + 10 % Pareto tail": _pareto_tail,
    "gamma k=1": lambda rng, n: rng.gamma(1.0, MEDIAN, n),
    "gamma k=2": lambda rng, n: rng.gamma(2.0, MEDIAN, n),
    "gamma k=5": lambda rng, n: rng.gamma(5.0, MEDIAN, n),
}


def _fmt(value, digits: int = 3) -> str:
    return "-" if value is None else f"{value:.{digits}f}"


def synthetic_rows(n: int):
    from interp.detection.thresholds import resolve_threshold

    rows = []
    for sigma in SPREADS:
        for ratio in RATIOS:
            for share in SHARES:
                norms, labels = planted_norms(share, sigma, ratio, n)
                thr = resolve_threshold(norms, "auto")
                p, r = precision_recall(norms, labels, thr.value) if thr.artifacts_found else (None, None)
                bp, br = best_cut(norms, labels)
                rows.append({"bulk log-sigma": sigma, "ratio": ratio, "share %": 100 * share,
                             "artifacts": thr.artifacts_found, "precision": p, "recall": r,
                             "best-cut precision": bp, "best-cut recall": br,
                             "cut / median": thr.value / MEDIAN if thr.artifacts_found else None,
                             "cut rule": thr.split.cut_rule})
    return rows


def negative_rows(n: int):
    from interp.detection.thresholds import resolve_threshold

    rows = []
    for name, draw in NEGATIVES.items():
        for seed in (0, 1):
            thr = resolve_threshold(draw(np.random.default_rng(seed), n), "auto")
            rows.append({"distribution": name, "seed": seed, "artifacts": thr.artifacts_found,
                         "why": thr.split.reason.split(";")[0]})
    return rows


def scene(n_images: int, n_patches: int, sigma: float, modes=(), scale: float = 1.0, seed: int = 0,
          fixed_norm: bool = False, df: float = 0.0):
    """(norms [N, P], labels [N, P]): a log-normal bulk (log-t with ``df`` > 0) whose median is MEDIAN times a
    per-image factor log-uniform in [1/scale, scale]; ``modes``: (ratio, share) of artifact modes (share >= 1:
    that many tokens), log-sigma OUTLIER_SIGMA around ratio x the image's median (x MEDIAN if ``fixed_norm``)."""
    rng = np.random.default_rng(seed)
    factor = np.exp(rng.uniform(-math.log(scale), math.log(scale), n_images))[:, None]
    z = rng.standard_t(df, (n_images, n_patches)) if df else rng.standard_normal((n_images, n_patches))
    norms, labels = MEDIAN * factor * np.exp(sigma * z), np.zeros((n_images, n_patches), bool)
    free, used = rng.permutation(n_images * n_patches), 0
    for ratio, share in modes:
        k = int(share) if share >= 1 else int(round(share * n_images * n_patches))
        i, j = np.unravel_index(free[used:used + k], norms.shape)
        used += k
        base = MEDIAN if fixed_norm else MEDIAN * factor[i, 0]
        norms[i, j], labels[i, j] = ratio * base * np.exp(OUTLIER_SIGMA * rng.standard_normal(k)), True
    return norms, labels


SHAPES = [(f"scale x0.5-2, log-sigma {s}, {r}x, 2 %", dict(n_images=64, n_patches=256, sigma=s, modes=[(r, .02)],
                                                             scale=2.0)) for s in (0.15, 0.30) for r in (3, 5, 8)]
SHAPES += [(f"scale x0.5-2, log-sigma {s}, no artifacts", dict(n_images=64, n_patches=256, sigma=s, scale=2.0))
           for s in (0.15, 0.30, 0.45)]
SHAPES += [("scale x0.5-2, log-t df 3 (0.30), no artifacts", dict(n_images=64, n_patches=256, sigma=0.3, scale=2.0, df=3)),
           ("scale x0.5-2, 0.15, 5x 2 % of FIXED norm", dict(n_images=64, n_patches=256, sigma=0.15, modes=[(5, .02)],
                                                            scale=2.0, fixed_norm=True))]
SHAPES += [(f"two modes 3x {a:g} % + 8x {b:g} %, log-sigma {s}", dict(n_images=64, n_patches=256, sigma=s,
                                                                      modes=[(3, a / 100), (8, b / 100)]))
           for s in (0.15, 0.30) for a, b in ((1, 1), (2, 0.5))]
SHAPES += [("log-t df 5 bulk (0.20), 8x 2 %", dict(n_images=64, n_patches=256, sigma=0.2, modes=[(8, .02)], df=5)),
           ("log-t df 3 bulk (0.20), 8x 2 %", dict(n_images=64, n_patches=256, sigma=0.2, modes=[(8, .02)], df=3))]
SHAPES += [(f"{100 * sh:g} %, 5x, log-sigma 0.30", dict(n_images=100, n_patches=1024, sigma=0.3, modes=[(5, sh)]))
           for sh in (0.001, 0.002, 0.005)]
SHAPES += [("1 image, 3 tokens at 8x, 0.15", dict(n_images=1, n_patches=256, sigma=0.15, modes=[(8, 3)])),
           ("1 image, 3 tokens at 8x, 0.30", dict(n_images=1, n_patches=1369, sigma=0.3, modes=[(8, 3)])),
           ("1 image, no artifacts, 0.30", dict(n_images=1, n_patches=1369, sigma=0.3)),
           ("2 images, scale x0.5-2, 5x 1 %, 0.30", dict(n_images=2, n_patches=1369, sigma=0.3, modes=[(5, .01)],
                                                        scale=2.0)),
           ("4 images, 5x 2 %, 0.30", dict(n_images=4, n_patches=256, sigma=0.3, modes=[(5, .02)]))]


def shape_rows(seeds=(0, 1)):
    """One row per shape and seed: verdict, precision and recall of the outlier mask (per-image cuts where
    the threshold has them), the split's normalisation."""
    from interp.detection.thresholds import resolve_threshold

    rows = []
    for name, kwargs in SHAPES:
        for seed in seeds:
            norms, labels = scene(seed=seed, **kwargs)
            thr = resolve_threshold(norms, "auto")
            mask = thr.mask(norms) if hasattr(thr, "mask") else norms > thr.value  # the code before had no mask
            tp = int((mask & labels).sum())
            found = bool(thr.artifacts_found)
            rows.append({"shape": name, "seed": seed, "tokens": int(norms.size), "planted": int(labels.sum()),
                         "artifacts": found, "precision": tp / max(int(mask.sum()), 1) if found else None,
                         "recall": tp / max(int(labels.sum()), 1) if found else None,
                         "normalisation": getattr(thr.split, "normalisation", "none (pooled)"),
                         "why": "" if found else thr.split.reason.split(";")[0]})
    return rows


def _photo_norms(model):
    """(last-block patch norms [N, P], the source) of ``model`` on the bundled photos."""
    from interp.models import sample_image_paths
    from interp.studies import open_source
    from interp.detection.detection import detect

    source = open_source(model=model, images=sample_image_paths(), batch_size=4)
    return detect(source, DetectionSpec(threshold="auto"), RunOptions(progress=False)), source


def model_rows():
    import torch

    import interp
    from interp.models.planted import planted_truth
    from interp.detection import norm_split

    torch.set_num_threads(max(1, min(2, torch.get_num_threads())))
    rows = []
    model = interp.load("planted_vit")
    found, source = _photo_norms(model)
    truth = planted_truth(model)
    mask = torch.cat([truth.artifact_mask(model, x) for _, x in source.image_batches()]).reshape(found.norms.shape)
    norms, labels = found.norms.numpy().ravel(), mask.numpy().ravel()
    split = found.threshold.split
    flagged = found.outliers.numpy().ravel()  # per-image cuts where the threshold has them
    tp = int((flagged & labels).sum())
    p, r = tp / max(int(flagged.sum()), 1), tp / max(int(labels.sum()), 1)
    f1_cut = math.exp(norm_split._best_cut(split.lower, split.upper, *getattr(split, "more_upper", ())))
    scales = np.ones(found.norms.shape[0]) if split.image_scales is None else np.asarray(split.image_scales)
    p_old, r_old = precision_recall((found.norms.numpy() / scales[:, None]).ravel(), labels, f1_cut)
    rows.append({"model": "planted_vit (synthetic), bundled photos", "tokens": int(norms.size),
                 "planted %": 100 * float(labels.mean()), "artifacts": found.artifacts_found,
                 "flagged %": 100 * found.threshold.share_above, "cut": found.threshold.value,
                 "precision": p, "recall": r, "cut rule": split.cut_rule,
                 "note": f"the F1 rule alone (before the degenerate-bulk rule): cut {f1_cut:.1f}, precision "
                         f"{p_old:.3f}, recall {r_old:.3f}"})
    for name, kwargs in (("vit_small_patch14_dinov2", dict(img_size=224)), ("vit_small_patch16_224", {})):
        model = interp.load(name, pretrained=False, seed=0, **kwargs)
        found, _ = _photo_norms(model)
        split = found.threshold.split
        rows.append({"model": f"{name}, RANDOM weights (seed 0), bundled photos",
                     "tokens": int(found.norms.numel()), "planted %": None, "artifacts": found.artifacts_found,
                     "flagged %": 100 * found.threshold.share_above, "cut": None, "precision": None,
                     "recall": None, "cut rule": split.cut_rule,
                     "note": f"{split.describe()}; rejected: {split.reason.split(';')[0]}"})
    return rows


def markdown(synthetic, negatives, models, shapes=()) -> str:
    out = ["| bulk log-sigma | ratio | share | artifacts | precision | recall | best cut P / R | cut / median |",
           "|---|---|---|---|---|---|---|---|"]
    for row in synthetic:
        out.append(f"| {row['bulk log-sigma']:.2f} | {row['ratio']}x | {row['share %']:.0f} % | "
                   f"{'yes' if row['artifacts'] else 'no'} | {_fmt(row['precision'])} | {_fmt(row['recall'])} | "
                   f"{row['best-cut precision']:.3f} / {row['best-cut recall']:.3f} | {_fmt(row['cut / median'], 2)} |")
    out += ["", "| negative (no separate mode) | seed | artifacts | why |", "|---|---|---|---|"]
    for row in negatives:
        out.append(f"| {row['distribution']} | {row['seed']} | {'yes' if row['artifacts'] else 'no'} | {row['why']} |")
    if shapes:
        out += ["", "| shape | seed | tokens | planted | artifacts | precision | recall | normalisation | why not |",
                "|---|---|---|---|---|---|---|---|---|"]
        for row in shapes:
            out.append(f"| {row['shape']} | {row['seed']} | {row['tokens']} | {row['planted']} | "
                       f"{'yes' if row['artifacts'] else 'no'} | {_fmt(row['precision'])} | {_fmt(row['recall'])} | "
                       f"{row['normalisation']} | {row['why']} |")
    if models:
        out += ["", "| model | tokens | planted | artifacts | flagged | cut | precision | recall | cut rule | note |",
                "|---|---|---|---|---|---|---|---|---|---|"]
        for row in models:
            planted = "-" if row["planted %"] is None else f"{row['planted %']:.1f} %"
            out.append(f"| {row['model']} | {row['tokens']} | {planted} | {'yes' if row['artifacts'] else 'no'} | "
                       f"{row['flagged %']:.1f} % | {_fmt(row['cut'], 1)} | {_fmt(row['precision'])} | "
                       f"{_fmt(row['recall'])} | {row['cut rule'] or '-'} | {row['note']} |")
        out.append("\nReal DINOv2 ViT-S/14 weights: not measured (no network here: the weights cannot be downloaded).")
    return "\n".join(out)


def main(argv=None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--n", type=int, default=100_000, help="tokens per synthetic case (default 100000)")
    parser.add_argument("--no-models", action="store_true", help="skip planted_vit and the random-weight ViTs")
    args = parser.parse_args(argv)
    start = time.perf_counter()
    synthetic, negatives, shapes = synthetic_rows(args.n), negative_rows(args.n // 2), shape_rows()
    models = [] if args.no_models else model_rows()
    print(markdown(synthetic, negatives, models, shapes))
    result = {"n": args.n, "synthetic": synthetic, "negatives": negatives, "shapes": shapes, "models": models,
              "seconds": time.perf_counter() - start}
    RESULTS.mkdir(exist_ok=True)
    (RESULTS / "detection_table.json").write_text(json.dumps(result, indent=1))
    return result


if __name__ == "__main__":
    main()
