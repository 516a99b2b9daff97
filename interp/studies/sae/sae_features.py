"""Which features of a trained SAE are the high-norm artifacts (docs/sae.md; rule in docs/methods.md section 8):
the ``interp study sae-features`` study over any activation source, around :func:`interp.sae.features.feature_report`.

One pass reads the patch-token norms at the SAE's hook (the detection: high-norm tokens are decided there), a
second encodes every token: firing rates per token kind, the artifact features with their unit directions in the
hook's units, their strongest patch tokens and their maps on the first ``n_maps`` images.

>>> r = sae_features_study(source, sae="out/sae", neurons="2:17,2:101", progress=False)  # doctest: +SKIP
>>> [(f["feature"], round(f["cos_register_neurons"]["max"], 2)) for f in r.artifact_features]  # doctest: +SKIP
[(57, 0.99)]
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Dict, List, Optional

from ...errors import InterpError
from ...interventions.base import check_neurons
from ...interventions.neuron_sets import check_ranked_on, neuron_set
from ...runtime.source import ActivationSource
from ...sae.features import hook_detection, source_feature_report, write_directions
from ...sae.model import load
from ...detection.detection import DetectionLike, threshold_param
from ..core.result import OutlierStudyResult, skipped_records
from ..declaration import study
from .configs import SaeFeaturesConfig

MAX_CROP_IMAGES = 64  # images decoded for the top-patch crops of a live run (later ones: code values only)


@dataclass
class SaeFeaturesResult(OutlierStudyResult):
    """Result of :func:`sae_features_study` (detection header: ``detect_layer`` is the SAE's block, the
    threshold is on the patch-token norms at its hook).

    Attributes:
        sae: the SAE's folder; hook, arch, n_features: the SAE's.
        n_images, n_tokens: images read; tokens per kind (normal_patch, high_norm, cls, register).
        n_alive: features firing on at least one token.
        features: ``[{"feature", "alive", "rates": {kind: rate or None}}]`` for every feature.
        artifact_features: ``[{"feature", "direction" (unit, hook units), "rates", "cos_register_neurons"
            ({"L:n": cos, "max": cos}; empty without ``--neurons``), "cos_mean_high_norm", "top_patches"
            ([{"image" (index into ids), "patch" (flat index, row-major on ``grid``), "code"}], strongest first),
            "maps" ([n_maps][P] codes on the first images)}]``, most concentrated on the high-norm tokens first.
        artifact_subspace: ``{"features", "coverage", "n_tokens", "n_enriched", "removed", "controls_removed",
            "control_features", "isolated" (the features' removal at the hook beyond random matched ones; when
            False the message says "artifact not isolated"), "cos_register_neurons" (the neurons' cosine with their
            projection on the subspace), "cos_mean_high_norm"}`` or None (rule:
            docs/methods.md section 8); enriched_features: features enriched on the high-norm tokens outside it;
            prefix_features: register and CLS features of an SAE on all tokens.
        tokens: the token kind the SAE was trained on (and is read on).
        neurons: the register neurons compared with (``{"L": [n, ...]}``) or None.
        grid: the patch grid [rows, cols] of the maps and top patches.
        reason: the detection's one sentence; rule: the artifact-feature rule's numbers; message: the headline.
        write_notes: ``{"L": note}`` for the blocks of ``neurons`` whose write directions pass through a LayerNorm
            (linearised at the images' operating point: ``HookedViT.neuron_writes``).
    """

    study = "sae_features"
    sae: str = ""
    hook: str = ""
    arch: str = ""
    n_features: int = 0
    n_alive: int = 0
    n_images: int = 0
    n_tokens: Dict[str, int] = field(default_factory=dict)
    grid: List[int] = field(default_factory=list)
    neurons: Optional[Dict[str, List[int]]] = None
    reason: Optional[str] = None
    rule: Dict[str, float] = field(default_factory=dict)
    features: List[Dict[str, Any]] = field(default_factory=list)
    artifact_features: List[Dict[str, Any]] = field(default_factory=list)
    artifact_subspace: Optional[Dict[str, Any]] = None
    enriched_features: List[Dict[str, Any]] = field(default_factory=list)
    prefix_features: List[Dict[str, Any]] = field(default_factory=list)
    tokens: str = "patches"
    message: str = ""
    write_notes: Dict[str, str] = field(default_factory=dict)

    def console_lines(self, config=None) -> List[str]:
        """The headline (said once, also without artifacts), then one line per artifact feature."""
        lines = [f"{self.message} ({self.n_alive} alive; trained and read on {self.tokens} tokens; {self.sae})"]
        for f in self.artifact_features:
            rates, cos = f["rates"], f["cos_register_neurons"]
            neurons = f", cos to register neurons max {cos['max']:.3f}" if cos else ""
            lines.append(f"feature {f['feature']}: fires on {rates['high_norm']:.0%} of high-norm and "
                         f"{rates['normal_patch'] or 0:.1%} of normal patches (precision {f['precision']:.3f}), covers "
                         f"{f['coverage']:.0%} of the excess alone; cos to the mean high-norm token "
                         f"{f['cos_mean_high_norm']:.3f}{neurons}")
        for layer, note in self.write_notes.items():
            lines.append(f"block {layer}'s write directions: {note}")
        for f in self.prefix_features:
            lines.append(f"{f['kind']} feature {f['feature']}: fires on {f['rate']:.0%} of the {f['kind']} tokens "
                         f"(precision {f['precision']:.3f})")
        return lines

    def crop_images(self) -> int:
        """How many of the first images the figures need: the maps' and the top patches' (capped)."""
        needed = [p["image"] + 1 for f in self.artifact_features for p in f.get("top_patches", [])]
        maps = max((len(f.get("maps", [])) for f in self.artifact_features), default=0)
        return min(MAX_CROP_IMAGES, max([maps, *needed], default=0))

    def figure_images(self, source) -> Any:
        """The first images up to the last one a figure crops (a live source, or a cache whose image files are
        here; else None: the figure shows ids)."""
        n = self.crop_images()
        return source.display_images(n) if source.shows_images and n else None


def _writes(config: SaeFeaturesConfig, source: ActivationSource):
    """(unit fc2 columns of ``--neurons``, their ``{"L": [n]}``), checked against the model; ({}, None) without."""
    if config.neurons is None:
        return {}, None
    if source.weights_model is None:
        raise InterpError("--neurons: their write directions are the model's fc2 columns; open the cache with "
                          "the model (open_source(cache=..., model=...))")
    nset = neuron_set(config.neurons, "--neurons")
    check_ranked_on(nset, source.weights_model, flag="their LAYER:NEURON text to --neurons")
    check_neurons(nset.neurons, source.n_layers, [source.d_mlp(i) for i in range(source.n_layers)])
    return write_directions(source, nset.neurons), {str(k): [int(n) for n in v] for k, v in nset.neurons.items()}


def _write_notes(source: ActivationSource, neurons) -> Dict[str, str]:
    """{"L": how block L's write directions are linearised} for the blocks whose writes pass through a norm."""
    notes = {layer: source.write_note(int(layer)) for layer in (neurons or {})}
    return {layer: note for layer, note in notes.items() if note}


@study(SaeFeaturesConfig)
def sae_features_study(source: ActivationSource, config: SaeFeaturesConfig, *, detection: DetectionLike,
                       progress: bool = True) -> SaeFeaturesResult:
    """The SAE's features per token kind and its artifact features over ``source``.

    Args:
        source: a live model over images, or a cache holding the SAE's hook (full vectors).
        config: :class:`~interp.studies.sae.configs.SaeFeaturesConfig` (or its options as keywords): ``sae``
            (the folder), ``neurons`` (compare with their fc2 columns), ``n_top``, ``n_maps``.
        detection: a :class:`~interp.detection.spec.DetectionSpec` (default the config's): the threshold and
            preset of the detection at the SAE's hook (``detect_layer`` may only name the SAE's block).
        progress: show progress bars.

    Raises:
        InterpError: (one line) an SAE of another model, hook or width, a damaged SAE folder, neurons of
            another model or out of range.
    """
    sae = load(config.sae)
    sae.check_source(source)
    hook = sae.hook
    spec, layer = hook_detection(detection, source, hook)
    writes, neurons = _writes(config, source)
    write_notes = _write_notes(source, neurons)
    layout, bs = source.layout, source.batch_size
    report = source_feature_report(sae, source, detection=spec, writes=writes, n_top=config.n_top,
                                   n_maps=config.n_maps, progress=progress)
    det = report["detection"] or {}
    found = report["artifacts_found"]
    warning = det.get("warning") if found else (report["reason"] or "no patch tokens stored")
    return SaeFeaturesResult(
        model=source.model_name, fingerprint=source.fingerprint,
        params={"sae": str(config.sae), "threshold": threshold_param(detection.threshold), "detect_layer": layer,
                "preset": spec.preset, "neurons": neurons, "n_top": config.n_top, "n_maps": config.n_maps,
                "batch_size": bs},
        seed=None, ids=list(source.ids), skipped=skipped_records(source),
        detect_layer=-1 if layer is None else layer, threshold=report["threshold"],
        threshold_method=det.get("method", "auto"), artifacts_found=found, warning=warning, preset=spec.preset,
        sae=str(config.sae), hook=hook, arch=sae.arch, n_features=report["n_features"], n_alive=report["n_alive"],
        n_images=report["n_images"], n_tokens=report["n_tokens"], grid=list(layout.grid), neurons=neurons,
        reason=report["reason"], rule=report["rule"], features=report["features"],
        artifact_features=report["artifact_features"], artifact_subspace=report["artifact_subspace"],
        enriched_features=report["enriched_features"], prefix_features=report["prefix_features"],
        tokens=report["tokens"], message=report["message"], write_notes=write_notes)
