"""What each study is, in one place: a :class:`StudyDescriptor` per study (its name, function, result class,
the hooks it reads for given options, whether it must re-run the model). The command line (``interp study``,
``interp cache --for``, the cache check) and the README's cache table are derived from these.

Importing this module imports no torch: functions and result classes are named ``"module:attribute"`` and
imported when asked for (``descriptor.function()``), and the hook rules import the hook-name builders inside.

>>> from interp.studies import required_hooks
>>> required_hooks("neurons", 6, {"detect_layer": -1, "highest_layer": 2})
['blocks.5.hook_resid_post', 'blocks.0.mlp.hook_post', 'blocks.1.mlp.hook_post', 'blocks.2.mlp.hook_post']
>>> DESCRIPTORS["ablate"].live_only, DESCRIPTORS["norms"].result_class().__name__
(True, 'NormsResult')
"""
from __future__ import annotations

import importlib
from dataclasses import dataclass
from typing import Any, Callable, Dict, List, Mapping, Optional

from ...errors import InterpError

HooksFn = Callable[[int, Mapping], List[str]]


def block_index(value: Optional[int], n_layers: int, default: int) -> int:
    """A block index as studies take it (None: ``default``; negative counts from the end) -> 0..n_layers-1."""
    layer = default if value is None else int(value)
    resolved = layer + n_layers if layer < 0 else layer
    if not 0 <= resolved < n_layers:
        raise InterpError(f"block {layer} is out of range for a model with {n_layers} blocks")
    return resolved


def norms_hooks(n_layers: int, options: Mapping) -> List[str]:
    """Per-block residual stream after attention and after the MLP (attention maps are optional extras)."""
    from ...hooks.names import resid_mid, resid_post  # here: importing the hooks package imports torch

    return [h for i in range(n_layers) for h in (resid_mid(i), resid_post(i))]


def neurons_hooks(n_layers: int, options: Mapping) -> List[str]:
    """The detection block's output plus the MLP activations of every block up to ``highest_layer``."""
    from ...hooks.names import mlp_post, resid_post
    from .presets import resolve_preset

    # a preset decides the detection and highest blocks unless the options name them
    opts = resolve_preset(options.get("preset"), detect_layer=options.get("detect_layer"),
                          highest_layer=options.get("highest_layer"))
    detect = block_index(opts.get("detect_layer"), n_layers, -1)
    highest = opts.get("highest_layer")
    highest = detect if highest is None else block_index(min(int(highest), n_layers - 1), n_layers, detect)
    return [resid_post(detect)] + [mlp_post(i) for i in range(highest + 1)]


def redundancy_hooks(n_layers: int, options: Mapping) -> List[str]:
    """The input patch embedding (``hook_patch_embed``; ``hook_embed`` for ``embedding="position"``) and the
    detection block's output."""
    from ...hooks.names import EMBED, PATCH_EMBED, resid_post
    from .presets import resolve_preset

    opts = resolve_preset(options.get("preset"), detect_layer=options.get("detect_layer"))
    embed = EMBED if options.get("embedding") == "position" else PATCH_EMBED
    return [embed, resid_post(block_index(opts.get("detect_layer"), n_layers, -1))]


def score_hooks(n_layers: int, options: Mapping) -> List[str]:
    """The Patch Score's patch tokens (``hook``) and the hook its global vector is read from (``reference``)."""
    from .score_maps import needed_hooks

    return needed_hooks(options.get("hook") or "hook_norm_final", options.get("reference") or "cls")


def probes_hooks(n_layers: int, options: Mapping) -> List[str]:
    """The probed tokens (``hook`` when given, else block ``layer``'s residual stream, default the last) and the
    detection block's output, which decides the high-norm patches (``detect_layer``, or the preset's; default
    the last block)."""
    from ...hooks.names import resid_post
    from .presets import resolve_preset

    detect = resolve_preset(options.get("preset"), detect_layer=options.get("detect_layer")).get("detect_layer")
    return [options.get("hook") or resid_post(block_index(options.get("layer"), n_layers, -1)),
            resid_post(block_index(detect, n_layers, -1))]


def lost_hooks(n_layers: int, options: Mapping) -> List[str]:
    """The keys of block ``layer`` (default the last), LOST's features."""
    from ...hooks.names import attn_k

    return [attn_k(block_index(options.get("layer"), n_layers, -1))]


def _load(qualified: str) -> Any:
    module, attribute = qualified.split(":")
    return getattr(importlib.import_module(module), attribute)


@dataclass(frozen=True)
class StudyDescriptor:
    """One study.

    Attributes:
        name: the study's name on the command line (``patch-score``).
        function: ``"module:function"`` of the study (``source, ...) -> result``): what ``interp study NAME``
            runs (the command gets it from here, imported when it runs).
        result: ``"module:Class"`` of its result (a :class:`~interp.studies.core.result.StudyResult`).
        summary: one line: what it measures.
        hooks: ``(n_layers, options) -> [hook names]`` it reads from a cache; None: it re-runs the model.
        cache_doc: the hooks in words, for the README table (one row per distinct text).
        full_vectors: a ``--norms-only`` cache cannot serve it.
        json_name: stem of its JSON file (the result's ``study``).
    """

    name: str
    function: str
    result: str
    summary: str
    json_name: str
    hooks: Optional[HooksFn] = None
    cache_doc: str = "none: they re-run the model (`--images`)"
    full_vectors: bool = True

    @property
    def live_only(self) -> bool:
        """True when the study re-runs the model (it needs a live source; no cache serves it)."""
        return self.hooks is None

    def study_function(self) -> Callable:
        return _load(self.function)

    def result_class(self) -> type:
        return _load(self.result)

    def required_hooks(self, n_layers: int, options: Optional[Mapping] = None) -> List[str]:
        """The hooks it reads from a cache of a model with ``n_layers`` blocks for ``options`` (missing ones take
        the defaults); an InterpError for a study that re-runs the model."""
        if self.hooks is None:
            raise InterpError(f"interp study {self.name} re-runs the model with an edit, so it reads no cache; "
                              "give it --images (cacheable studies: "
                              f"{', '.join(d.name for d in DESCRIPTORS.values() if not d.live_only)})")
        return list(dict.fromkeys(self.hooks(n_layers, dict(options or {}))))


_S = "interp.studies."
_NORMS_DOC = ("`blocks.{0..N-1}.hook_resid_mid`, `blocks.{0..N-1}.hook_resid_post` "
              "(a `--norms-only` cache is enough)")
_SCORE_DOC = "`--hook` (default `hook_norm_final`) and `hook_norm_final` (`hook_pooled` with `--reference pooled`)"
DESCRIPTORS: Dict[str, StudyDescriptor] = {d.name: d for d in (
    StudyDescriptor("norms", _S + "artifacts.norms:norms_study", _S + "artifacts.norms:NormsResult",
                    "high-norm tokens: per-block norms, outliers, emergence layer", "norms", norms_hooks,
                    _NORMS_DOC, full_vectors=False),
    StudyDescriptor("neurons", _S + "artifacts.neurons:neurons_study", _S + "artifacts.neurons:NeuronsResult",
                    "rank register neurons (MLP neurons firing on high-norm tokens)", "neurons", neurons_hooks,
                    "`blocks.{D}.hook_resid_post`, `blocks.{0..H}.mlp.hook_post`"),
    StudyDescriptor("ablate", _S + "artifacts.ablate:ablation_study", _S + "artifacts.ablate:AblationResult",
                    "ablate register neurons vs random same-size controls", "ablate"),
    StudyDescriptor("relocate", _S + "artifacts.relocate:relocation_study", _S + "artifacts.relocate:RelocationResult",
                    "move the high-norm tokens onto a chosen mask", "relocate"),
    StudyDescriptor("registers", _S + "artifacts.registers:register_study", _S + "artifacts.registers:RegisterResult",
                    "test-time register: move the high norm into an extra token", "registers"),
    StudyDescriptor("redundancy", _S + "artifacts.redundancy:redundancy_study",
                    _S + "artifacts.redundancy:RedundancyResult",
                    "cosine of each input patch embedding to its 4 neighbours, normal vs high-norm tokens",
                    "redundancy", redundancy_hooks,
                    "`hook_patch_embed` (`hook_embed` with `--embedding position`), `blocks.{D}.hook_resid_post`"),
    StudyDescriptor("patch-score", _S + "aggregation.patch_score:patch_score_study", _S + "aggregation.patch_score:PatchScoreResult",
                    "Patch Score maps cos(patch, global vector), fg/bg distributions", "patch_score", score_hooks,
                    _SCORE_DOC),
    StudyDescriptor("pib", _S + "aggregation.pib:pib_study", _S + "aggregation.pib:PiBResult",
                    "PiB: share of images whose top Patch Score patch is in the box", "pib", score_hooks, _SCORE_DOC),
    StudyDescriptor("masking", _S + "aggregation.masking:masking_study", _S + "aggregation.masking:MaskingResult",
                    "mask top-k / bottom-k patches by Patch Score and re-measure", "masking"),
    StudyDescriptor("selective-cls", _S + "aggregation.selective_cls:selective_cls_study",
                    _S + "aggregation.selective_cls:SelectiveCLSResult",
                    "PiB, score distributions and agreement with/without SelectiveCLS", "selective_cls"),
    StudyDescriptor("probes", _S + "probes.token_probes:probes_study", _S + "probes.token_probes:ProbesResult",
                    "linear probes per token group: position, pixels, image label", "probes", probes_hooks,
                    "`--hook`, or `blocks.{L}.hook_resid_post` for `--layer L` (default last), and "
                    "`blocks.{D}.hook_resid_post` for `--detect-layer D` (default last); pixel probes need `--images`"),
    StudyDescriptor("lost", _S + "objects.lost:lost_study", _S + "objects.lost:LostResult",
                    "LOST object discovery: seed, mask, box per image, CorLoc", "lost", lost_hooks,
                    "`blocks.{L}.attn.hook_k` for `--layer L` (default last)"),
    StudyDescriptor("segment", _S + "objects.segmentation:segmentation_variants", _S + "objects.segmentation:SegmentationResult",
                    "coarse segmentation from Patch Scores, Jaccard vs masks", "segmentation", score_hooks,
                    _SCORE_DOC),
)}


def descriptor(study: str) -> StudyDescriptor:
    """The descriptor of ``study`` (its command-line name); an error listing the known studies otherwise."""
    try:
        return DESCRIPTORS[study]
    except KeyError:
        raise InterpError(f"unknown study {study!r}; known: {', '.join(DESCRIPTORS)}") from None


def required_hooks(study: str, n_layers: int, options: Optional[Mapping] = None) -> List[str]:
    """Hook names ``study`` reads from a cache of a model with ``n_layers`` blocks, for its ``options``
    (``detect_layer``, ``highest_layer``, ``preset``, ``hook``, ``reference``, ``layer``; missing ones take the
    defaults). Raises InterpError for a study that re-runs the model (it cannot read a cache)."""
    return descriptor(study).required_hooks(n_layers, options)


def cache_table() -> str:
    """The README's markdown table of the hooks each study reads from a cache (studies with the same hooks
    share a row; those that re-run the model come last)."""
    rows: Dict[str, List[str]] = {}
    for d in sorted(DESCRIPTORS.values(), key=lambda d: d.live_only):
        rows.setdefault(d.cache_doc, []).append(f"`{d.name}`")
    head = ("| study | hooks it reads (N blocks; D = detection block, default last; H = `--highest-layer`, "
            "default D) |\n|---|---|\n")
    return head + "".join(f"| {', '.join(names)} | {doc} |\n" for doc, names in rows.items())
