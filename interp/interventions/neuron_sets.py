"""The forms a set of MLP neurons takes, the same in Python and on the command line, and where it came from.

>>> neuron_set({5: [12, 40]}).neurons            # a dict {layer: [neuron, ...]}
{5: [12, 40]}
>>> neuron_set("2:17,2:101,5:40").neurons        # LAYER:NEURON pairs
{2: [17, 101], 5: [40]}
>>> from interp.studies.artifacts.neurons import neurons_study
>>> neurons_result = neurons_study(source, top_k=4, progress=False)
>>> neuron_set(neurons_result).neurons           # a NeuronsResult (anything with neuron_dict())
{2: [17, 101, 402, 655]}

A neurons study's JSON file (``neuron_set("runs/dino/neurons.json")``) also records the model it ranked.

A set read from a neurons study remembers the model and weights fingerprint it was ranked on, so
:func:`check_ranked_on` can refuse it on another model (register neurons are specific to one set of weights).
"""
from __future__ import annotations

import json
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Dict, List, Optional

from ..errors import InterpError
from ..values import NEURONS_SYNTAX
from ..paths import check_input_path



@dataclass(frozen=True)
class NeuronSet:
    """``{layer: [neuron, ...]}`` plus the model it was ranked on (None when the form does not say).

    Attributes:
        neurons: layer -> neuron indices, in the order given.
        model, fingerprint: name and weights fingerprint of the model a neurons study ranked them on.
        origin: the form it was read from, for messages (``'runs/neurons.json'``, ``'a dict'``...).
    """

    neurons: Dict[int, List[int]]
    model: Optional[str] = None
    fingerprint: Optional[str] = None
    origin: str = "a dict"


def parse_neuron_text(text: str, label: str = "neurons") -> Dict[int, List[int]]:
    """``"2:17,2:101,5:40"`` -> ``{2: [17, 101], 5: [40]}``. Raises InterpError on bad syntax or a repeat
    (``label`` names the value in the message, e.g. ``--neurons``)."""
    text = (text or "").strip()
    if not text:
        raise InterpError(f"{label} is empty: give {NEURONS_SYNTAX}")
    out: Dict[int, List[int]] = {}
    for item in text.split(","):
        m = re.fullmatch(r"\s*(\d+)\s*:\s*(\d+)\s*", item)
        if not m:
            raise InterpError(f"{label} {text!r}: cannot read {item!r}; expected {NEURONS_SYNTAX}")
        layer, neuron = int(m.group(1)), int(m.group(2))
        if neuron in out.setdefault(layer, []):
            raise InterpError(f"{label} {text!r}: neuron {layer}:{neuron} is listed twice")
        out[layer].append(neuron)
    return out


def _ranked_dict(entries: Any, where: str) -> Dict[int, List[int]]:
    if not isinstance(entries, list) or not all(isinstance(e, dict) and "layer" in e and "neuron" in e
                                                for e in entries):
        raise InterpError(f"{where} is not a neurons study result: it needs \"neurons\": "
                          "[{\"layer\": L, \"neuron\": N, ...}]")
    out: Dict[int, List[int]] = {}
    for e in entries:
        if isinstance(e["layer"], bool) or isinstance(e["neuron"], bool):
            raise InterpError(f"{where}: layer/neuron must be integers, got {e}")
        try:
            out.setdefault(int(e["layer"]), []).append(int(e["neuron"]))
        except (TypeError, ValueError):
            raise InterpError(f"{where}: layer/neuron must be integers, got {e}") from None
    return out


def read_neurons_json(path) -> NeuronSet:
    """The ranked neurons of a neurons study's JSON file, with the model it ranked them on."""
    path = Path(path)
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, ValueError, RecursionError) as e:
        raise InterpError(f"cannot read neurons file {str(path)!r} ({type(e).__name__}: {e}); give the "
                          "neurons.json an `interp study neurons` run wrote") from None
    if not isinstance(data, dict) or "neurons" not in data:
        raise InterpError(f"{str(path)!r} is not a neurons study result (no \"neurons\" list); give the "
                          "neurons.json an `interp study neurons` run wrote")
    neurons = _ranked_dict(data["neurons"], repr(str(path)))
    if not neurons:
        raise InterpError(f"{path} ranks no neurons ({data.get('message') or 'empty list'}); nothing to edit")
    return NeuronSet(neurons, data.get("model"), data.get("fingerprint"), repr(str(path)))


def neuron_set(spec: Any, label: str = "neurons") -> NeuronSet:
    """Any accepted form (dict, ``"L:N,..."`` text, neurons.json path, neurons result, a NeuronSet) -> NeuronSet
    (``label`` names a text form in error messages, e.g. ``--neurons``)."""
    if isinstance(spec, NeuronSet):
        return spec
    if isinstance(spec, dict):
        return NeuronSet(dict(spec))
    if callable(getattr(spec, "neuron_dict", None)):  # a NeuronsResult (studies sit above this layer)
        neurons = spec.neuron_dict()
        if not neurons:
            raise InterpError(f"this neurons result ranks no neurons ({getattr(spec, 'message', '') or 'empty'}); "
                              "nothing to edit")
        return NeuronSet(neurons, getattr(spec, "model", None), getattr(spec, "fingerprint", None),
                         "a neurons study result")
    if isinstance(spec, Path) or (isinstance(spec, str) and spec.strip().endswith(".json")):
        path = Path(spec)
        check_input_path(path, "neurons file")
        if not path.is_file():
            raise InterpError(f"neurons file {str(path)!r} does not exist")
        return read_neurons_json(path)
    if isinstance(spec, str):
        return NeuronSet(parse_neuron_text(spec, label), origin=repr(spec))
    raise InterpError(f"cannot read neurons from a {type(spec).__name__}: give a dict {{layer: [neuron, ...]}}, "
                      f"a neurons.json path, a neurons study result or {NEURONS_SYNTAX}")


def check_ranked_on(nset: NeuronSet, model, force: bool = False, flag: str = "force=True") -> None:
    """Refuse neurons a study ranked on other weights than ``model``'s (unless ``force``); ``model`` may be an
    activation source (its ``fingerprint`` is its model's).

    Raises:
        InterpError: naming both models and fingerprints, and ``flag`` to override.
    """
    if force or not re.fullmatch(r"[0-9a-f]{16}", str(nset.fingerprint or "")):
        return  # no fingerprint recorded ("?" from a cache without one, a hand-written file): nothing to check
    from ..models.fingerprint import weights_fingerprint

    mine = getattr(model, "fingerprint", None) or weights_fingerprint(model)
    if mine == nset.fingerprint:
        return
    name = getattr(model, "model_name", type(model).__name__)
    raise InterpError(f"{nset.origin} was ranked on {nset.model or '?'} (weights {nset.fingerprint}), not on "
                      f"this {name} (weights {mine}): register neurons belong to one set of weights; rank them "
                      f"on this model with `interp study neurons`, or pass {flag} to use them anyway")


def ranked_neurons(spec: Any, model, force: bool = False, label: str = "neurons",
                   flag: str = "force=True") -> Dict[int, List[int]]:
    """The neurons of ``spec`` (any form of :func:`neuron_set`; text is stripped) as ``{layer: [neuron, ...]}``,
    refused when a neurons study ranked them on other weights than ``model``'s (:func:`check_ranked_on`)."""
    nset = neuron_set(spec.strip() if isinstance(spec, str) else spec, label)
    check_ranked_on(nset, model, force=force, flag=flag)
    return nset.neurons
