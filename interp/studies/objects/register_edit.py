"""The test-time register the object studies also run with (``--neurons``; Jiang et al.'s edit,
:class:`~interp.interventions.TestTimeRegister`), or an edit handed in from Python."""
from __future__ import annotations

from typing import Any, Optional

from ...errors import InterpError
from ...interventions import TestTimeRegister
from ...interventions.neuron_sets import neuron_set


def study_edit(neurons: Any, n_registers: int = 1, intervention: Any = None) -> Optional[Any]:
    """``intervention`` when given, else the ``TestTimeRegister`` fed by ``neurons`` (any form of
    :func:`~interp.interventions.neuron_sets.neuron_set`; None or empty: no edit)."""
    if neurons is None or (isinstance(neurons, str) and not neurons.strip()):
        return intervention
    if intervention is not None:
        raise InterpError("give the edit by intervention= or by neurons=, not both")
    return TestTimeRegister(neuron_set(neurons, label="--neurons").neurons, n_registers=n_registers)
