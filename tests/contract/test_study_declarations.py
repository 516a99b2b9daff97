"""Every study is one declaration: a torch-free config registered by name, one name for command, module,
function, result class and JSON file, its figures registered by result class, and the docs' cache table generated
from the configs."""
from __future__ import annotations

import dataclasses
import importlib
import json
import subprocess
import sys
from pathlib import Path

import pytest

from interp.errors import InterpError, UsageError
from interp.studies.declaration import (StudyConfig, cache_table, declare, declared, option, required_hooks, study,
                                        study_function)
from conftest import REPO

ROOT = REPO


def test_declarations_load_without_torch_and_every_study_is_there():
    code = ("import json, sys; from interp.studies.declaration import declared; names = list(declared()); "
            "print(json.dumps({'names': names, 'heavy': [m for m in ('torch', 'numpy', 'matplotlib') "
            "if m in sys.modules]}))")
    out = json.loads(subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                                    check=True).stdout)
    assert out["heavy"] == []
    assert {"norms", "neurons", "redundancy", "ablate", "relocate", "registers", "patch-score", "pib", "masking",
            "selective-cls", "probes", "lost", "segment"} <= set(out["names"])


@pytest.mark.parametrize("name", sorted(declared()))
def test_one_name_for_command_module_function_result_and_json(name):
    config = declared()[name]
    stem = config.json_name()
    assert stem == name.replace("-", "_") and config.summary() and config.description()
    function = study_function(config)
    module = importlib.import_module(function.__module__)
    assert module.__name__ == f"{config.__module__.rpartition('.')[0]}.{stem}"
    assert function.__name__ == f"{stem}_study" and function.config_class is config
    result_class = function.__annotations__["return"]
    result_class = getattr(module, result_class) if isinstance(result_class, str) else result_class
    assert result_class.study == stem
    assert result_class.__name__ == config.__name__[:-len("Config")] + "Result"
    assert result_class.__name__.lower() == stem.replace("_", "") + "result"


def test_the_public_api_has_every_study_in_one_place():
    import interp.studies as api

    for config in declared().values():
        stem, result = config.json_name(), config.__name__[:-len("Config")] + "Result"
        assert {f"{stem}_study", result, config.__name__} <= set(api.__all__)
        assert getattr(api, f"{stem}_study") is study_function(config)
        assert getattr(api, config.__name__) is config and getattr(api, result).study == stem
    assert api.detect.__name__ == "detect" and api.open_source.__name__ == "open_source"
    with pytest.raises(AttributeError, match="no attribute 'norms'"):
        api.norms  # the flat module paths of earlier versions are gone


def test_every_result_class_has_registered_figures():
    import interp.plots  # noqa: F401  (registers the figures)
    from interp.plots.registry import FIGURES

    for config in declared().values():
        function = study_function(config)
        module = importlib.import_module(function.__module__)
        result_class = getattr(module, function.__annotations__["return"])
        assert FIGURES.get(result_class), f"{config.name}: no figures registered for {result_class.__name__}"
    from interp.studies.artifacts.norms import NormsResult

    assert [s.stem for s in FIGURES[NormsResult]] == ["norm_profile", "norm_histograms", "outlier_maps"]  # in order


def test_the_docs_cache_table_is_generated_from_the_configs():
    page = (ROOT / "docs" / "hooks-and-cache.md").read_text()
    assert cache_table() in page, "regenerate the table: python -c 'from interp.studies.declaration import " \
                                  "cache_table; print(cache_table())'"
    assert all(f"`{name}`" in cache_table() for name in declared())


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
        word: str = option("hi", "the word", choices=("hi", "ho"))
        times: int = option(2, "how often")
        loud: bool = option(False, "shout")
        quiet_only: bool = True  # a Python-only option: no flag

        def check(self):
            if self.times < 0:
                raise UsageError("--times must be >= 0")

    declare(EchoConfig)
    assert declared()["echo-test"] is EchoConfig

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
