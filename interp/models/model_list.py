"""Writes ``interp/data/timm_models.json``, the torch-free list :mod:`interp._model_names` checks model names
against: every timm entry point with the last part of its module. Run ``python -m interp.models.model_list``
after a timm upgrade (``tests/cli/test_cli_fast_feedback.py`` checks the shipped list equals :func:`generate`).
"""
from __future__ import annotations

import json

from .._model_names import NAMES_FILE


def generate() -> dict:
    """The list for the installed timm (imports timm)."""
    import timm
    from timm.models import _registry

    return {"timm": timm.__version__,
            "models": {n: _registry._model_entrypoints[n].__module__.rsplit(".", 1)[-1]
                       for n in sorted(_registry._model_entrypoints)}}


if __name__ == "__main__":
    NAMES_FILE.write_text(json.dumps(generate(), indent=0, sort_keys=True) + "\n")
    print(f"wrote {NAMES_FILE}")
