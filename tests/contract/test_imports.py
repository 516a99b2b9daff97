"""Import structure: no import cycles between interp's modules, no import from a lower layer into a higher one
(the layers of docs/architecture.md), no study theme importing another, and a lazy ``import interp``.

The graph is read from the source with ``ast``: every ``import``/``from ... import`` of an interp module, at
module level and inside functions (a function-level import is still an arrow: it closes a cycle as much as a
module-level one), except imports under ``if TYPE_CHECKING:``. Importing a package's submodule is an edge to the
submodule, not to the package. The lazy ``interp/__init__.py`` facade (PEP 562 ``__getattr__``) is the top of the
stack and is left out.
"""
from __future__ import annotations

import ast
import functools
from pathlib import Path
from typing import Dict, List, Set

import pytest

import fresh_interpreter
import interp

PACKAGE_DIR = Path(interp.__file__).resolve().parent
ROOT = "interp"

# Lower rank = lower layer; a module may import only modules of its own rank or lower.
LAYERS = [
    ("interp.errors", "interp._version", "interp._progress", "interp._transforms",
     "interp._model_names", "interp.paths", "interp.values", "interp.options"),
    ("interp.formats",),
    ("interp.models",),
    ("interp.hooks",),
    ("interp.cache",),
    ("interp.interventions",),
    ("interp.runtime",),
    ("interp.detection",),
    ("interp.studies", "interp.sae", "interp.sae_settings"),
    ("interp.plots",),
    ("interp.report", "interp.explore", "interp.commands", "interp.cli", "interp.console", "interp.__main__",
     "interp"),
]

from interp.studies.catalog import THEMES  # noqa: E402  (torch-free)

STUDY_THEMES = tuple(t.name for t in THEMES)


def module_files() -> Dict[str, Path]:
    """{dotted module name: file} for every module of the package (packages under their own name)."""
    out = {}
    for path in PACKAGE_DIR.rglob("*.py"):
        parts = list(path.relative_to(PACKAGE_DIR.parent).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts = parts[:-1]
        out[".".join(parts)] = path
    return out


def _is_type_checking(node: ast.AST) -> bool:
    test = getattr(node, "test", None)
    return isinstance(node, ast.If) and (
        (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING")
        or (isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING"))


def imported_modules(name: str, path: Path, known: Set[str], include_functions: bool) -> Set[str]:
    """The interp modules ``name`` imports (at module level, and inside functions if asked)."""
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found: Set[str] = set()

    def visit(node: ast.AST) -> None:
        if _is_type_checking(node):
            return
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and not include_functions:
            return
        if isinstance(node, ast.Import):
            found.update(a.name for a in node.names if a.name.split(".")[0] == ROOT)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base_parts = package.split(".")[: len(package.split(".")) - (node.level - 1)]
                base = ".".join(base_parts + ([node.module] if node.module else []))
            else:
                base = node.module or ""
            if base.split(".")[0] == ROOT:
                for alias in node.names:
                    sub = f"{base}.{alias.name}"
                    found.add(sub if sub in known else base)
        for child in ast.iter_child_nodes(node):
            visit(child)

    visit(ast.parse(path.read_text(encoding="utf-8")))
    found.discard(name)
    return {m for m in found if m in known}


@functools.lru_cache(maxsize=None)  # read once per session: four tests check the same graph (don't change it)
def import_graph(include_functions: bool) -> Dict[str, Set[str]]:
    files = module_files()
    known = set(files)
    return {name: imported_modules(name, path, known, include_functions)
            for name, path in files.items() if name != ROOT}


def find_cycles(graph: Dict[str, Set[str]]) -> List[List[str]]:
    """One cycle per strongly connected component with more than one module (Tarjan)."""
    index: Dict[str, int] = {}
    low: Dict[str, int] = {}
    stack: List[str] = []
    on_stack: Set[str] = set()
    cycles: List[List[str]] = []

    def connect(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in sorted(graph.get(v, ())):
            if w not in graph:
                continue
            if w not in index:
                connect(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                cycles.append(sorted(component))

    for v in sorted(graph):
        if v not in index:
            connect(v)
    return cycles


def layer_of(module: str) -> int:
    for rank, prefixes in enumerate(LAYERS):
        if module in prefixes or any(module.startswith(p + ".") for p in prefixes if p != ROOT):
            return rank
    raise AssertionError(f"{module} is in no layer of tests/contract/test_imports.py LAYERS: add it to the right one")


def test_cycle_finder_finds_a_planted_cycle():
    graph = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}, "e": set()}
    assert find_cycles(graph) == [["a", "b", "c"]]
    assert find_cycles({"a": {"b"}, "b": set()}) == []


def test_graph_reader_sees_relative_lazy_and_type_checking_imports(tmp_path):
    src = tmp_path / "mod.py"
    src.write_text("from typing import TYPE_CHECKING\nfrom . import b\nfrom ..c import x\n"
                   "if TYPE_CHECKING:\n    from .d import y\n"
                   "def f():\n    from .e import z\n")
    known = {"p.q.mod", "p.q.b", "p.c", "p.q.d", "p.q.e"}
    global ROOT
    saved, ROOT = ROOT, "p"
    try:
        assert imported_modules("p.q.mod", src, known, include_functions=False) == {"p.q.b", "p.c"}
        assert imported_modules("p.q.mod", src, known, include_functions=True) == {"p.q.b", "p.c", "p.q.e"}
    finally:
        ROOT = saved


def test_no_import_cycles_counting_imports_inside_functions():
    graph = import_graph(include_functions=True)
    assert len(graph) > 40  # the reader found the package
    assert find_cycles(graph) == [], "import cycles between interp modules"


def test_no_layer_imports_a_higher_one():
    backward = [f"{src} (layer {layer_of(src)}) imports {dst} (layer {layer_of(dst)})"
                for src, targets in sorted(import_graph(include_functions=True).items())
                for dst in sorted(targets) if layer_of(dst) > layer_of(src)]
    assert backward == [], "imports against the layer order of docs/architecture.md:\n" + "\n".join(backward)


def study_theme(module: str):
    parts = module.split(".")
    return parts[2] if len(parts) > 2 and parts[:2] == ["interp", "studies"] and parts[2] in STUDY_THEMES else None


def test_no_study_theme_imports_another():
    sideways = [f"{src} imports {dst}" for src, targets in sorted(import_graph(include_functions=True).items())
                for dst in sorted(targets) if study_theme(src) and study_theme(dst) not in (None, study_theme(src))]
    assert sideways == [], ("a study theme imports another (move the shared piece down to studies/core or "
                            "interp/runtime):\n" + "\n".join(sideways))


def test_report_and_explorer_do_not_import_the_facade():
    graph = import_graph(include_functions=True)
    found = [f"{src} imports {dst}" for src, targets in sorted(graph.items())
             if src.split(".")[:2] in (["interp", "report"], ["interp", "explore"])
             for dst in sorted(targets) if dst in ("interp", "interp.api")]
    assert found == []


def test_no_module_replaces_itself_or_hooks_the_import_system():
    tricks = ("sys.modules[__name__]", "sys.meta_path", "importlib.abc")
    found = [f"{path.relative_to(PACKAGE_DIR.parent)}: {t}" for path in sorted(PACKAGE_DIR.rglob("*.py"))
             for t in tricks if t in path.read_text(encoding="utf-8")]
    assert found == []


@pytest.mark.early(fresh_interpreter.NAME)
def test_import_interp_is_lazy_and_every_public_name_resolves():
    result = fresh_interpreter.checks()  # a fresh interpreter: ``import interp``, then every public name resolved
    assert result["heavy"] == []
    assert "error" not in result["names"], result["names"]
    assert set(result["names"]) == set(interp.__all__) and result["patch_save"] is True
    assert result["names"]["load"] == "function" and result["names"]["HookedViT"] == "type"
    with pytest.raises(AttributeError, match="no attribute 'nothing_here'"):
        interp.nothing_here


def test_interp_patch_is_the_patch_file_module():
    import interp.interventions.export as patch_module

    assert interp.patch is patch_module
    for name in ("save", "load", "apply", "describe", "export_weights"):
        assert callable(getattr(patch_module, name)), name


def test_version_is_defined_once_and_matches_pyproject():
    from interp._version import __version__

    assert interp.__version__ == __version__
    pyproject = (PACKAGE_DIR.parent / "pyproject.toml").read_text(encoding="utf-8")
    assert f'\nversion = "{__version__}"\n' in pyproject
