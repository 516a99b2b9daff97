"""Test oracle: mIoU as mmsegmentation computes it (never imported by ``interp``).

Follows ``open-mmlab/mmsegmentation``, ``mmseg/core/evaluation/metrics.py`` at commit
020acda4c19e8ee9c9147cca7ccbeccf6f67fdee: ``intersect_and_union`` (pixels whose label equals ``ignore_index``
are dropped from both maps, then per-class histograms of the intersection, prediction and label; union =
pred + label - intersection), ``total_intersect_and_union`` (those histograms summed over the images) and
``total_area_to_metrics`` (IoU = total intersection / total union per class; the mIoU its test script prints
is the nan-mean over classes). Written here in numpy with label maps of integer classes.
"""
from __future__ import annotations

import numpy as np


def intersect_and_union(pred_label, label, num_classes, ignore_index):
    pred_label, label = np.asarray(pred_label), np.asarray(label)
    keep = label != ignore_index
    pred_label, label = pred_label[keep], label[keep]
    intersect = pred_label[pred_label == label]
    bins = np.arange(num_classes + 1)
    area_intersect = np.histogram(intersect, bins=bins)[0].astype(np.float64)
    area_pred = np.histogram(pred_label, bins=bins)[0].astype(np.float64)
    area_label = np.histogram(label, bins=bins)[0].astype(np.float64)
    return area_intersect, area_pred + area_label - area_intersect


def dataset_miou(preds, labels, num_classes=2, ignore_index=255):
    """(per-class IoU [num_classes] with NaN where no union, nan-mean mIoU) from dataset-summed areas."""
    total_i = np.zeros(num_classes)
    total_u = np.zeros(num_classes)
    for p, g in zip(preds, labels):
        i, u = intersect_and_union(p, g, num_classes, ignore_index)
        total_i += i
        total_u += u
    with np.errstate(invalid="ignore", divide="ignore"):
        iou = total_i / total_u
    return iou, float(np.nanmean(iou))


def image_mean_miou(preds, labels, num_classes=2, ignore_index=255):
    """The per-image variant: each image's nan-mean mIoU, averaged over the images."""
    return float(np.mean([dataset_miou([p], [g], num_classes, ignore_index)[1] for p, g in zip(preds, labels)]))
