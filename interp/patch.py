"""Alias: ``import interp.patch`` gives :mod:`interp.interventions.export` (patch files), the same module object.

Kept so that ``import interp.patch`` / ``from interp import patch`` keep working after the move; new code
imports ``interp.interventions.export``.
"""
import sys

from .interventions import export as _export

sys.modules[__name__] = _export
