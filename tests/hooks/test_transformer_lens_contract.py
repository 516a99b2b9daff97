"""What interp relies on from transformer-lens, checked on the installed version.

``interp.hooks.hook_registry`` overrides only public ``HookedRootModule`` methods and resolves glob patterns
before calling them. If a transformer-lens release changes any of the behaviour below, these tests fail
and name it; raise or lower the ``transformer-lens`` bound in pyproject.toml only after they pass.
"""
from __future__ import annotations

import inspect
import re
from importlib.metadata import version

import pytest
import torch
from torch import nn

from interp.hooks.hooked_vit import HookedViT
from conftest import REPO

TL = "transformer-lens"
PUBLIC_METHODS_USED = ("setup", "add_hook", "hooks", "run_with_hooks", "run_with_cache", "get_caching_hooks",
                       "reset_hooks")


def _root_module_class():
    try:
        from transformer_lens import HookedRootModule
    except ImportError as e:  # pragma: no cover - only on an unsupported version
        pytest.fail(f"`from transformer_lens import HookedRootModule` failed ({e}); interp.hooks imports it so")
    return HookedRootModule


class Tiny(_root_module_class()):
    """Two hook points around a linear layer: the smallest HookedRootModule."""

    def __init__(self):
        from transformer_lens.hook_points import HookPoint

        super().__init__()
        self.lin = nn.Linear(3, 3)
        self.hook_in = HookPoint()
        self.hook_out = HookPoint()
        self.setup()

    def forward(self, x):
        return self.hook_out(self.lin(self.hook_in(x)))


def test_installed_version_is_inside_the_tested_range():
    pyproject = (REPO / "pyproject.toml").read_text(encoding="utf-8")
    bound = re.search(r'"transformer-lens>=([\d.]+),<(\d+)"', pyproject)
    assert bound, "pyproject.toml must pin transformer-lens as >=X,<MAJOR (the newest tested major + 1)"
    major = int(version(TL).split(".")[0])
    assert int(bound.group(1).split(".")[0]) <= major < int(bound.group(2)), version(TL)


def test_hooked_vit_overrides_no_private_transformer_lens_member():
    root = _root_module_class()
    private = [n for n in vars(root) if n.startswith("_") and not n.startswith("__")]
    overridden = [n for n in private if getattr(HookedViT, n, None) is not getattr(root, n, None)]
    assert overridden == [], f"HookedViT overrides private transformer-lens internals: {overridden}"
    for name in ("setup", "check_and_add_hook", "context_level"):
        assert name not in vars(HookedViT), f"HookedViT must not override HookedRootModule.{name}"


@pytest.mark.parametrize("method", PUBLIC_METHODS_USED)
def test_public_methods_keep_the_signatures_interp_calls(method):
    fn = getattr(_root_module_class(), method, None)
    assert callable(fn), f"transformer-lens HookedRootModule.{method} is gone"
    params = inspect.signature(fn).parameters
    needed = {"hooks": ["fwd_hooks", "bwd_hooks", "reset_hooks_end", "clear_contexts"],
              "run_with_hooks": ["fwd_hooks", "bwd_hooks"], "run_with_cache": ["names_filter"],
              "get_caching_hooks": ["names_filter"], "add_hook": ["name", "hook", "dir"]}.get(method, [])
    missing = [p for p in needed if p not in params]
    assert missing == [], f"HookedRootModule.{method} lost parameters {missing}"
    if method == "hooks":  # passed positionally by interp's override, in this order
        assert list(params)[1:5] == needed


def test_setup_indexes_and_names_every_hook_point():
    model = Tiny()
    assert set(model.hook_dict) == {"hook_in", "hook_out"}
    assert all(hp.name == name for name, hp in model.hook_dict.items())


def test_hooks_replace_values_see_the_hook_point_and_are_removed():
    model = Tiny()
    x = torch.randn(2, 3)
    seen = []

    def zero(t, hook):
        seen.append(hook.name)
        return torch.zeros_like(t)

    with model.hooks(fwd_hooks=[("hook_out", zero)]):
        assert model.hook_dict["hook_out"]._forward_hooks, "interp.models.families.parts.is_hooked reads _forward_hooks"
        assert torch.equal(model(x), torch.zeros(2, 3))
    assert seen == ["hook_out"] and not model.hook_dict["hook_out"]._forward_hooks
    out = model.run_with_hooks(x, fwd_hooks=[(lambda n: n == "hook_in", zero)])
    assert torch.allclose(out, model.lin.bias.expand(2, 3))
    assert not any(hp._forward_hooks for hp in model.hook_dict.values())


def test_run_with_cache_returns_output_and_a_plain_dict_of_exact_names():
    model = Tiny()
    x = torch.randn(2, 3)
    out, cache = model.run_with_cache(x, names_filter=["hook_in"])
    assert isinstance(cache, dict) and list(cache) == ["hook_in"]
    assert torch.equal(cache["hook_in"], x) and torch.allclose(out, model.lin(x))
    _, cache = model.run_with_cache(x, names_filter=lambda n: n == "hook_out")
    assert list(cache) == ["hook_out"]
