"""Token replacement: the hidden state of chosen tokens overwritten at block outputs, by zero or by a replacement
that keeps the tokens in distribution (Parodi, Matelsky, Segado 2026, arXiv 2604.14433; docs/methods.md section 2).

The replacements (``mode``):

* ``zero``: the rows set to 0 (what "ablating a token" usually means; out of distribution);
* ``mean``: each row set to its mean at that block over a calibration image set (``means`` [B, n, d]);
* ``noise``: each row drawn from a Gaussian with the calibration set's per-block, per-token, per-channel mean and
  standard deviation (``means``, ``stds``), from a generator seeded by ``seed`` (a fresh draw per forward, so a
  batch's noise depends on the batches before it);
* ``shuffle``: each row taken from another image of the batch, a fresh derangement per block; a batch of one image
  takes it from a calibration bank instead (``bank`` [B, K, n, d], K calibration images).

Fix-Reg-Mean (Sun et al. 2024, ``locuslab/massive-activations`` ``lib/eval_utils.py``, ``fix_reg_mean``) is ``mean``
on the registers at the input of every block: :func:`fix_reg_mean` builds it (the register rows entering block 0 are
the learned register tokens themselves, the same for every image, so it edits the outputs of blocks 0..L-2).

>>> from interp.interventions.token_replacement import TokenReplacement, calibrate, token_rows
>>> rows = token_rows(model.layout, "cls")
>>> stats = calibrate(model, images, rows)                       # per block mean, std, a bank; streamed
>>> edit = TokenReplacement(rows, "mean", means=stats.means)     # every block's output
>>> model.run_with_interventions(images, [edit]).shape
torch.Size([4, 10])
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Dict, Iterable, List, NamedTuple, Optional, Sequence, Union

import torch
from torch import nn

from ..errors import InterpError
from ..models.layout import TokenLayout
from .base import NEURON, EditContext, Intervention, check_choice
from .edits import derangement

REPLACEMENTS = ("zero", "mean", "noise", "shuffle")
BANK_SIZE = 16  # calibration images kept per block for shuffling a batch of one


def token_rows(layout: TokenLayout, target: str, seed: int = 0) -> List[int]:
    """The rows of the token axis ``target`` names, in the model's own layout (prefix tokens first).

    Args:
        target: ``cls``; ``registers`` (every trained register / storage token); ``register:I`` (the I-th);
            ``patches:I,J,...`` (flat patch indices); ``random:K`` (K patches drawn with ``seed``, a control).

    Raises:
        InterpError: a model without that kind of token, an index out of range, or an unknown target.
    """
    kind, _, arg = str(target).partition(":")
    if layout.stage_grids:
        raise InterpError("token replacement needs one token axis for every block; a pyramid's stages have their "
                          "own grids and no prefix tokens")
    if kind == "cls":
        if layout.cls_index is None:
            raise InterpError("target cls: the model has no CLS token")
        return [layout.cls_index]
    if kind in ("registers", "register"):
        regs = list(range(layout.register_slice.start, layout.register_slice.stop))
        if not regs:
            raise InterpError(f"target {target}: the model has no register tokens")
        if kind == "registers":
            return regs
        i = _index(arg, target)
        if i >= len(regs):
            raise InterpError(f"target {target}: the model has registers 0..{len(regs) - 1}")
        return [regs[i]]
    if kind == "patches":
        picked = [_index(a, target) for a in arg.split(",") if a.strip()]
        if not picked or max(picked) >= layout.n_patches or len(set(picked)) != len(picked):
            raise InterpError(f"target {target}: give distinct patch indices 0..{layout.n_patches - 1}")
        return [layout.n_prefix + p for p in picked]
    if kind == "random":
        k = _index(arg, target)
        if not 1 <= k <= layout.n_patches:
            raise InterpError(f"target {target}: K must be 1..{layout.n_patches}")
        g = torch.Generator().manual_seed(int(seed))
        return sorted(layout.n_prefix + int(p) for p in torch.randperm(layout.n_patches, generator=g)[:k])
    raise InterpError(f"unknown target {target!r}: cls, registers, register:I, patches:I,J,... or random:K")


def _index(text: str, target: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise InterpError(f"target {target}: expected a whole number after ':'") from None
    if value < 0:
        raise InterpError(f"target {target}: indices are >= 0")
    return value


class Calibration(NamedTuple):
    """What :func:`calibrate` measured at the outputs of ``blocks``: ``means`` and ``stds`` [B, n, d] (float32,
    per block, token row and channel) and ``bank`` [B, K, n, d] (the first K images' rows)."""

    blocks: List[int]
    means: torch.Tensor
    stds: torch.Tensor
    bank: torch.Tensor


def calibration_from(rows: Iterable[torch.Tensor], blocks: Sequence[int], bank_size: int = BANK_SIZE) -> Calibration:
    """The :class:`Calibration` of batches of token rows [b, B, n, d] (B = ``blocks``), streamed: sums in float64,
    the first ``bank_size`` images kept."""
    total, sq, n, bank = 0.0, 0.0, 0, []
    for x in rows:
        x = x.double().cpu()
        total, sq, n = total + x.sum(0), sq + (x * x).sum(0), n + len(x)
        kept = sum(len(b) for b in bank)
        if kept < bank_size:
            bank.append(x[:bank_size - kept].float())
    if not n:
        raise InterpError("calibration needs at least one image")
    means = total / n
    stds = (sq / n - means * means).clamp_min(0).sqrt()
    return Calibration(list(blocks), means.float(), stds.float(), torch.cat(bank).transpose(0, 1).contiguous())


@torch.no_grad()
def calibrate(model, images: Union[torch.Tensor, Iterable[torch.Tensor]], rows: Sequence[int],
              blocks: Optional[Sequence[int]] = None, batch_size: int = 16, bank_size: int = BANK_SIZE) -> Calibration:
    """Per-block statistics of the ``rows`` at the outputs of ``blocks`` (default every block) of ``model`` (a
    ``HookedViT``, under the interventions it is run with) over ``images`` (a preprocessed Tensor [N, 3, H, W], cut
    into batches of ``batch_size``, or an iterable of such batches), streamed (:func:`calibration_from`)."""
    blocks = list(range(model.n_layers)) if blocks is None else [int(b) for b in blocks]
    hooks = [model.block_names.resid_post(b) for b in blocks]
    idx = torch.as_tensor(list(rows), dtype=torch.long)
    batches = (images[s:s + batch_size] for s in range(0, len(images), batch_size)) \
        if isinstance(images, torch.Tensor) else images

    def row_batches():
        for x in batches:
            seen: Dict[str, torch.Tensor] = {}
            model.run_with_hooks(x, fwd_hooks=[(h, lambda t, hook: seen.__setitem__(
                hook.name, t[:, idx.to(t.device)].detach().cpu())) for h in hooks])
            yield torch.stack([seen[h] for h in hooks], 1)  # [b, B, n, d]

    return calibration_from(row_batches(), blocks, bank_size)


class RowReplacement(nn.Module):
    """Block ``layer``'s output [b, t, d] with ``rows`` replaced (one block's share of a :class:`TokenReplacement`)."""

    def __init__(self, rows: torch.Tensor, mode: str, mean=None, std=None, bank=None, generator=None):
        super().__init__()
        self.mode, self.generator = mode, generator
        self.register_buffer("rows", rows, persistent=False)
        for name, t in (("mean", mean), ("std", std), ("bank", bank)):
            self.register_buffer(name, None if t is None else t.float(), persistent=False)

    def _draw(self, shape, device) -> torch.Tensor:
        return torch.randn(shape, generator=self.generator).to(device)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = x.clone()
        b, rows = x.shape[0], self.rows
        if self.mode == "zero":
            out[:, rows] = 0
        elif self.mode == "mean":
            out[:, rows] = self.mean.to(x.dtype)
        elif self.mode == "noise":
            out[:, rows] = (self.mean + self.std * self._draw((b, *self.mean.shape), x.device)).to(x.dtype)
        elif b > 1:  # shuffle within the batch: every image gets another image's rows
            out[:, rows] = x[derangement(b, self.generator).to(x.device)][:, rows]
        else:  # one image: rows of a calibration image
            pick = torch.randint(0, self.bank.shape[0], (b,), generator=self.generator)
            out[:, rows] = self.bank[pick.to(self.bank.device)].to(x.dtype)
        return out


@dataclass(eq=False)
class TokenReplacement(Intervention):
    """Replace the hidden state of ``rows`` at the outputs of ``blocks`` (see the module docstring).

    Args:
        rows: token rows in the model's own layout (:func:`token_rows`); patch rows move behind test-time
            registers when another intervention adds some.
        mode: ``zero``, ``mean``, ``noise`` or ``shuffle``.
        blocks: the blocks whose output is edited (default: every block, as Parodi et al.); with calibration
            tensors, in the order of their first axis.
        means, stds: [B, n, d] calibration statistics (:func:`calibrate`); ``mean`` needs ``means``, ``noise``
            both.
        bank: [B, K, n, d] calibration rows, for ``shuffle`` on a batch of one image.
        seed: the noise and shuffle generator's seed.
    """

    rows: Sequence[int] = ()
    mode: str = "zero"
    blocks: Optional[Sequence[int]] = None
    means: Optional[torch.Tensor] = field(default=None, repr=False)
    stds: Optional[torch.Tensor] = field(default=None, repr=False)
    bank: Optional[torch.Tensor] = field(default=None, repr=False)
    seed: int = 0

    kind = "TokenReplacement"
    stage = NEURON

    def __post_init__(self):
        check_choice("mode", self.mode, REPLACEMENTS)
        self._generator = torch.Generator().manual_seed(int(self.seed))  # advances over every forward it edits
        self.rows = [int(r) for r in self.rows]
        if not self.rows or min(self.rows) < 0 or len(set(self.rows)) != len(self.rows):
            raise ValueError(f"rows must be distinct token rows >= 0, got {self.rows}")
        self.blocks = None if self.blocks is None else [int(b) for b in self.blocks]
        needs = {"mean": ("means",), "noise": ("means", "stds")}.get(self.mode, ())
        for name in needs:
            if getattr(self, name) is None:
                raise ValueError(f"mode={self.mode!r} needs {name} from a calibration set (token_replacement.calibrate)")
        for name in ("means", "stds"):
            t = getattr(self, name)
            if t is not None and (t.ndim != 3 or t.shape[1] != len(self.rows)):
                raise ValueError(f"{name} must be [blocks, {len(self.rows)} rows, d], got {tuple(t.shape)}")
            if t is not None and self.blocks is not None and t.shape[0] != len(self.blocks):
                raise ValueError(f"{name} holds {t.shape[0]} blocks, blocks names {len(self.blocks)}")

    def _blocks(self, n_layers: int) -> List[int]:
        blocks = list(range(n_layers)) if self.blocks is None else self.blocks
        if blocks and max(blocks) >= n_layers:
            raise InterpError(f"block {max(blocks)} does not exist: the model has blocks 0..{n_layers - 1}")
        for name in ("means", "stds", "bank"):
            t = getattr(self, name)
            if t is not None and t.shape[0] != len(blocks):
                raise InterpError(f"the calibration's {name} hold {t.shape[0]} blocks; the edit names {len(blocks)}")
        return blocks

    def resid_edits(self, ctx: EditContext) -> Dict[int, nn.Module]:
        shift = ctx.n_prefix - ctx.base_prefix  # test-time registers sit between the prefix and the patches
        rows = torch.tensor([r if r < ctx.base_prefix else r + shift for r in self.rows])
        if self.mode == "shuffle" and self.bank is None:
            raise InterpError("shuffle needs a calibration bank for batches of one image: pass bank= "
                              "(token_replacement.calibrate)")
        return {layer: RowReplacement(rows, self.mode, *(None if t is None else t[i] for t in
                                                         (self.means, self.stds, self.bank)), generator=self._generator)
                for i, layer in enumerate(self._blocks(ctx.n_layers))}

    # ------------------------------------------------------------------ serialisation
    def params(self) -> Dict[str, Any]:
        return {"rows": self.rows, "mode": self.mode, "blocks": self.blocks, "seed": self.seed}

    def tensors(self) -> Dict[str, torch.Tensor]:
        return {name: t for name in ("means", "stds", "bank") if (t := getattr(self, name)) is not None}

    @classmethod
    def from_params(cls, params, tensors):
        return cls(**params, **{k: v for k, v in tensors.items() if k in ("means", "stds", "bank")})


def fix_reg_mean(model, images, batch_size: int = 16) -> TokenReplacement:
    """Sun et al.'s Fix-Reg-Mean: every register token replaced at the input of every block by its mean there over
    ``images`` (block 0's input holds the learned register tokens themselves, so blocks 0..L-2's outputs are
    edited)."""
    rows = token_rows(model.layout, "registers")
    blocks = list(range(model.n_layers - 1))
    if not blocks:
        raise InterpError("Fix-Reg-Mean needs at least two blocks")
    stats = calibrate(model, images, rows, blocks, batch_size)
    return TokenReplacement(rows, "mean", blocks=blocks, means=stats.means)
