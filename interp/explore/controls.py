"""Which of the page's edit controls a model does not define, and why: the page disables them with the reason as
their tooltip, instead of offering an edit that can only fail (a pyramid has no slot for an extra token and no
CLS token)."""
from __future__ import annotations

from typing import Dict, Optional


def refused_controls(family, layout) -> Dict[str, Optional[str]]:
    """{"register" (the test-time register), "selcls" (SelectiveCLS), "head" (the CLS attention's head
    selector): why this model does not define it, or None where it does}. ``family``: the model's
    :class:`~interp.models.families.base.Family`; ``layout``: its :class:`~interp.models.layout.TokenLayout`."""
    tokens = family.extra_tokens_refusal
    no_cls = None if layout.cls_index is not None else "this model has no CLS token"
    return {"register": tokens and f"test-time registers are not defined here: {tokens}",
            "selcls": no_cls and f"SelectiveCLS chooses what the CLS token attends to: {no_cls}",
            "head": no_cls and f"the attention heads' maps are the CLS token's: {no_cls}"}
