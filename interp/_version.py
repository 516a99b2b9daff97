"""The package version, in a module of its own so any module can read it without importing ``interp``.

Kept equal to ``[project] version`` in pyproject.toml (``tests/contract/test_imports.py`` checks it).
"""
__version__ = "0.1.0"
