"""The cells of the reassessment table (:mod:`interp.report.reassessment`): its rows and their definitions
(:data:`ROWS`), what the reassessment keeps of one model (:class:`ModelRun`), and each row's cell built from it,
a number with what it is, "no artifacts", or "n/a" with why."""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Dict, Optional, Sequence, Tuple

import torch

from ..studies.core.stats import attention_on_artifacts

NO_ARTIFACTS = "no artifacts"
NO_LABELS = "the images carry no labels (an image-folder layout DIR/<class>/img gives them)"

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
    "pixel_probe": ("4", "pixel probe MSE normal / high-norm (R^2)",
                    "linear probe mean squared error per pixel value of the token's own input patch (the paper's "
                    "measure, in the model's normalised input space), from normal vs high-norm tokens; R^2 beside "
                    "it in brackets (R^2 divides by each group's own variance, so it can order the groups "
                    "differently)"),
    "artifact_attention": ("5", "attention on artifacts (unedited)",
                           "share of the last block's attention on the high-norm patches in the unedited model: the "
                           "CLS->patch row (head mean, over the patches), or for a model without CLS the mean "
                           "attention each patch token receives (over heads and the queries that can attend to "
                           "it; the paper's definition), mean over the images that have any (uniform: the "
                           "patches' share)"),
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
              "pixel_probe": ("pix_mse_normal", "pix_mse_high", None)}
TWO_MODE_NOTE = ("two-mode test: no separated high-norm mode; the figure reads the tokens above the percentile, "
                 "as the paper does")


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
    ids: Tuple[str, ...] = ()  # the images it was measured on, in order
    received_attention: Optional[torch.Tensor] = None  # [N, P] last block, without CLS (reassessment_attention)
    received_why: Optional[str] = None
    percentile: bool = False  # a percentile threshold (the paper's p98): rows 3-5 also without a two-mode verdict

    @property
    def measured(self) -> bool:
        """Whether rows 3-5 have numbers: artifacts found, or the paper's percentile rule (its tokens above it)."""
        return self.artifacts or self.percentile


def _probe_cell(run: ModelRun, key: str) -> Cell:
    normal, high, chance = PROBE_ROWS[key]
    values = {"normal": run.row.get(normal), "high_norm": run.row.get(high)}
    if not any(c in run.row for c in (normal, high)):
        return _na("probes not run (--no-probes)")
    text = _pair(values["normal"], values["high_norm"])
    if key == "pixel_probe":  # MSE, the paper's measure; R^2 beside it
        values.update(r2_normal=run.row.get("pix_normal"), r2_high_norm=run.row.get("pix_high"))
        text += f" (R^2 {_pair(values['r2_normal'], values['r2_high_norm'])})"
    if chance is not None and run.row.get(chance) is not None:
        values["chance"] = run.row[chance]
        text += f" ({_fmt(run.row[chance])})"
    noted = ("pix_normal", "pix_high") if key == "pixel_probe" else (normal, high)  # the MSE's notes are R^2's
    whys = sorted({run.notes[c] for c in noted if c in run.notes})
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


def _attention_cell(run: ModelRun) -> Cell:
    """Claim 5's attention on the artifacts in the unedited model: the CLS row's share, else the share of the
    mean attention each patch receives (no CLS)."""
    if run.cls_attention is not None:
        attention, what = run.cls_attention, "CLS->patch row"
    elif run.received_attention is not None:
        attention, what = run.received_attention, "mean attention received per token (no CLS token)"
    else:
        return _na(run.received_why or "no attention pattern at the last block")
    if attention.shape != run.outliers.shape:
        return _na(f"the detection block's grid ({run.outliers.shape[-1]} patches) is not the last block's "
                   f"({attention.shape[-1]}): the attention is read at the last block")
    shares, uniform = attention_on_artifacts(attention, run.outliers)
    if not shares:
        return _na("no patch above the counting threshold")
    on, share = _mean(shares), _mean(uniform)
    return Cell({"on_artifacts": on, "uniform": share}, f"{_fmt(on)} ({_fmt(share)})", what)


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
    if not plain.measured:
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
    if not run.measured:
        return {**cells, **{key: Cell(text=NO_ARTIFACTS) for key in ARTIFACT_ROWS}}
    cells["redundancy"] = _redundancy_cell(run)
    cells.update({key: _probe_cell(run, key) for key in PROBE_ROWS})
    cells["artifact_attention"] = _attention_cell(run)
    cells.update(_ttr_cells(run))
    if not run.artifacts:  # the paper's percentile rule: its numbers, with the two-mode verdict beside them
        cells["artifacts"].why = TWO_MODE_NOTE
        for key in ARTIFACT_ROWS:
            if key in cells:
                cells[key].why = "; ".join(w for w in (cells[key].why, TWO_MODE_NOTE) if w)
    return cells


def trained_cells_of(me: int, runs: Sequence[ModelRun], pairs: Dict[int, int]) -> Dict[str, Cell]:
    """The trained-register rows of model ``runs[me]``'s column: its pair's cells when ``pairs`` (trained-register
    column -> sibling column) pairs it, else "no artifacts" or n/a."""
    run = runs[me]
    for reg, plain in pairs.items():
        if me in (reg, plain):
            return _trained_cells(runs[plain], runs[reg])
    if not run.measured:
        return {key: Cell(text=NO_ARTIFACTS) for key in ("trained_attention", "trained_accuracy")}
    why = ("no register sibling among the models (a model named like it with _regN, e.g. "
           "vit_small_patch14_reg4_dinov2 beside vit_small_patch14_dinov2, or --siblings REG=PLAIN)")
    return {key: _na(why) for key in ("trained_attention", "trained_accuracy")}
