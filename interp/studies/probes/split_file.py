"""The split file of the probes (``--split FILE``), read without torch (the config reads it before the model
loads): one image per line, ``train PATH`` or ``test PATH`` (a comma or a tab may separate the two; ``#`` starts
a comment), or JSON ``{"train": [...], "test": [...]}``; relative paths are relative to the file's folder."""
from __future__ import annotations

import json
from pathlib import Path
from typing import Dict, List, Tuple, Union

from ...errors import InterpError
from ...paths import check_input_path

SPLIT_NAMES = ("train", "test")
PathLike = Union[str, Path]


def read_split(path: PathLike) -> Tuple[List[str], List[str]]:
    """(train entries, test entries) of a split file (module docstring); relative paths made relative to the
    file's folder. Raises InterpError naming the first bad line."""
    path = Path(path)
    check_input_path(path, "split file")
    try:
        text = path.read_text()
    except (OSError, UnicodeDecodeError) as e:
        raise InterpError(f"cannot read the split file {str(path)!r}: {e}") from None
    sets: Dict[str, List[str]] = {"train": [], "test": []}
    if path.suffix.lower() == ".json":
        try:
            data = json.loads(text)
        except (json.JSONDecodeError, RecursionError) as e:
            reason = "nested too deeply" if isinstance(e, RecursionError) else str(e)
            raise InterpError(f"split file {str(path)!r} is not valid JSON: {reason}") from None
        if not isinstance(data, dict) or set(data) - set(SPLIT_NAMES) or \
                not all(isinstance(v, list) for v in data.values()):
            raise InterpError(f"split file {str(path)!r}: JSON must be {{\"train\": [...], \"test\": [...]}}")
        sets = {k: [str(v) for v in data.get(k, [])] for k in SPLIT_NAMES}
    else:
        for number, line in enumerate(text.splitlines(), 1):
            line = line.strip()
            if not line or line.startswith("#"):
                continue
            sep = "\t" if "\t" in line else "," if "," in line else None
            name, _, entry = line.partition(sep) if sep else line.partition(" ")
            name, entry = name.strip().lower(), entry.strip()
            if number == 1 and name in ("split", "set") and entry.lower() in ("image", "id", "path"):
                continue  # a header line
            if name not in SPLIT_NAMES or not entry:
                raise InterpError(f"split file {str(path)!r} line {number}: {line!r}; each line is "
                                  "'train PATH' or 'test PATH'")
            sets[name].append(entry)
    if not sets["test"]:
        raise InterpError(f"split file {str(path)!r} lists no test image; give 'test PATH' lines")
    base = path.parent
    resolve = (lambda e: e if Path(e).is_absolute() or not (base / e).exists() else str(base / e))
    return [resolve(e) for e in sets["train"]], [resolve(e) for e in sets["test"]]
