"""Running the documentation's code blocks as written (README.md and the pages of docs/).

Every fenced ```python and ```bash block of a page runs, in the page's order, as written from the repository
root: in a temporary working directory that mirrors the root (each top-level entry of the checkout linked in,
the git-ignored outputs ``out/``, ``report/`` and ``site/`` left out), on the bundled default; then every file
the blocks wrote must be one the repository's ``.gitignore`` ignores (examples write under ``out/``, never
litter the checkout). The conventions (also stated in docs/contributing.md):

- ``<!-- readme-test: skip (why) -->`` on the line right before a fence skips that block (installs, real
  weights, the full report, a server). Use it sparingly: a skipped block is an untested block.
- Images are the bundled sample photos, by their path in a checkout (``interp/data/samples``) or
  ``interp.models.sample_image_paths()``; there is no ``photos/`` folder.
- The python blocks of one page share one namespace (a later block builds on an earlier one's ``model``,
  ``x``, ...); each page has its own namespace and its own folder.
- In bash blocks, ``interp ARGS`` runs in this process (``interp.cli.main(ARGS)``, no interpreter start-up)
  and must exit 0; ``NAME=value`` lines set a variable that ``$NAME`` expands to; any other line runs in bash.
  ``\\`` continues a line and ``#`` starts a comment, as in a shell.
"""
from __future__ import annotations

import importlib.util
import linecache
import os
import re
import shlex
import subprocess
from dataclasses import dataclass
from pathlib import Path
from typing import Dict, List, Optional

REPO = Path(__file__).resolve().parents[1]


def gen_cli():
    """docs/gen_cli.py, the MkDocs hook, loaded from its file as MkDocs loads it."""
    spec = importlib.util.spec_from_file_location("gen_cli", REPO / "docs" / "gen_cli.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


SKIP_MARK = re.compile(r"<!--\s*readme-test:\s*skip\b(.*?)-->")
FENCE = re.compile(r"^```(\w*)\s*$")
IGNORED_OUTPUTS = ("out", "report", "site")  # git-ignored folders the examples (or mkdocs) write in a checkout


@dataclass
class Block:
    """One fenced code block of a page: its language, first code line (1-based) and text."""

    lang: str
    line: int
    code: str
    skip: Optional[str]  # the reason given in the skip marker, or None when the block runs


def code_blocks(text: str) -> List[Block]:
    """The ```python and ```bash blocks of ``text`` in order, each with the skip marker right above it."""
    lines = text.splitlines()
    blocks, i = [], 0
    while i < len(lines):
        opened = FENCE.match(lines[i])
        if not opened or not opened.group(1):
            i += 1
            continue
        start = i + 1
        end = start
        while end < len(lines) and lines[end].strip() != "```":
            end += 1
        before = next((lines[j] for j in range(i - 1, -1, -1) if lines[j].strip()), "")
        mark = SKIP_MARK.search(before)
        if opened.group(1) in ("python", "bash"):
            blocks.append(Block(opened.group(1), start + 1, "\n".join(lines[start:end]),
                                mark.group(1).strip(" ()") if mark else None))
        i = end + 1
    return blocks


def shell_commands(code: str) -> List[str]:
    """The commands of a bash block: continuation lines joined, comments and blank lines dropped."""
    joined = re.sub(r"\\\n\s*", " ", code)
    commands = []
    for line in joined.splitlines():
        words = shlex.split(line, comments=True)
        if words:
            commands.append(line)
    return commands


def run_shell(code: str, cwd: Path, variables: Dict[str, str], where: str) -> None:
    """Run one bash block: ``interp`` commands in process, variable assignments kept, other lines in bash."""
    from interp.cli import main

    env = {**os.environ, **variables}
    for command in shell_commands(code):
        assignment = re.fullmatch(r"([A-Za-z_]\w*)=(\S+)", command.strip())
        if assignment:
            variables[assignment.group(1)] = os.path.expandvars(assignment.group(2))
            env[assignment.group(1)] = variables[assignment.group(1)]
            continue
        words = [expand(w, variables) for w in shlex.split(command, comments=True)]
        if words[0] == "interp":
            assert main(words[1:]) == 0, f"{where}: `{command}` failed (see stderr above)"
        else:
            done = subprocess.run(["bash", "-c", command], cwd=cwd, env=env, capture_output=True, text=True)
            assert done.returncode == 0, f"{where}: `{command}` failed:\n{done.stderr}"


def expand(word: str, variables: Dict[str, str]) -> str:
    """``$NAME`` and ``${NAME}`` in ``word`` replaced by the block variables (others left as they are)."""
    return re.sub(r"\$(\w+)|\$\{(\w+)\}", lambda m: variables.get(m.group(1) or m.group(2), m.group(0)), word)


def root_mirror(where: Path) -> Path:
    """A folder that looks like the repository root to an example: every top-level entry of the checkout
    (README, interp/, examples/, ...) linked in, except git metadata and the ignored outputs."""
    where.mkdir(parents=True, exist_ok=True)
    for entry in REPO.iterdir():
        if entry.name not in (".git", *IGNORED_OUTPUTS) and not entry.name.startswith((".venv", ".pytest")):
            (where / entry.name).symlink_to(entry, target_is_directory=entry.is_dir())
    return where


def written_files(root: Path) -> List[str]:
    """Paths (relative to ``root``) of the files under ``root`` that are not links into the checkout."""
    return sorted(str((Path(folder) / name).relative_to(root)) for folder, _, names in os.walk(root)
                  for name in names if not (Path(folder) / name).is_symlink())


def not_ignored(paths: List[str]) -> List[str]:
    """Those of ``paths`` the repository's .gitignore does not ignore (checked as paths of the checkout)."""
    if not paths:
        return []
    done = subprocess.run(["git", "-C", str(REPO), "check-ignore", "--no-index", "--stdin"], input="\n".join(paths),
                          capture_output=True, text=True)
    ignored = set(done.stdout.split())
    return [p for p in paths if p not in ignored]


def run_page(page: Path, root: Path) -> int:
    """Run every unskipped block of ``page`` in order, with ``root`` (a :func:`root_mirror`) as the working
    directory the caller has already entered; returns how many ran. Raises on the first block that fails."""
    import matplotlib

    matplotlib.use("Agg")  # the examples may plot; never open a window
    name = page.relative_to(REPO) if page.is_relative_to(REPO) else page.name
    namespace: Dict = {"__name__": "__docs_example__"}
    variables: Dict[str, str] = {}
    ran = 0
    for block in code_blocks(page.read_text(encoding="utf-8")):
        if block.skip is not None:
            continue
        where = f"{name} line {block.line} ({block.lang} block)"
        if block.lang == "python":
            source = block.code + "\n"  # kept in linecache: nnsight reads a `with` block's source back
            linecache.cache[where] = (len(source), None, source.splitlines(keepends=True), where)
            exec(compile(source, where, "exec"), namespace)
        else:
            run_shell(block.code, root, variables, where)
        ran += 1
    return ran
