"""Coarse segmentation from Patch Scores (LaSt, Table 6; docs/methods.md section 3), scored by mIoU and Jaccard.

Per image: the Patch Score map S [h, w] (any reference vector, :mod:`interp.studies.aggregation.patch_score`);
foreground = S > mean(S) + ``k_std`` x std(S) (the image's own map; population std); the cell mask is
upsampled (nearest) to the model-input size [H, W] and compared, pixel by pixel, with the ground truth
(:mod:`interp.studies.objects.seg_scoring`):

* ``frame="input"`` (default): in the model-input frame, the ground truth mapped through the model's
  resize/crop (nearest original pixel under each input pixel centre; what the crop removed is not scored);
  ``frame="full"``: on the whole original image at the mask's resolution (pixels the crop cut away count as
  predicted background; ``unseen_share`` says how many). ``whole_image=True`` shows the model each whole image
  (resized to its input size, nothing cropped), so every pixel is seen and scored.
* mIoU over the two classes background and foreground, void pixels left out; ``average="image"`` (default)
  averages each image's mIoU, ``average="dataset"`` sums the intersections and unions over the dataset first.
* ``jaccard``: the foreground class's IoU per image, ``|pred & gt| / |pred | gt|`` over the scored pixels.

Ground truth, matched to the images:

* a folder of mask images (``DIR/<image stem>.png``, the original image's size): palette PNGs (VOC's
  ``SegmentationClass``) by index, 0 background, 255 void, any other index foreground; other images nonzero =
  foreground (:func:`~interp.formats.masks.read_label_mask`), or
* a COCO instances JSON with polygon ``segmentation``s (the union of an image's polygons, rasterised with
  PIL ``ImageDraw``; RLE masks are refused with a clear error), matched by ``file_name`` like box files.

>>> result = segment_study(source, masks="masks.json", reference="cls", with_selective=False, progress=False)
>>> len(result.jaccard), result.jaccard[1:]       # one score per image; None: no mask for that image
(4, [None, None, None])
>>> result.average, result.n_evaluated            # result.miou: the mean of the evaluated images' mIoU
('image', 1)
"""
from __future__ import annotations

import math
import warnings
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Dict, List, Optional, Sequence, Tuple, Union

import numpy as np
import torch

from ...errors import InterpError, InterpWarning
from ...formats.box_files import coco_annotations, coco_images, match_boxes, read_json_file
from ...formats.masks import check_mask_size, mask_files, read_label_mask
from ...models.inputs.geometry import input_geometry
from ...models.inputs.preprocessing import timm_transform
from .configs import SegmentConfig
from .register_edit import study_edit
from .whole_image import whole_image_source
from .seg_scoring import image_miou, reduce_areas, score_image
from ..core.score_maps import FINAL, check_source, compute_score_maps, needed_hooks, score_maps_from_acts
from ..core.result import StudyResult
from ...runtime.source import ActivationSource, n_batches, require_live
from ..declaration import study
from ...interventions.selective_cls import SelectiveCLS

Polygons = List[List[float]]  # COCO polygons: flat [x0, y0, x1, y1, ...] in original pixels


def foreground_cells(score_map: torch.Tensor, k_std: float = 1.0) -> torch.Tensor:
    """Cells of a score map [h, w] above the map's mean + ``k_std`` x std (population std) -> bool [h, w]."""
    s = score_map.double()
    return s > s.mean() + k_std * s.std(unbiased=False)


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
        short = [len(p) for p in seg if len(p) < 6 or len(p) % 2]
        if short:
            raise InterpError(f"{path}: annotation {i}: a polygon of {short[0]} numbers; a polygon is x, y pairs "
                              "of at least 3 points (an even count >= 6)")
        if ann.get("image_id") not in names:
            raise InterpError(f"{path}: annotation {i} refers to image_id {ann.get('image_id')!r}, not in 'images'")
        key = names[ann["image_id"]]
        _check_polygons(seg, table[key][0], f"{path}: annotation {i} (image {key!r})")
        table[key][1].extend(seg)
    return table


def _check_polygons(polygons: Polygons, size: Tuple[int, int], where: str) -> None:
    """Refuse an annotation that marks no pixel: no polygon, a polygon of zero area (its points on one line), or
    one wholly outside its ``size = (width, height)`` image; and one that reaches more than half the image beyond an
    edge (other units, or crafted: as box files, :func:`~interp.formats.box_types.check_box_in_image`). Each would score the image as if it had no object
    (mIoU 1.0 for an empty prediction) instead of saying the ground truth is wrong."""
    if not polygons:
        raise InterpError(f"{where}: 'segmentation' is an empty list; give its polygons or remove the annotation")
    width, height = size
    for j, poly in enumerate(polygons):
        xs, ys = poly[0::2], poly[1::2]
        area = 0.5 * abs(sum(xs[k] * ys[k - 1] - xs[k - 1] * ys[k] for k in range(len(xs))))
        if area == 0:
            raise InterpError(f"{where}: polygon {j} has zero area (its points lie on one line); fix or remove it")
        if max(xs) <= 0 or min(xs) >= width or max(ys) <= 0 or min(ys) >= height:
            raise InterpError(f"{where}: polygon {j} lies wholly outside its {width} x {height} image "
                              f"(x {min(xs):g}..{max(xs):g}, y {min(ys):g}..{max(ys):g}); fix its coordinates")
        if min(xs) < -width / 2 or max(xs) > 1.5 * width or min(ys) < -height / 2 or max(ys) > 1.5 * height:
            # PIL draws on int32 pixels: 3e9 wrapped to one pixel and scored mIoU 0.83
            raise InterpError(f"{where}: polygon {j} reaches far outside its {width} x {height} image "
                              f"(x {min(xs):g}..{max(xs):g}, y {min(ys):g}..{max(ys):g}); coordinates are pixels "
                              "of the original image")


GroundTruth = Tuple[np.ndarray, np.ndarray]  # (foreground, void): bool [H0, W0] each, original pixels


def ground_truth_labels(ids: Sequence[str], masks: Union[str, Path]) -> List[Optional[GroundTruth]]:
    """Original-size (foreground, void) bool masks [H0, W0] per image id (None when the ground truth has none
    for it). COCO polygons have no void."""
    masks = Path(masks)
    if masks.is_file() and masks.suffix.lower() == ".json":
        table = read_coco_polygons(masks)
        entries = match_boxes(ids, table)  # matching only uses the keys: same rule as box files
        out: List[Optional[GroundTruth]] = []
        for image_id, e in zip(ids, entries):
            fg = None if e is None else rasterise_polygons(e[1], e[0])
            if fg is not None:
                check_mask_size(fg.shape, image_id, f"{masks}: the image record of {image_id!r} (width x height)")
                if e[1] and not fg.any():  # polygons thinner than a pixel: nothing to score against
                    raise InterpError(f"{masks}: the polygons of {image_id!r} cover no pixel of its image; fix them "
                                      "or remove its annotations")
            out.append(None if fg is None else (fg, np.zeros_like(fg)))
        return out
    if not masks.is_dir():
        raise InterpError(f"masks={str(masks)!r}: give a folder of PNG masks (matched by file stem) or a COCO "
                          "instances JSON with polygon segmentations")
    files = mask_files(masks)
    out = []
    for image_id in ids:
        path = files.get(Path(image_id).stem)
        labels = None if path is None else read_label_mask(path)
        if labels is not None:
            check_mask_size(labels[0].shape, image_id, f"mask {str(path)!r}")
        out.append(labels)
    return out


def ground_truth_masks(ids: Sequence[str], masks: Union[str, Path]) -> List[Optional[np.ndarray]]:
    """Original-size bool foreground masks [H0, W0] per image id (None when the ground truth has none for it)."""
    return [None if gt is None else gt[0] for gt in ground_truth_labels(ids, masks)]


@dataclass
class SegmentResult(StudyResult):
    """Result of :func:`segment_study`.

    Attributes:
        miou: mIoU over the classes background and foreground (void left out), reduced as ``average`` says:
            "image" = mean of the images' mIoU, "dataset" = from intersections and unions summed over the images.
        class_iou: {"background": ..., "foreground": ...} reduced the same way.
        image_miou: per image (None: no ground-truth mask, or no scored pixel).
        areas: per image {"intersection": [bg, fg], "union": [bg, fg]} pixel counts (None without a mask).
        n_scored: images with a mask and at least one scored pixel (what ``miou`` averages).
        jaccard: per image the foreground IoU (None: no ground-truth mask, or prediction and mask both empty).
        mean_jaccard: mean over the images with a number; n_evaluated: how many.
        foreground_share: per image the share of cells called foreground.
        frame: "input" (the model-input frame; ``input_size`` [H, W]) or "full" (each original image).
        whole_image: True when the model saw each whole image (no centre crop).
        unseen_share: per image the share of its scored ground-truth pixels the model input does not show
            (cut away by the crop; counted as predicted background in the full frame, 0 in the input frame).
    """

    study = "segment"
    ids: List[str] = field(default_factory=list)
    hook: str = FINAL
    reference: str = "cls"
    k_std: float = 1.0
    grid: List[int] = field(default_factory=list)
    input_size: List[int] = field(default_factory=list)
    frame: str = "input"
    whole_image: bool = False
    average: str = "image"
    miou: Optional[float] = None
    class_iou: Dict[str, Optional[float]] = field(default_factory=dict)
    image_miou: List[Optional[float]] = field(default_factory=list)
    areas: List[Optional[Dict[str, List[int]]]] = field(default_factory=list)
    n_scored: int = 0
    unseen_share: List[Optional[float]] = field(default_factory=list)
    jaccard: List[Optional[float]] = field(default_factory=list)
    foreground_share: List[float] = field(default_factory=list)
    mean_jaccard: Optional[float] = None
    n_evaluated: int = 0
    foreground: List[List[List[int]]] = field(default_factory=list)
    intervention: Optional[Dict] = None
    variants: Dict[str, Dict] = field(default_factory=dict)

    def summary(self) -> str:
        if self.n_scored == 0:
            return f"segmentation: no image of {len(self.ids)} has a ground-truth mask with a scored pixel"
        how = "dataset sums" if self.average == "dataset" else "mean over images"
        lines = [f"coarse segmentation ({self.reference}, mean + {self.k_std:g} std, {self.frame} frame): mIoU "
                 f"{_num(self.miou)} ({how}; background {_num(self.class_iou.get('background'))}, foreground "
                 f"{_num(self.class_iou.get('foreground'))}) on {self.n_scored} of {len(self.ids)} images; "
                 f"mean Jaccard {_num(self.mean_jaccard)} on {self.n_evaluated}"]
        lines += [f"  {name}: mIoU {_num(v['miou'])}, mean Jaccard {_num(v['mean_jaccard'])} on "
                  f"{v['n_evaluated']} images" for name, v in self.variants.items()]
        return "\n".join(lines)

    def figure_images(self, source) -> Any:
        """The images as the model saw them (each whole image with ``whole_image``)."""
        return super().figure_images(whole_image_source(source) if self.whole_image else source)


def _num(value: Optional[float]) -> str:
    return "n/a" if value is None else f"{value:.3f}"


VARIANT_FIELDS = ("reference", "intervention", "miou", "class_iou", "image_miou", "n_scored", "jaccard",
                  "mean_jaccard", "n_evaluated", "foreground_share", "foreground")


def _read_ground_truth(source: ActivationSource, masks: Union[str, Path]) -> List[Optional[GroundTruth]]:
    gt = ground_truth_labels(source.ids, masks)
    if not any(m is not None for m in gt):
        raise InterpError(f"no image of the source has a ground-truth mask in {str(masks)!r} (images like "
                          f"{source.ids[0]!r}); masks match by file stem (folders) or file_name (COCO)")
    return gt


def _segment_run(source: ActivationSource, masks: Union[str, Path], gt: List[Optional[GroundTruth]], *,
                 reference: str, hook: str, selective, k_std: float, average: str, frame: str, whole_image: bool,
                 intervention=None, progress: bool = True, maps: Optional[torch.Tensor] = None) -> SegmentResult:
    """One variant of :func:`segment_study`: mIoU and Jaccard of the thresholded Patch Score map against the
    ground truth ``gt`` (read from ``masks``), per image and overall; ``maps`` [N, h, w]: the score maps when
    already computed, else computed here (under ``intervention`` when given: live source only)."""
    batch_size = source.batch_size
    if maps is None and intervention is None:
        maps = compute_score_maps(source, hook, reference, selective, batch_size, progress)  # [N, h, w]
    elif maps is None:
        require_live(source, "segmentation with an intervention")
        maps = compute_score_maps(source.with_interventions(intervention), hook, reference, selective, batch_size,
                                  progress)
    cell_masks = [foreground_cells(m, k_std) for m in maps]
    transform = timm_transform(source.data_config())
    jaccard: List[Optional[float]] = []
    per_image: List[Optional[float]] = []
    areas: List[Optional[Dict[str, List[int]]]] = []
    unseen: List[Optional[float]] = []
    scored = []
    shares: List[float] = []
    input_size: Tuple[int, int] = (0, 0)
    for cells, truth in zip(cell_masks, gt):
        shares.append(float(cells.float().mean()))
        if truth is None:
            for column in (jaccard, per_image, areas, unseen):
                column.append(None)
            continue
        foreground, void = truth
        geometry = input_geometry(transform, (foreground.shape[1], foreground.shape[0]))
        input_size = geometry.input_size
        inter, union, hidden = score_image(cells, foreground, void, geometry, frame)
        jaccard.append(None if union[1] == 0 else float(inter[1]) / float(union[1]))
        per_image.append(image_miou(inter, union))
        areas.append({"intersection": inter.tolist(), "union": union.tolist()})
        unseen.append(hidden)
        if union.sum() > 0:
            scored.append((inter, union))
    reduced = reduce_areas(scored, average)
    hidden_shares = [u for u in unseen if u]
    if frame == "full" and hidden_shares:
        warnings.warn(f"segmentation: the model input does not show {100 * max(hidden_shares):.1f} % of an "
                      f"image's scored pixels (the centre crop; {len(hidden_shares)} images); in the full frame "
                      "they count as predicted background: use a transform without a crop to score what the "
                      "model saw of the whole image", InterpWarning, stacklevel=2)
    used = [s for s in jaccard if s is not None]
    spec = None if intervention is None else {"kind": intervention.kind, **intervention.params()}
    params = {"reference": reference, "hook": hook, "k_std": k_std, "average": average, "frame": frame,
              "whole_image": whole_image, "masks": str(masks), "intervention": spec}
    return SegmentResult(
        model=source.model_name, fingerprint=source.fingerprint, params=params, seed=None, ids=list(source.ids),
        hook=hook, reference=reference, k_std=k_std, grid=list(source.layout.grid), input_size=list(input_size),
        frame=frame, whole_image=whole_image, average=average, miou=reduced["miou"], class_iou=reduced["class_iou"],
        image_miou=per_image,
        areas=areas, n_scored=len(scored), unseen_share=unseen,
        jaccard=jaccard, foreground_share=shares, mean_jaccard=sum(used) / len(used) if used else None,
        n_evaluated=len(used), foreground=[c.int().tolist() for c in cell_masks], intervention=spec,
    )


def _score_maps_together(source: ActivationSource, hook: str, references: Sequence[str], selective,
                         batch_size: Optional[int], progress: bool) -> Dict[str, torch.Tensor]:
    """Score maps [N, h, w] for several references from one pass over the source (as
    :func:`~interp.studies.core.score_maps.compute_score_maps` gives them one by one)."""
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


@study(SegmentConfig)
def segment_study(source: ActivationSource, config: SegmentConfig, *, intervention=None,
                  progress: bool = True) -> SegmentResult:
    """The coarse segmentation with the config's ``reference`` (the result) and, under ``result.variants``, the
    same with the SelectiveCLS vector (``with_selective``, unless ``reference`` is already ``selective``) and
    with a test-time register (``neurons``, or an ``intervention`` handed in; live source only): LaSt Table 6
    with and without the fixes. Each variant holds the :data:`VARIANT_FIELDS`.

    Args:
        source: live source over image files or a cache of them (ids are the image paths).
        config: the options (:class:`~interp.studies.objects.configs.SegmentConfig`; or pass them as keywords):
            ``masks`` a folder of PNG masks or a COCO instances JSON (module docstring; required); ``reference``,
            ``hook``, ``selective_k`` the Patch Score
            (:func:`~interp.studies.aggregation.patch_score.patch_score_study`); ``k_std``: foreground = score >
            mean + k_std x std of the image's map; ``average`` "image" (mean of per-image mIoU) or "dataset"
            (intersections and unions summed first); ``frame`` "input" (the model-input frame; the crop's
            removed border is not scored) or "full" (the whole original image; what the preprocessing cut away
            counts as predicted background); ``whole_image``: the model sees each whole image, resized to its
            input size without the centre crop (aspect not kept; :mod:`~interp.studies.objects.whole_image`), so
            every pixel is seen and scored (live source over image files only).
        intervention: an edit instead of ``neurons`` (e.g. a ``TestTimeRegister``).
    """
    c = config
    if c.masks is None:
        raise InterpError("segment_study needs masks=: a folder of PNG masks or a COCO instances JSON")
    masks, reference = c.masks, c.reference
    intervention = study_edit(c.neurons, c.n_registers, intervention)
    selective = SelectiveCLS(k=c.selective_k) if c.with_selective or reference == "selective" else None
    if c.whole_image:
        source = whole_image_source(source)  # once, for every variant
    gt = _read_ground_truth(source, masks)  # read once for every variant
    options = dict(hook=c.hook, k_std=c.k_std, average=c.average, frame=c.frame, whole_image=c.whole_image,
                   progress=progress)
    with_selective = selective is not None and reference != "selective"
    maps = None
    if with_selective:  # both maps from one pass over the source
        maps = _score_maps_together(source, c.hook, (reference, "selective"), selective, source.batch_size,
                                    progress)
    result = _segment_run(source, masks, gt, reference=reference, selective=selective,
                          maps=None if maps is None else maps[reference], **options)
    runs = {}
    if with_selective:
        runs[f"selective (k={selective.k})"] = _segment_run(source, masks, gt, reference="selective",
                                                            selective=selective, maps=maps["selective"], **options)
    if intervention is not None:
        runs[f"{reference} + {intervention.kind}"] = _segment_run(source, masks, gt, reference=reference,
                                                                  selective=selective, intervention=intervention,
                                                                  **options)
    result.variants = {name: {f: getattr(r, f) for f in VARIANT_FIELDS} for name, r in runs.items()}
    result.params["variants"] = list(result.variants)
    return result
