"""``interp hooks MODEL``: print every hook name with its shape."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

from ..options import Options, group, option
from .common import load_model
from .groups import ModelOptions, SeedOption
from .inputs import RunInputs, command


@dataclass(frozen=True, kw_only=True)
class HooksOptions(Options):
    model: ModelOptions = group(ModelOptions)
    seed: SeedOption = group(SeedOption)
    pattern: Optional[str] = option(None, "only hooks matching this glob, e.g. 'blocks.*.mlp.*'")


def register(sub) -> None:
    command(sub, "hooks", HooksOptions, run, help="list every hook name with its shape",
            description="Print every hook point of MODEL with its activation shape for one image.")


def run(options: HooksOptions, inputs: RunInputs) -> int:
    model = load_model(inputs, (options,))
    shapes = model.hook_shapes()
    names = model.resolve_hooks(options.pattern) if options.pattern else model.hook_names()
    print(f"# {model!r}")
    print(f"# layout: {model.layout.to_dict()}")
    print(f"# position table: {_pos_table_line(model)}")
    width = max(len(n) for n in names)
    for n in names:
        shape = list(shapes[n]) if n in shapes else "(fires only while SelectiveCLS is active)"
        print(f"{n:<{width}}  {shape}")
    return 0


def _pos_table_line(model) -> str:
    """How the weights' position table met the model's input size (``HookedViT.pos_resample``)."""
    how = getattr(model, "pos_resample", None)
    if how is None:
        return "not resampled (the weights' own grid, or weights built at this size)"
    return f"resampled to {model.layout.grid[0]}x{model.layout.grid[1]} with {how} arithmetic (--pos-resample)"
