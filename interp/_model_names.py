"""timm's model names without importing timm, so the command line refuses a mistyped model name in about a
second instead of after torch and timm load (10-15 s).

The names ship in ``interp/data/timm_models.json`` (``{"timm": version, "models": {name: module}, "families":
{family: {"title", "modules"}}}``: every registered timm entry point with the last part of its module,
``vision_transformer``, ``resnet``..., and the timm modules of each family interp instruments, from
:mod:`interp.models.families`). Regenerate it after a timm upgrade or a new family with
``python -m interp.models.model_list`` (``tests/cli/test_cli_fast_feedback.py`` checks that it equals what the
installed timm and the families give). The list is used only while the installed timm is the version it
was made from; the check of :func:`interp.models.loading.check_model_name` still runs once timm is imported.
"""
from __future__ import annotations

import json
import os
from functools import lru_cache
from importlib import metadata
from pathlib import Path
from typing import Dict, Optional

from .errors import UnknownModelError, UnsupportedModelError, close_matches

NAMES_FILE = Path(__file__).parent / "data" / "timm_models.json"
PLANTED_NAME = "planted_vit"  # interp.models.planted.PLANTED_NAME (that module imports torch)
PLANTED_NAMES = (PLANTED_NAME, "planted_dinov3", "planted_pvt", "planted_swin")  # interp.models.planted.PLANTED_BUILDERS
DEPRECATED_MODULE = "_registry"  # timm registers its deprecated names there; timm.list_models() leaves them out


def installed_timm_version() -> Optional[str]:
    """The installed timm's version from its package metadata (no import); None when timm is not installed."""
    try:
        return metadata.version("timm")
    except metadata.PackageNotFoundError:
        return None


@lru_cache(maxsize=1)
def shipped_names() -> Optional[Dict[str, str]]:
    """{timm model name: module} of the shipped list, or None when it does not describe the installed timm."""
    try:
        data = json.loads(NAMES_FILE.read_text())
    except (OSError, ValueError):
        return None
    if data.get("timm") != installed_timm_version():
        return None
    return dict(data["models"])


@lru_cache(maxsize=1)
def shipped_families() -> Dict[str, dict]:
    """{family name: {"title", "modules"}} of the shipped list (torch-free)."""
    try:
        return dict(json.loads(NAMES_FILE.read_text()).get("families", {}))
    except (OSError, ValueError):
        return {}


def is_hf_folder(path) -> bool:
    """Whether ``path`` is a folder holding a ``config.json`` (a Hugging Face ``transformers`` save)."""
    return isinstance(path, (str, os.PathLike)) and (Path(path) / "config.json").is_file()


def looks_like_hub_id(name: str) -> bool:
    """``org/name`` that is not a local path: a Hugging Face hub id (timm names have no slash)."""
    parts = name.split("/")
    return (len(parts) == 2 and all(parts) and not name.startswith((".", "~")) and ":" not in name
            and not os.path.exists(name))


def check_model_name_fast(name: str) -> bool:
    """Refuse an unknown timm name (with close matches) or a timm model of no family interp instruments, the way
    :func:`interp.models.loading.check_model_name` does, from the shipped list. Returns False when the list
    cannot tell (another timm version): the check after import decides then."""
    names = shipped_names()
    if names is None:
        return False
    if name in PLANTED_NAMES:
        return True
    if is_hf_folder(name) or looks_like_hub_id(name):  # a transformers folder or hub id: its config.json decides
        return False
    base = name.split(".")[0]
    module = names.get(base)
    if module is None:
        listed = [n for n, m in names.items() if m != DEPRECATED_MODULE]  # what timm.list_models() gives
        hints = close_matches(base, listed, n=5)
        hint = f" Did you mean: {', '.join(hints)}?" if hints else ""
        raise UnknownModelError(f"unknown timm model {name!r}.{hint}")
    families = shipped_families()
    if not any(module in f["modules"] for f in families.values()):
        titles = "; ".join(f["title"] for f in families.values())
        raise UnsupportedModelError(f"{name!r}: a {module} model is not a family interp instruments. "
                                    f"interp instruments: {titles}.")
    return True
