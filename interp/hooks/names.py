"""Hook names: the names of a model's blocks (:class:`BlockNames`, one spelling for the whole package) and
resolution of hook specifications (exact names, glob patterns, lists, callables) to hook names.

A block's hook names are its prefix, its module path in timm (``blocks.3`` in a ViT or an Eva,
``stages.2.blocks.0`` in PVTv2, ``layers.2.blocks.0`` in Swin-v2), then a leaf (``hook_resid_post``,
``attn.hook_q``, ``mlp.hook_post``...). Code that serves every model family builds names from the model's
:class:`BlockNames` (``model.block_names``, ``source.blocks``) with a flat block index ``layer`` (0 = the first
block of the whole model); the module-level builders spell the ``blocks.{i}`` names of single-stage models.

>>> resid_post(11), mlp_post(2), attn_pattern(0)
('blocks.11.hook_resid_post', 'blocks.2.mlp.hook_post', 'blocks.0.attn.hook_pattern')
>>> block_of("blocks.3.attn.hook_z"), block_of("hook_logits")
(3, None)
>>> pvt = BlockNames(("stages.0.blocks.0", "stages.0.blocks.1", "stages.1.blocks.0"))
>>> pvt.resid_post(2), pvt.block_of("stages.0.blocks.1.mlp.hook_post"), pvt.label(2)
('stages.1.blocks.0.hook_resid_post', 1, 'stage 1 block 0')
"""
from __future__ import annotations

import fnmatch
import re
from dataclasses import dataclass, field
from typing import Callable, Iterable, List, Optional, Sequence, Tuple, Union

from ..errors import HookNameError, InterpError, close_matches

NamesSpec = Union[None, str, Sequence[str], Callable[[str], bool]]

_GLOB_CHARS = set("*?[")
EVERY_BLOCK = "*"  # pass as the layer to get a glob pattern over all blocks: resid_post(EVERY_BLOCK)
_BLOCK_RE = re.compile(r"blocks\.(\d+)\.")
_STAGED_RE = re.compile(r"(?:stages|layers)\.(\d+)\.blocks\.(\d+)$")
_PREFIX_RE = re.compile(r"((?:stages|layers)\.\d+\.blocks\.\d+|blocks\.\d+)\.")  # a block's prefix in a hook name


# Root hooks that fire before block 0 (a forward with stop_at_layer=0 runs them): the patch embedding's output
# [b, P, d] (before prefix tokens and position embedding) and the token sequence entering block 0 [b, t, d].
PATCH_EMBED = "hook_patch_embed"
EMBED = "hook_embed"
EMBEDDING_HOOKS = (PATCH_EMBED, EMBED)

# The two residual-stream points per block where norms are tracked: after attention, after the MLP.
RESID_STAGES = ("resid_mid", "resid_post")


def resolve_block(value: Optional[int], n_layers: int, default: int = -1) -> int:
    """A block index as options take it (None: ``default``; negative counts from the end) -> 0..n_layers-1.

    Raises:
        InterpError: no such block in an ``n_layers``-block model.
    """
    layer = default if value is None else int(value)
    resolved = layer + n_layers if layer < 0 else layer
    if not 0 <= resolved < n_layers:
        raise InterpError(f"block {layer} is out of range for a model with {n_layers} blocks (0-{n_layers - 1}, "
                          "or negative from the end)")
    return resolved


def block_hook(layer, name: str) -> str:
    """``blocks.{layer}.{name}``: the hook ``name`` (e.g. ``hook_resid_post``, ``attn.hook_q``) of one block."""
    return f"blocks.{layer}.{name}"


def resid_pre(layer) -> str:
    """Residual stream entering block ``layer`` [b, t, d]."""
    return block_hook(layer, "hook_resid_pre")


def resid_mid(layer) -> str:
    """Residual stream after the attention step of block ``layer`` [b, t, d]."""
    return block_hook(layer, "hook_resid_mid")


def resid_stage(layer, stage: str) -> str:
    """``blocks.{layer}.hook_{stage}`` for a stage of :data:`RESID_STAGES` (``resid_mid`` or ``resid_post``)."""
    if stage not in RESID_STAGES:
        raise HookNameError(f"stage {stage!r}: use one of {RESID_STAGES}")
    return block_hook(layer, f"hook_{stage}")


def resid_post(layer) -> str:
    """Output of block ``layer`` (un-normalised residual stream) [b, t, d]."""
    return block_hook(layer, "hook_resid_post")


def attn_out(layer) -> str:
    """Attention output of block ``layer`` after LayerScale [b, t, d]."""
    return block_hook(layer, "hook_attn_out")


def mlp_out(layer) -> str:
    """MLP output of block ``layer`` after LayerScale [b, t, d]."""
    return block_hook(layer, "hook_mlp_out")


def mlp_pre(layer) -> str:
    """fc1 output of block ``layer`` [b, t, d_mlp]."""
    return block_hook(layer, "mlp.hook_pre")


def mlp_post(layer) -> str:
    """MLP hidden activation after the non-linearity (the fc2 input) of block ``layer`` [b, t, d_mlp]."""
    return block_hook(layer, "mlp.hook_post")


def attn_q(layer) -> str:
    """Queries of block ``layer`` [b, t, h, dh]."""
    return block_hook(layer, "attn.hook_q")


def attn_k(layer) -> str:
    """Keys of block ``layer`` [b, t, h, dh]."""
    return block_hook(layer, "attn.hook_k")


def attn_v(layer) -> str:
    """Values of block ``layer`` [b, t, h, dh]."""
    return block_hook(layer, "attn.hook_v")


def attn_z(layer) -> str:
    """Per-head attention outputs of block ``layer`` [b, t, h, dh]."""
    return block_hook(layer, "attn.hook_z")


def attn_scores(layer) -> str:
    """Pre-softmax attention scores of block ``layer`` [b, h, t, t]."""
    return block_hook(layer, "attn.hook_attn_scores")


def attn_pattern(layer) -> str:
    """Attention pattern (post-softmax) of block ``layer`` [b, h, t, t]."""
    return block_hook(layer, "attn.hook_pattern")


def block_of(name: str) -> Optional[int]:
    """The block index of a per-block hook name, None for a root hook (``hook_embed``, ``hook_logits``...)."""
    m = _BLOCK_RE.match(name)
    return int(m.group(1)) if m else None


def block_prefix(name: str) -> Optional[str]:
    """The block prefix of a per-block hook name (``blocks.3``, or ``stages.1.blocks.0`` in a pyramid), None for a
    root hook."""
    m = _PREFIX_RE.match(name)
    return m.group(1) if m else None


def blocks_needed(hook_names: Sequence[str]) -> Optional[int]:
    """How many blocks a forward must run so every hook in ``hook_names`` fires (``stop_at_layer``), or
    None when one of them needs the full forward (``hook_norm_final``, ``hook_pooled``, ``hook_logits``...)."""
    needed = 0
    for name in hook_names:
        block = block_of(name)
        if block is not None:
            needed = max(needed, block + 1)
        elif name not in EMBEDDING_HOOKS:
            return None
    return needed


def is_pattern(name: str) -> bool:
    return any(c in _GLOB_CHARS for c in name)


def unknown_hook_error(name: str, known: Sequence[str]) -> HookNameError:
    block = block_of(name)
    prefixes = list(dict.fromkeys(m.group(1) for m in map(_PREFIX_RE.match, known) if m))  # forward order
    if block is not None and (block >= len(prefixes) or prefixes[block] != f"blocks.{block}"):
        rest, n = name[len(f"blocks.{block}."):], len(prefixes)
        if n == 0:
            return HookNameError(f"hook name {name!r}: this model has no blocks")
        flat = prefixes[0] == "blocks.0"
        shown = f"{n} blocks ({'0-' + str(n - 1) if flat else prefixes[0] + ' .. ' + prefixes[-1]})"
        if block < n:  # a pyramid names its blocks by stage (PVTv2, Swin-v2)
            staged = prefixes[block] + "." + rest
            fix = staged if staged in known else next(iter(close_matches(staged, known, n=1)), staged)
            return HookNameError(f"hook name {name!r}: this model names its {shown} by stage; did you mean "
                                 f"{fix!r}?")
        return HookNameError(f"hook name {name!r}: block {block} does not exist, this model has {shown}; "
                             f"last: {prefixes[-1] + '.' + rest!r}")
    hints = close_matches(name, known, n=3)
    while len(hints) > 1 and len(", ".join(hints)) > 80:  # the refusal stays one short line (pyramid names are long)
        hints.pop()
    hint = f" Close matches: {', '.join(hints)}." if hints else ""
    kind = "pattern" if is_pattern(name) else "hook name"
    return HookNameError(f"{kind} {name!r} matches no hook point.{hint} List them: `interp hooks MODEL`")


def match(name_or_pattern: str, known: Sequence[str]) -> List[str]:
    """Hook names matching one exact name or glob pattern (``blocks.*.hook_resid_post``), in model order.

    Raises:
        HookNameError: nothing matches; the message lists close matches.
    """
    if is_pattern(name_or_pattern):
        found = [n for n in known if fnmatch.fnmatchcase(n, name_or_pattern)]
    else:
        found = [name_or_pattern] if name_or_pattern in set(known) else []
    if not found:
        raise unknown_hook_error(name_or_pattern, known)
    return found


def resolve(spec: NamesSpec, known: Sequence[str]) -> List[str]:
    """All hook names selected by ``spec`` (None = all), in model order, without duplicates."""
    if spec is None:
        return list(known)
    if callable(spec):
        return [n for n in known if spec(n)]
    if isinstance(spec, str):
        spec = [spec]
    chosen = set()
    for item in spec:
        if not isinstance(item, str):
            raise TypeError(f"hook names must be strings, got {type(item).__name__}")
        chosen.update(match(item, known))
    return [n for n in known if n in chosen]


@dataclass(frozen=True)
class BlockNames:
    """The hook-name prefix of every block of one model, in forward order (torch-free, JSON-able).

    ``layer`` everywhere is the flat block index (0 .. n - 1, negative from the end). Every builder of the
    module-level API has a method of the same name here.

    Attributes:
        prefixes: ``("blocks.0", "blocks.1", ...)``, or ``("stages.0.blocks.0", ...)`` for a staged model.
    """

    prefixes: Tuple[str, ...]
    _index: dict = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "prefixes", tuple(self.prefixes))
        object.__setattr__(self, "_index", {p: i for i, p in enumerate(self.prefixes)})

    @classmethod
    def flat(cls, n_layers: int) -> "BlockNames":
        """``blocks.0 .. blocks.{n-1}``: the blocks of a single-stage model (ViT, Eva)."""
        return cls(tuple(f"blocks.{i}" for i in range(n_layers)))

    @classmethod
    def from_hooks(cls, hook_names: Iterable[str]) -> "BlockNames":
        """The blocks named by ``hook_names`` (every block must have its ``hook_resid_post`` there)."""
        prefixes = []
        for name in hook_names:
            m = _PREFIX_RE.match(name)
            if m and name == f"{m.group(1)}.hook_resid_post":
                prefixes.append(m.group(1))
        return cls(tuple(prefixes))

    def __len__(self) -> int:
        return len(self.prefixes)

    @property
    def n_layers(self) -> int:
        return len(self.prefixes)

    @property
    def staged(self) -> bool:
        """True when blocks are named by stage (a pyramid model)."""
        return bool(self.prefixes) and not self.prefixes[0].startswith("blocks.")

    def index(self, layer: int) -> int:
        """``layer`` as a non-negative index (``-1`` -> the last block).

        Raises:
            HookNameError: no such block (the valid range named).
        """
        n = len(self.prefixes)
        if isinstance(layer, bool) or not isinstance(layer, int) or not -n <= layer < n:
            raise HookNameError(f"block {layer!r} does not exist: the model has {n} blocks (0-{n - 1}, or -1 for "
                                "the last)")
        return layer % n

    def hook(self, layer: int, leaf: str) -> str:
        """``{prefix of block layer}.{leaf}`` (``leaf``: ``hook_resid_post``, ``attn.hook_q``...)."""
        return f"{self.prefixes[self.index(layer)]}.{leaf}"

    def every(self, leaf: str) -> List[str]:
        """``leaf`` of every block, in order."""
        return [f"{p}.{leaf}" for p in self.prefixes]

    def block_of(self, name: str) -> Optional[int]:
        """The flat block index of a per-block hook name, None for a root hook (``hook_embed``...)."""
        m = _PREFIX_RE.match(name)
        return self._index.get(m.group(1)) if m else None

    def label(self, layer: int) -> str:
        """What figures and messages call block ``layer``: ``block 7``, or ``stage 2 block 1`` when staged."""
        i = self.index(layer)
        m = _STAGED_RE.match(self.prefixes[i])
        return f"stage {m.group(1)} block {m.group(2)}" if m else f"block {i}"

    def short(self, layer: int) -> str:
        """A compact label for axis ticks: ``7``, or ``s2.b1`` when staged."""
        i = self.index(layer)
        m = _STAGED_RE.match(self.prefixes[i])
        return f"s{m.group(1)}.b{m.group(2)}" if m else str(i)

    def layout_of(self, layout, hook: str):
        """The layout of ``hook``'s token rows: ``layout.for_block`` of its block (of the first block for the
        embedding hooks, of the last for the final ones); ``layout`` itself on a single-grid model."""
        block = self.block_of(hook)
        if block is None:
            block = 0 if hook in EMBEDDING_HOOKS else len(self.prefixes) - 1
        return layout.for_block(block) if self.prefixes else layout

    def blocks_needed(self, hook_names: Sequence[str]) -> Optional[int]:
        """How many blocks a forward must run so every hook fires (``stop_at_layer``), or None when one needs
        the full forward (``hook_norm_final``, ``hook_pooled``, ``hook_logits``...)."""
        needed = 0
        for name in hook_names:
            block = self.block_of(name)
            if block is not None:
                needed = max(needed, block + 1)
            elif name not in EMBEDDING_HOOKS:
                return None
        return needed

    def resid_pre(self, layer: int) -> str:
        return self.hook(layer, "hook_resid_pre")

    def resid_mid(self, layer: int) -> str:
        return self.hook(layer, "hook_resid_mid")

    def resid_post(self, layer: int) -> str:
        return self.hook(layer, "hook_resid_post")

    def resid_stage(self, layer: int, stage: str) -> str:
        if stage not in RESID_STAGES:
            raise HookNameError(f"stage {stage!r}: use one of {RESID_STAGES}")
        return self.hook(layer, f"hook_{stage}")

    def attn_out(self, layer: int) -> str:
        return self.hook(layer, "hook_attn_out")

    def mlp_out(self, layer: int) -> str:
        return self.hook(layer, "hook_mlp_out")

    def mlp_pre(self, layer: int) -> str:
        return self.hook(layer, "mlp.hook_pre")

    def mlp_post(self, layer: int) -> str:
        return self.hook(layer, "mlp.hook_post")

    def attn_q(self, layer: int) -> str:
        return self.hook(layer, "attn.hook_q")

    def attn_k(self, layer: int) -> str:
        return self.hook(layer, "attn.hook_k")

    def attn_v(self, layer: int) -> str:
        return self.hook(layer, "attn.hook_v")

    def attn_z(self, layer: int) -> str:
        return self.hook(layer, "attn.hook_z")

    def attn_scores(self, layer: int) -> str:
        return self.hook(layer, "attn.hook_attn_scores")

    def attn_pattern(self, layer: int) -> str:
        return self.hook(layer, "attn.hook_pattern")

