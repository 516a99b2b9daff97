"""A family added from outside the package: ``interp.register_family`` with the worked example
``examples/deit_distilled.py`` (timm's ``VisionTransformerDistilled``): lookup by exact class, hooks equal to timm
per block, the distillation token in the layout and not counted as a register."""
from __future__ import annotations

import runpy
from pathlib import Path

import pytest
import timm
import torch

import interp
from interp.errors import InterpError, UnsupportedModelError
from interp.models.families import Family, VitFamily, family_of
from interp.models.layout import TokenLayout

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "deit_distilled.py"
NAME = "deit_tiny_distilled_patch16_224"


@pytest.fixture
def deit_family():
    """The example's family, registered for the test and removed after it (the registry is process-wide)."""
    before = list(Family.registry)
    namespace = runpy.run_path(str(EXAMPLE), run_name="deit_example")
    yield namespace["DeitDistilledFamily"]
    Family.registry[:] = before


@pytest.fixture(scope="module")
def deit():
    torch.manual_seed(0)
    return timm.create_model(NAME, pretrained=False, depth=2, img_size=64).eval()


def test_unregistered_distilled_deit_is_refused_with_the_way_to_add_it(deit):
    with pytest.raises(UnsupportedModelError, match="register_family"):
        family_of(deit)


def test_example_family_matches_timm_per_block(deit_family, deit):
    model = interp.HookedViT.from_timm(deit, name=NAME)
    assert type(model.family) is deit_family  # the exact class's family, not VitFamily (registered first)
    x = torch.randn(2, 3, 64, 64, generator=torch.Generator().manual_seed(1))
    names = [model.block_names.hook(i, leaf) for i in range(model.n_layers)
             for leaf in ("hook_resid_pre", "hook_resid_mid", "hook_resid_post")]
    seen = {}

    def keep(name):
        return lambda module, args, out: seen.__setitem__(name, out)

    handles = [block.register_forward_hook(keep(f"blocks.{i}.hook_resid_post")) for i, block in enumerate(deit.blocks)]
    with torch.no_grad():
        logits, cache = model.run_with_cache(x, names_filter=names)
        # timm's own forward, its blocks' outputs taken by plain torch hooks with the hook points bypassed:
        # HookPoints are identities, so timm's Block.forward is the reference arithmetic
        reference = deit.forward_head(deit.forward_features(x))
    for h in handles:
        h.remove()
    for i in range(model.n_layers):
        name = f"blocks.{i}.hook_resid_post"
        torch.testing.assert_close(cache[model.block_names.hook(i, "hook_resid_post")], seen[name], atol=1e-5,
                                   rtol=1e-5)
    torch.testing.assert_close(logits, reference, atol=1e-5, rtol=1e-5)
    layout = model.layout
    assert (layout.n_prefix, layout.cls_index, layout.dist_index, layout.n_registers) == (2, 0, 1, 0)
    assert layout.register_slice == slice(2, 2) and layout.dist_slice == slice(1, 2)
    with pytest.raises(InterpError, match="no register tokens"):
        layout.rows_of("registers")


def test_example_script_prints_parity(deit_family, capsys):
    runpy.run_path(str(EXAMPLE), run_name="__main__")
    out = capsys.readouterr().out
    worst = float(out.split("blocks vs timm, max |diff|: ")[1].split(";")[0])
    assert worst <= 1e-5 and "distillation token row: 1" in out and "registers: 0" in out


def test_registration_rules(deit_family):
    assert interp.register_family(deit_family) is deit_family  # again: a no-op

    class Other(VitFamily):
        name = "other_deit"

        @classmethod
        def timm_class(cls):
            return deit_family.timm_class()

    assert Other not in Family.registry  # defined outside the package: not registered until asked
    with pytest.raises(InterpError, match="already has the family"):
        interp.register_family(Other)
    interp.register_family(Other, replace=True)
    assert Other in Family.registry and deit_family not in Family.registry
    with pytest.raises(InterpError, match="subclass"):
        interp.register_family(int)


def test_layout_with_distillation_and_test_time_registers():
    layout = TokenLayout(n_prefix=2, n_registers=0, cls_index=0, grid=(2, 2), dist_index=1).with_extra(3)
    assert layout.register_slice == slice(2, 5) and layout.patch_slice == slice(5, 9)
    assert TokenLayout.from_dict(layout.to_dict()) == layout
    assert layout.kind_slices()["cls"] == slice(0, 1)
