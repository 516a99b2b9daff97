"""``InterventionMixin``: apply intervention objects to a hooked model, and always undo them.

This layer knows nothing about the intervention classes (``interp.interventions`` sits above it); it
only calls a small protocol on each object:

* ``stage`` (int, class attribute): where it runs in a composition (see the rule below).
* ``setup(model, state) -> EditState`` (optional): return ``state`` (an :class:`~.edit_state.EditState`,
  immutable) with this intervention's structural edits added (test-time registers, extra key/values, a
  pooling override). It must not change the model: ``intervene`` installs the final state itself.
* ``attach(model) -> [(hook_name, fn), ...]``: forward hooks ``fn(tensor, hook) -> tensor``; called once
  ``model.edit_state`` holds every intervention's edits (so ``model.layout`` counts all test-time registers).
* ``teardown(model)`` (optional): forget what ``setup`` recorded on the intervention itself.

Composition rule (the order edits take effect):

1. Interventions are sorted by ``stage``, a stable sort (ties keep the order given):
   0 = structural (``TestTimeRegister``, ``AttentionBias``), 1 = neuron edits (``NeuronAblation``,
   ``Relocation``), 2 = pooling (``SelectiveCLS``).
2. ``setup`` runs in that order, each on the state the previous one returned, starting from the model's
   current ``edit_state`` (so the test-time registers of two ``TestTimeRegister`` sit in that order after
   the model's prefix tokens); the result becomes ``model.edit_state``; then every ``attach`` runs; hooks on
   one hook point run in that order. Hooks on different layers run in layer order because the forward runs layer by layer.
3. Hooks added inside the context (``run_with_cache``, ``run_with_hooks``) run after the interventions'
   hooks, so caches see the edited values.
4. On exit, also on an exception, all hooks are removed, the previous ``edit_state`` object is put back
   and ``teardown`` runs in reverse order.

>>> from interp.interventions import SelectiveCLS, TestTimeRegister
>>> with model.intervene(TestTimeRegister({2: [17, 101]}), SelectiveCLS(k=1)):
...     logits, cache = model.run_with_cache(images, names_filter="blocks.5.hook_resid_post")
>>> cache["blocks.5.hook_resid_post"].shape    # [b, t, d]: CLS + the test-time register + 196 patches
torch.Size([4, 198, 192])
"""
from __future__ import annotations

from contextlib import contextmanager
from typing import Any, Callable, Iterator, List, Sequence, Tuple

from .edit_state import EditState


def composition_order(interventions: Sequence[Any]) -> List[Any]:
    """The interventions in the order they are set up and their hooks run (stable sort by ``stage``).

    Raises:
        TypeError: an object does not follow the intervention protocol, or one object is given twice.
    """
    items = list(interventions)
    for item in items:
        if not callable(getattr(item, "attach", None)) or not isinstance(getattr(item, "stage", None), int):
            raise TypeError(
                f"{type(item).__name__} is not an intervention: it needs an int `stage` and an "
                "`attach(model) -> [(hook_name, fn)]` method (see interp.interventions)"
            )
    if len({id(item) for item in items}) != len(items):
        raise TypeError("the same intervention object is given twice; pass it once (or a copy)")
    return sorted(items, key=lambda item: item.stage)


def _flatten(interventions: Tuple[Any, ...]) -> List[Any]:
    """Accept ``intervene(a, b)`` and ``intervene([a, b])``."""
    if len(interventions) == 1 and isinstance(interventions[0], (list, tuple)):
        return list(interventions[0])
    return list(interventions)


def _checked_state(item: Any, state: Any) -> EditState:
    if not isinstance(state, EditState):
        raise TypeError(f"{type(item).__name__}.setup(model, state) returned {type(state).__name__}; it must "
                        "return the EditState it was given, with its own edits added")
    return state


class InterventionMixin:
    """Adds ``intervene`` and ``run_with_interventions`` to a ``HookedRootModule`` (HookedViT)."""

    @contextmanager
    def intervene(self, *interventions: Any) -> Iterator["InterventionMixin"]:
        """Context manager: the model with ``interventions`` applied (composition rule in the module doc).

        >>> from interp.interventions import NeuronAblation, SelectiveCLS
        >>> with model.intervene(NeuronAblation({3: [7]}), SelectiveCLS()):
        ...     logits = model(images)
        >>> logits.shape
        torch.Size([4, 10])
        """
        ordered = composition_order(_flatten(interventions))
        previous: EditState = self.edit_state
        set_up: List[Any] = []
        try:
            state = previous
            for item in ordered:
                setup = getattr(item, "setup", None)
                new_state = setup(self, state) if setup is not None else state
                set_up.append(item)
                state = _checked_state(item, new_state)
            self.edit_state = state
            fwd_hooks: List[Tuple[str, Callable]] = []
            for item in ordered:
                fwd_hooks.extend(item.attach(self))
            with self.hooks(fwd_hooks=fwd_hooks):
                yield self
        finally:
            self.edit_state = previous
            errors = []
            for item in reversed(set_up):
                teardown = getattr(item, "teardown", None)
                if teardown is None:
                    continue
                try:
                    teardown(self)
                except Exception as e:  # keep undoing the others, then report the first failure
                    errors.append(e)
            if errors:
                raise errors[0]

    def run_with_interventions(self, x, interventions: Sequence[Any], fwd_hooks=(), **forward_kwargs):
        """One forward pass with ``interventions`` applied (and optional extra ``fwd_hooks`` after them).

        Returns whatever ``forward`` returns (logits [b, n_classes] by default).
        """
        with self.intervene(*list(interventions)):
            if fwd_hooks:
                return self.run_with_hooks(x, fwd_hooks=list(fwd_hooks), **forward_kwargs)
            return self(x, **forward_kwargs)
