"""Token replacement (Parodi, Matelsky, Segado 2026, arXiv 2604.14433; docs/methods.md section 2): is a token set's
content needed, or only its presence?

The token set (registers, CLS, chosen or random patches) is replaced at the output of every block but the last (the
paper's setting, :class:`~interp.interventions.token_replacement.TokenReplacement`; at the last block's output a
register reaches nothing and a CLS token is the readout itself, so replacing it there would measure the
replacement, not the model) by zero, by its mean over a calibration set, by
Gaussian noise with that set's per-block, per-token, per-channel mean and standard deviation, and by the same tokens
of another image. As many random patches zeroed are the control. Per condition, against the intact model on the
same images:

* behaviour (:mod:`interp.studies.core.behaviour`): accuracy with labels, else top-1 agreement through class
  logits, else the pooled vector's cosine; ``effect`` is the loss on that metric (``metric`` says which);
* the CLS->patch attention (head mean, renormalised over the patches): its Jensen-Shannon divergence (bits) to the
  intact model's, per block;
* the effective rank of the final patch features (Roy and Vetterli: ``exp`` of the entropy of the normalised
  singular values of the per-image centred [P, d] patch tokens after the final norm), mean over images;
* the patch outliers left at the detection block.

For a set of several tokens it also zeroes each one alone: the sum of those effects beside the collective one.
The verdict reads the effects: *image-specific content* when another image's tokens hurt, *presence only* when
zero hurts and mean, noise and shuffle do not, *not needed* when zero does no more than the random control.
The calibration set is the study's own images (Parodi et al. used 5,000 other images): say so when comparing.

>>> result = replace_study(source, target="cls", progress=False)
>>> sorted(result.conditions)[:3], result.metric
(['control', 'intact', 'mean'], 'pooled_cosine')
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Dict, List, Optional

import numpy as np
import torch

from ...errors import InterpError
from ...interventions.token_replacement import TokenReplacement, calibration_from, token_rows
from ...runtime.paired import Condition, paired_pass
from ...runtime.source import require_live
from ...detection.detection import DetectionLike, RunOptions, detect, detection_header, detection_params
from ..core.behaviour import BehaviourMeter, behaviour_readout, headline_metric
from ..core.options import FINAL
from ..core.result import OutlierStudyResult, behaviour_lines, skipped_records
from ..declaration import study
from .configs import ReplaceConfig

FLOOR = 0.01  # an effect below this on the headline metric is no effect
FUNGIBLE = 0.25  # presence only: every in-distribution replacement costs under this share of zeroing's effect


def effective_rank(tokens: torch.Tensor) -> torch.Tensor:
    """[b, P, d] patch features -> [b] effective rank: exp of the entropy of each image's normalised singular values
    (after centring over the patches)."""
    x = tokens.double()
    x = x - x.mean(1, keepdim=True)
    gram = x @ x.transpose(1, 2) if x.shape[1] <= x.shape[2] else x.transpose(1, 2) @ x  # the smaller Gram
    s = torch.linalg.eigvalsh(gram).clamp_min(0).sqrt()  # [b, min(P, d)] singular values
    p = s / s.sum(-1, keepdim=True).clamp_min(1e-300)
    return torch.exp(-(p * torch.log(p.clamp_min(1e-300))).sum(-1)).float().cpu()


def js_divergence(p: torch.Tensor, q: torch.Tensor) -> torch.Tensor:
    """[b, P] attention rows -> [b] Jensen-Shannon divergence in bits (each row renormalised over the P patches)."""
    p = p.double() / p.double().sum(-1, keepdim=True).clamp_min(1e-300)
    q = q.double() / q.double().sum(-1, keepdim=True).clamp_min(1e-300)
    m = (p + q) / 2

    def kl(a, b):
        return (a * (torch.log2(a.clamp_min(1e-300)) - torch.log2(b.clamp_min(1e-300)))).sum(-1)

    return (kl(p, m) / 2 + kl(q, m) / 2).float().cpu()


@dataclass
class ReplaceResult(OutlierStudyResult):
    """Result of :func:`replace_study`.

    Attributes:
        target: the token set as asked (``auto`` resolved); rows: its rows of the token axis; control_rows: the
            random patches zeroed as the control (as many, seeded).
        metric: the behaviour metric ``effect`` is the loss on (accuracy, top1_agreement or pooled_cosine).
        conditions: name (``intact``, ``zero``, ``mean``, ``noise``, ``shuffle``, ``control``, ``zero:ROW``) -> the
            behaviour metrics, ``effect``, ``outlier_count``, ``attention_js`` (per block, None without CLS),
            ``attention_js_mean`` and ``effective_rank``.
        singles: {"collective", "sum", "per_token"} zero effects, None for one token or without ``singles``.
        verdict: "image-specific content", "presence only", "not needed" or "mixed"; message: the headline.
        calibration: what the mean, noise and shuffle replacements were calibrated on.
    """

    study = "replace"
    target: str = ""
    rows: List[int] = field(default_factory=list)
    control_rows: List[int] = field(default_factory=list)
    metric: str = ""
    conditions: Dict[str, Dict] = field(default_factory=dict)
    singles: Optional[Dict] = None
    verdict: str = ""
    message: str = ""
    calibration: str = ""
    classifier: Optional[Dict] = None
    behaviour_note: Optional[str] = None

    def console_lines(self, config=None) -> List[str]:
        return [self.message, *behaviour_lines(self)]


def _target(layout, target: str) -> str:
    if target != "auto":
        return target
    if layout.n_registers:
        return "registers"
    if layout.cls_index is not None:
        return "cls"
    raise InterpError("this model has no CLS or register tokens: give --target patches:I,J,... or random:K")


def _effect(metric: str, record: Dict, intact: Dict) -> float:
    """The loss on ``metric`` against the intact run (float error below 1e-9 reads as none)."""
    if metric == "accuracy":
        value = intact["accuracy"] - record["accuracy"]
    elif metric == "top1_agreement":
        value = 1.0 - record["top1_agreement"]
    else:
        value = 1.0 - record["pooled_cosine"]
    return 0.0 if abs(value) < 1e-9 else float(value)


def verdict(effects: Dict[str, float]) -> str:
    """The reading of the effects (module doc): ``zero``, ``control`` and the modes that ran."""
    zero, floor = effects.get("zero", 0.0), max(FLOOR, effects.get("control", 0.0))
    shuffle = effects.get("shuffle")
    in_dist = [effects[m] for m in ("mean", "noise", "shuffle") if m in effects]
    if shuffle is not None and shuffle > floor and shuffle >= FUNGIBLE * max(zero, shuffle):
        return "image-specific content"
    if zero <= floor:
        return "not needed"
    if in_dist and max(in_dist) < FUNGIBLE * zero:
        return "presence only"
    return "mixed"


VERDICT_WORDS = {
    "image-specific content": "another image's tokens hurt: the model reads their image-specific content",
    "presence only": "zero hurts, in-distribution replacements do not: the content is fungible, a zero-ablation "
                     "overstates it",
    "not needed": "zeroing them does no more than zeroing as many random patches",
    "mixed": "in-distribution replacements hurt too, another image's tokens no more than the mean",
}


@study(ReplaceConfig)
@torch.no_grad()
def replace_study(source, config: ReplaceConfig, *, detection: DetectionLike,
                  progress: bool = True) -> ReplaceResult:
    """Replace a token set by zero, mean, noise and another image's tokens at every block (module doc).

    Args:
        source: a live source (the study re-runs the model).
        config: the options (:class:`~interp.studies.artifacts.configs.ReplaceConfig`; or pass them as keywords):
            ``target`` the token set; ``modes`` the replacements; ``singles`` zero each token alone too;
            ``classifier`` class logits for agreement and accuracy;
            ``seed`` the control's patches and the noise and shuffle draws.
        detection: the outliers counted: a Detection of the unedited model on this source (made by
            :func:`~interp.detection.detection.detect`), or a DetectionSpec (default the config's).
        progress: show progress bars.
    """
    require_live(source, "token replacement study")
    layout = source.layout
    readout = behaviour_readout(source, config.classifier)
    target = _target(layout, config.target)
    rows = token_rows(layout, target, seed=config.seed)
    control = token_rows(layout, f"random:{len(rows)}", seed=config.seed + 1)
    found = detect(source, detection, RunOptions(source.batch_size, progress=progress))
    thr = found.counting_threshold()
    where = list(range(source.n_layers - 1))
    if not where:
        raise InterpError("token replacement needs a model of at least two blocks (it edits every block's output "
                          "but the last)")
    stats = None
    if set(config.modes) - {"zero"}:
        hooks = [source.blocks.resid_post(b) for b in where]
        picked = torch.tensor(rows)
        batches = source.batches(hooks, source.batch_size, reduce={h: lambda t: t[:, picked.to(t.device)] for h in hooks})
        stats = calibration_from((torch.stack([b.acts[h] for h in hooks], 1) for b in batches), where)
    edits = {"intact": []}
    for mode in config.modes:
        edits[mode] = [TokenReplacement(rows, mode, blocks=where, means=None if stats is None else stats.means,
                                        stds=None if stats is None else stats.stds,
                                        bank=None if stats is None else stats.bank, seed=config.seed)]
    edits["control"] = [TokenReplacement(control, "zero", blocks=where)]
    singles = config.singles and len(rows) > 1 and "zero" in config.modes
    if singles:
        edits.update({f"zero:{r}": [TokenReplacement([r], "zero", blocks=where)] for r in rows})
    has_cls = layout.cls_index is not None
    blocks = list(range(source.n_layers)) if has_cls else []
    final_rank = lambda lay: {FINAL: lambda t: effective_rank(t[:, lay.patch_slice])}  # noqa: E731 (per layout)
    conditions = {name: Condition(iv, attention_layers=blocks, hooks=[FINAL], reduce=final_rank)
                  for name, iv in edits.items()}
    meter = BehaviourMeter(readout)
    tally = {name: {"outliers": 0, "js": np.zeros(len(blocks)), "rank": 0.0} for name in edits}
    n = 0
    for pair in paired_pass(source, conditions, detect_layer=found.layer, classifier=readout.classifier,
                            baseline=False, progress=progress, desc="token replacement"):
        intact = pair.edited["intact"]
        for name, out in pair.edited.items():
            meter.add(name, pair.start, out.logits, out.pooled, intact.logits, intact.pooled)
            tally[name]["outliers"] += int((out.patch_norms > thr).sum())
            tally[name]["rank"] += float(out.acts[FINAL].sum())
            for j, b in enumerate(blocks):
                tally[name]["js"][j] += float(js_divergence(out.cls_attention[b], intact.cls_attention[b]).sum())
        n += len(pair)
    metric = headline_metric(readout)
    table = {}
    intact_record = meter.metrics("intact")
    for name, t in tally.items():
        record = meter.metrics(name)
        js = (t["js"] / max(n, 1)).tolist() if has_cls else None
        table[name] = {**record, "effect": _effect(metric, record, intact_record), "outlier_count": t["outliers"],
                       "attention_js": js, "attention_js_mean": float(np.mean(js)) if js else None,
                       "effective_rank": t["rank"] / max(n, 1)}
    effects = {name: table[name]["effect"] for name in ("zero", "mean", "noise", "shuffle", "control") if name in table}
    single = None
    if singles:
        per = [table[f"zero:{r}"]["effect"] for r in rows]
        single = {"collective": table["zero"]["effect"], "sum": float(sum(per)), "per_token": per}
    reading = verdict(effects)
    header = detection_header(found, "replace", warn=False)
    params = {"target": target, "modes": list(config.modes), "singles": bool(config.singles), "seed": config.seed,
              **detection_params(found), "batch_size": source.batch_size}
    return ReplaceResult(
        model=source.model_name, fingerprint=source.fingerprint, params=params, seed=config.seed,
        ids=list(source.ids), skipped=skipped_records(source), **header, target=target, rows=rows,
        control_rows=control, metric=metric, conditions=table, singles=single, verdict=reading,
        message=_message(target, len(rows), metric, effects, single, reading),
        calibration=f"the study's own {n} images" if stats is not None else "none (zero only)",
        classifier=readout.record(), behaviour_note=readout.note)


def _message(target: str, n_rows: int, metric: str, effects: Dict[str, float], single: Optional[Dict],
             reading: str) -> str:
    loss = {"accuracy": "accuracy lost", "top1_agreement": "1 - top-1 agreement",
            "pooled_cosine": "1 - pooled cosine"}[metric]
    parts = ", ".join(f"{k} {v:.3f}" for k, v in effects.items() if k != "control")
    singles = (f"; each token zeroed alone: sum {single['sum']:.3f} vs all together {single['collective']:.3f}"
               if single else "")
    return (f"{target} ({n_rows} token{'s' if n_rows != 1 else ''}) replaced at every block but the last, {loss}: "
            f"{parts}; "
            f"{n_rows} random patches zeroed: {effects['control']:.3f}{singles}. {reading}: {VERDICT_WORDS[reading]}")
