"""The table of ``interp study NAME`` commands: one row per study, naming the module that holds its
arguments and its run, its one-line help, and the hooks it reads from an activation cache.

Adding a study to the command line is "add a file, register it": write ``interp/commands/study_<x>.py`` with
``add_<x>_arguments(parser)`` and ``run_<x>(args) -> int``, and add a :class:`StudyCommand` row to
``STUDIES`` below (with a ``hooks`` function when the study can read a cache).

Nothing here imports torch: the parsers are built from this table without loading a model.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Dict, List, Mapping, Optional

from ..errors import InterpError

HooksFn = Callable[[int, Mapping], List[str]]


def _layer(value: Optional[int], n_layers: int, default: int) -> int:
    """A block index as the CLI takes it (None: ``default``; negative counts from the end) -> 0..n_layers-1."""
    layer = default if value is None else int(value)
    resolved = layer + n_layers if layer < 0 else layer
    if not 0 <= resolved < n_layers:
        raise InterpError(f"block {layer} is out of range for a model with {n_layers} blocks")
    return resolved


def norms_hooks(n_layers: int, options: Mapping) -> List[str]:
    """Per-block residual stream after attention and after the MLP (attention maps are optional extras)."""
    from ..hooks.names import resid_mid, resid_post  # here: importing the hooks package imports torch

    return [h for i in range(n_layers) for h in (resid_mid(i), resid_post(i))]


def neurons_hooks(n_layers: int, options: Mapping) -> List[str]:
    """The detection block's output plus the MLP activations of every block up to ``highest_layer``."""
    from ..hooks.names import mlp_post, resid_post
    from ..studies.presets import resolve_preset

    # a preset decides the detection and highest blocks unless the options name them
    opts = resolve_preset(options.get("preset"), detect_layer=options.get("detect_layer"),
                          highest_layer=options.get("highest_layer"))
    detect = _layer(opts.get("detect_layer"), n_layers, -1)
    highest = opts.get("highest_layer")
    highest = detect if highest is None else _layer(min(int(highest), n_layers - 1), n_layers, detect)  # capped

    return [resid_post(detect)] + [mlp_post(i) for i in range(highest + 1)]


def score_hooks(n_layers: int, options: Mapping) -> List[str]:
    """The Patch Score's patch tokens (``hook``) and the hook its global vector is read from (``reference``)."""
    from ..studies.patch_score import needed_hooks

    return needed_hooks(options.get("hook") or "hook_norm_final", options.get("reference") or "cls")


def probes_hooks(n_layers: int, options: Mapping) -> List[str]:
    """The probed tokens: ``hook`` when given, else block ``layer``'s residual stream (default the last)."""
    from ..hooks.names import resid_post

    return [options.get("hook") or resid_post(_layer(options.get("layer"), n_layers, -1))]


def lost_hooks(n_layers: int, options: Mapping) -> List[str]:
    """The keys of block ``layer`` (default the last), LOST's features."""
    from ..hooks.names import attn_k

    return [attn_k(_layer(options.get("layer"), n_layers, -1))]


@dataclass(frozen=True)
class StudyCommand:
    """One ``interp study NAME``.

    Attributes:
        name: the CLI name (``patch-score``).
        module: module under ``interp.commands`` with the two functions below.
        add_arguments: name of ``(argparse parser) -> None`` in ``module`` (sets the parser's description too).
        run: name of ``(args) -> int`` in ``module``.
        help: the one-line help shown by ``interp study --help``.
        hooks: ``(n_layers, options) -> [hook names]`` the study reads from a cache; None for a study that
            re-runs the model (it needs ``--images``).
        full_vectors: True when a ``--norms-only`` cache cannot serve it.
        result: stem of its JSON when it is not the CLI name (``segment`` writes ``segmentation.json``).
    """

    name: str
    module: str
    add_arguments: str
    run: str
    help: str
    hooks: Optional[HooksFn] = None
    full_vectors: bool = True
    result: Optional[str] = None

    @property
    def result_name(self) -> str:
        """Stem of the JSON file the study writes (``patch_score`` for ``patch-score``)."""
        return self.result or self.name.replace("-", "_")


_A, _L, _O = "study_artifacts", "study_lazy", "study_objects"
STUDIES: Dict[str, StudyCommand] = {c.name: c for c in (
    StudyCommand("norms", _A, "add_norms_arguments", "run_norms",
                 "high-norm tokens: per-block norms, outliers, emergence layer", norms_hooks, full_vectors=False),
    StudyCommand("neurons", _A, "add_neurons_arguments", "run_neurons",
                 "rank register neurons (MLP neurons firing on high-norm tokens)", neurons_hooks),
    StudyCommand("ablate", _A, "add_ablate_arguments", "run_ablate",
                 "ablate register neurons vs random same-size controls"),
    StudyCommand("relocate", _A, "add_relocate_arguments", "run_relocate",
                 "move the high-norm tokens onto a chosen mask"),
    StudyCommand("registers", _A, "add_registers_arguments", "run_registers",
                 "test-time register: move the high norm into an extra token"),
    StudyCommand("patch-score", _L, "add_patch_score_arguments", "run_patch_score",
                 "Patch Score maps cos(patch, global vector), fg/bg distributions", score_hooks),
    StudyCommand("pib", _L, "add_pib_arguments", "run_pib",
                 "PiB: share of images whose top Patch Score patch is in the box", score_hooks),
    StudyCommand("masking", _L, "add_masking_arguments", "run_masking",
                 "mask top-k / bottom-k patches by Patch Score and re-measure"),
    StudyCommand("selective-cls", _L, "add_selective_cls_arguments", "run_selective_cls",
                 "PiB, score distributions and agreement with/without SelectiveCLS"),
    StudyCommand("probes", _O, "add_probes_arguments", "run_probes",
                 "linear probes per token group: position, pixels, image label", probes_hooks),
    StudyCommand("lost", _O, "add_lost_arguments", "run_lost",
                 "LOST object discovery: seed, mask, box per image, CorLoc", lost_hooks),
    StudyCommand("segment", _O, "add_segment_arguments", "run_segment",
                 "coarse segmentation from Patch Scores, Jaccard vs masks", score_hooks, result="segmentation"),
)}


def study_command(name: str) -> StudyCommand:
    """The table row of ``name``; an error listing the known studies otherwise."""
    try:
        return STUDIES[name]
    except KeyError:
        raise InterpError(f"unknown study {name!r}; known: {', '.join(STUDIES)}") from None


def required_hooks(study: str, n_layers: int, options: Optional[Mapping] = None) -> List[str]:
    """Hook names ``study`` reads from a cache of a model with ``n_layers`` blocks, for its ``options``
    (``detect_layer``, ``highest_layer``, ``hook``, ``reference``; missing ones take the CLI defaults).

    Raises InterpError for a study that re-runs the model (it cannot read a cache)."""
    command = study_command(study)
    if command.hooks is None:
        raise InterpError(f"interp study {study} re-runs the model with an edit, so it reads no cache; "
                          "give it --images (cacheable studies: "
                          f"{', '.join(n for n, c in STUDIES.items() if c.hooks)})")
    return list(dict.fromkeys(command.hooks(n_layers, dict(options or {}))))


def hooks_for_studies(studies: str, n_layers: int) -> List[str]:
    """The union (in order) of the hooks the comma-separated ``studies`` need with their default options."""
    names = [s.strip() for s in studies.split(",") if s.strip()]
    if not names:
        raise InterpError("--for needs study names, e.g. --for norms,neurons")
    hooks: List[str] = []
    for name in names:
        hooks += required_hooks(name, n_layers)
    return list(dict.fromkeys(hooks))


def check_cache_serves(source, study: str, n_layers: int, options: Mapping) -> None:
    """Before any work: raise unless the cache ``source`` holds every hook ``study`` reads on a model with
    ``n_layers`` blocks (in full when it needs vectors), naming the missing hooks and the ``interp cache --for``
    command that writes them."""
    command = study_command(study)
    hooks = required_hooks(study, n_layers, options)
    missing = [h for h in hooks if not source.has(h)]
    if missing:
        shown = ", ".join(missing[:6]) + (f" and {len(missing) - 6} more" if len(missing) > 6 else "")
        raise InterpError(f"the cache lacks hooks that interp study {study} reads: {shown}; write one with "
                          f"`interp cache MODEL --images DIR --for {study} --out FILE.h5` or run on --images")
    if command.full_vectors and getattr(source, "norms_only", False):
        raise InterpError(f"the cache stores token norms only (--norms-only); interp study {study} needs the "
                          "activations: write the cache without --norms-only")

