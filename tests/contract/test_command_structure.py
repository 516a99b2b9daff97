"""The shape of the command side (issue 48): a command module imports no other command module (their shared
helpers live in ``commands/groups.py``, ``inputs.py``, ``common.py``, ...), options are composed as fields (no
options class of a command or a study has more than one options base, and each command's names are unique), and
no public function of ``interp/report/`` or ``interp/commands/`` takes more than :data:`MAX_PARAMETERS`
parameters (the engines take the models and one settings object). Read from the source with ``ast``, and from the
command-line parser and the study declarations; torch-free."""
from __future__ import annotations

import argparse
import ast
from pathlib import Path
from typing import Dict, List, Set

import interp
from interp.cli import build_parser
from interp.options import Options
from interp.studies.catalog import declared

PACKAGE_DIR = Path(interp.__file__).resolve().parent
COMMANDS_DIR = PACKAGE_DIR / "commands"
MAX_PARAMETERS = 6


def _tree(path: Path) -> ast.Module:
    return ast.parse(path.read_text(encoding="utf-8"))


def command_modules() -> Set[str]:
    """The module names under interp/commands that register a command (a top-level ``register(sub)``)."""
    return {p.stem for p in COMMANDS_DIR.glob("*.py")
            if any(isinstance(n, ast.FunctionDef) and n.name == "register" for n in _tree(p).body)}


def commands_imported(tree: ast.Module) -> Set[str]:
    """The interp/commands modules a module's imports name (``from .x import``, ``from . import x``,
    ``from ..commands.x import``, ``import interp.commands.x``), at any depth of the module."""
    names: Set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level == 1:  # inside interp/commands
                names |= {base.split(".")[0]} if base else {a.name for a in node.names}
            elif base.startswith("commands") and node.level == 2:
                names |= {base.split(".")[1]} if "." in base else {a.name for a in node.names}
            elif base.startswith("interp.commands"):
                parts = base.split(".")
                names |= {parts[2]} if len(parts) > 2 else {a.name for a in node.names}
        elif isinstance(node, ast.Import):
            names |= {a.name.split(".")[2] for a in node.names
                      if a.name.startswith("interp.commands.") and len(a.name.split(".")) > 2}
    return names


def test_no_command_module_imports_another():
    commands = command_modules()
    assert {"compare", "reassess", "report", "study"} <= commands  # the rule sees the commands
    found: Dict[str, List[str]] = {}
    for name in sorted(commands):
        other = sorted((commands_imported(_tree(COMMANDS_DIR / f"{name}.py")) & commands) - {name})
        if other:
            found[name] = other
    assert not found, f"command modules import other command modules (move the shared part out): {found}"


def test_the_import_rule_sees_what_it_is_meant_to_see():
    source = ("from .compare import per_model\nfrom . import reassess\nfrom ..commands.report import x\n"
              "import interp.commands.study\ndef f():\n    from .hooks import run\n")
    assert commands_imported(ast.parse(source)) == {"compare", "reassess", "report", "study", "hooks"}


def test_command_options_are_composed_as_fields_not_bases():
    """Every options class declared in interp/commands has at most one base (its groups are fields)."""
    many = [f"{p.stem}.{n.name}" for p in sorted(COMMANDS_DIR.glob("*.py")) for n in _tree(p).body
            if isinstance(n, ast.ClassDef) and len(n.bases) > 1]
    assert not many, f"options classes with several bases (hold the groups as group() fields): {many}"


def parsers(parser: argparse.ArgumentParser):
    """Every parser of the command tree."""
    yield parser
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for child in action.choices.values():
                yield from parsers(child)


def options_classes() -> List[type]:
    """Every options class the command line and the declared studies use: the commands' options, the study
    configs, the groups they hold (at any depth) and the options classes they derive from."""
    roots = [o for p in parsers(build_parser()) for o in getattr(p.get_default("func"), "options", ())]
    found: Dict[type, None] = {}
    stack = roots + list(declared().values())
    while stack:
        cls = stack.pop()
        if cls not in found:
            found[cls] = None
            stack += [f.metadata["group"] for f in cls.group_fields()]
            stack += [b for b in cls.__bases__ if issubclass(b, Options) and b is not Options]
    return list(found)


def test_options_are_composed_as_fields_not_bases():
    """No options class of a command or a study has more than one options base (its groups are group() fields),
    and the names of each (its fields', its groups') are one namespace, as its flags' destinations are."""
    classes = options_classes()
    assert declared()["pib"] in classes and len(classes) > 40  # the walk sees the studies and their groups
    many = [c.__qualname__ for c in classes if sum(issubclass(b, Options) for b in c.__bases__) > 1]
    assert not many, f"options classes with several options bases (hold the groups as group() fields): {many}"
    for cls in classes:
        cls.keyword_homes()  # a name declared twice is a TypeError


def parameter_count(node: ast.FunctionDef) -> int:
    """Positional and keyword parameters (``*args`` and ``**kwargs`` one each), ``self``/``cls`` excluded."""
    a = node.args
    names = [x.arg for x in a.posonlyargs + a.args + a.kwonlyargs if x.arg not in ("self", "cls")]
    return len(names) + (a.vararg is not None) + (a.kwarg is not None)


def long_signatures(paths) -> List[str]:
    return [f"{p.relative_to(PACKAGE_DIR)}:{n.lineno} {n.name} ({parameter_count(n)})" for p in paths
            for n in ast.walk(_tree(p)) if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef))
            and not n.name.startswith("_") and parameter_count(n) > MAX_PARAMETERS]


def test_no_public_function_of_report_or_commands_takes_more_than_six_parameters():
    paths = sorted((PACKAGE_DIR / "report").glob("*.py")) + sorted(COMMANDS_DIR.glob("*.py"))
    found = long_signatures(paths)
    assert not found, f"group the settings into one frozen dataclass: {found}"


def test_the_parameter_rule_counts_every_kind():
    (node,) = ast.parse("def f(self, a, /, b, *args, c=1, **kw): pass").body
    assert parameter_count(node) == 5
