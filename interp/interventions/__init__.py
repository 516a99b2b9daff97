"""Interventions: small serialisable edits applied to a ``HookedViT`` through hooks and structural state.

>>> from interp.interventions import NeuronAblation, SelectiveCLS, TestTimeRegister
>>> with model.intervene(TestTimeRegister({2: [17, 101]}), SelectiveCLS(k=1)):
...     logits = model(images)
>>> logits = model.run_with_interventions(images, [NeuronAblation({3: [7]})])
>>> logits.shape
torch.Size([4, 10])

Composition order (``interp.hooks.intervene``): interventions are stably sorted by stage,
structural first (``TestTimeRegister``, ``AttentionBias``), then neuron edits (``NeuronAblation``,
``Relocation``), then pooling (``SelectiveCLS``); ties keep the order given. Set-up runs in that order
(test-time registers of several ``TestTimeRegister`` sit in that order after the prefix tokens), and hooks
on one hook point run in that order; edits on different layers run in layer order. Everything is undone
on exit, also on exceptions. ``interp.patch.apply`` (:mod:`.export`) composes plain-module edits in the same
order.

Every edit works per image (a batch of b gives the same values as b batches of 1). The same edits can be
saved to a patch file and applied to a plain timm model (:mod:`interp.interventions.export`, also
reachable as ``interp.patch``). A new intervention is one module here (a dataclass subclassing
``Intervention`` with a ``kind``: it registers itself), imported below.
"""
from . import masks
from .ablation import NeuronAblation
from .attention_bias import AttentionBias
from .base import NEURON, POOLING, STRUCTURAL, EditContext, Intervention
from .high_norm_replacement import HighNormReplacement
from .register import TestTimeRegister
from .regcache import RegCache
from .relocation import Relocation
from .sae_features import SAEFeatureAblation
from .selective_aggregation import selective_aggregate
from .selective_cls import SelectiveCLS, SelectivePool
from .spec import interventions_from_spec
from .token_replacement import TokenReplacement

__all__ = [
    "Intervention", "EditContext", "NeuronAblation", "Relocation", "TestTimeRegister", "AttentionBias",
    "SelectiveCLS", "SelectivePool", "SAEFeatureAblation", "TokenReplacement", "HighNormReplacement", "RegCache",
    "selective_aggregate", "masks", "interventions_from_spec",
    "STRUCTURAL", "NEURON", "POOLING",
]
