"""Coarse segmentation from Patch Scores (LaSt, Table 6; docs/methods.md section 3), scored by Jaccard.

Per image: the Patch Score map S [h, w] (any reference vector, :mod:`interp.studies.aggregation.patch_score`);
foreground = S > mean(S) + ``k_std`` x std(S) (the image's own map; population std); the cell mask is
upsampled (nearest) to the model-input size [H, W] and compared, pixel by pixel, with the ground-truth mask
mapped into the same input frame through the model's resize/crop (nearest original pixel under each input
pixel centre; what the crop removed is not scored). Jaccard = |pred & gt| / |pred | gt|.

Ground truth, matched to the images:

* a folder of mask images (``DIR/<image stem>.png``, nonzero = foreground, the original image's size), or
* a COCO instances JSON with polygon ``segmentation``s (the union of an image's polygons, rasterised with
  PIL ``ImageDraw``; RLE masks are refused with a clear error), matched by ``file_name`` like box files.

>>> result = segmentation_study(source, masks="masks.json", reference="cls", progress=False)
>>> len(result.jaccard), result.jaccard[1:]       # one score per image; None: no mask for that image
(4, [None, None, None])
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Dict, List, Optional, Sequence, Tuple, Union

import numpy as np
import torch

from ...errors import InterpError
from .box_files import coco_annotations, coco_images, mask_files, read_json_file, read_mask
from ..core.metrics import iou
from .boxes import InputGeometry, eval_transform, input_geometry, match_boxes
from ..aggregation.patch_score import FINAL, check_source, compute_score_maps, needed_hooks, score_maps_from_acts
from ..core.result import StudyResult
from ..core.source import ActivationSource, live_model, n_batches

Polygons = List[List[float]]  # COCO polygons: flat [x0, y0, x1, y1, ...] in original pixels


def foreground_cells(score_map: torch.Tensor, k_std: float = 1.0) -> torch.Tensor:
    """Cells of a score map [h, w] above the map's mean + ``k_std`` x std (population std) -> bool [h, w]."""
    s = score_map.double()
    return s > s.mean() + k_std * s.std(unbiased=False)


def upsample_nearest(mask: torch.Tensor, size: Tuple[int, int]) -> torch.Tensor:
    """Nearest-neighbour upsampling of a bool [h, w] mask to [H, W]."""
    up = torch.nn.functional.interpolate(mask[None, None].float(), size=tuple(size), mode="nearest")
    return up[0, 0] > 0.5


def rasterise_polygons(polygons: Polygons, size: Tuple[int, int]) -> np.ndarray:
    """Union of COCO polygons (flat [x0, y0, x1, y1, ...], original pixels) on a ``size = (width, height)``
    canvas -> bool [height, width] (PIL ``ImageDraw.polygon`` fill)."""
    from PIL import Image, ImageDraw

    canvas = Image.new("L", (int(size[0]), int(size[1])), 0)
    draw = ImageDraw.Draw(canvas)
    for poly in polygons:
        if len(poly) >= 6:
            draw.polygon([(float(poly[i]), float(poly[i + 1])) for i in range(0, len(poly) - 1, 2)], fill=1)
    return np.asarray(canvas) > 0


def mask_to_input(mask: np.ndarray, geometry: InputGeometry) -> torch.Tensor:
    """An original-size bool mask [H0, W0] -> the model-input frame [H, W]: nearest original pixel under each
    input pixel centre, background where the input shows no original pixel (padding)."""
    h, w = geometry.input_size
    cols = np.floor((np.arange(w) + 0.5 - geometry.offset_x) / geometry.scale_x).astype(int)
    rows = np.floor((np.arange(h) + 0.5 - geometry.offset_y) / geometry.scale_y).astype(int)
    ok_c, ok_r = (cols >= 0) & (cols < mask.shape[1]), (rows >= 0) & (rows < mask.shape[0])
    out = np.zeros((h, w), dtype=bool)
    out[np.ix_(ok_r, ok_c)] = mask[np.ix_(rows[ok_r], cols[ok_c])]
    return torch.from_numpy(out)


def read_coco_polygons(path: Union[str, Path]) -> Dict[str, Tuple[Tuple[int, int], Polygons]]:
    """COCO instances JSON -> {file_name: ((width, height), polygons of all its annotations)}; file names are
    normalised as box files' keys are (``./`` prefixes dropped, ``/`` separators), so they match the same way."""
    path = Path(path)
    data = read_json_file(path)
    if not (isinstance(data, dict) and "images" in data and "annotations" in data):
        raise InterpError(f"{path}: expected COCO instances JSON with 'images' and 'annotations'")
    images = coco_images(data, path, need_size=True)  # checked records; sizes bounded (a mask is held per image)
    table = {key: (size, []) for _, key, size in images}
    names = {image_id: key for image_id, key, _ in images}
    for i, ann in enumerate(coco_annotations(data, path)):
        seg = ann.get("segmentation")
        if isinstance(seg, dict):
            raise InterpError(f"{path}: annotation {i} stores its mask as RLE; only polygon segmentations are "
                              "read (convert RLE to PNG masks and pass the folder instead)")
        if not isinstance(seg, list) or not all(
                isinstance(p, list) and all(isinstance(v, (int, float)) and not isinstance(v, bool)
                                            and math.isfinite(v) for v in p) for p in seg):
            raise InterpError(f"{path}: annotation {i}: 'segmentation' must be a list of polygons "
                              "[x0, y0, x1, y1, ...] of finite numbers")
        if ann.get("image_id") not in names:
            raise InterpError(f"{path}: annotation {i} refers to image_id {ann.get('image_id')!r}, not in 'images'")
        table[names[ann["image_id"]]][1].extend(seg)
    return table


def ground_truth_masks(ids: Sequence[str], masks: Union[str, Path]) -> List[Optional[np.ndarray]]:
    """Original-size bool masks [H0, W0] per image id (None when the ground truth has none for it)."""
    masks = Path(masks)
    if masks.is_file() and masks.suffix.lower() == ".json":
        table = read_coco_polygons(masks)
        entries = match_boxes(ids, table)  # matching only uses the keys: same rule as box files
        return [None if e is None else rasterise_polygons(e[1], e[0]) for e in entries]
    if not masks.is_dir():
        raise InterpError(f"masks={str(masks)!r}: give a folder of PNG masks (matched by file stem) or a COCO "
                          "instances JSON with polygon segmentations")
    files = mask_files(masks)
    return [None if (path := files.get(Path(image_id).stem)) is None else read_mask(path) for image_id in ids]


@dataclass
class SegmentationResult(StudyResult):
    """Result of :func:`segmentation_study`.

    Attributes:
        jaccard: per image (None: no ground-truth mask, or prediction and mask both empty).
        mean_jaccard: mean over the images with a number; n_evaluated: how many.
        foreground_share: per image the share of cells called foreground.
        input_size: [H, W] of the frame the Jaccard is measured in (the model input).
    """

    study = "segmentation"
    ids: List[str] = field(default_factory=list)
    hook: str = FINAL
    reference: str = "cls"
    k_std: float = 1.0
    grid: List[int] = field(default_factory=list)
    input_size: List[int] = field(default_factory=list)
    jaccard: List[Optional[float]] = field(default_factory=list)
    foreground_share: List[float] = field(default_factory=list)
    mean_jaccard: Optional[float] = None
    n_evaluated: int = 0
    foreground: List[List[List[int]]] = field(default_factory=list)
    intervention: Optional[Dict] = None
    variants: Dict[str, Dict] = field(default_factory=dict)

    def summary(self) -> str:
        if self.mean_jaccard is None:
            return f"segmentation: no image of {len(self.ids)} has a ground-truth mask"
        lines = [f"coarse segmentation ({self.reference}, mean + {self.k_std:g} std): mean Jaccard "
                 f"{self.mean_jaccard:.3f} on {self.n_evaluated} of {len(self.ids)} images"]
        lines += [f"  {name}: mean Jaccard {_num(v['mean_jaccard'])} on {v['n_evaluated']} images"
                  for name, v in self.variants.items()]
        return "\n".join(lines)


def _num(value: Optional[float]) -> str:
    return "n/a" if value is None else f"{value:.3f}"


VARIANT_FIELDS = ("reference", "intervention", "jaccard", "mean_jaccard", "n_evaluated", "foreground_share",
                  "foreground")


def _read_ground_truth(source: ActivationSource, masks: Union[str, Path]) -> List[Optional[np.ndarray]]:
    gt = ground_truth_masks(source.ids, masks)
    if not any(m is not None for m in gt):
        raise InterpError(f"no image of the source has a ground-truth mask in {str(masks)!r} (images like "
                          f"{source.ids[0]!r}); masks match by file stem (folders) or file_name (COCO)")
    return gt


def segmentation_study(source: ActivationSource, masks: Union[str, Path], *, reference: str = "cls",
                       hook: str = FINAL, selective=None, k_std: float = 1.0, intervention=None,
                       batch_size: Optional[int] = None, progress: bool = True, _gt=None,
                       _maps: Optional[torch.Tensor] = None) -> SegmentationResult:
    """Jaccard of the thresholded Patch Score map against ground-truth masks, per image and mean.

    Args:
        source: live source over image files or a cache of them (ids are the image paths).
        masks: a folder of PNG masks or a COCO instances JSON (module docstring).
        reference, hook, selective: the Patch Score (:func:`~interp.studies.aggregation.patch_score.patch_score_study`).
        k_std: foreground = score > mean + k_std x std of the image's map.
        intervention: an edit (e.g. a ``TestTimeRegister``; live source only) active while the maps are computed.
        _gt, _maps: private (:func:`segmentation_variants`): the ground-truth masks and score maps, already read.
    """
    gt = _read_ground_truth(source, masks) if _gt is None else _gt
    if _maps is not None:
        maps = _maps
    elif intervention is None:
        maps = compute_score_maps(source, hook, reference, selective, batch_size, progress)  # [N, h, w]
    else:
        live_model(source, "segmentation with an intervention")
        maps = compute_score_maps(source.with_interventions(intervention), hook, reference, selective, batch_size,
                                  progress)
    cell_masks = [foreground_cells(m, k_std) for m in maps]
    transform = eval_transform(source.data_config())
    scores: List[Optional[float]] = []
    shares: List[float] = []
    input_size: Tuple[int, int] = (0, 0)
    for cells, mask in zip(cell_masks, gt):
        shares.append(float(cells.float().mean()))
        if mask is None:
            scores.append(None)
            continue
        geometry = input_geometry(transform, (mask.shape[1], mask.shape[0]))
        input_size = geometry.input_size
        scores.append(iou(upsample_nearest(cells, input_size), mask_to_input(mask, geometry)))
    used = [s for s in scores if s is not None]
    spec = None if intervention is None else {"kind": intervention.kind, **intervention.params()}
    params = {"reference": reference, "hook": hook, "k_std": k_std, "masks": str(masks), "intervention": spec}
    return SegmentationResult(
        model=source.model_name, fingerprint=source.fingerprint, params=params, seed=None, ids=list(source.ids),
        hook=hook, reference=reference, k_std=k_std, grid=list(source.layout.grid), input_size=list(input_size),
        jaccard=scores, foreground_share=shares, mean_jaccard=sum(used) / len(used) if used else None,
        n_evaluated=len(used), foreground=[c.int().tolist() for c in cell_masks], intervention=spec,
    )


def _score_maps_together(source: ActivationSource, hook: str, references: Sequence[str], selective,
                         batch_size: Optional[int], progress: bool) -> Dict[str, torch.Tensor]:
    """Score maps [N, h, w] for several references from one pass over the source (as
    :func:`~interp.studies.aggregation.patch_score.compute_score_maps` gives them one by one)."""
    from ..._progress import tqdm

    hooks = list(dict.fromkeys(h for ref in references for h in needed_hooks(hook, ref)))
    check_source(source, hooks)
    bs = batch_size or source.batch_size
    maps: Dict[str, List[torch.Tensor]] = {ref: [] for ref in references}
    for batch in tqdm(source.batches(hooks, bs), total=n_batches(source, bs), disable=not progress,
                      desc="patch scores", unit="batch", leave=False):
        for ref in references:
            maps[ref].append(score_maps_from_acts(batch.acts, batch.layout, hook, ref, selective))
    return {ref: torch.cat(m) if m else torch.zeros(0, *source.layout.grid) for ref, m in maps.items()}


def segmentation_variants(source: ActivationSource, masks: Union[str, Path], *, reference: str = "cls",
                          selective=None, intervention=None, **options) -> SegmentationResult:
    """The segmentation with ``reference`` (the result) and, under ``result.variants``, the same with the
    SelectiveCLS vector (when ``selective`` is given and ``reference`` is not already ``selective``) and with
    the ``intervention`` (e.g. a test-time register, live source only): LaSt Table 6 with and without the fixes.

    ``options`` go to :func:`segmentation_study` (hook, k_std, batch_size, progress). Each variant holds the
    :data:`VARIANT_FIELDS`."""
    gt = _read_ground_truth(source, masks)  # read once for every variant
    with_selective = selective is not None and reference != "selective"
    maps = None
    if with_selective:  # both maps from one pass over the source
        maps = _score_maps_together(source, options.get("hook", FINAL), (reference, "selective"), selective,
                                    options.get("batch_size"), options.get("progress", True))
    result = segmentation_study(source, masks, reference=reference, selective=selective, _gt=gt,
                                _maps=None if maps is None else maps[reference], **options)
    runs = {}
    if with_selective:
        runs[f"selective (k={selective.k})"] = segmentation_study(source, masks, reference="selective",
                                                                   selective=selective, _gt=gt,
                                                                   _maps=maps["selective"], **options)
    if intervention is not None:
        kind = intervention.kind
        runs[f"{reference} + {kind}"] = segmentation_study(source, masks, reference=reference, selective=selective,
                                                           intervention=intervention, _gt=gt, **options)
    result.variants = {name: {f: getattr(r, f) for f in VARIANT_FIELDS} for name, r in runs.items()}
    result.params["variants"] = list(result.variants)
    return result
