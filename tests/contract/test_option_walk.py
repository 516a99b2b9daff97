"""The walk of a command's options: the option classes a reader opens to know every option of a command (its
options classes, their group fields and bases, transitively), the modules they live in, and the base classes
climbed. A run over several models (``interp reassess``) must be no longer to read than a study on one
(``interp study norms``): the issue that asked for model sets measured 27 files and 15 climbs against 16 / 9.
Torch-free."""
from __future__ import annotations

import argparse
import dataclasses
from typing import List, Set, Tuple

from interp.cli import build_parser
from interp.options import Options


def _command(words: List[str]):
    parser = build_parser()
    for word in words:
        sub = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
        parser = sub.choices[word]
    return parser.get_default("func")


def walk(words: List[str]) -> Tuple[Set[str], int]:
    """The modules of every option class a command's options reach, and how many base classes (other than
    ``Options``) those classes climb."""
    seen: Set[type] = set()

    def visit(cls: type) -> None:
        for c in cls.__mro__:
            if c in seen or c is Options or not (isinstance(c, type) and issubclass(c, Options)):
                continue
            seen.add(c)
            for f in dataclasses.fields(c):
                if "group" in f.metadata:
                    visit(f.metadata["group"])

    for cls in _command(words).options:
        visit(cls)
    climbs = sum(1 for c in seen for b in c.__bases__ if b is not Options and issubclass(b, Options))
    return {c.__module__ for c in seen}, climbs


def test_a_run_over_several_models_is_no_longer_to_read_than_a_study_on_one():
    reassess, norms = walk(["reassess"]), walk(["study", "norms"])
    assert len(reassess[0]) <= len(norms[0]) and reassess[1] <= norms[1], (reassess, norms)
    assert len(walk(["compare"])[0]) <= len(norms[0])
