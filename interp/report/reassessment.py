"""The cross-architecture reassessment as one table (docs/methods.md section 6, "The reassessment table"): the
claims of Baxevanakis et al. re-tested on several models over the same images, one row per measured figure, one
column per model.

* claim 2, size census: whether there are artifacts, their share of the patch tokens, the norm ratio;
* claim 3, where they sit: the local redundancy (input-patch similarity to the 4 neighbours) of normal and
  high-norm tokens;
* claim 4, what they hold: label, position and pixel probes from normal and high-norm tokens;
* claim 5, registers: attention-map cleanliness (the share of the last block's CLS->patch attention on the
  artifact patches) and behaviour, without and with a test-time register (every model where it is defined),
  and without and with trained registers (a ``*_regN*`` model beside its no-register sibling).

Rows 2 reuse :func:`interp.report.compare.model_row` (the norms, redundancy and probes studies); row 5 runs the
neurons study and :func:`~interp.studies.artifacts.registers.registers_study`. Every model is read with one
detection rule (a :class:`DetectionSpec`), each model's threshold its own. A model without artifacts gives
"no artifacts" in rows 3-5; a figure that is not defined for a model is "n/a", and why is printed under the table.

>>> vit = interp.load("vit_small_patch16_224", pretrained=False, depth=2)
>>> result = reassess_models([model, vit], photos, names=["planted", "vit"], probes=False, progress=False)
>>> result.cell("redundancy", "vit").text                        # a random ViT has no artifacts
'no artifacts'
>>> result.cell("ttr_attention", "planted").values["without"] > 0.8    # CLS attends to the planted sinks
True
"""
from __future__ import annotations

import re
import sys
from dataclasses import dataclass, field
from typing import Dict, List, Optional, Sequence, Tuple

import torch

from ..errors import InterpError
from ..detection.detection import DetectionSpec, detection_from_norms, spec_of, threshold_param
from ..hooks.names import resolve_block
from ..models.planted import planted_truth
from ..runtime.open import open_source
from ..runtime.passes import baseline_pass
from ..studies.artifacts.neurons import neurons_study
from ..studies.artifacts.registers import attention_on_artifacts, registers_study
from ..studies.core.behaviour import behaviour_readout
from ..studies.core.result import StudyResult, skipped_records
from .compare import PROBE_OPTIONS, model_row, preprocess_name

NO_ARTIFACTS = "no artifacts"
NO_LABELS = "the images carry no labels (an image-folder layout DIR/<class>/img gives them)"
DEFAULT_TOP_K = 10  # register neurons of the test-time register (the planted models: their planted count)

# row key -> (claim, figure as the table names it, definition: docs/methods.md section 6 repeats these)
ROWS: Dict[str, Tuple[str, str, str]] = {
    "artifacts": ("2", "artifacts found",
                  "whether the detection found high-norm artifacts at the detection block (two-mode test)"),
    "share": ("2", "artifact share, % of patches",
              "share of the patch tokens above the model's threshold at the detection block, in percent"),
    "norm_ratio": ("2", "norm ratio max / median",
                   "max over median patch-token norm at the detection block's output (before the final norm)"),
    "redundancy": ("3", "redundancy normal / high-norm",
                   "median cosine of a token's input patch embedding to its 4 neighbours, normal vs high-norm "
                   "tokens (high: the artifacts sit in redundant regions); n/a when the normal median reaches 0.99 "
                   "(nothing to contrast)"),
    "label_probe": ("4", "label probe normal / high-norm",
                    "image-label linear probe top-1 from one normal vs one high-norm patch token (chance in "
                    "brackets); needs labelled images (DIR/<class>/img)"),
    "position_probe": ("4", "position probe normal / high-norm",
                       "linear probe top-1 of a token's own grid position, from normal vs high-norm tokens "
                       "(chance in brackets)"),
    "pixel_probe": ("4", "pixel probe normal / high-norm",
                    "linear probe R^2 of the token's own input pixels, from normal vs high-norm tokens"),
    "ttr_attention": ("5", "test-time register: CLS attention on artifacts, without -> with",
                      "share of the last block's CLS->patch attention (head mean, over the patches) on the "
                      "unedited model's high-norm patches, mean over the images that have any, without and with "
                      "one test-time register on the top-k ranked register neurons (uniform: the patches' share)"),
    "ttr_behaviour": ("5", "test-time register: behaviour, without -> with",
                      "accuracy without and with the test-time register when the images carry labels the "
                      "classifier names; else top-1 agreement with the unedited model; else (no class logits) the "
                      "pooled vector's cosine to the unedited one; the cell says which"),
    "trained_attention": ("5", "trained registers: CLS attention on artifacts, without -> with",
                          "the same share in the no-register model and in its trained-register sibling (a model "
                          "named like it with _regN, given too), both read on the no-register model's "
                          "high-norm patches (same images, same grid)"),
    "trained_accuracy": ("5", "trained registers: accuracy, without -> with",
                         "accuracy of the no-register model and of its trained-register sibling through their own "
                         "heads; needs class logits and labelled images"),
}
ARTIFACT_ROWS = tuple(k for k, (claim, _, _) in ROWS.items() if claim in ("3", "4", "5"))
PROBE_ROWS = {"label_probe": ("glob_normal", "glob_high", "glob_chance"),
              "position_probe": ("pos_normal", "pos_high", "pos_chance"),
              "pixel_probe": ("pix_normal", "pix_high", None)}


def row_table() -> str:
    """The markdown table of the rows and their definitions (docs/methods.md section 6)."""
    return "| row | claim | figure | definition |\n|---|---|---|---|\n" + "".join(
        f"| `{key}` | {claim} | {label} | {doc} |\n" for key, (claim, label, doc) in ROWS.items())


@dataclass
class Cell:
    """One model's figure for one row: ``values`` (numbers, None where there is none), ``text`` as the table
    shows it, and ``why`` a cell has no number ("n/a", "-"), or what it is (e.g. "top-1 agreement")."""

    values: Dict[str, Optional[float]] = field(default_factory=dict)
    text: str = "-"
    why: Optional[str] = None


def _fmt(value: Optional[float]) -> str:
    return "-" if value is None else f"{value:.3g}"


def _pair(a: Optional[float], b: Optional[float], sep: str = " / ") -> str:
    return f"{_fmt(a)}{sep}{_fmt(b)}"


def _mean(values: Sequence[float]) -> float:
    return sum(values) / len(values)


def _na(why: str) -> Cell:
    return Cell(text="n/a", why=why)


@dataclass(eq=False)
class ModelRun:
    """What the reassessment keeps of one model: its comparison row and notes, the unedited forward (per-image
    CLS attention and logits), the high-norm patches, the behaviour readout, the test-time register result or
    why there is none."""

    name: str
    model_name: str
    row: Dict
    notes: Dict[str, str]
    artifacts: bool
    outliers: torch.Tensor  # Bool[N, P] at the counting threshold
    cls_attention: Optional[torch.Tensor]  # [N, P] last block, head mean; None without CLS
    logits: torch.Tensor
    readout: object
    registers: object = None
    registers_why: Optional[str] = None
    neurons: Optional[Dict] = None


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
    """(registers result, ranked neurons, None) or (None, None, why there is none) for one model."""
    if not found.artifacts_found:
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


def assess_model(model, images, spec: DetectionSpec, *, name: Optional[str] = None, batch_size: int = 16,
                 probes: bool = True, probe_tokens: int = 2000, probe_options: Optional[Dict] = None,
                 top_k: Optional[int] = None, seed: int = 0, strict: bool = False, preprocess=None,
                 classifier=None, progress: bool = True) -> Tuple[ModelRun, List]:
    """One model's measures (a :class:`ModelRun`) and the images it skipped. One unedited forward gives the
    detection, the CLS attention and the logits; then the comparison row (norms, redundancy, probes) and, where
    defined, the neurons study and the test-time register (top ``top_k`` neurons; default the planted count
    for a planted model, else :data:`DEFAULT_TOP_K`). ``classifier``: a classifier file (path, dict or
    :func:`interp.load_classifier`) whose class logits give claim 5's accuracy or agreement (default the model's
    own head)."""
    name = name or model.model_name
    source = open_source(model=model, images=images, batch_size=batch_size, strict=strict, preprocess=preprocess)
    skipped = skipped_records(source)
    source = source.held_if_small()
    readout = behaviour_readout(source, classifier)  # a classifier that does not fit fails before any forward
    base = baseline_pass(source, resolve_block(spec.layer, source.n_layers), progress=progress,
                         classifier=readout.classifier)
    found = detection_from_norms(source, spec, base.patch_norms)
    row, notes = model_row(source, found, name, probes=probes, probe_tokens=probe_tokens,
                           probe_options=probe_options, seed=seed, progress=progress)
    truth = planted_truth(model)
    k = top_k or (len(truth.neurons) if truth is not None else DEFAULT_TOP_K)
    registers, neurons, why = _test_time_register(source, found, base, k, readout.classifier, progress)
    outliers = base.patch_norms > found.counting_threshold()
    run = ModelRun(name, model.model_name, row, notes, bool(found.artifacts_found), outliers, base.cls_attention,
                   base.logits, readout, registers, why, neurons)
    return run, skipped


def _probe_cell(run: ModelRun, key: str) -> Cell:
    normal, high, chance = PROBE_ROWS[key]
    values = {"normal": run.row.get(normal), "high_norm": run.row.get(high)}
    if not any(c in run.row for c in (normal, high)):
        return _na("probes not run (--no-probes)")
    text = _pair(values["normal"], values["high_norm"])
    if chance is not None and run.row.get(chance) is not None:
        values["chance"] = run.row[chance]
        text += f" ({_fmt(run.row[chance])})"
    whys = sorted({run.notes[c] for c in (normal, high) if c in run.notes})
    if not whys and values["normal"] is None and values["high_norm"] is None:
        whys = [NO_LABELS if key == "label_probe" else "no score"]
    return Cell(values, text, "; ".join(whys) or None)


def _behaviour_cell(result) -> Cell:
    """Accuracy, else top-1 agreement, else pooled cosine, without -> with the test-time register."""
    base, reg = result.baseline, result.with_register
    for metric, label in (("accuracy", "accuracy"), ("top1_agreement", "top-1 agreement"),
                          ("pooled_cosine", "pooled cosine")):
        if reg.get(metric) is not None:
            why = label if result.behaviour_note is None else f"{label}: {result.behaviour_note}"
            return Cell({"without": base.get(metric), "with": reg[metric]},
                        f"{_pair(base.get(metric), reg[metric], ' -> ')} ({label})", why)
    return _na(result.behaviour_note or "no behaviour metric")


def _ttr_cells(run: ModelRun) -> Dict[str, Cell]:
    if run.registers is None:
        cell = Cell(text=NO_ARTIFACTS) if run.registers_why == NO_ARTIFACTS else _na(run.registers_why)
        return {"ttr_attention": cell, "ttr_behaviour": Cell(cell.values, cell.text, cell.why)}
    on = run.registers.attention_on_artifacts
    if not on:
        attention = _na("no CLS token: the cleanliness reads the CLS attention row")
    else:
        attention = Cell({"without": on["baseline"], "with": on["with_register"], "uniform": on["patch_share"]},
                         f"{_pair(on['baseline'], on['with_register'], ' -> ')} ({_fmt(on['patch_share'])})")
    return {"ttr_attention": attention, "ttr_behaviour": _behaviour_cell(run.registers)}


def _accuracy(run: ModelRun) -> Optional[float]:
    labels = run.readout.labels
    if not run.readout.classes or labels is None:
        return None
    return float((run.logits.argmax(-1) == labels).float().mean())


def _trained_cells(plain: ModelRun, reg: ModelRun) -> Dict[str, Cell]:
    """The trained-register rows of a no-register model and its sibling (the same cells in both columns)."""
    if not plain.artifacts:
        return {"trained_attention": Cell(text=NO_ARTIFACTS, why=f"{plain.name} has no artifacts"),
                "trained_accuracy": Cell(text=NO_ARTIFACTS, why=f"{plain.name} has no artifacts")}
    if plain.cls_attention is None or reg.cls_attention is None:
        attention = _na("no CLS token: the cleanliness reads the CLS attention row")
    elif plain.outliers.shape != reg.cls_attention.shape:
        attention = _na(f"the siblings' patch grids differ ({plain.outliers.shape[-1]} vs "
                        f"{reg.cls_attention.shape[-1]} patches): give both the same --img-size")
    elif not plain.outliers.any():
        attention = _na(f"{plain.name} has no patch above the counting threshold")
    else:
        without, share = (_mean(v) for v in attention_on_artifacts(plain.cls_attention, plain.outliers))
        with_ = _mean(attention_on_artifacts(reg.cls_attention, plain.outliers)[0])
        attention = Cell({"without": without, "with": with_, "uniform": share},
                         f"{_pair(without, with_, ' -> ')} ({_fmt(share)})", f"{plain.name} -> {reg.name}")
    acc = (_accuracy(plain), _accuracy(reg))
    if None in acc:
        why = next(r.readout.note for r in (plain, reg) if _accuracy(r) is None)
        accuracy = _na(f"accuracy needs class logits and labelled images: {why}")
    else:
        accuracy = Cell({"without": acc[0], "with": acc[1]}, _pair(acc[0], acc[1], " -> "),
                        f"{plain.name} -> {reg.name}")
    return {"trained_attention": attention, "trained_accuracy": accuracy}


PARALLEL_COS = 0.99  # normal patches this alike at the input: a shared component dominates, nothing to contrast


def _redundancy_cell(run: ModelRun) -> Cell:
    """Claim 3's cell; n/a (the medians kept in ``values``) when even the normal patches' input embeddings are
    nearly parallel to their neighbours: a component shared by every patch (e.g. a large embedding bias) hides
    the image, so "redundant region" has no contrast to show."""
    row = run.row
    values = {"normal": row["redund_normal"], "high_norm": row["redund_high"]}
    if row["redund_normal"] is not None and row["redund_normal"] >= PARALLEL_COS:
        return Cell(values, "n/a", f"normal patches' input embeddings are already nearly parallel to their "
                                   f"neighbours (median cos {row['redund_normal']:.3f} >= {PARALLEL_COS}): a "
                                   "component shared by every patch dominates, so the measure cannot tell "
                                   "redundant regions")
    whys = sorted({run.notes[c] for c in ("redund_normal", "redund_high") if c in run.notes})
    return Cell(values, _pair(row["redund_normal"], row["redund_high"]), "; ".join(whys) or None)


def model_cells(run: ModelRun) -> Dict[str, Cell]:
    """The cells of one model's column, but the trained-register rows (:func:`_trained_cells`)."""
    row = run.row
    cells = {"artifacts": Cell({"artifacts": float(run.artifacts)}, "yes" if run.artifacts else "no"),
             "share": Cell({"share": row["outlier_%"]}, _fmt(row["outlier_%"])),
             "norm_ratio": Cell({"ratio": row["max/median"]}, _fmt(row["max/median"]))}
    if not run.artifacts:
        return {**cells, **{key: Cell(text=NO_ARTIFACTS) for key in ARTIFACT_ROWS}}
    cells["redundancy"] = _redundancy_cell(run)
    cells.update({key: _probe_cell(run, key) for key in PROBE_ROWS})
    cells.update(_ttr_cells(run))
    return cells


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


def reassess_models(models: Sequence, images, *, detection: Optional[DetectionSpec] = None,
                    names: Optional[Sequence[str]] = None, batch_size: int = 16, probes: bool = True,
                    probe_tokens: int = 2000, probe_options: Optional[Dict] = None, top_k: Optional[int] = None,
                    seed: int = 0, strict: bool = False, preprocess=None, siblings: Optional[Dict[str, str]] = None,
                    classifiers: Optional[Sequence] = None, progress: bool = True) -> ReassessmentResult:
    """The reassessment table of ``models`` (HookedViTs) over the same ``images`` (what ``open_source`` takes).

    Args:
        detection: one :class:`DetectionSpec` for every model (default: "auto" at the last block; a percentile
            or "auto" is each model's own).
        names: the column names (default each model's name); a trained-register sibling is paired by
            ``model.model_name`` (:func:`register_siblings`).
        probes, probe_tokens, probe_options: the linear probes of claim 4 (as in ``compare_models``).
        top_k: register neurons the test-time register edits (default: the planted count, else 10).
        siblings: {trained-register column: its no-register sibling's column} (names as in ``names``); default
            the pairs :func:`register_siblings` finds among the model names.
        preprocess: one eval transform for every model's images (default each model's own).
        classifiers: one classifier file (or None: the model's own head) per model, for claim 5's behaviour.
    """
    spec = spec_of(detection)
    probe_options = dict(PROBE_OPTIONS if probe_options is None else probe_options)
    runs, skipped = [], []
    for i, model in enumerate(models):
        if progress:
            print(f"interp reassess: model {i + 1}/{len(models)}: {names[i] if names else model.model_name}",
                  file=sys.stderr, flush=True)
        run, skips = assess_model(model, images, spec, name=names[i] if names else None, batch_size=batch_size,
                                  probes=probes, probe_tokens=probe_tokens, probe_options=probe_options,
                                  top_k=top_k, seed=seed, strict=strict, preprocess=preprocess,
                                  classifier=classifiers[i] if classifiers else None, progress=progress)
        runs.append(run)
        skipped = skipped or skips
    labels = [run.name for run in runs]
    pairs = sibling_pairs(labels, [run.model_name for run in runs], siblings)
    columns = {run.name: model_cells(run) for run in runs}
    for i, run in enumerate(runs):
        columns[run.name].update(trained_cells_of(i, runs, pairs))
    siblings = {labels[r]: labels[p] for r, p in pairs.items()}
    params = {"models": labels, "threshold": threshold_param(spec.threshold), "detect_layer": spec.layer,
              "preset": spec.preset, "batch_size": batch_size, "probes": probes, "probe_tokens": probe_tokens,
              "probe_options": probe_options, "top_k": top_k, "seed": seed, "preprocess": preprocess_name(preprocess)}
    return ReassessmentResult(model=",".join(labels), fingerprint="", params=params, seed=seed, skipped=skipped,
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


def trained_cells_of(me: int, runs: Sequence[ModelRun], pairs: Dict[int, int]) -> Dict[str, Cell]:
    """The trained-register rows of model ``runs[me]``'s column: its pair's cells when ``pairs`` (trained-register
    column -> sibling column) pairs it, else "no artifacts" or n/a."""
    run = runs[me]
    for reg, plain in pairs.items():
        if me in (reg, plain):
            return _trained_cells(runs[plain], runs[reg])
    if not run.artifacts:
        return {key: Cell(text=NO_ARTIFACTS) for key in ("trained_attention", "trained_accuracy")}
    why = ("no register sibling among the models (a model named like it with _regN, e.g. "
           "vit_small_patch14_reg4_dinov2 beside vit_small_patch14_dinov2, or --siblings REG=PLAIN)")
    return {key: _na(why) for key in ("trained_attention", "trained_accuracy")}
