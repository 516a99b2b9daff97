"""The explorer's display of the one behaviour readout (:mod:`interp.studies.core.behaviour`, the studies' and
the report's): the edited forward against the unedited one over all loaded images, as one JSON-able dict.

The label rule, the classifier (``--classifier FILE`` or the model's own head) and the note saying why there
is no accuracy or no agreement are the studies'; this module only lays out the numbers for the page.
"""
from __future__ import annotations

from typing import Dict

import torch

from ..studies.core.behaviour import BehaviourMeter, BehaviourReadout

METRIC_WORDS = {"classifier": "top-1 agreement with the unedited model",
                "embedding": "cosine to the unedited pooled vector (mean over images)"}


def compare_outputs(readout: BehaviourReadout, base: Dict[str, torch.Tensor], edited: Dict[str, torch.Tensor]) -> Dict:
    """{"kind", "metric", "value", "min", "n_images", "why", "accuracy", "baseline_accuracy", "accuracy_note",
    "behaviour_note", "metrics"} of the ``edited`` outputs against the ``base`` ones.

    ``base``/``edited``: {"pooled": [N, d'], "logits": [N, C]} (``logits``: the classifier's class logits when
    the readout has a classifier file). ``value`` is the top-1 agreement for class logits, else the pooled
    cosine; ``metrics`` is the studies' record (:data:`~interp.studies.core.behaviour.METRICS`).
    """
    meter = BehaviourMeter(readout)
    meter.add("baseline", 0, base["logits"], base["pooled"], base["logits"], base["pooled"])
    meter.add("edited", 0, edited["logits"], edited["pooled"], base["logits"], base["pooled"])
    metrics, unedited = meter.metrics("edited"), meter.metrics("baseline")
    kind = "classifier" if readout.classes else "embedding"
    value = metrics["top1_agreement"] if readout.classes else metrics["pooled_cosine"]
    note = readout.note if readout.classes else None  # an embedding's cosine needs no excuse on the page
    return {"kind": kind, "metric": METRIC_WORDS[kind], "value": value, "min": metrics["pooled_cosine_min"],
            "n_images": int(base["pooled"].shape[0]), "why": readout.why, "accuracy": metrics["accuracy"],
            "baseline_accuracy": unedited["accuracy"], "accuracy_note": note, "behaviour_note": readout.note,
            "metrics": metrics}
