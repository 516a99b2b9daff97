"""``TestTimeRegister``: a training-free register token that takes over the register neurons (docs/methods.md section 2).

>>> ttr = TestTimeRegister({2: [17, 101, 402, 655]})
>>> with model.intervene(ttr):
...     logits, cache = model.run_with_cache(images, names_filter="blocks.*.hook_resid_post")
...     n_prefix = model.layout.n_prefix      # inside the context: one more prefix token
>>> n_prefix, model.layout.n_prefix
(2, 1)
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, ClassVar, Dict

from ..errors import InterpError

from .base import STRUCTURAL, EditContext, Intervention, Neurons, check_choice, check_neurons, take_neurons
from .edits import PATCH_FILLS, VALUE_MODES
from .modules import RegisterNeuronEdit


@dataclass(eq=False)
class TestTimeRegister(Intervention):
    """Insert ``n_registers`` zero tokens (no position embedding) after the model's prefix tokens and, at every
    listed layer, right after the MLP non-linearity, move the register neurons' activity into them.

    Per image and listed layer: v = :func:`interp.interventions.edits.register_value` of the neurons over
    all tokens (before the edit); the register tokens get v for those neurons; on the patch tokens the
    neurons become 0 (``patch_fill="zero"``), the image's mean over patches (``"mean"``), or only
    values above mean + 1 std become the mean (``"outliers"``). CLS and trained registers are untouched.
    The added tokens count as prefix tokens (``model.layout``), so average pooling skips them and the head
    output keeps its shape.

    Args:
        neurons: ``{layer: [neuron, ...]}`` register neurons, ``"2:17,2:101"``, a neurons.json path or a
            neurons study result.
        n_registers: tokens to add, 1..``MAX_REGISTERS`` (each one is a token of every forward; raise the
            class attribute ``TestTimeRegister.MAX_REGISTERS`` to allow more).
        value: ``"layer_max"`` (reference code: one signed scalar per layer) or ``"neuron_max"``.
        patch_fill: ``"zero"``, ``"mean"`` or ``"outliers"``.
        force: use neurons a neurons study ranked on another model's weights (refused by default).
    """

    __test__ = False  # not a pytest test class despite the name

    neurons: Neurons
    n_registers: int = 1
    value: str = "layer_max"
    patch_fill: str = "zero"
    force: bool = field(default=False, repr=False)

    MAX_REGISTERS: ClassVar[int] = 1024
    kind = "TestTimeRegister"
    stage = STRUCTURAL

    def __post_init__(self):
        self.neurons = take_neurons(self)
        if isinstance(self.n_registers, bool) or not isinstance(self.n_registers, (int, float)) or \
                self.n_registers != int(self.n_registers):
            raise InterpError(f"n_registers must be a whole number, got {self.n_registers!r}")
        self.n_registers = int(self.n_registers)
        if self.n_registers < 1:
            raise ValueError(f"n_registers must be >= 1, got {self.n_registers}")
        if self.n_registers > self.MAX_REGISTERS:
            raise InterpError(f"n_registers={self.n_registers} is more than {self.MAX_REGISTERS} test-time registers "
                              "(each adds a token to every forward: memory and time grow with it; the papers use "
                              "1); raise TestTimeRegister.MAX_REGISTERS to allow more")
        check_choice("value", self.value, VALUE_MODES)
        check_choice("patch_fill", self.patch_fill, PATCH_FILLS)

    @property
    def n_extra_tokens(self) -> int:
        return self.n_registers

    def mlp_edits(self, ctx: EditContext):
        ctx.check_neurons(self.neurons)
        return {layer: RegisterNeuronEdit(idx, ctx.n_prefix, ctx.extra_start, self.n_registers, self.value,
                                          self.patch_fill)
                for layer, idx in self.neurons.items()}

    def params(self) -> Dict[str, Any]:
        return {"neurons": {str(l): idx for l, idx in self.neurons.items()}, "n_registers": self.n_registers,
                "value": self.value, "patch_fill": self.patch_fill}
