"""The README's examples run as written (issue 12, point 1).

Every fenced ```python and ```bash block of README.md runs, in the README's order, as written from the
repository root, in a temporary folder that mirrors it, and may write only git-ignored files. The machinery and
its conventions (skip markers, one namespace, ``interp ARGS`` in-process) are in ``tests/doc_examples.py``,
shared with the pages of docs/ (``tests/contract/test_docs_site.py``).
"""
from __future__ import annotations

import shlex

import pytest

from doc_examples import REPO, code_blocks, expand, not_ignored, root_mirror, run_page, shell_commands, written_files

README = REPO / "README.md"


# ----------------------------------------------------------------------------------------- the parser itself
def test_blocks_and_skip_markers_are_found():
    text = ("intro\n```python\na = 1\n```\n<!-- readme-test: skip (needs weights) -->\n\n```bash\ninterp x\n```\n"
            "```text\nnot code\n```\n```\nplain\n```\n")
    blocks = code_blocks(text)
    assert [(b.lang, b.line, b.code, b.skip) for b in blocks] == [
        ("python", 3, "a = 1", None), ("bash", 8, "interp x", "needs weights")]


def test_shell_commands_join_continuations_and_drop_comments():
    code = "# a comment\nS=dir\ninterp cache m --hooks 'a b' \\\n    --out x.h5   # trailing\n\n"
    commands = shell_commands(code)
    assert [shlex.split(c, comments=True) for c in commands] == [
        ["S=dir"], ["interp", "cache", "m", "--hooks", "a b", "--out", "x.h5"]]
    assert expand("$S/img", {"S": "photos"}) == "photos/img"


# ----------------------------------------------------------------------------------------- the README
def test_written_files_outside_ignored_paths_are_reported(tmp_path):
    root = root_mirror(tmp_path / "root")
    (root / "out").mkdir()
    (root / "out" / "x.json").write_text("{}")
    (root / "bias.safetensors").write_text("")
    assert (root / "interp").is_symlink() and (root / "README.md").is_symlink() and not (root / "photos").exists()
    assert written_files(root) == ["bias.safetensors", "out/x.json"]
    assert not_ignored(written_files(root)) == ["bias.safetensors"]


def test_readme_blocks_skipped_as_run_in_docs_are_run_there():
    """A README block marked ``skip (runs in docs...)`` is not run twice: each of its commands is a command of
    a block of docs/ that runs (tests/contract/test_docs_site.py)."""
    in_docs = {tuple(shlex.split(c, comments=True)) for page in (REPO / "docs").glob("*.md")
               for b in code_blocks(page.read_text(encoding="utf-8")) if b.skip is None and b.lang == "bash"
               for c in shell_commands(b.code)}
    moved = [b for b in code_blocks(README.read_text(encoding="utf-8")) if (b.skip or "").startswith("runs in docs")]
    assert moved, "the README's command-line tour runs in docs/ and says so"
    missing = [c for b in moved for c in shell_commands(b.code) if tuple(shlex.split(c, comments=True)) not in in_docs]
    assert missing == [], f"README commands run nowhere: {missing}"


@pytest.mark.slow
def test_readme_examples_run(tmp_path, monkeypatch):
    """Every python and bash block of README.md runs in order, from a copy of the repository root, on the
    bundled default, and writes only git-ignored files."""
    blocks = code_blocks(README.read_text(encoding="utf-8"))
    assert any(b.lang == "python" and b.skip is None for b in blocks), "README.md has no runnable python block"
    root = root_mirror(tmp_path / "root")
    monkeypatch.chdir(root)
    monkeypatch.setenv("INTERP_NO_PROGRESS", "1")
    assert run_page(README, root) >= 1
    written = written_files(root)
    assert not not_ignored(written), f"README examples wrote files git does not ignore: {not_ignored(written)}"
