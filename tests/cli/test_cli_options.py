"""Every command is declared once (an options dataclass of ``option()`` fields, :mod:`interp.options`), its run's
inputs travel in one :class:`~interp.commands.inputs.RunInputs`, and each option name has one meaning: a former
name is refused in one line that names the new one, never read as an abbreviation of another. Torch-free."""
from __future__ import annotations

import argparse
import dataclasses
from dataclasses import dataclass

import pytest

from interp.cli import build_parser, main
from interp.commands.inputs import Command, ModelSpec, RunInputs
from interp.options import Options, group, option
from interp.sae_settings import TrainSettings


def walk(parser, words=("interp",)):
    """(words, parser) of every parser of the command tree."""
    yield words, parser
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for name, child in action.choices.items():
                yield from walk(child, words + (name,))


def leaf_parsers():
    """(words, parser) of every command that runs (no sub-commands of its own)."""
    return [(w, p) for w, p in walk(build_parser())
            if not any(isinstance(a, argparse._SubParsersAction) for a in p._actions)]


def test_every_command_is_a_declared_options_dataclass_and_every_option_a_field():
    for words, parser in leaf_parsers():
        command = parser.get_default("func")
        assert isinstance(command, Command), words
        assert command.options and all(issubclass(o, Options) for o in command.options), words
        declared = {f.name for o in command.options for f in o.option_fields()}
        dests = {a.dest for a in parser._actions if a.dest not in ("help", argparse.SUPPRESS)}
        assert dests == declared, (words, dests ^ declared)


def test_sae_train_options_are_the_train_settings():
    """One place for each default and help text: every TrainSettings option is an option of `sae train` with
    TrainSettings' default."""
    parser = dict((" ".join(w), p) for w, p in walk(build_parser()))["interp sae train"]
    actions = {a.dest: a for a in parser._actions}
    for f in TrainSettings.cli_fields():
        assert actions[f.name].default == f.default, f.name
        assert actions[f.name].help == f.metadata["flag"].help, f.name
    assert actions["tokens_per_step"].option_strings == ["--tokens-per-step"]
    assert actions["batch_size"].option_strings == ["--batch-size"]


def test_the_run_inputs_come_from_the_parsed_options_once(tmp_path):
    images = tmp_path / "img"
    images.mkdir()
    argv = ["sae", "train", "planted_vit", "--images", str(images), "--hook", "blocks.1.hook_resid_post", "--out",
            str(tmp_path / "o"), "--seed", "7", "--depth", "2", "--batch-size", "4", "--tokens-per-step", "64",
            "--no-progress"]
    args = build_parser().parse_args(argv)
    options = args.func.parse(args)
    inputs = RunInputs.of(options, argv)
    assert inputs.models == (ModelSpec("planted_vit", depth=2),)
    assert (inputs.images, inputs.progress, inputs.stage_lines, inputs.argv) == (
        str(images), False, False, tuple(argv))
    (train,) = options
    assert (train.batch_size, train.settings.tokens_per_step) == (4, 64)  # images per forward; tokens per step
    assert train.settings.seed == 7  # the SAE's seed (sae train takes the model's random weights from it too)


@pytest.fixture
def sae_argv(tmp_path):
    cache = tmp_path / "acts.h5"
    cache.write_bytes(b"")
    return ["sae", "train", "planted_vit", "--cache", str(cache), "--hook", "blocks.1.hook_resid_post", "--out",
            str(tmp_path / "o")]


@pytest.mark.parametrize("extra, words", [
    (["--batch-images", "32"], ["--batch-images was renamed --batch-size (images per forward)", "--tokens-per-step"]),
    (["--batch-size", "1024"], ["--batch-size 1024", "a --cache run makes no forward pass", "--tokens-per-step"]),
    (["--batch", "32"], ["unrecognized arguments: --batch 32"]),  # no abbreviation of --batch-size
    (["--tokens-per", "32"], ["unrecognized arguments: --tokens-per 32"]),
])
def test_a_former_or_abbreviated_option_is_one_line_naming_the_new_one(sae_argv, capsys, extra, words):
    assert main([*sae_argv, *extra]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and all(w in err for w in words), err


def test_a_token_sized_batch_size_on_a_live_run_is_refused(tmp_path, capsys):
    images = tmp_path / "img"
    images.mkdir()
    argv = ["sae", "train", "planted_vit", "--images", str(images), "--hook", "blocks.1.hook_resid_post", "--out",
            str(tmp_path / "o"), "--batch-size", "1024"]  # the former default of tokens per step
    assert main(argv) == 2
    err = capsys.readouterr().err.strip()
    assert "more than --window-images 256" in err and "--tokens-per-step" in err and len(err.splitlines()) == 1


def test_cache_batch_size_is_images_per_forward_and_the_file_keeps_its_chunking():
    parser = dict((" ".join(w), p) for w, p in walk(build_parser()))["interp cache"]
    (action,) = [a for a in parser._actions if a.dest == "batch_size"]
    assert action.default == 32 and "images per forward pass" in action.help


def test_options_objects_are_frozen_and_checked_on_construction():
    from interp.commands.groups import PreprocessOptions
    from interp.errors import UsageError

    with pytest.raises(UsageError, match="--crop 224 needs --resize"):
        PreprocessOptions(eval_crop=224)
    options = PreprocessOptions(eval_resize=256, eval_crop=224)
    assert options.preprocess() == "resize256-crop224"
    with pytest.raises(dataclasses.FrozenInstanceError):
        options.eval_resize = 1


def test_sae_token_choices_are_the_layouts_token_selections():
    """``--tokens`` is declared torch-free (interp/sae_settings.py); the rows it selects come from the token layout."""
    from interp.models.layout import TOKEN_SELECTIONS
    from interp.sae_settings import TOKEN_CHOICES

    assert set(TOKEN_CHOICES) == set(TOKEN_SELECTIONS)


@dataclass(frozen=True, kw_only=True)
class _Batch(Options):
    batch_size: int = option(16, "images per pass", parse=int)


@dataclass(frozen=True, kw_only=True)
class _Command(Options):
    first: str = option("x", "first")
    batch: _Batch = group(_Batch, batch_size=4)
    last: bool = option(False, "last")


def test_an_option_group_is_a_field_listed_where_it_is_declared_with_the_commands_defaults():
    parser = argparse.ArgumentParser()
    _Command.add_arguments(parser)
    text = parser.format_help()
    assert text.index("--first") < text.index("--batch-size") < text.index("--last")
    assert _Command.from_args(parser.parse_args([])) == _Command() == _Command(batch=_Batch(batch_size=4))
    given = _Command.from_args(parser.parse_args(["--batch-size", "2"]))
    assert given.batch.batch_size == 2
    assert given.to_dict() == {"first": "x", "batch": {"batch_size": 2}, "last": False}


@dataclass(frozen=True, kw_only=True)
class _Inner(Options):
    depth: int = option(1, "depth", parse=int)


@dataclass(frozen=True, kw_only=True)
class _Pass(Options):
    batch_size: int = option(16, "images per pass", parse=int)
    workers: int = option(0, "loader workers", parse=int)
    inner: _Inner = group(_Inner)


@dataclass(frozen=True, kw_only=True)
class _Run(Options):
    first: str = option("x", "first")
    run_pass: _Pass = group(_Pass, batch_size=4)


def test_flat_keywords_build_the_groups_they_name():
    """``build`` routes a keyword naming a group's field (at any depth) into that group, keeping the group's
    defaults of this command; a group given whole goes under its own name; ``with_options`` routes alike."""
    assert _Run.build() == _Run()
    run = _Run.build(first="y", workers=2, depth=3)
    assert run == _Run(first="y", run_pass=_Pass(batch_size=4, workers=2, inner=_Inner(depth=3)))
    assert _Run.build(run_pass=_Pass(workers=1)).run_pass == _Pass(workers=1)
    assert run.with_options(batch_size=8).run_pass == _Pass(batch_size=8, workers=2, inner=_Inner(depth=3))
    assert set(_Run.keyword_homes()) == {"first", "run_pass", "batch_size", "workers", "inner", "depth"}
    with pytest.raises(TypeError, match="give run_pass= or its options"):
        _Run.build(run_pass=_Pass(), workers=1)
    with pytest.raises(TypeError, match="_Run has no option 'width'"):
        _Run.build(width=1)


@dataclass(frozen=True, kw_only=True)
class _Seed(Options):
    seed: int = option(0, "seed", parse=int)


@dataclass(frozen=True, kw_only=True)
class _Seeded(Options):
    seed: _Seed = group(_Seed)


def test_a_group_of_one_named_as_its_option_takes_the_option():
    assert _Seeded.build(seed=3) == _Seeded(seed=_Seed(seed=3))
    assert _Seeded.keyword_homes() == {"seed": "seed"}


def test_a_name_declared_twice_in_one_command_is_refused():
    @dataclass(frozen=True, kw_only=True)
    class Twice(Options):
        workers: int = option(0, "also workers")
        run_pass: _Pass = group(_Pass)

    with pytest.raises(TypeError, match="Twice declares 'workers' twice"):
        Twice.build(workers=1)
