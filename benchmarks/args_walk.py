"""The walk of a command's parsed input: where the argparse Namespace is read or written after parsing.

Runs one ``interp`` command in this process with argparse's parse result replaced by a recording Namespace, and
counts, after ``parse_args`` returned:

* rooms: the distinct interp modules whose code reads or writes an attribute of the Namespace (and, finer, the
  distinct functions);
* climbs: how many times the Namespace is read again in a caller after a callee read it (an access whose stack
  is a strict prefix of the previous access's stack: the parsed input went back up the call stack).

    python benchmarks/args_walk.py -- study norms planted_vit --images DIR --out /tmp/o --no-progress
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import List, Tuple

ROOT = Path(__file__).resolve().parents[1]

_accesses: List[Tuple[Tuple[int, ...], str, str]] = []  # (stack of frame ids, module file, attribute)
_frames: dict = {}  # frame object -> id (kept alive so that ids stay distinct)
_recording = [False]


def _stack() -> Tuple[Tuple[int, ...], str]:
    frame = sys._getframe(2)
    caller = f"{frame.f_code.co_filename}:{frame.f_code.co_name}"
    ids = []
    while frame is not None:
        if frame not in _frames:
            _frames[frame] = len(_frames)
        ids.append(_frames[frame])
        frame = frame.f_back
    return tuple(reversed(ids)), caller


class Recorded(argparse.Namespace):
    def __getattribute__(self, name):
        if _recording[0] and not name.startswith("__"):
            stack, caller = _stack()
            _accesses.append((stack, caller, name))
        return object.__getattribute__(self, name)

    def __setattr__(self, name, value):
        if _recording[0]:
            stack, caller = _stack()
            _accesses.append((stack, caller, name))
        object.__setattr__(self, name, value)


def walk(argv: List[str]) -> dict:
    sys.path.insert(0, str(ROOT))
    from interp import cli

    shown = argparse.ArgumentParser.parse_args

    def parse_args(self, args=None, namespace=None):  # the top parser's call (sub-parsers parse_known_args)
        parsed = shown(self, args, Recorded() if namespace is None else namespace)
        _recording[0] = True
        return parsed

    argparse.ArgumentParser.parse_args = parse_args
    try:
        status = cli.main(argv)
    finally:
        argparse.ArgumentParser.parse_args = shown
    interp_dir = str(ROOT / "interp")
    inside = [(s, f, a) for s, f, a in _accesses if f.startswith(interp_dir)]
    rooms = sorted({str(Path(f.partition(":")[0]).relative_to(ROOT)) for _, f, _ in inside})
    functions = sorted({f"{Path(f).relative_to(ROOT)}" for _, f, _ in inside})
    climbs = sum(1 for (before, _, _), (now, _, _) in zip(inside, inside[1:])
                 if len(now) < len(before) and before[:len(now)] == now)
    return {"argv": argv, "status": status, "rooms": len(rooms), "functions": len(functions),
            "climbs": climbs, "modules": rooms, "function_list": functions,
            "accesses": len(inside)}


if __name__ == "__main__":
    words = sys.argv[1:]
    if words[:1] == ["--"]:
        words = words[1:]
    print(json.dumps(walk(words), indent=1))
