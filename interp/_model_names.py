"""timm's model names without importing timm, so the command line refuses a mistyped model name in about a
second instead of after torch and timm load (10-15 s).

The names ship in ``interp/data/timm_models.json`` (``{"timm": version, "models": {name: module}}``: every
registered timm entry point with the last part of its module, ``vision_transformer``, ``resnet``...). Regenerate
it after a timm upgrade with ``python -m interp.models.model_list`` (``tests/cli/test_cli_fast_feedback.py``
checks that it equals what the installed timm gives). The list is used only while the installed timm is the
version it was made from; the check of :func:`interp.models.loading.check_model_name` still runs once timm is
imported. The families interp instruments (their titles and timm modules) are read from their own class bodies
in ``interp/models/families/`` (:func:`declared_families`), so a new family needs no list regenerated.
"""
from __future__ import annotations

import ast
import json
import os
import re
from functools import lru_cache
from pathlib import Path
from typing import Dict, List, Optional

from .errors import UnknownModelError, UnsupportedModelError, close_matches

NAMES_FILE = Path(__file__).parent / "data" / "timm_models.json"
FAMILIES_DIR = Path(__file__).parent / "models" / "families"
PLANTED_NAME = "planted_vit"  # interp.models.planted.PLANTED_NAME (that module imports torch)
PLANTED_NAMES = (PLANTED_NAME, "planted_dinov3", "planted_pvt", "planted_swin")  # interp.models.planted.PLANTED_BUILDERS
DEPRECATED_MODULE = "_registry"  # timm registers its deprecated names there; timm.list_models() leaves them out


def installed_timm_version() -> Optional[str]:
    """The installed timm's version from its package metadata (no import); None when timm is not installed."""
    from importlib import metadata  # 50-130 ms to import: only when a model name is checked, not for --help

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


_FAMILY_FIELDS = ("name", "title", "timm_modules", "stages_attr")


def _class_fields(node: ast.ClassDef) -> Dict[str, object]:
    """The literal values a class body assigns to the ``Family`` fields (``name = "vit"``...)."""
    fields = {}
    for stmt in node.body:
        if isinstance(stmt, ast.Assign) and len(stmt.targets) == 1 and isinstance(stmt.targets[0], ast.Name):
            if stmt.targets[0].id in _FAMILY_FIELDS:
                fields[stmt.targets[0].id] = ast.literal_eval(stmt.value)
    return fields


@lru_cache(maxsize=1)
def declared_families() -> List[dict]:
    """interp's own families as ``{"name", "title", "modules", "pyramid"}`` in registration order, read without
    torch from the class bodies of ``interp/models/families/`` (each a ``Family`` subclass with a literal ``name``,
    ``title``, ``timm_modules`` and, for a pyramid, ``stages_attr``), in the order ``families/__init__.py``
    imports their modules; ``"modules"`` are the last parts of the timm module names (``vision_transformer``).
    ``tests/contract/test_supported_models.py`` checks it is ``Family.registry``."""
    package = ast.parse((FAMILIES_DIR / "__init__.py").read_text(encoding="utf-8"))
    modules = [n.module for n in package.body if isinstance(n, ast.ImportFrom) and n.level == 1 and n.module]
    families = []
    for module in modules:
        tree = ast.parse((FAMILIES_DIR / f"{module}.py").read_text(encoding="utf-8"))
        for node in tree.body:
            fields = _class_fields(node) if isinstance(node, ast.ClassDef) else {}
            if fields.get("name"):
                families.append({"name": fields["name"], "title": fields["title"],
                                 "modules": sorted(m.rsplit(".", 1)[-1] for m in fields["timm_modules"]),
                                 "pyramid": fields.get("stages_attr") is not None})
    return families


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
        hints = close_matches(base, [*PLANTED_NAMES, *listed], n=5)
        hint = f" Did you mean: {', '.join(hints)}?" if hints else ""
        raise UnknownModelError(f"unknown timm model {name!r}.{hint}")
    families = declared_families()
    if not any(module in f["modules"] for f in families):
        raise UnsupportedModelError(f"{name!r}: a {module} model is not a family interp instruments; "
                                    f"{families_in_short([f['title'] for f in families])}")
    return True


SUPPORTED_MODELS_PAGE = "docs/getting-started.md#models"


def families_in_short(titles: List[str]) -> str:
    """One short clause naming the instrumented families' timm classes and where the full list is, for one-line
    refusals (the titles themselves run to hundreds of characters).

    >>> families_in_short(["timm Eva: DINOv3 (vit_*_dinov3*)", "timm SwinTransformerV2 (swinv2_*)"])
    'it instruments timm Eva, SwinTransformerV2 (all: docs/getting-started.md#models)'
    """
    classes = [re.match(r"timm (\w+)", t).group(1) if t.startswith("timm ") else t for t in titles]
    return f"it instruments timm {', '.join(classes)} (all: {SUPPORTED_MODELS_PAGE})"


SUPPORTED_MODELS_BEGIN = "<!-- supported-models: generated from interp/models/families, checked by tests -->"
SUPPORTED_MODELS_END = "<!-- /supported-models -->"
_NAME_PATTERN = re.compile(r"[\w*.]*_[\w*.]*[\w*]")  # a timm name or pattern: vit_*_dinov2, pvt_v2_b0


def supported_models_markdown(pyramid_page: str) -> str:
    """The supported-models list of the README and the docs, one bullet per registered family in registration
    order, from the shipped list (torch-free); a pyramid family links ``pyramid_page``.

    >>> print(supported_models_markdown("pyramid-models.md").splitlines()[0][:40])
    - timm `VisionTransformer`: plain ViT (`
    """
    lines: List[str] = []
    for family in declared_families():
        title = _NAME_PATTERN.sub(lambda m: f"`{m.group(0)}`", family["title"])
        title = re.sub(r"^timm (\w+)", r"timm `\1`", title)
        link = f"; a pyramid: [Pyramid models]({pyramid_page})" if family.get("pyramid") else ""
        lines.append(f"- {title}{link}")
    return "\n".join(lines)


def fill_supported_models(text: str, pyramid_page: str) -> str:
    """``text`` with what stands between its supported-models markers replaced by
    :func:`supported_models_markdown` (unchanged where it has no markers)."""
    begin, end = re.escape(SUPPORTED_MODELS_BEGIN), re.escape(SUPPORTED_MODELS_END)
    block = f"{SUPPORTED_MODELS_BEGIN}\n{supported_models_markdown(pyramid_page)}\n{SUPPORTED_MODELS_END}"
    return re.sub(f"{begin}.*?{end}", lambda m: block, text, flags=re.S)
