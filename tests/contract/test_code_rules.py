"""Rules the source keeps (read as text): hook names come from ``interp.hooks.names`` builders, never f-strings;
studies ask their source, never the model."""
from __future__ import annotations

import ast
import re
from pathlib import Path

import interp

PACKAGE = Path(interp.__file__).resolve().parent
# f"blocks.{...}.hook_..." / f"blocks.{...}.mlp.hook_..." / f"blocks.{...}.{...}": a hook name spelt by hand.
# Module paths (f"blocks.{i}.mlp.fc2.weight") and messages (f"blocks.{i} has ...") are not hook names.
HOOK_FSTRING = re.compile(r"""f["']blocks\.\{[^}]*\}\.(?:\w+\.)?(?:hook_|\{)""")
BUILDERS = PACKAGE / "hooks" / "names.py"


def test_no_hook_name_is_an_f_string_outside_the_builders():
    found = [f"{p.relative_to(PACKAGE.parent)}:{i}: {line.strip()}"
             for p in sorted(PACKAGE.rglob("*.py")) if p != BUILDERS
             for i, line in enumerate(p.read_text(encoding="utf-8").splitlines(), 1) if HOOK_FSTRING.search(line)]
    assert found == [], "use interp.hooks.names (resid_post(i), mlp_post(i), block_hook(i, name)...):\n" + "\n".join(found)


def test_the_rule_sees_what_it_is_meant_to_see():
    assert HOOK_FSTRING.search('return f"blocks.{layer}.mlp.hook_post"')
    assert HOOK_FSTRING.search("kept[f'blocks.{l}.hook_{s}']") and HOOK_FSTRING.search('f"blocks.{i}.{rel}"')
    assert not HOOK_FSTRING.search('state[f"blocks.{layer}.mlp.fc2.weight"]')
    assert not HOOK_FSTRING.search('f"blocks.{i} has an unsupported {problem}"')


# A study reads the model's anatomy through its source (source.neuron_writes, d_mlp, head, layout_of...) and edits
# it through runtime.paired; reaching into the module itself ties the study to one family's attributes.
MODEL_REACH = re.compile(r"\btimm_model\b|\bsource\.model\b(?!_)|\blive_model\(|\.blocks\[")
STUDIES = PACKAGE / "studies"


def test_studies_do_not_reach_into_the_model():
    found = [f"{p.relative_to(PACKAGE.parent)}:{i}: {line.strip()}"
             for p in sorted(STUDIES.rglob("*.py"))
             for i, line in enumerate(p.read_text(encoding="utf-8").splitlines(), 1) if MODEL_REACH.search(line)]
    assert found == [], "ask the source (interp.runtime.source.ActivationSource):\n" + "\n".join(found)


def test_the_model_rule_sees_what_it_is_meant_to_see():
    assert MODEL_REACH.search("blocks = getattr(model, 'timm_model', model).blocks")
    assert MODEL_REACH.search("w = source.model.blocks") and MODEL_REACH.search("m = live_model(source)")
    assert MODEL_REACH.search("fc2 = model.blocks[layer].mlp.fc2")
    assert not MODEL_REACH.search("name = source.model_name") and not MODEL_REACH.search("source.blocks.layout_of(h)")


def _warn_calls_without_interp_category(source: str) -> list:
    """Line numbers of ``warnings.warn(...)`` calls whose category is not ``InterpWarning`` (or a variable:
    the battery re-emits recorded warnings with their own category)."""
    found = []
    for node in ast.walk(ast.parse(source)):
        if (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == "warn"
                and isinstance(node.func.value, ast.Name) and node.func.value.id == "warnings"):
            category = node.args[1] if len(node.args) > 1 else next(
                (k.value for k in node.keywords if k.arg == "category"), None)
            if category is None or (isinstance(category, ast.Attribute) or
                                    (isinstance(category, ast.Name) and category.id.endswith("Warning")
                                     and category.id != "InterpWarning")):
                found.append(node.lineno)
    return found


def test_interp_warns_in_its_own_category():
    """interp's warnings to the user are ``InterpWarning``s (issue 52, item 10), so the test suite's summary
    lists only other libraries' warnings (pyproject's filterwarnings) and a program can filter interp's."""
    offenders = [f"{path.relative_to(PACKAGE)}:{line}" for path in sorted(PACKAGE.rglob("*.py"))
                 for line in _warn_calls_without_interp_category(path.read_text(encoding="utf-8"))]
    assert offenders == []
    assert _warn_calls_without_interp_category("import warnings\nwarnings.warn('x')\n"
                                               "warnings.warn('y', UserWarning)\n"
                                               "warnings.warn('z', InterpWarning, stacklevel=2)\n") == [2, 3]
