"""A patch file's spec and tensor header, read without torch: what ``interp patch show FILE`` prints answers in
a fraction of a second instead of after torch and timm load (the file format: :mod:`interp.interventions.export`).

A ``.safetensors`` file is an 8-byte little-endian header length, a JSON header (each tensor's ``dtype``,
``shape`` and ``data_offsets`` into the body, and ``__metadata__``) and the body; the patch spec is the
``interp_patch`` metadata entry.
"""
from __future__ import annotations

import hashlib
import json
import struct
from pathlib import Path
from typing import Any, Dict, Tuple, Union

from .._version import __version__
from ..errors import PatchError
from ..paths import check_input_path

FORMAT = "interp-patch"
FORMAT_VERSION = 1
METADATA_KEY = "interp_patch"
# The intervention kinds this interp writes (interp.interventions' registry: tests/interventions check it).
KNOWN_KINDS = ("AttentionBias", "HighNormReplacement", "NeuronAblation", "RegCache", "Relocation",
               "SAEFeatureAblation", "SelectiveCLS", "TestTimeRegister", "TokenReplacement")
# safetensors' dtype codes as torch names them (what a patch's tensor checksum hashes).
TORCH_DTYPES = {"F64": "float64", "F32": "float32", "F16": "float16", "BF16": "bfloat16", "I64": "int64",
                "I32": "int32", "I16": "int16", "I8": "int8", "U8": "uint8", "BOOL": "bool"}
MAX_HEADER = 100_000_000  # safetensors' own limit on the JSON header
PathLike = Union[str, Path]


def read_header(path: Path) -> Tuple[Dict[str, Dict[str, Any]], Dict[str, str], int]:
    """(tensors {name: {"dtype", "shape", "data_offsets"}}, metadata, where the body starts) of a safetensors
    file, checked against the file's size.

    Raises:
        PatchError: not a safetensors file, or truncated.
    """
    size = path.stat().st_size
    try:
        with open(path, "rb") as f:
            (n,) = struct.unpack("<Q", f.read(8))
            if n > min(MAX_HEADER, size - 8):
                raise ValueError(f"header length {n} exceeds the file ({size} bytes)")
            header = json.loads(f.read(n))
        if not isinstance(header, dict):
            raise ValueError("the header is not a JSON object")
        metadata = header.pop("__metadata__", None) or {}
        end = max((int(t["data_offsets"][1]) for t in header.values()), default=0)
        if 8 + n + end > size:
            raise ValueError(f"the tensors end at byte {8 + n + end}, past the file's {size}")
    except (struct.error, ValueError, KeyError, TypeError, IndexError, RecursionError, OSError) as e:
        raise PatchError(f"{str(path)!r} is not a readable patch file (corrupt or truncated?): {e}") from None
    return header, metadata, 8 + n


def read_spec(path: PathLike) -> Dict[str, Any]:
    """The JSON spec of a patch file (no tensors read).

    Raises:
        PatchError: missing, unreadable, truncated or foreign file, or a newer format version.
    """
    path = Path(path)
    check_input_path(path, "patch file")
    if not path.is_file():
        raise PatchError(f"patch file {str(path)!r} does not exist")
    metadata = read_header(path)[1]
    if METADATA_KEY not in metadata:
        raise PatchError(f"{str(path)!r} is a safetensors file but not an interp patch (no {METADATA_KEY!r} "
                         "metadata); write patches with interp.patch.save or `interp patch export`")
    try:
        spec = json.loads(metadata[METADATA_KEY])
    except (json.JSONDecodeError, RecursionError, TypeError) as e:
        reason = "nested too deeply" if isinstance(e, RecursionError) else str(e)
        raise PatchError(f"{str(path)!r}: the patch spec is not valid JSON ({reason}); the file is corrupt") from None
    if not isinstance(spec, dict) or spec.get("format") != FORMAT or "interventions" not in spec:
        raise PatchError(f"{str(path)!r}: the patch spec is not an {FORMAT} spec; the file is corrupt")
    version = spec.get("version")
    if isinstance(version, bool) or not isinstance(version, int):
        raise PatchError(f"{str(path)!r}: the patch format version is {version!r}, not a whole number; the file "
                         "is corrupt: export the patch again")
    if version > FORMAT_VERSION:
        raise PatchError(f"{str(path)!r} is patch format version {spec['version']}; this interp "
                         f"({__version__}) reads up to version {FORMAT_VERSION}: upgrade interp")
    _check_entries(spec["interventions"], path)
    return spec


def _check_entries(entries: Any, path: Path) -> None:
    """The ``interventions`` list of a patch spec: objects with a string ``kind``, a ``params`` object and a
    ``tensors`` list of names. Raises one PatchError naming the first bad entry."""
    if not isinstance(entries, list):
        raise PatchError(f"{str(path)!r}: the patch spec's \"interventions\" is a {type(entries).__name__}, not a "
                         "list of intervention entries; the file is corrupt: export the patch again")
    for i, entry in enumerate(entries):
        ok = (isinstance(entry, dict) and isinstance(entry.get("kind"), str)
              and isinstance(entry.get("params", {}), dict)
              and isinstance(entry.get("tensors", []), list)
              and all(isinstance(t, str) for t in entry.get("tensors", [])))
        if not ok:
            raise PatchError(f"{str(path)!r}: intervention entry {i} ({str(entry)[:80]}) is not an object with a "
                             "\"kind\" string, \"params\" object and \"tensors\" name list; the file is corrupt")


def file_tensor_digest(path: Path, header: Dict[str, Dict[str, Any]], start: int) -> str:
    """The SHA-256 the patch spec records of its tensors (``export._tensor_digest``: per name in order, the
    name, torch dtype and shape, then the raw bytes), from the file's bytes."""
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for name in sorted(header):
            info = header[name]
            h.update(f"{name}:torch.{TORCH_DTYPES.get(info['dtype'], info['dtype'])}:{tuple(info['shape'])};"
                     .encode())
            begin, end = info["data_offsets"]
            f.seek(start + begin)
            h.update(f.read(end - begin))
    return h.hexdigest()


def describe(path: PathLike) -> str:
    """Human-readable summary of a patch file (``interp patch show``), torch-free: its spec, each intervention's
    kind, parameters and tensors (shape, dtype), after checking the tensors against their checksum and every
    kind against the ones interp knows (each entry's parameters are checked where it is loaded).

    Raises:
        PatchError: as :func:`read_spec`, a checksum mismatch, an unknown kind or a missing tensor.
    """
    spec = read_spec(path)
    path = Path(path)
    header, _, start = read_header(path)
    if file_tensor_digest(path, header, start) != spec.get("tensor_sha256"):
        raise PatchError(f"{str(path)!r}: the patch tensors do not match their checksum; the file is corrupt")
    lines = [f"patch {path}", f"  format {spec['format']} v{spec['version']} (interp {spec.get('interp_version')})",
             f"  model {spec.get('model_name')}  architecture {spec.get('architecture_fingerprint')}  "
             f"weights {spec.get('weights_fingerprint')}"]
    for i, entry in enumerate(spec["interventions"]):
        if entry["kind"] not in KNOWN_KINDS:
            raise PatchError(f"{str(path)!r}: unknown intervention kind {entry['kind']!r} "
                             f"(known: {sorted(KNOWN_KINDS)}); upgrade interp")
        lines.append(f"  [{i}] {entry['kind']} {json.dumps(entry.get('params', {}))}")
        for name in entry.get("tensors", []):
            info = header.get(f"{i}.{name}")
            if info is None:
                raise PatchError(f"{str(path)!r}: intervention entry {i} ({entry['kind']}) needs tensor "
                                 f"'{i}.{name}' that the file does not hold; the file is corrupt")
            lines.append(f"       {name}: {list(info['shape'])} {TORCH_DTYPES.get(info['dtype'], info['dtype'])}")
    return "\n".join(lines)
