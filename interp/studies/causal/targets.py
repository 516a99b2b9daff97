"""What the causal tools explain about the output: a class's logit or probability, a logit difference, or (for a
head with no classes) the cosine to a reference output.

>>> logits = model(images)
>>> target = output_target(source.head(), source.final_readout(), (3, 5), logits)    # the difference 3 - 5
>>> target.kind, target.logit(logits).shape
('logit-diff', torch.Size([4]))
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Dict, Optional, Sequence, Tuple

import torch

KINDS = ("probability", "logit", "logit-diff", "cosine")


@dataclass
class OutputTarget:
    """One output coordinate per image and how it is read.

    Attributes:
        kind: "probability" (a classifier's class), "logit" (an output coordinate of a head that is not a
            classifier), "logit-diff" (A - B), "cosine" (no head: the cosine to a reference output).
        a: [b] the class of each image (None for "cosine"); b: [b] the subtracted class of "logit-diff".
        chosen: the classes as given (None: each image's top-1 output).
    """

    kind: str
    a: Optional[torch.Tensor]
    b: Optional[torch.Tensor] = None
    chosen: Optional[Tuple[int, ...]] = None

    def logit(self, out: torch.Tensor) -> torch.Tensor:
        """The attributed logit of outputs ``out`` [b, (t,) C]: class a's, minus class b's for a difference."""
        value = _take(out, self.a)
        return value if self.b is None else value - _take(out, self.b)

    def value(self, out: torch.Tensor) -> torch.Tensor:
        """What the lens reads of ``out`` [b, (t,) C]: class a's probability for "probability", else the logit."""
        if self.kind == "probability":
            return _take(out.float().softmax(-1), self.a)
        return self.logit(out)

    def direction(self, readout, logits: torch.Tensor) -> Tuple[torch.Tensor, torch.Tensor]:
        """(head row direction [b, d'], its bias [b]) of the attributed logit (``FinalReadout.class_directions``)."""
        w, bias = readout.class_directions(self.a)
        if self.b is not None:
            w_b, bias_b = readout.class_directions(self.b)
            w, bias = w - w_b, bias - bias_b
        return w, bias.cpu()

    def record(self) -> Dict:
        return {"kind": self.kind, "classes": list(self.chosen) if self.chosen else "top-1 output of each image"}


def _take(out: torch.Tensor, classes: torch.Tensor) -> torch.Tensor:
    index = classes.to(out.device).view(-1, *([1] * (out.ndim - 1)))
    return out.gather(-1, index.expand(*out.shape[:-1], 1)).squeeze(-1)


def output_target(head, readout, classes: Optional[Sequence[int]], logits: torch.Tensor) -> OutputTarget:
    """The target of a batch whose final outputs are ``logits`` [b, C] (``head``: ``source.head()``; ``readout``:
    ``source.final_readout()``; ``classes``: () / None, (C,) or (A, B))."""
    n = logits.shape[0]
    chosen = tuple(int(c) for c in classes) if classes else None
    if chosen and max(chosen) >= logits.shape[1]:
        raise ValueError(f"class {max(chosen)} does not exist: the output has {logits.shape[1]} coordinates")
    if readout is not None and not readout.has_head:
        return OutputTarget("cosine", None, None, chosen)
    if chosen and len(chosen) == 2:
        return OutputTarget("logit-diff", torch.full((n,), chosen[0]), torch.full((n,), chosen[1]), chosen)
    a = torch.full((n,), chosen[0]) if chosen else logits.argmax(-1)
    return OutputTarget("probability" if head.kind == "classifier" else "logit", a, None, chosen)
