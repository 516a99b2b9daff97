"""The cross-architecture reassessment as one table (docs/methods.md section 6, "The reassessment table"): the
claims of Baxevanakis et al. re-tested on several models over the same images, one row per measured figure, one
column per model.

* claim 2, size census: whether there are artifacts, their share of the patch tokens, the norm ratio;
* claim 3, where they sit: the local redundancy (input-patch similarity to the 4 neighbours) of normal and
  high-norm tokens;
* claim 4, what they hold: label, position and pixel probes from normal and high-norm tokens;
* claim 5, registers: the attention the artifacts take in the unedited model (the CLS row's share on them, or
  for a model without CLS the share of the mean attention each token receives: the paper's definition);
  attention-map cleanliness (the share of the last block's CLS->patch attention on the artifact patches) and
  behaviour, without and with a test-time register (every model where it is defined), and without and with
  trained registers (a ``*_regN*`` model beside its no-register sibling).

The rows, their definitions and each cell: :mod:`interp.report.reassessment_cells`. Rows 2-4 reuse
:func:`interp.report.compare.model_row` (the norms, redundancy and probes studies); row 5 runs the
neurons study and :func:`~interp.studies.artifacts.registers.registers_study`. Every model is read with one
detection rule (a :class:`DetectionSpec`), each model's threshold its own. A model without artifacts gives
"no artifacts" in rows 3-5, but under a percentile threshold (the paper's p98, ``--preset reassessment``): there
rows 3-5 give the paper's numbers on the tokens above it, with the two-mode verdict beside them. A figure that is
not defined for a model is "n/a", and why is printed under the table.

>>> vit = interp.load("vit_small_patch16_224", pretrained=False, depth=2)
>>> settings = ReassessSettings(probes=False, progress=False)
>>> result = reassess_models([model, vit], photos, settings, names=["planted", "vit"])
>>> result.cell("redundancy", "vit").text                        # a random ViT has no artifacts
'no artifacts'
>>> result.cell("ttr_attention", "planted").values["without"] > 0.8    # CLS attends to the planted sinks
True
"""
from __future__ import annotations

import re
import sys
from dataclasses import dataclass, field, replace
from typing import Dict, List, Optional, Sequence, Tuple


from ..errors import InterpError
from ..detection.detection import detect
from ..runtime.passes import baseline_pass
from ..models.planted import planted_truth
from ..runtime.open import open_source
from ..studies.artifacts.neurons import neurons_study
from ..studies.artifacts.registers import registers_study
from ..studies.core.behaviour import behaviour_readout
from ..studies.core.result import StudyResult, skipped_records
from .compare import CompareSettings, model_row
from .reassessment_attention import received_attention
from .reassessment_cells import NO_ARTIFACTS, ROWS, Cell, ModelRun, model_cells, trained_cells_of

DEFAULT_TOP_K = 10  # register neurons of the test-time register (the planted models: their planted count)


@dataclass(frozen=True)
class ReassessSettings(CompareSettings):
    """How every model of the reassessment is measured: the comparison's settings (:class:`CompareSettings`: the
    detection rule, the probes of claim 4, batch size, seed, preprocessing, progress) and ``top_k``, the register
    neurons the test-time register edits (None: the planted count for a planted model, else
    :data:`DEFAULT_TOP_K`)."""

    top_k: Optional[int] = None


def register_siblings(model_names: Sequence[str]) -> Dict[int, int]:
    """{index of a trained-register model: index of its no-register sibling} among ``model_names``: a name
    with ``_reg<N>`` (timm: ``vit_small_patch14_reg4_dinov2``) and the same name without it
    (``vit_small_patch14_dinov2``)."""
    pairs = {}
    for i, name in enumerate(model_names):
        plain = re.sub(r"_reg\d+", "", name)
        if plain != name and plain in model_names:
            pairs[i] = list(model_names).index(plain)
    return pairs


def _test_time_register(source, found, baseline, top_k: int, classifier, progress: bool):
    """(registers result, ranked neurons, None) or (None, None, why there is none) for one model (under a
    percentile threshold, the paper's rule, also without a two-mode verdict: on the tokens above it)."""
    if not found.artifacts_found and found.method != "percentile":
        return None, None, NO_ARTIFACTS
    refusal = source.model.family.extra_tokens_refusal
    if refusal:
        return None, None, f"test-time registers are not defined here: {refusal}"
    ranked = neurons_study(source, detection=found, top_k=top_k, progress=progress)
    if not ranked.neurons:
        return None, None, f"no register neurons ranked ({ranked.message or 'nothing above the threshold'})"
    neurons = ranked.neuron_dict()
    result = registers_study(source, neurons=neurons, detection=found, baseline=baseline, classifier=classifier,
                             progress=progress)
    return result, neurons, None


def assess_model(model, images, settings: ReassessSettings, name: Optional[str] = None,
                 classifier=None) -> Tuple[ModelRun, List]:
    """One model's measures (a :class:`ModelRun`) and the images it skipped. One unedited forward gives the
    detection (``settings.detection``), the CLS attention and the logits; then the comparison row (norms,
    redundancy, probes) and, where defined, the neurons study and the test-time register (top ``settings.top_k``
    neurons). ``classifier``: a classifier file (path, dict or :func:`interp.load_classifier`) whose class logits
    give claim 5's accuracy or agreement (default the model's own head)."""
    name = name or model.model_name
    progress = settings.progress
    source = open_source(model=model, images=images, batch_size=settings.batch_size, strict=settings.strict,
                         preprocess=settings.preprocess)
    skipped = skipped_records(source)
    source = source.held_if_small()
    readout = behaviour_readout(source, classifier)  # a classifier that does not fit fails before any forward
    spec = settings.detection.resolved()
    base = baseline_pass(source, spec.detect_block(source.n_layers), settings.batch_size, progress,
                         readout.classifier, norm_hooks=spec.hooks(source.blocks))  # one forward: baseline, detection
    found = detect(source, spec, norms=base.norms)
    base = replace(base, layer=found.layer, patch_norms=found.norms)
    row, notes = model_row(source, found, name, settings)
    truth = planted_truth(model)
    k = settings.top_k or (len(truth.neurons) if truth is not None else DEFAULT_TOP_K)
    registers, neurons, why = _test_time_register(source, found, base, k, readout.classifier, progress)
    outliers = base.patch_norms > found.counting_threshold()
    percentile = found.method == "percentile"
    received, received_why = None, None
    if base.cls_attention is None and (found.artifacts_found or percentile):
        received, received_why = received_attention(source, progress)
    run = ModelRun(name, model.model_name, row, notes, bool(found.artifacts_found), outliers, base.cls_attention,
                   base.logits, readout, registers, why, neurons, tuple(source.ids), received_attention=received,
                   received_why=received_why, percentile=percentile)
    return run, skipped


@dataclass
class ReassessmentResult(StudyResult):
    """Result of :func:`reassess_models`: ``cells[row][model]`` (:class:`Cell` as a dict in JSON), the models in
    order, the register siblings paired, each model's comparison row and test-time register neurons."""

    study = "reassess"
    models: List[str] = field(default_factory=list)
    cells: Dict[str, Dict[str, Cell]] = field(default_factory=dict)
    siblings: Dict[str, str] = field(default_factory=dict)  # trained-register model -> no-register sibling
    compare_rows: List[Dict] = field(default_factory=list)
    register_neurons: Dict[str, Optional[Dict]] = field(default_factory=dict)
    definitions: Dict[str, str] = field(default_factory=dict)

    def cell(self, row: str, model: str) -> Cell:
        c = self.cells[row][model]
        return c if isinstance(c, Cell) else Cell(**c)  # a result read back from JSON holds dicts

    def table(self, markdown: bool = False) -> str:
        """The table (rows: figures, columns: models), aligned text or markdown, then one line per cell that
        has no number (or says what its number is): ``- model, row: why``."""
        header = ["claim", "figure", *self.models]
        body = [[ROWS[key][0], ROWS[key][1], *(self.cell(key, m).text for m in self.models)] for key in self.cells]
        if markdown:
            lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
            lines += ["| " + " | ".join(r) + " |" for r in body]
        else:
            widths = [max(len(r[i]) for r in [header] + body) for i in range(len(header))]
            lines = ["  ".join(v.ljust(w) for v, w in zip(r, widths)).rstrip() for r in [header] + body]
        lines.append("")
        for key in self.cells:
            by_why: Dict[str, List[str]] = {}
            for m in self.models:
                why = self.cell(key, m).why
                if why:
                    by_why.setdefault(why, []).append(m)
            lines += [f"- {', '.join(ms)}, {key}: {why}" for why, ms in by_why.items()]
        return "\n".join(lines).rstrip() + "\n"


def reassess_models(models: Sequence, images, settings: ReassessSettings = ReassessSettings(), *,
                    names: Optional[Sequence[str]] = None, siblings: Optional[Dict[str, str]] = None,
                    classifiers: Optional[Sequence] = None) -> ReassessmentResult:
    """The reassessment table of ``models`` (HookedViTs) over the same ``images`` (what ``open_source`` takes),
    each measured with ``settings`` (one detection rule for every model: a percentile or "auto" is each model's
    own threshold).

    Args:
        names: the column names (default each model's name); a trained-register sibling is paired by
            ``model.model_name`` (:func:`register_siblings`).
        siblings: {trained-register column: its no-register sibling's column} (names as in ``names``); default
            the pairs :func:`register_siblings` finds among the model names.
        classifiers: one classifier file (or None: the model's own head) per model, for claim 5's behaviour.
    """
    runs, skipped = [], []
    for i, model in enumerate(models):
        if settings.progress:
            print(f"interp reassess: model {i + 1}/{len(models)}: {names[i] if names else model.model_name}",
                  file=sys.stderr, flush=True)
        run, skips = assess_model(model, images, settings, names[i] if names else None,
                                  classifiers[i] if classifiers else None)
        runs.append(run)
        skipped = skipped or skips
    labels = [run.name for run in runs]
    pairs = sibling_pairs(labels, [run.model_name for run in runs], siblings)
    columns = {run.name: model_cells(run) for run in runs}
    for i, run in enumerate(runs):
        columns[run.name].update(trained_cells_of(i, runs, pairs))
    siblings = {labels[r]: labels[p] for r, p in pairs.items()}
    params = {"models": labels, **settings.params(), "top_k": settings.top_k}
    return ReassessmentResult(model=",".join(labels), fingerprint="", params=params, seed=settings.seed,
                              skipped=skipped, ids=list(runs[0].ids) if runs else [],
                              models=labels, cells={key: {m: columns[m][key] for m in labels} for key in ROWS},
                              siblings=siblings, compare_rows=[run.row for run in runs],
                              register_neurons={run.name: run.neurons for run in runs},
                              definitions={key: doc for key, (_, _, doc) in ROWS.items()})


def sibling_pairs(labels: Sequence[str], model_names: Sequence[str],
                  siblings: Optional[Dict[str, str]] = None) -> Dict[int, int]:
    """{column of a trained-register model: column of its no-register sibling}: ``siblings`` (column names) when
    given, else :func:`register_siblings` over the model names. A name that is not a column, a model paired with
    itself or twice is refused."""
    if siblings is None:
        return register_siblings(model_names)
    pairs: Dict[int, int] = {}
    for reg, plain in siblings.items():
        for name in (reg, plain):
            if name not in labels:
                raise InterpError(f"sibling {name!r} is not one of the models ({', '.join(labels)})")
        r, p = list(labels).index(reg), list(labels).index(plain)
        if r == p or r in pairs or r in pairs.values() or p in pairs or p in pairs.values():
            raise InterpError(f"{reg}={plain}: a model is paired with itself or twice; give each pair once")
        pairs[r] = p
    return pairs
