"""What the explorer accepts in a request, exactly, and how much of it.

A request's ``interventions`` are a patch-file spec list (:mod:`interp.interventions.spec`), read strictly
here before the library parses it: the library converts with ``int()``, so ``1.5``, ``true`` or ``"17"`` as a
neuron index would silently edit another neuron than the one asked for. Here every index (neurons, layers,
relocation cells, ``k``, ``n_registers``) must be a JSON integer, and every number finite.

Limits (no real use comes near them; the page sends at most two interventions):

* :data:`MAX_INTERVENTIONS` interventions per request (``/api/run`` and ``/api/export``); more get 413;
* :data:`MAX_REGISTER_TOKENS` test-time register tokens per request (``n_registers`` summed over its
  TestTimeRegister and AttentionBias entries) and :data:`MAX_FEATURES` SAE features or layers per intervention;
  more get 413;
* a request's model work (calibration, edited forward, readout over all images) stops after
  ``ExploreOptions.max_seconds`` (``--max-seconds``, default :data:`MAX_SECONDS`) with 413
  (:class:`RequestTooLarge`), checked at every block of every forward pass;
* a threshold is a finite norm > 0; one above every norm is accepted and means "no outliers".

>>> check_spec([{"kind": "NeuronAblation", "neurons": {"2": [1.5]}}])  # doctest: +ELLIPSIS
Traceback (most recent call last):
...
interp.explore.requests.BadSpec: neuron indices must be JSON integers: neurons["2"] holds 1.5 (a float); ...
"""
from __future__ import annotations

import math
import re
from typing import Any, Dict, Sequence

from ..errors import InterpError
from ..interventions.neuron_sets import NEURONS_SYNTAX

MAX_INTERVENTIONS = 16  # per request: the page sends at most 2 (one neuron edit and SelectiveCLS)
MAX_REGISTER_TOKENS = 64  # test-time register tokens per request, all interventions together (models use 1-16)
MAX_FEATURES = 4096  # SAE features (or layers) named in one intervention
MAX_SECONDS = 600.0  # per request's model work: a toggle takes well under a second on planted_vit
INDEX_FIELDS = ("k", "n_registers")  # integer parameters besides neurons, layers and relocation cells
_NEURON_TEXT = re.compile(r"\s*\d+\s*:\s*\d+\s*(,\s*\d+\s*:\s*\d+\s*)*")  # "L:N,...": no file named
_LAYER_KEY = re.compile(r"\d+")


class BadSpec(InterpError):
    """A request the explorer refuses as written (HTTP 400)."""


class RequestTooLarge(InterpError):
    """A request over one of the explorer's limits (HTTP 413)."""


def _kind(value: Any) -> str:
    return {bool: "a boolean", float: "a float", str: "a string", int: "an integer", dict: "an object",
            type(None): "null"}.get(type(value), f"a {type(value).__name__}")


def _is_index(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _check_index(value: Any, where: str, what: str = "neuron indices") -> None:
    if not _is_index(value):
        raise BadSpec(f"{what} must be JSON integers: {where} holds {value!r} ({_kind(value)}); write a whole "
                      "number such as 17 (not 17.0, true or \"17\")")


def check_neurons(neurons: Any) -> None:
    """A spec's ``neurons``: ``{"layer": [neuron, ...]}`` with integer layers and indices, or ``"L:N,..."`` text.

    Anything else is refused before anything reads it: a string such as a neurons.json path would make the
    server read a file named by the request."""
    if isinstance(neurons, str) and _NEURON_TEXT.fullmatch(neurons):
        return
    if not isinstance(neurons, dict):
        raise BadSpec("the explorer reads no files: 'neurons' must be an object {\"layer\": [neuron, ...]} "
                      f"or {NEURONS_SYNTAX.split(' (')[0]}, not a file path or another value "
                      "(load a neurons.json with --neurons when starting the explorer)")
    for layer, idx in neurons.items():
        if not (_is_index(layer) or (isinstance(layer, str) and _LAYER_KEY.fullmatch(layer))):
            raise BadSpec(f"neurons: layer {layer!r} must be a block number such as \"2\"")
        if not isinstance(idx, list):
            raise BadSpec(f"neurons[{layer!r}] must be a list of neuron indices such as [17, 101], not {_kind(idx)}")
        for value in idx:
            _check_index(value, f"neurons[{layer!r}]".replace("'", '"'))


def _check_target(target: Any) -> None:
    """Relocation cells: box/indices numbers are integers, a 0/1 grid holds 0, 1 (or true, false) only."""
    if isinstance(target, dict):
        for name, values in target.items():
            for value in values if isinstance(values, list) else [values]:
                for v in value if isinstance(value, list) else [value]:
                    _check_index(v, f"target {name}", "target cells")
    elif isinstance(target, list) and not all(isinstance(r, str) for r in target):
        for row in target:
            for v in row if isinstance(row, list) else [row]:
                if v not in (0, 1) or isinstance(v, float):
                    raise BadSpec(f"a target grid holds 0 or 1 per cell, not {v!r} ({_kind(v)})")


def check_finite(value: Any, where: str = "interventions") -> None:
    """Refuse inf and NaN anywhere in ``value`` (JSON has neither; Python callers can still pass them)."""
    stack = [value]
    while stack:
        v = stack.pop()
        if isinstance(v, float) and not math.isfinite(v):
            raise BadSpec(f"{where} holds {v!r}: every number must be finite")
        if isinstance(v, dict):
            stack.extend(v.values())
        elif isinstance(v, (list, tuple)):
            stack.extend(v)


def check_spec(spec: Any) -> None:
    """Refuse a request's interventions unless every index is an integer, every number finite, and there are
    at most :data:`MAX_INTERVENTIONS` of them. The library checks the rest (kinds, ranges, shapes)."""
    if not isinstance(spec, list):
        raise BadSpec("'interventions' must be a list of {\"kind\": ..., params} objects (the patch-file spec, "
                      "see interp.interventions.spec)")
    if len(spec) > MAX_INTERVENTIONS:
        raise RequestTooLarge(f"{len(spec)} interventions in one request: the explorer takes at most "
                              f"{MAX_INTERVENTIONS} (the page sends at most 2)")
    registers = sum(e["n_registers"] if _is_index(e.get("n_registers")) else 1 for e in spec
                    if isinstance(e, dict) and e.get("kind") in ("TestTimeRegister", "AttentionBias"))
    if registers > MAX_REGISTER_TOKENS:  # each is one more token through every block: 16 x 1024 took 7 GB
        raise RequestTooLarge(f"{registers} test-time register tokens in one request: the explorer takes at most "
                              f"{MAX_REGISTER_TOKENS} (published models use 1-16)")
    for entry in spec:
        if not isinstance(entry, dict):
            continue  # the library's message says what an entry is
        for name in ("features", "layers"):
            if isinstance(entry.get(name), list) and len(entry[name]) > MAX_FEATURES:
                raise RequestTooLarge(f"{len(entry[name])} {name} in one intervention: the explorer takes at most "
                                      f"{MAX_FEATURES}")
        if entry.get("neurons") is not None:
            check_neurons(entry["neurons"])
        for name in INDEX_FIELDS:
            if name in entry:
                _check_index(entry[name], repr(name), f"'{name}'")
        for name, what in (("layers", "layers"), ("features", "SAE features")):
            if name in entry and not isinstance(entry[name], list):  # "58" would be read as [5, 8], {"58": 1} as [58]
                raise BadSpec(f"'{name}' must be a JSON list of {what} such as [12, 40], not {_kind(entry[name])} "
                              f"({entry[name]!r})")
            if isinstance(entry.get(name), list):
                for value in entry[name]:
                    _check_index(value, repr(name), what)
        if "target" in entry:
            _check_target(entry["target"])
    check_finite(spec)


def check_threshold(threshold: Any) -> float:
    """A request's threshold as a float: a finite norm > 0. One above every norm is kept (no outliers)."""
    bad = isinstance(threshold, bool) or not isinstance(threshold, (int, float))
    try:
        value = math.nan if bad else float(threshold)
    except OverflowError:  # an integer beyond any float
        value = math.inf
    if not math.isfinite(value) or value <= 0:
        raise BadSpec(f"threshold {threshold!r} must be a finite norm > 0 (a number; one above every norm means "
                      "no outliers)")
    return value


def describe_edits(spec: Sequence[Dict[str, Any]]) -> str:
    """One readable line for a spec list: ``"none"`` or e.g. ``"ablate (zero) 2:17, 2:101; SelectiveCLS k=1"``."""
    parts = []
    for entry in spec:
        kind = entry.get("kind", "?")
        neurons = entry.get("neurons")
        if isinstance(neurons, dict):
            names = ", ".join(f"{l}:{n}" for l, idx in neurons.items() for n in idx)
        else:
            names = str(neurons or "")
        if kind == "NeuronAblation":
            parts.append(f"ablate ({entry.get('mode', 'zero')}) {names}")
        elif kind == "TestTimeRegister":
            parts.append(f"test-time register from {names}")
        elif kind == "Relocation":
            target = entry.get("target")
            where = f"{sum(map(sum, target))} drawn cells" if isinstance(target, list) and target and \
                isinstance(target[0], list) else str(target if target is not None else "smiley")
            parts.append(f"relocate {names} onto {where}")
        elif kind == "SAEFeatureAblation":
            parts.append(f"ablate SAE features ({entry.get('mode', 'zero')}) {entry.get('features')}")
        elif kind == "SelectiveCLS":
            parts.append(f"SelectiveCLS k={entry.get('k', 1)}")
        else:
            parts.append(f"{kind} {names}".strip())
    return "; ".join(parts) or "none"
