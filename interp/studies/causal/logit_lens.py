"""Logit lens and direct logit attribution (docs/causal.md).

>>> result = logit_lens_study(source, progress=False)          # planted_vit
>>> result.rows[:3], len(result.lens_pooled)                   # the embedding, then every block
(['embed', 'block 0', 'block 1'], 7)
>>> abs(result.dla["max_sum_error"]) < 1e-4                      # the contributions sum to the output
True

**Logit lens.** Each block's output (and the embedding) is read as if it were the last block's: through the final
norm, the pooling and the head (:class:`~interp.models.families.readout.FinalReadout`), pooled and per token. The
metric is the probability of each image's final top-1 class for a classification head (or of ``classes``; the
logit difference for ``A,B``), else the cosine of the read to the final output (an embedding head: a CLIP
projection, an identity head).

**Direct logit attribution.** The final residual stream is the embedding plus every block's attention and MLP
output; with the final norms' scales frozen from it (TransformerLens's ``apply_ln_to_stack``), the output is the sum
of one term per component plus a constant (the norms' and head's biases). Each term is the component dotted with
``G`` [b, t, d], the gradient of the frozen readout (linear, so exact), so the heads (``attn.hook_z`` times each
head's ``proj`` columns) and the neurons (``mlp.hook_post`` times their write directions) come out of the same
forward, reduced inside the hooks.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Dict, List, Optional

import torch

from ..._progress import tqdm
from ...errors import InterpError
from ...hooks.names import EMBED
from ...runtime.source import n_batches, require_live
from ..core.result import StudyResult, skipped_records
from ..declaration import study
from .configs import LogitLensConfig
from .targets import OutputTarget, output_target


@dataclass
class LogitLensResult(StudyResult):
    """Result of :func:`logit_lens_study`.

    Attributes:
        rows: the rows' labels: "embed", then "block i".
        metric: what the lens reads ("probability", "logit-diff" or "cosine"); target: what the output is
            (:class:`~interp.studies.causal.targets.OutputTarget` as a dict).
        lens_pooled: [blocks] the pooled read's metric, mean over images; lens_top1: [blocks] share of images
            whose pooled read's top-1 is the final one (None without classes).
        lens_maps: [blocks][gh][gw] each patch token's read, mean over images; lens_prefix: [blocks][n_prefix]
            the prefix tokens' (CLS, registers); grid: (gh, gw).
        dla: the decomposition (mean over images): "components" (labels), "mean" (their contributions), "bias",
            "output" (the mean output), "max_sum_error" (the largest |sum - output| over images), "heads" ([blocks]
            [heads] or None), "neurons" ({block: [[neuron, mean contribution], ...]} by |contribution|); None with
            the reason in ``notes`` for a model without a head.
    """

    study = "logit_lens"
    rows: List[str] = field(default_factory=list)
    metric: str = ""
    target: Dict = field(default_factory=dict)
    lens_pooled: List[float] = field(default_factory=list)
    lens_top1: Optional[List[float]] = None
    lens_maps: List = field(default_factory=list)
    lens_prefix: List = field(default_factory=list)
    grid: List[int] = field(default_factory=list)
    dla: Optional[Dict] = None
    n_images: int = 0
    notes: List[str] = field(default_factory=list)

    def console_lines(self, config=None) -> List[str]:
        lines = [f"logit lens ({self.metric}, pooled): " + ", ".join(f"{b} {v:.3g}" for b, v in
                                                                    zip(self.rows, self.lens_pooled))]
        if self.dla is not None:
            top = sorted(zip(self.dla["components"], self.dla["mean"]), key=lambda kv: -abs(kv[1]))[:3]
            lines.append("largest direct contributions: " + ", ".join(f"{c} {v:+.3g}" for c, v in top))
        return lines + self.notes


def logit_gradient(readout, resid: torch.Tensor, n_prefix: int, direction: torch.Tensor) -> torch.Tensor:
    """G [b, t, d]: what a unit of residual stream at each token adds to each image's output along ``direction``
    [b, d'] through ``readout`` with its norms frozen from ``resid`` [b, t, d] (the readout is then linear)."""
    probe = torch.zeros(1, *resid.shape, device=resid.device, requires_grad=True)
    with torch.enable_grad():
        parts, _ = readout.decompose(probe, resid, n_prefix)
        (g,) = torch.autograd.grad((parts[0] * direction).sum(), probe)
    return g[0].detach()


def check_readout(readout, resid: torch.Tensor, n_prefix: int, logits: torch.Tensor) -> None:
    """Refuse a forward whose output is not the readout of its last residual stream (a pooling edit such as
    SelectiveCLS replaces the pooling): the lens and the decomposition would read another model."""
    out = readout.output(readout.pooled(resid, n_prefix)).cpu()
    if (out - logits).abs().max() > 1e-3 * (1.0 + logits.abs().max()):
        raise InterpError("the model's output is not its final norm, pooling and head of the last block's stream "
                          "(a pooling edit?): the logit lens and decomposition read the unedited readout only")


def lens_metric(out: torch.Tensor, final: torch.Tensor, target: OutputTarget) -> torch.Tensor:
    """The lens's value of outputs ``out`` [b, (t,) C] against the final output ``final`` [b, C]: the target's
    probability or logit difference, or the cosine to ``final``."""
    if target.kind == "cosine":
        ref = final if out.ndim == 2 else final[:, None]
        return torch.nn.functional.cosine_similarity(out, ref.expand_as(out), dim=-1)
    return target.value(out)


def merged(groups: Dict[str, Dict]) -> Dict:
    """{hook: reducer} of several groups of reducers: each hook's reducer returns {group: its value}."""
    hooks = dict.fromkeys(h for fns in groups.values() for h in fns)
    return {h: (lambda t, fs=[(g, fns[h]) for g, fns in groups.items() if h in fns]: {g: f(t) for g, f in fs})
            for h in hooks}


def _dla_reducers(source, grad: torch.Tensor, per_head: bool):
    """{hook: reducer} of the decomposition's terms: each component's contribution [b] (a head's [b, h], a
    neuron's [b, n]) with ``grad`` G [b, t, d] on the model's device."""
    blocks = source.blocks
    fns = {EMBED: lambda t: (t.float() * grad).sum((1, 2))}
    for i in range(len(blocks)):
        fns[blocks.attn_out(i)] = lambda t: (t.float() * grad).sum((1, 2))
        fns[blocks.mlp_out(i)] = lambda t: (t.float() * grad).sum((1, 2))
        writes = source.neuron_writes(i).to(grad.device)  # [d, n]
        fns[blocks.mlp_post(i)] = lambda t, w=writes: torch.einsum("btn,dn,btd->bn", t.float(), w, grad)
        if per_head:
            w_heads, _ = source.head_writes(i)
            w_heads = w_heads.to(grad.device)
            fns[blocks.attn_z(i)] = lambda t, w=w_heads: torch.einsum("bthe,hed,btd->bh", t.float(), w, grad)
    return fns


def _lens_reducers(source, readout, layout, final: torch.Tensor, target: OutputTarget):
    """{hook: reducer} of the lens: the embedding's and every block's output read through ``readout``."""
    def read(t):
        pooled_out = readout.output(readout.pooled(t, layout.n_prefix))
        out = {"pooled": lens_metric(pooled_out, final, target), "tokens": lens_metric(
            readout.token_output(t), final, target)}
        if target.kind != "cosine":
            out["top1"] = (pooled_out.argmax(-1) == final.argmax(-1)).float()
        return out

    return {h: read for h in [EMBED] + [source.blocks.resid_post(i) for i in range(len(source.blocks))]}


@study(LogitLensConfig)
def logit_lens_study(source, config: LogitLensConfig, *, progress: bool = True) -> LogitLensResult:
    """The logit lens and direct logit attribution over the images of a live ``source`` (module doc).

    Args:
        source: a live source (ViT or Eva family; pyramids are refused in one line).
        config: ``classes`` (one class, or two for the difference; default each image's top-1 output),
            ``per_head`` (split attention by head), ``top_neurons`` (neurons listed per block).
    """
    require_live(source, "logit lens")
    readout = source.final_readout()
    head = source.head()
    blocks = source.blocks
    n = len(blocks)
    last = blocks.resid_post(n - 1)
    notes: List[str] = []
    per_head = config.per_head
    if per_head:
        try:
            source.head_writes(0)
        except InterpError as e:
            per_head = False
            notes.append(f"no per-head split: {e}")
    sums: Dict[str, torch.Tensor] = {}
    count, max_error, target = 0, 0.0, None

    def add(key, value):
        sums[key] = sums.get(key, 0) + value.detach().float().cpu().sum(0)

    for _, x in tqdm(source.image_batches(), disable=not progress, desc="logit lens", unit="batch",
                         total=n_batches(source, None), leave=False):
        first = source.run(x, [last], logits=True)
        layout = first.layout
        resid = first.acts[last].to(x.device)
        final = first.logits.to(x.device)
        check_readout(readout, resid, layout.n_prefix, first.logits)
        target = output_target(head, readout, config.classes, first.logits)
        groups = {"lens": _lens_reducers(source, readout, layout, final, target)}
        if readout.has_head:
            direction, const = target.direction(readout, first.logits)
            grad = logit_gradient(readout, resid, layout.n_prefix, direction.to(x.device))
            _, bias = readout.decompose(torch.zeros(1, *resid.shape, device=x.device), resid, layout.n_prefix)
            bias_term = (bias * direction.to(x.device)).sum(-1).cpu() + const
            groups["dla"] = _dla_reducers(source, grad, per_head)
            attn_bias = torch.stack([(source.head_writes(i)[1].to(x.device) * grad.sum(1)).sum(-1).cpu()
                                     for i in range(n)], 1) if per_head else None
        fns = merged(groups)
        run = source.run(x, list(fns), reduce=fns)
        for h in groups["lens"]:
            value = run.acts[h]["lens"]
            add(f"lens_tokens:{h}", value["tokens"])
            if "top1" in value:
                add(f"top1:{h}", value["top1"])
            add(f"lens_pooled:{h}", value["pooled"])
        if readout.has_head:
            terms = [run.acts[EMBED]["dla"]]
            for i in range(n):
                if per_head:
                    heads = run.acts[blocks.attn_z(i)]["dla"]
                    add(f"heads:{i}", heads)
                    terms += [heads.sum(1) + attn_bias[:, i]]
                else:
                    terms.append(run.acts[blocks.attn_out(i)]["dla"])
                terms.append(run.acts[blocks.mlp_out(i)]["dla"])
                add(f"neurons:{i}", run.acts[blocks.mlp_post(i)]["dla"])
            terms = torch.stack(terms, 1)  # [b, 2n + 1]
            output = target.logit(first.logits)
            max_error = max(max_error, float((terms.sum(1) + bias_term - output).abs().max()))
            add("terms", terms)
            add("bias", bias_term)
            add("output", output)
        count += len(x)
    if not count:
        raise InterpError("the logit lens needs at least one image")
    labels = ["embed"] + [blocks.label(i) for i in range(n)]
    hooks = [EMBED] + [blocks.resid_post(i) for i in range(n)]
    gh, gw = layout.grid
    maps = [(sums[f"lens_tokens:{h}"] / count) for h in hooks]
    dla = None
    if readout.has_head:
        components = ["embed"] + [f"{blocks.label(i)} {part}" for i in range(n) for part in ("attn", "mlp")]
        neurons = {}
        for i in range(n):
            mean = sums[f"neurons:{i}"] / count
            top = mean.abs().argsort(descending=True)[:config.top_neurons]
            neurons[str(i)] = [[int(j), float(mean[j])] for j in top]
        dla = {"components": components, "mean": (sums["terms"] / count).tolist(),
               "bias": float(sums["bias"] / count), "output": float(sums["output"] / count),
               "max_sum_error": max_error, "neurons": neurons,
               "heads": [(sums[f"heads:{i}"] / count).tolist() for i in range(n)] if per_head else None}
    else:
        notes.append("the model has no head (its output is the pooled vector): no logit to decompose; the lens "
                     "reads each block's pooled-vector cosine to the final pooled vector")
    if head.kind != "classifier" and readout.has_head:
        notes.append(f"the head is not a classifier ({head.why}): its outputs are coordinates, not classes")
    return LogitLensResult(
        model=source.model_name, fingerprint=source.fingerprint, seed=None, ids=list(source.ids),
        skipped=skipped_records(source),
        params={"classes": list(config.classes) if config.classes else None, "per_head": per_head,
                "top_neurons": config.top_neurons},
        rows=labels, metric=target.kind, target=target.record(),
        lens_pooled=[float(sums[f"lens_pooled:{h}"] / count) for h in hooks],
        lens_top1=[float(sums[f"top1:{h}"] / count) for h in hooks] if f"top1:{EMBED}" in sums else None,
        lens_maps=[m[layout.patch_slice].reshape(gh, gw).tolist() for m in maps],
        lens_prefix=[m[:layout.n_prefix].tolist() for m in maps], grid=[gh, gw], dla=dla, n_images=count,
        notes=notes)
