"""Every study is one declaration: a torch-free config registered by name that names, as literals, the module,
function and result class of the study; its figures registered by result class; the catalogue lists every theme
(no discovery by file names); the docs' cache table and API list generated from the configs."""
from __future__ import annotations

import dataclasses
import json
import subprocess
import sys

import pytest

from interp.errors import InterpError, UsageError
from interp.studies.catalog import (THEMES, api_reference, cache_table, declared, required_hooks, result_class,
                                    study_function)
from interp.studies.declaration import StudyConfig, declare, option, study
from conftest import REPO

ROOT = REPO


def test_declarations_load_without_torch_and_every_study_is_there():
    code = ("import json, sys; from interp.studies.catalog import declared; names = list(declared()); "
            "print(json.dumps({'names': names, 'heavy': [m for m in ('torch', 'numpy', 'matplotlib') "
            "if m in sys.modules]}))")
    out = json.loads(subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                                    check=True).stdout)
    assert out["heavy"] == []
    assert {"norms", "neurons", "redundancy", "ablate", "relocate", "registers", "patch-score", "pib", "masking",
            "selective-cls", "probes", "lost", "segment"} <= set(out["names"])


@pytest.mark.parametrize("name", sorted(declared()))
def test_the_config_names_its_module_function_and_result(name):
    config = declared()[name]
    stem = config.json_name()
    assert stem == name.replace("-", "_") and config.summary() and config.description()
    function = study_function(config)
    assert function.__module__ == config.module and function.__name__ == config.function
    assert function.config_class is config
    result = result_class(config)
    assert result.__module__ == config.module and result.__name__ == config.result and result.study == stem


def test_the_catalogue_lists_every_theme_package():
    packages = {p.parent.name for p in (ROOT / "interp" / "studies").glob("*/configs.py")}
    assert {t.name for t in THEMES} == packages, "a theme with a configs.py is missing from catalog.THEMES"
    assert all(t.studies() for t in THEMES)


def test_a_config_without_its_module_is_refused(monkeypatch):
    from interp.studies import declaration

    monkeypatch.setattr(declaration, "_DECLARED", dict(declaration._DECLARED))

    @dataclasses.dataclass(frozen=True, kw_only=True)
    class LoneConfig(StudyConfig):
        """lone"""
        name = "lone-test"

    with pytest.raises(TypeError, match="declares no module, function, result"):
        declare(LoneConfig)


def test_the_public_api_has_every_study_in_one_place():
    import interp.studies as api

    for config in declared().values():
        assert {config.function, config.result, config.__name__} <= set(api.__all__)
        assert getattr(api, config.function) is study_function(config)
        assert getattr(api, config.__name__) is config and getattr(api, config.result) is result_class(config)
    assert api.detect.__name__ == "detect" and api.open_source.__name__ == "open_source"
    with pytest.raises(AttributeError, match="no attribute 'norms'"):
        api.norms  # the flat module paths of earlier versions are gone


def test_every_result_class_has_registered_figures():
    import interp.plots  # noqa: F401  (registers the figures)
    from interp.plots.registry import FIGURES

    for config in declared().values():
        result = result_class(config)
        assert FIGURES.get(result), f"{config.name}: no figures registered for {result.__name__}"
    from interp.studies.artifacts.norms import NormsResult

    assert [s.stem for s in FIGURES[NormsResult]] == ["norm_profile", "norm_histograms", "outlier_maps"]  # in order


def test_the_docs_tables_are_generated_from_the_configs():
    """The pages hold markers that the docs build (docs/gen_cli.py) fills from the catalogue."""
    assert "<!-- study-cache-table -->" in (ROOT / "docs" / "hooks-and-cache.md").read_text()
    assert "<!-- study-api -->" in (ROOT / "docs" / "api-studies.md").read_text()
    assert all(f"`{name}`" in cache_table() for name in declared())
    assert all(f"::: {c.module}.{c.function}" in api_reference() for c in declared().values())


def test_required_hooks_come_from_the_config_and_live_studies_read_none():
    assert required_hooks("lost", 4, {"layer": -2}) == ["blocks.2.attn.hook_k"]
    with pytest.raises(InterpError, match="re-runs the model"):
        required_hooks("masking", 4)
    with pytest.raises(InterpError, match="unknown study 'nope'"):
        required_hooks("nope", 4)


def test_a_new_study_is_one_config_and_one_function(monkeypatch):
    """A study declared outside the package: its options give a parser, keywords build its config, and the
    bound function gets the checked config."""
    import argparse

    from interp.studies import declaration

    monkeypatch.setattr(declaration, "_DECLARED", dict(declaration._DECLARED))  # the registry as it was, after
    monkeypatch.setattr(declaration, "_FUNCTIONS", dict(declaration._FUNCTIONS))

    @dataclasses.dataclass(frozen=True, kw_only=True)
    class EchoConfig(StudyConfig):
        """echo: repeat a word

        Repeats --word --times times."""
        name = "echo-test"
        module, function, result = f"{__name__.rpartition('.')[0]}.echo", "echo_test_study", "EchoResult"
        word: str = option("hi", "the word", choices=("hi", "ho"))
        times: int = option(2, "how often")
        loud: bool = option(False, "shout")
        quiet_only: bool = True  # a Python-only option: no flag

        def check(self):
            if self.times < 0:
                raise UsageError("--times must be >= 0")

    declare(EchoConfig)
    assert EchoConfig in declaration.declared_configs()

    @study(EchoConfig)
    def echo_test_study(source, config):
        return [config.word.upper() if config.loud else config.word] * config.times

    parser = argparse.ArgumentParser()
    EchoConfig.add_arguments(parser)
    args = parser.parse_args(["--word", "ho", "--times", "3", "--loud", "--seed", "7"])
    config = EchoConfig.from_args(args)
    assert (config.word, config.times, config.loud, config.seed, config.quiet_only) == ("ho", 3, True, 7, True)
    assert echo_test_study(None, config) == ["HO"] * 3
    assert echo_test_study(None, times=1) == ["hi"]  # keywords build the config
    assert echo_test_study(None, config, loud=False, times=1) == ["ho"]  # and change a given one
    with pytest.raises(UsageError, match="--times must be >= 0"):
        echo_test_study(None, times=-1)
    with pytest.raises(TypeError, match="takes a EchoConfig"):
        echo_test_study(None, object())
    with pytest.raises(SystemExit):
        parser.parse_args(["--word", "no"])
    assert "[--quiet-only" not in parser.format_usage()
