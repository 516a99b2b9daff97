"""Paths given on the command line, checked while it is parsed (before torch): inputs that exist and can be read
(not a FIFO, a device or a dangling link: :func:`check_input_path`), outputs whose names fit the file system
(:func:`check_output_path`), configuration JSON of bounded size, and the argparse ``type=`` checks of files and
folders (``--images``, ``--cache``, ``--weights``, ``--classifier``, ``--image-list``). Torch-free.
"""
from __future__ import annotations

import argparse
import os
import stat
from pathlib import Path
from typing import Optional

from .errors import InputPathError, UsageError


_KINDS = ((stat.S_ISCHR, "a character device"), (stat.S_ISBLK, "a block device"), (stat.S_ISFIFO, "a FIFO (named pipe)"),
          (stat.S_ISSOCK, "a socket"))


def special_kind(path) -> Optional[str]:
    """What ``path`` is when it is neither a regular file nor a folder (a device node, FIFO, socket, or a symlink
    to one, or a dangling symlink), in words; None for a regular file, a folder, or nothing there."""
    path = str(path)
    if not os.path.lexists(path):
        return None
    try:
        mode = os.stat(path).st_mode
    except OSError:
        return "a symlink to nothing (dangling)" if os.path.islink(path) else "an entry that cannot be read"
    if stat.S_ISREG(mode) or stat.S_ISDIR(mode):
        return None
    kind = next((name for test, name in _KINDS if test(mode)), "not a regular file")
    return f"a symlink to {kind}" if os.path.islink(path) else kind


def check_input_path(path, label: str = "", folder_ok: bool = False) -> None:
    """Refuse, before it is opened, an input ``path`` that is there but is neither a regular file nor a folder:
    a FIFO (opening it waits for a writer forever), a device node (it may stream without end), a socket, a
    symlink to one, and an empty path given as text (``Path("")`` is the working folder). Every file a command
    reads passes here first (the argparse types below, the pre-checks, the readers). Nothing there (a dangling
    symlink too), a file or a folder passes: the caller says what is missing or of the wrong kind
    (``folder_ok``: the message offers a folder too).

    Raises:
        InputPathError: one line naming ``label`` (an option such as ``--masks``, or what the file is), the
            path, what it is and the fix; exit status 2.
    """
    if isinstance(path, str) and not path.strip():  # Path("") is the working folder: every image under it was read
        raise InputPathError(f"{label + ' ' if label else ''}'' is an empty path: give a file or folder")
    kind = special_kind(path)
    if kind is None or not os.path.exists(path):  # a dangling symlink is missing: the caller says so
        return
    where = f"{label} {str(path)!r}" if label else repr(str(path))
    wanted = "a regular file or folder" if folder_ok else "a regular file"
    raise InputPathError(f"{where} is {kind}, not {wanted}: reading it could block forever; give {wanted} "
                         "(save what it streams into a file first)")


MAX_CONFIG_BYTES = 1 << 20  # a configuration file (JSON) of a few kB; /dev/zero behind a link would never end


def read_config_json(path, label: str, limit: int = MAX_CONFIG_BYTES) -> dict:
    """The JSON object in the small configuration file ``path`` (``label``: what it is, in messages), read
    through :func:`check_input_path` and at most ``limit`` bytes: a FIFO, a device, an endless or huge file, bytes
    that are not UTF-8 JSON, or a value that is not an object is one UsageError line (exit status 2)."""
    import json

    check_input_path(path, label)
    where = f"{label} {str(path)!r}"
    try:
        with open(path, "rb") as f:
            data = f.read(limit + 1)
    except OSError as e:
        raise UsageError(f"cannot read {where} ({e.strerror or type(e).__name__})") from None
    if len(data) > limit:
        raise UsageError(f"{where} is larger than {limit:,} bytes: not a configuration file; give the file its "
                         "project wrote")
    try:
        value = json.loads(data.decode("utf-8"))
    except (UnicodeDecodeError, ValueError, RecursionError) as e:
        raise UsageError(f"{where} is not JSON ({type(e).__name__}); give the file its project wrote") from None
    if not isinstance(value, dict):
        raise UsageError(f"{where} holds a JSON {type(value).__name__}, not an object; give the file its project "
                         "wrote")
    return value


MAX_NAME_BYTES = 223  # a file name part: 255 bytes (Linux, macOS) less the suffixes of interp's temporary files
MAX_PATH_BYTES = 4000  # a whole path (PATH_MAX 4096 with the same room)


def check_output_path(path, flag: str = "--out") -> None:
    """Refuse, before any work, an output path that is empty (``''`` wrote into the working folder) or that the
    file system cannot hold: a name part over :data:`MAX_NAME_BYTES` bytes or a path over :data:`MAX_PATH_BYTES`
    (the write failed at the end with a raw ``File name too long``).

    Raises:
        UsageError: one line naming ``flag`` and the fix (exit status 2).
    """
    text = os.fsdecode(path) if isinstance(path, bytes) else str(path)
    if not text.strip():
        raise UsageError(f"{flag} '' is an empty path: give a file or folder name")
    size = len(os.fsencode(text))
    long = max(Path(text).parts, key=lambda part: len(os.fsencode(part)))
    if len(os.fsencode(long)) > MAX_NAME_BYTES or size > MAX_PATH_BYTES:
        what = (f"a name of {len(os.fsencode(long))} bytes ({long[:24]!r}...)" if len(os.fsencode(long)) > MAX_NAME_BYTES
                else f"a path of {size} bytes")
        raise UsageError(f"{flag} has {what}: give names of at most {MAX_NAME_BYTES} bytes and a path of at most "
                         f"{MAX_PATH_BYTES}")


def readable_input(text: str, folder_ok: bool) -> None:
    """:func:`check_input_path` as an argparse type check (argparse names the option)."""
    try:
        check_input_path(text, folder_ok=folder_ok)
    except InputPathError as e:
        raise argparse.ArgumentTypeError(str(e)) from None


def existing_path(text: str) -> str:
    """A file or folder that exists (--images, --masks); not a FIFO or device (:func:`check_input_path`)."""
    readable_input(text, folder_ok=True)
    if not Path(text).exists():
        raise argparse.ArgumentTypeError(f"{text!r} does not exist (looked in {Path.cwd()})")
    return text


def classifier_source(text: str) -> str:
    """A classifier file, or a ``transformers`` image-classification folder (its ``config.json`` beside the
    weights: ``Dinov2ForImageClassification``'s head is read from it) (--classifier)."""
    return file_or_model_folder(text, "a classifier file or a transformers image-classification folder")


def file_or_model_folder(text: str, wanted: str) -> str:
    """A file that exists (:func:`existing_file`), or a ``transformers`` folder (one holding a ``config.json``);
    ``wanted`` names both in the refusal of a folder without one."""
    if Path(text).is_dir():
        readable_input(text, folder_ok=True)
        if not (Path(text) / "config.json").is_file():
            raise argparse.ArgumentTypeError(f"{text!r} is a folder without config.json; give {wanted}")
        return text
    return existing_file(text)


def existing_file(text: str) -> str:
    """A file that exists (--cache, --boxes, --weights, --interventions, a patch file); not a FIFO or device
    (:func:`check_input_path`)."""
    readable_input(text, folder_ok=False)
    path = Path(text)
    if not path.exists():
        raise argparse.ArgumentTypeError(f"{text!r} does not exist (looked in {Path.cwd()})")
    if path.is_dir():
        raise argparse.ArgumentTypeError(f"{text!r} is a folder; give a file")
    return text


def weights_arg(text: str) -> str:
    """``--weights``: a weight file that exists (:func:`existing_file`), or a Hugging Face ``transformers`` folder
    (one holding a ``config.json``)."""
    return file_or_model_folder(text, "a weight file or a transformers folder (save_pretrained)")


def image_list_file(text: str) -> str:
    """A readable ``.txt``/``.lst`` text file listing image paths, one a line (--image-list)."""
    existing_file(text)
    if not text.lower().endswith((".txt", ".lst")):
        raise argparse.ArgumentTypeError(f"expected a .txt or .lst file with one image path per line, got {text!r}")
    try:
        with open(text, "rb") as f:
            head = f.read(1 << 16)
    except OSError as e:
        raise argparse.ArgumentTypeError(f"cannot read {text!r}: {e.strerror}") from None
    binary = b"\0" in head
    if not binary:
        try:
            head.decode("utf-8")
        except UnicodeDecodeError as e:
            binary = e.start < len(head) - 4  # a character cut at the 64 KB boundary is not binary
    if binary:
        raise argparse.ArgumentTypeError(f"{text!r} is not a text file (binary bytes); give one image path per line")
    return text
