"""Running the artifact battery: norms, redundancy, probes, LOST and register neurons from one observational
pass, then ablation -> test-time register -> relocation on one model (the page's sections 1-8,
:mod:`interp.report.sections`), then writing each study's JSON, the figures, ``report.json`` and ``index.html``.

Without images it reads the bundled photos: the 4 of ``interp.models.sample_image_paths()`` and the
:data:`REPORT_SAMPLES_DIR` ones (16 in all, enough for probe scores).

The images are decoded once (``LiveSource.held()``) and the high-norm tokens detected once, from the unedited
baseline forward (:func:`~interp.runtime.passes.baseline_pass`); every stage gets that one source and that
one detection. Norms, neuron scores, probes and LOST then read one shared observational forward
(:mod:`interp.runtime.passes`), and the causal stages add only their edited runs: 10 forwards per image on
the defaults (1 baseline + 1 observational + 6 ablation + 1 test-time register + 1 relocation).

Example (not a doctest: a report takes ~20 s; ``tests/report/test_report.py`` runs it)::

    summary = run_report()                      # the planted synthetic model on the bundled photos
    summary["planted"]["all_neurons_recovered"]  # True
    run_report(interp.load("vit_small_patch14_reg4_dinov2"), images="photos/", out_dir="report_dinov2",
               detection=DetectionSpec(threshold="p99"), n_controls=10)
"""
from __future__ import annotations

import dataclasses
import json
import sys
import time
import warnings
from dataclasses import dataclass, field
from pathlib import Path
from typing import Dict, List, Optional, Union

from ..errors import InterpWarning
from ..models.planted import planted_truth
from ..models.inputs.samples import SAMPLES_DIR
from ..detection.detection import Detection
from ..detection.spec import DetectionSpec, refuse_loose_fields
from ..studies.core.result import jsonable
from ..models.inputs.preprocessing import ImagesSpec
from ..runtime.live_source import LiveSource
from ..runtime.open import open_source
from .html import write_html
from .sections import CAUSAL, SECTIONS, outlier_share_remark, section_index, small_sample, step_line
from .summary import (build_summary, synthetic_note, lost_summary, planted_comparison, probes_summary,
                      redundancy_summary, sae_features_summary)

N_STAGES = len(SECTIONS)  # the console's steps = the page's sections
# the report's default adds these photos to the 4 samples; a folder of its own, so that the samples folder given
# as an image folder still holds 4
REPORT_SAMPLES_DIR = SAMPLES_DIR.parent / "report_samples"
DISPLAY_LIMIT = 8  # images un-normalised for the map figures (the figures draw at most this many)


@dataclass(frozen=True)
class ReportOptions:
    """What the battery is run with.

    Attributes:
        detection: what counts as a high-norm token for every stage: threshold, block, preset (default
            "auto" at the last block, or the preset's); detected once on the report's images.
        highest_layer: last block scored for register neurons (default: the detection block).
        top_k: neurons kept (default: the number of planted neurons for the planted model, else 10).
        n_controls, seed: random control neuron sets of the ablation.
        batch_size: images per forward.
        classifier: a classifier file (path, dict or :func:`interp.load_classifier`) for the causal stages'
            top-1 agreement and accuracy (without one: only for a head that is a classifier).
        progress: one line per stage on stderr, and the studies' progress bars.
        progress_bars: the studies' progress bars (None: follow ``progress``).
        strict: stop at the first unreadable image (default: skip it with a warning; listed under
            "skipped_images").
        preprocess: a paper's eval transform for the image files (``"resize256-crop224"``; default timm's own),
            recorded as report.json's ``preprocess``.
        sae: a trained SAE's folder (``interp sae train``): the report's appendix runs the sae-features study on
            the report's images with it, comparing its artifact features with the ranked register neurons.
    """

    detection: DetectionSpec = field(default_factory=DetectionSpec)
    highest_layer: Optional[int] = None
    top_k: Optional[int] = None
    n_controls: int = 5
    seed: int = 0
    batch_size: int = 16
    progress: bool = True
    progress_bars: Optional[bool] = None
    classifier: object = None
    sae: Optional[str] = None
    strict: bool = False
    preprocess: Optional[str] = None

    def bars(self, progress: bool) -> bool:
        """Whether the studies draw progress bars, given ``run_report``'s ``progress``."""
        return progress if self.progress_bars is None else self.progress_bars


@dataclass
class BatteryResults:
    """The stage results (None for a stage that did not run) and why the causal stages were skipped."""

    detection: Detection
    norms: object
    neurons: object
    ablation: object = None
    register: object = None
    relocation: object = None
    skipped: Optional[str] = None
    probes: object = None
    lost: object = None
    redundancy: object = None
    sae_features: object = None
    not_run: Dict[str, str] = field(default_factory=dict)  # section key -> why (the page says it too)

    def results(self) -> List:
        return [r for r in (self.norms, self.neurons, self.ablation, self.register, self.relocation, self.probes,
                            self.lost, self.redundancy, self.sae_features) if r is not None]


def _say(progress: bool, text: str) -> None:
    if progress:
        print(text, file=sys.stderr, flush=True)


def report_sample_paths() -> List[Path]:
    """The report's default images: ``interp.models.sample_image_paths()`` (4 photos), then the photos of
    :data:`REPORT_SAMPLES_DIR` (public domain / CC0 from scikit-image, listed in its LICENSE.md)."""
    from ..models import sample_image_paths

    return sample_image_paths() + sorted(REPORT_SAMPLES_DIR.glob("*.jpg"))


def report_source(model, images: Optional[ImagesSpec], batch_size: int, strict: bool = False,
                  preprocess=None) -> LiveSource:
    """The one live source every stage reads: the images (default: :func:`report_sample_paths`) decoded once
    when there are at most ``HOLD_LIMIT`` of them (``LiveSource.held_if_small``). Unreadable images are skipped
    and listed in ``source.skipped`` (``strict``: the first one stops the run)."""
    source = open_source(model=model, images=report_sample_paths() if images is None else images,
                         batch_size=batch_size, strict=strict, preprocess=preprocess)
    return source.held_if_small()


def run_battery(source: LiveSource, options: ReportOptions, progress: bool = True, *,
                objects: bool = False) -> BatteryResults:
    """Run the stages on ``source``; the causal ones only when the neuron study ranks neurons.
    ``objects``: also the probes and LOST (:func:`object_readings`), read from the same observational pass.

    Forwards per image: one unedited pass (the detection's norms and the causal studies' baseline), one
    observational pass shared by norms, neuron scores (and probes, LOST), then the edited runs of the causal
    stages. The two unedited passes cannot be one: the neuron scores, the probes' token sample and the norms'
    outlier tallies need the threshold, which needs every image's norms first.

    Without artifacts the stages still run (under a fixed or percentile threshold) and warn once, not per stage."""
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        out = _run_stages(source, options, progress, objects)
    once = {(str(w.message), w.category): None for w in caught if not str(w.message).startswith("no artifacts")}
    for text, category in once:  # each distinct warning once, with its own category
        warnings.warn(text, category, stacklevel=2)
    if not out.detection.artifacts_found:
        warnings.warn(f"{source.model_name} shows no artifacts: at block {out.detection.layer}, "
                      f"{out.detection.reason}; any neurons the report ranks are not register neurons",
                      InterpWarning, stacklevel=2)
    return out


def _run_stages(source: LiveSource, options: ReportOptions, progress: bool, objects: bool) -> BatteryResults:
    """The stages of :func:`run_battery`."""
    from ..studies.artifacts.neurons import neurons_reading, resolve_neuron_options
    from ..studies.artifacts.ablate import ablate_study
    from ..studies.core.behaviour import behaviour_readout
    from ..detection.detection import detect
    from ..runtime.passes import baseline_pass
    from ..runtime.passes import run_readings
    from ..studies.artifacts.norms import norms_reading
    from ..studies.artifacts.registers import registers_study
    from ..studies.artifacts.relocate import relocate_study

    o = options
    common = dict(batch_size=o.batch_size, progress=o.bars(progress))
    spec = o.detection.resolved()
    settings = resolve_neuron_options(spec.preset, highest_layer=o.highest_layer, top_k=o.top_k)
    clf = behaviour_readout(source, o.classifier).classifier  # bound (and checked) once, before any forward
    # one unedited forward per image gives the detection's norms and the causal studies' baseline
    base = baseline_pass(source, spec.detect_block(source.n_layers), classifier=clf,
                         norm_hooks=spec.hooks(source.blocks), **common)
    found = detect(source, spec, norms=base.norms)
    baseline = dataclasses.replace(base, layer=found.layer, patch_norms=found.norms)
    highest = min(settings.get("highest_layer", found.layer), source.n_layers - 1)
    _say(progress, step_line("norms", f"per-block patch norms of {source.model_name} over {len(source)} images"))
    readings = [norms_reading(source, found, batch_size=o.batch_size),
                neurons_reading(source, found, highest_layer=highest, top_k=settings["top_k"],
                                positions=settings["positions"], sparsity=settings["sparsity"], seed=o.seed,
                                batch_size=o.batch_size)]
    pyramid = bool(source.layout.stage_grids)  # PVTv2, Swin-v2: no LOST (one grid of patch keys needed)
    if objects:
        _say(progress, step_line("redundancy", "input-patch similarity to the neighbours per token group"))
        _say(progress, step_line("probes", "position / pixels / label per token group"))
        _say(progress, step_line("lost", f"skipped: {LOST_ON_PYRAMIDS}" if pyramid else
                                 "seed and box from the last block's keys"))
        readings += object_readings(source, found, options, lost=not pyramid)
    _say(progress, step_line("neurons", f"ranking register neurons in blocks <= {highest} (the same pass)"))
    results = run_readings(source, readings, desc="observational pass", **common)
    out = BatteryResults(found, results[0], results[1])
    if objects and pyramid:
        out.not_run["lost"] = f"Not run: {LOST_ON_PYRAMIDS}."
    if objects:
        out.probes, out.redundancy = results[2], results[-1]
        out.lost = results[3] if not pyramid else None
    if not out.neurons.neurons:
        out.skipped = (f"no register neurons to test ({out.neurons.message or 'nothing ranked'}); the ablation, "
                       "test-time register and relocation studies need neurons and were not run")
        for key in CAUSAL:
            _say(progress, step_line(key, f"skipped: {out.skipped}" if key == CAUSAL[0] else "skipped"))
        return out
    chosen = out.neurons.neuron_dict()
    _say(progress, step_line("ablate", f"{len(out.neurons.neurons)} neurons vs {o.n_controls} random controls"))
    edits = dict(neurons=chosen, detection=found, baseline=baseline, classifier=clf, progress=o.bars(progress))
    out.ablation = ablate_study(source, controls=o.n_controls, seed=o.seed, **edits)
    refusal = source.model.family.extra_tokens_refusal  # e.g. a pyramid model: no place for an extra token
    if refusal:
        _say(progress, step_line("registers", f"skipped: test-time registers are not defined here ({refusal})"))
        out.not_run["registers"] = f"Not run: test-time registers are not defined here ({refusal})."
    else:
        _say(progress, step_line("registers", "test-time register with these neurons"))
        out.register = registers_study(source, **edits)
    _say(progress, step_line("relocate", "moving the high norm onto a smiley"))
    out.relocation = relocate_study(source, **edits)
    return out


LOST_ON_PYRAMIDS = "LOST is not defined for a pyramid model (it reads one grid of patch keys)"
REPORT_PROBE_TOKENS = 2000  # training tokens of the report's probes (a seeded sample; keeps them to seconds)


def object_readings(source: LiveSource, detection: Detection, options: ReportOptions, lost: bool = True) -> List:
    """The report's last two sections and its redundancy row as readings of the observational pass, on the same
    source and detection: the linear probes (position and pixels per token group, the label too when the images
    carry one) on a capped token sample, LOST's seeds, masks and boxes (no CorLoc: the report has no
    ground-truth boxes), and the input patches' neighbour similarity per token group."""
    from .compare import PROBE_OPTIONS
    from ..studies.artifacts.redundancy import redundancy_reading
    from ..studies.objects.lost import lost_reading
    from ..studies.probes.probes import probes_reading

    return [probes_reading(source, detection=detection, seed=options.seed, batch_size=options.batch_size,
                           probe_options=PROBE_OPTIONS, max_train_tokens=REPORT_PROBE_TOKENS,
                           max_test_tokens=REPORT_PROBE_TOKENS // 2),
            *([lost_reading(source, seed=options.seed)] if lost else []),
            redundancy_reading(source, detection, warn=False)]


def sae_appendix_study(source: LiveSource, sae: str, neurons, progress: bool, bars: bool):
    """The appendix: the sae-features study of the SAE in ``sae`` on the report's images, its artifact features
    compared with the register neurons the report ranked (when it ranked any)."""
    from ..studies.sae.sae_features import sae_features_study

    _say(progress, f"interp report [appendix] SAE features (sae-features): the SAE in {sae} on the same images")
    ranked = neurons.neuron_dict() if neurons is not None and neurons.neurons else None
    return sae_features_study(source, sae=str(sae), neurons=ranked, progress=bars)


def write_results(results: BatteryResults, source: LiveSource, out: Path) -> Dict[str, List[str]]:
    """Each study's ``<study>.json`` (with ``figure_files`` and ``skipped``) and figures (PNG) into ``out``
    (:func:`~interp.plots.save.save_result`); returns study -> figure file names."""
    from ..plots.save import save_result

    pictures = source.display_images(DISPLAY_LIMIT)
    return {result.study: save_result(result, out, pictures) for result in results.results()}


def run_report(model=None, images: Optional[ImagesSpec] = None, out_dir: Union[str, Path] = "report",
               options: Optional[ReportOptions] = None, **option_values) -> Dict:
    """Run the battery (:func:`run_battery`) and write the report.

    Args:
        model: a HookedViT or a model name for ``interp.load``; None: the synthetic ``planted_vit``.
        images: what ``open_source`` takes (directory, list file, paths, or a preprocessed Tensor); None: the
            bundled photos (:func:`report_sample_paths`).
        out_dir: directory for ``index.html``, ``report.json``, each study's JSON and the PNGs.
        options: a :class:`ReportOptions`; ``option_values`` (``detection=DetectionSpec(...)``,
            ``highest_layer=``, ``top_k=``, ``n_controls=``, ``seed=``, ``batch_size=``, ``progress=``,
            ``strict=``, ``preprocess=``, ...) override its fields. ``threshold=``, ``detect_layer=`` and
            ``preset=`` are the detection's: given loose they are refused (one line naming ``detection=``).

    Returns:
        The report.json summary (a dict), with ``"planted"`` holding the ground-truth comparison for a
        planted model and ``"files"`` the written files (relative to ``out_dir``).
    """
    from ..hooks.load import load

    started = time.monotonic()
    refuse_loose_fields("run_report", option_values)
    options = dataclasses.replace(options or ReportOptions(), **option_values)  # TypeError names a bad key
    progress = options.progress
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    if model is None or isinstance(model, str):
        model = load(model or "planted_vit")
    truth = planted_truth(model)
    if truth is not None:
        _say(progress, f"interp report: note: {synthetic_note(model)}")
    if options.top_k is None and truth is not None:  # else 10, or the preset's
        options = dataclasses.replace(options, top_k=len(truth.neurons))
    source = report_source(model, images, options.batch_size, options.strict, options.preprocess)
    results = run_battery(source, options, progress, objects=True)
    if options.sae is not None:
        results.sae_features = sae_appendix_study(source, options.sae, results.neurons, progress,
                                                  options.bars(progress))
    figures = write_results(results, source, out)

    r = results
    summary = build_summary(model, source, r)
    summary["planted"] = planted_comparison(model, source, r.norms, r.neurons) if truth is not None else None
    summary["probes"], summary["lost"] = probes_summary(r.probes), lost_summary(r.lost)
    summary["redundancy"] = redundancy_summary(r.redundancy)
    summary["not_run"] = dict(r.not_run)
    summary["sae_features"] = sae_features_summary(r.sae_features)
    summary["files"] = {"index": "index.html", "results": [f"{x.study}.json" for x in r.results()],
                        "figures": [f for names in figures.values() for f in names]}
    summary["skipped_images"] = [{"image": image, "reason": reason} for image, reason in source.skipped]
    summary["small_sample"] = small_sample(summary["n_images"])
    summary["outlier_share_remark"] = outlier_share_remark(summary)
    summary["sections"] = section_index(summary)
    summary["seconds"] = round(time.monotonic() - started, 2)
    (out / "report.json").write_text(json.dumps(jsonable(summary), indent=1))
    write_html(out / "index.html", summary, figures)
    return summary
