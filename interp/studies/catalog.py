"""The catalogue of studies: every theme and its declarations, imported by name here (no discovery by naming
convention), and what is derived from them: the study of a name, its function and result class (each config
names the module that defines them), the hooks a study reads from a cache and the docs' tables.

Torch-free: it imports only the themes' ``configs`` modules; a study's own module (torch) is imported when its
function or result is asked for.

Adding a study to a theme is its config in the theme's ``configs.py`` (with ``module``, ``function``,
``result``), its module, its figure and its test; a new theme is one :class:`Theme` line below.
"""
from __future__ import annotations

import importlib
from dataclasses import dataclass
from types import ModuleType
from typing import Callable, Dict, List, Optional, Sequence, Tuple, Type, Union

from ..errors import InterpError, UsageError
from ..hooks.names import BlockNames
from .aggregation import configs as aggregation_configs
from .artifacts import configs as artifacts_configs
from .causal import configs as causal_configs
from .declaration import StudyConfig, declared_configs, function_of
from .objects import configs as objects_configs
from .probes import configs as probes_configs
from .repairs import configs as repairs_configs
from .sae import configs as sae_configs


@dataclass(frozen=True)
class Theme:
    """One study theme: a package under ``interp/studies`` with its torch-free declarations.

    Attributes:
        name: the package's name (``artifacts``).
        title: what the docs call it.
        configs: its ``configs`` module.
    """

    name: str
    title: str
    configs: ModuleType

    def studies(self) -> List[Type[StudyConfig]]:
        """Its declared studies, in declaration order."""
        return [c for c in declared_configs() if c.__module__ == self.configs.__name__]


THEMES: Tuple[Theme, ...] = (
    Theme("artifacts", "High-norm tokens and register neurons", artifacts_configs),
    Theme("aggregation", "Lazy aggregation", aggregation_configs),
    Theme("objects", "Objects in the maps", objects_configs),
    Theme("probes", "What the tokens hold", probes_configs),
    Theme("sae", "Sparse autoencoders", sae_configs),
    Theme("causal", "The causal toolkit", causal_configs),
    Theme("repairs", "Training-free repairs", repairs_configs),
)


def declared() -> Dict[str, Type[StudyConfig]]:
    """Every declared study, name -> config class, theme by theme."""
    return {config.name: config for theme in THEMES for config in theme.studies()}


def config_class(name: str) -> Type[StudyConfig]:
    """The config class of the study ``name``; an error listing the known studies otherwise."""
    studies = declared()
    try:
        return studies[name]
    except KeyError:
        raise InterpError(f"unknown study {name!r}; known: {', '.join(studies)}") from None


def study_function(config: Type[StudyConfig]) -> Callable:
    """The study function bound to ``config`` (imports the module the config names)."""
    importlib.import_module(config.module)
    return function_of(config)


def result_class(config: Type[StudyConfig]) -> type:
    """The result class the config names, from its module."""
    return getattr(importlib.import_module(config.module), config.result)


def required_hooks(name: str, blocks: Union[BlockNames, int], options: Optional[Dict] = None) -> List[str]:
    """The hooks study ``name`` reads from a cache of a model with ``blocks`` (its block names, or a number of
    ``blocks.{i}`` blocks) with ``options`` (the rest default)."""
    return config_class(name).build(**dict(options or {})).required_hooks(blocks)


def hooks_for_studies(names: Sequence[str], blocks: Union[BlockNames, int]) -> List[str]:
    """The union (in order) of the hooks the studies ``names`` read with their default options."""
    if not names:
        raise UsageError("--for needs study names, e.g. --for norms,neurons")
    return list(dict.fromkeys(h for name in names for h in required_hooks(name, blocks)))


def cache_table() -> str:
    """The docs' markdown table of the hooks each study reads from a cache (studies with the same hooks share a
    row; those that re-run the model come last)."""
    rows: Dict[str, List[str]] = {}
    for config in sorted(declared().values(), key=lambda c: c.live_only()):
        rows.setdefault(config.cache_doc, []).append(f"`{config.name}`")
    head = ("| study | hooks it reads (N blocks; D = detection block, default last; H = `--highest-layer`, "
            "default D) |\n|---|---|\n")
    return head + "".join(f"| {', '.join(names)} | {doc} |\n" for doc, names in rows.items())


def api_reference() -> str:
    """The docs' API reference of the study functions: a section per theme, a mkdocstrings entry per study."""
    parts = []
    for theme in THEMES:
        entries = "\n\n".join(f"::: {c.module}.{c.function}" for c in theme.studies())
        parts.append(f"## {theme.title}\n\n{entries}\n")
    return "\n".join(parts)
