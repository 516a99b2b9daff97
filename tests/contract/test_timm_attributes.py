"""Only the family adapters read timm's module attributes (docs/architecture.md, *Model families*).

The rule, read from the source with ``ast`` over ``interp/**/*.py`` outside ``interp/models/families/`` (planted
models included: they write their weights through the adapters' accessors):

* a name of :data:`TIMM_ONLY` (attributes only timm's modules carry in interp: ``patch_embed``, ``pos_embed``,
  ``cls_token``, ``fc2``, ``num_heads``...) is refused as an attribute (``x.pos_embed``, read or written) on any
  object, and as the literal name of ``getattr``/``hasattr``/``setattr``/``delattr``;
* a name of :data:`SHARED` (``blocks``, ``mlp``, ``patch_size``...: interp's own objects carry these too, a
  source's ``blocks`` are its ``BlockNames``, a ``HookedViT`` has a ``patch_size``) is refused the same way when
  the object it is read from is a timm module: an expression whose last name (``tm``, ``x.timm_model``,
  ``ref.blocks[0]``) is one of :data:`TIMM_OBJECTS` for that attribute.

An expression of :data:`ALLOWED` is another library's attribute of the same name, allowed with its reason.
timm's model-level interface that every timm model has (``pretrained_cfg``, ``num_classes``, ``num_features``,
``get_classifier``, ``reset_classifier``, ``head``) is not a module internal and is not refused. A variable
holding another library's module (open_clip's) is not named like a timm one.
"""
from __future__ import annotations

import ast
from pathlib import Path
from typing import List

import interp

PACKAGE = Path(interp.__file__).resolve().parent
FAMILIES = PACKAGE / "models" / "families"

TIMM_ONLY = frozenset({
    "patch_embed", "pos_embed", "cls_token", "reg_token", "dist_token", "embed_dim", "num_prefix_tokens",
    "no_embed_class", "num_reg_tokens", "grid_size", "num_patches", "dynamic_img_size", "set_input_size",
    "norm_pre", "fc_norm", "attn_pool", "rope", "num_heads", "fc1", "fc2", "qkv", "norm1", "norm2", "ls1", "ls2",
    "gamma_1", "gamma_2",
})
_MODULES = frozenset({"model", "timm_model", "tm", "module", "ref", "tower", "trunk", "block", "blk", "stage"})
TIMM_OBJECTS = {
    "blocks": _MODULES, "stages": _MODULES, "layers": _MODULES, "attn": _MODULES, "mlp": _MODULES,
    # a HookedViT (``model``) has its own patch_size / img_size (its family's): only a timm module's are refused
    "patch_size": _MODULES - {"model"} | {"pe"}, "img_size": _MODULES - {"model"} | {"pe"},
}
SHARED = frozenset(TIMM_OBJECTS)
# (file under interp/, the expression as ast.unparse writes it): why it is not timm's
ALLOWED = {
    ("models/weights/open_clip_bridge.py", "resblock.attn.num_heads"): "torch's nn.MultiheadAttention of open_clip",
}
ACCESSORS = frozenset({"getattr", "hasattr", "setattr", "delattr"})


def _last_name(node: ast.AST) -> str:
    """The last name of an expression: ``tm`` -> tm, ``x.timm_model`` -> timm_model, ``ref.blocks[0]`` -> blocks,
    ``f(x).mlp`` -> mlp (a call: its function's)."""
    while isinstance(node, (ast.Subscript, ast.Call, ast.Starred)):
        node = node.func if isinstance(node, ast.Call) else node.value
    if isinstance(node, ast.Name):
        return node.id
    if isinstance(node, ast.Attribute):
        return node.attr
    return ""


def _refused(attr: str, receiver: ast.AST) -> bool:
    if attr in TIMM_ONLY:
        return True
    return attr in SHARED and _last_name(receiver) in TIMM_OBJECTS[attr]


def timm_reads(source: str, where: str = "") -> List[int]:
    """Line numbers of the reads of timm's module attributes in ``source`` (the file ``where`` under interp/), by
    the module docstring's rule."""
    lines = set()
    for node in ast.walk(ast.parse(source)):
        if (where, ast.unparse(node)) in ALLOWED:
            continue
        if isinstance(node, ast.Attribute) and _refused(node.attr, node.value):
            lines.add(node.lineno)
        elif (isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id in ACCESSORS
              and len(node.args) >= 2 and isinstance(node.args[1], ast.Constant)
              and isinstance(node.args[1].value, str) and _refused(node.args[1].value, node.args[0])):
            lines.add(node.lineno)
    return sorted(lines)


def _checked_files() -> List[Path]:
    return [p for p in sorted(PACKAGE.rglob("*.py")) if FAMILIES not in p.parents]


def test_only_the_families_read_timm_module_attributes():
    found = [f"{p.relative_to(PACKAGE.parent)}:{line}" for p in _checked_files()
             for line in timm_reads(p.read_text(encoding="utf-8"), p.relative_to(PACKAGE).as_posix())]
    assert found == [], ("ask the family adapter (interp/models/families/: family_of(module).patch_size, "
                         "positions_of(module).grid, ...) instead of reading timm's attributes:\n" + "\n".join(found))


def test_the_rule_sees_what_it_is_meant_to_see():
    seen = ["g = model.patch_embed.grid_size", "n = int(ref.blocks[0].attn.num_heads)", "tm.pos_embed = p",
            "x = getattr(model, 'no_embed_class', False)", "d = len(model.blocks)", "p = tm.patch_size",
            "w = block.mlp", "s = model.timm_model.blocks", "r = hasattr(model, 'set_input_size')",
            "h = blk.mlp.fc1.out_features"]
    for line in seen:
        assert timm_reads(line) == [1], line
    unseen = ["b = source.blocks.resid_post(3)", "p = self.model.patch_size", "s = spec.img_size",
              "p = result.patch_size", "n = len(batch.blocks)", "m = family.mlp(3)", "h = resblock.attn",
              "c = model.pretrained_cfg", "k = model.num_classes", "s = 'pos_embed'", "b = config.blocks"]
    for line in unseen:
        assert timm_reads(line) == [], line
    for (where, expression) in ALLOWED:
        assert timm_reads(f"x = {expression}") == [1] and timm_reads(f"x = {expression}", where) == []
        assert expression in (PACKAGE / where).read_text(encoding="utf-8"), f"{where} no longer reads {expression}"
    # the one exemption is where the reads are: the adapters themselves
    assert timm_reads((FAMILIES / "base.py").read_text(encoding="utf-8")) != []
