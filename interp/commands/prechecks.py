"""What the command line checks after parsing and before torch is imported (torch and timm take 10-15 s to load):
the model name(s) against timm's shipped name list, the images an ``--images``/``--image-list`` names (they exist
and at least one opens as an image; all of them with ``--strict``), every command's ``--out`` (not empty, no name
too long for the file system), the writer lock of an ``interp cache`` output, and the input files no argparse type
sees (an ``--sae`` folder's files, a ``--neurons`` file: none may be a FIFO or a device,
:func:`interp.paths.check_input_path`). The same checks run again where the work happens; these only make a
mistake cost a second. What needs the model's structure is checked after torch loads but before the model does, on
its skeleton (:func:`interp.commands.common.check_before_load`)."""
from __future__ import annotations

import os
from pathlib import Path
from typing import Any, Dict, Sequence

from ..formats.image_files import LIST_SUFFIXES, list_images
from .._model_names import PLANTED_NAME, check_model_name_fast
from ..errors import ImageError, UsageError
from ..options import Options
from ..sae_settings import SAE_CONFIG, SAE_WEIGHTS
from ..paths import check_input_path, check_output_path
from .common import option_values
from .inputs import RunInputs

HEADERS_CHECKED = 64  # image headers opened before the run (PIL reads a few hundred bytes of each)


def check_before_torch(options: Sequence[Options], inputs: RunInputs) -> None:
    """Every pre-check that applies to a command's parsed ``options`` and run ``inputs`` (a command without
    these options passes)."""
    for spec in inputs.models:
        if isinstance(spec.name, str):
            check_model_name_fast(spec.name)
    given = option_values(options)
    out = given.get("out")
    if isinstance(out, str):  # every command's --out: not empty, names the file system can hold
        check_output_path(out)
    check_input_files(given)
    check_against_config(given, inputs)
    for flag, value in (("--images", inputs.images), ("--image-list", inputs.image_list)):
        if isinstance(value, str):
            check_images(value, flag, inputs.strict)




def check_input_files(given: Dict[str, Any]) -> None:
    """The input files inside or behind an option that argparse only sees as text, refused when one is a FIFO,
    a device or a socket (reading it would wait forever): the files of the ``--sae`` folder, and the
    ``--neurons`` value when it names a file (``neurons.json``; else it is ``LAYER:NEURON`` text)."""
    sae, neurons = given.get("sae"), given.get("neurons")
    if isinstance(sae, str):
        for name in (SAE_CONFIG, SAE_WEIGHTS):
            check_input_path(Path(sae) / name, "--sae")
    if isinstance(neurons, str) and os.path.lexists(neurons):
        check_input_path(neurons, "--neurons")


PLANTED_DEPTH = 6  # interp.models.planted.planted_vit's blocks (that module imports torch)
LAYER_FLAGS = (("detect_layer", "--detect-layer"), ("highest_layer", "--highest-layer"), ("layer", "--layer"))


def known_depth(inputs: RunInputs):
    """The model's block count when it is known without torch: ``--depth`` (the model keeps at most that many
    blocks, so a block >= it cannot exist) or planted_vit's; None otherwise (the check on the model's skeleton
    decides)."""
    if len(inputs.models) != 1:
        return None
    depth = inputs.model.depth
    if inputs.model.name == PLANTED_NAME:
        depth = min(depth or PLANTED_DEPTH, PLANTED_DEPTH)
    return depth if isinstance(depth, int) else None


def check_against_config(given: Dict[str, Any], inputs: RunInputs) -> None:
    """Argument errors that need no model, caught before torch (torch and timm take 10-15 s to import): block
    numbers (``--detect-layer``, ``--highest-layer``, ``--layer``, the block of ``--hook``) beyond a known depth,
    and ``--features`` beyond the ``n_features`` the ``--sae`` folder's sae.json records."""

    n = known_depth(inputs)
    if n is not None:
        name = inputs.model.name or "the model"
        for attr, flag in LAYER_FLAGS:
            value = given.get(attr)
            if isinstance(value, int) and not -n <= value < n:
                raise UsageError(f"{flag} {value} is out of range: {name} has {n} blocks "
                                 f"(0..{n - 1}, or -{n}..-1 counted from the end)")
        hook = given.get("hook")
        block = _block_number(hook) if isinstance(hook, str) else None
        if block is not None and block >= n:
            raise UsageError(f"--hook {hook!r}: {name} has {n} blocks (0..{n - 1}); list its hooks with "
                             f"`interp hooks {name}`")
    features, sae = given.get("features"), given.get("sae")
    if features and isinstance(sae, str):
        count = _sae_features(sae)
        bad = [f for f in features if isinstance(f, int) and not 0 <= f < (count or 0)]
        if count and bad:
            raise UsageError(f"--features: feature {bad[0]} does not exist: the SAE in {sae!r} has {count} features "
                             f"(0..{count - 1})")


def _block_number(hook: str):
    import re

    found = re.match(r"blocks\.(\d+)\.", hook)
    return int(found.group(1)) if found else None


def _sae_features(folder: str):
    """``n_features`` from ``folder/sae.json`` read as text (None when it does not say: the load decides)."""
    import json

    try:
        value = json.loads((Path(folder) / SAE_CONFIG).read_text(encoding="utf-8")).get("n_features")
    except (OSError, ValueError, AttributeError, RecursionError):
        return None
    return value if isinstance(value, int) and not isinstance(value, bool) and value > 0 else None


def check_images(path: str, flag: str = "--images", strict: bool = False) -> int:
    """``path`` names at least one readable image: a folder with image files, a list file whose paths exist,
    or an image file. Opens up to :data:`HEADERS_CHECKED` image headers (the first of each kind of failure is
    named); with ``strict`` every listed path must exist and every checked header open. Returns the number of
    images named. Raises ImageError (one line; the status the run would give, 1) otherwise."""
    try:
        files = list_images(path)
    except ImageError as e:
        raise ImageError(f"{flag} {path!r}: {e}") from None
    except (OSError, UnicodeDecodeError) as e:
        raise ImageError(f"{flag} {path!r}: cannot read the list ({getattr(e, 'strerror', None) or e})") from None
    listed = Path(path).suffix.lower() in LIST_SUFFIXES and not Path(path).is_dir()
    if not files:
        raise ImageError(f"{flag} {path!r} lists no image paths; give one image path per line")
    missing = [f for f in files if not f.is_file()]
    if missing and (strict or len(missing) == len(files)):
        what = f"of its {len(files)} listed paths" if listed else "image file(s)"
        dangling = " (a dangling symlink)" if missing[0].is_symlink() else ""
        raise ImageError(f"{flag} {path!r}: {len(missing)} {what} do not exist, e.g. {str(missing[0])!r}{dangling}"
                         + (" (--strict stops at the first)" if strict and len(missing) < len(files) else ""))
    checked = [f for f in files if f.is_file()][:HEADERS_CHECKED]
    problems = [(f, why) for f, why in ((f, _header_problem(f)) for f in checked) if why]
    if problems and (strict or (len(problems) == len(checked) == len(files))):
        f, why = problems[0]
        scope = "" if len(checked) == len(files) else f" (of the first {len(checked)} checked)"
        raise ImageError(f"{flag} {path!r}: {len(problems)} file(s){scope} do not open as images, e.g. "
                         f"{str(f)!r} ({why}); give image files (jpg, png, ...)")
    return len(files)


def _header_problem(path: Path):
    """Why ``path`` does not open as an image (PIL reads its header only), or None."""
    from PIL import Image

    try:
        with Image.open(path) as im:
            im.size  # noqa: B018  (the header is parsed on open; size proves it)
    except Image.DecompressionBombError:
        return None  # a real image, too large: the run skips it and says so
    except Exception as e:  # PIL raises many types for broken files
        return f"{type(e).__name__}: {str(e).splitlines()[0] if str(e) else 'unreadable'}"
    return None


def check_cache_lock(out: str) -> None:
    """Refuse at once when another process is writing the cache ``out`` (its :class:`WriterLock` is held)."""
    from ..cache.lock import WriterLock, lock_path  # torch-free: interp.cache resolves its heavy names lazily

    if not lock_path(out).exists():  # a writer keeps its lock file while it runs
        return
    lock = WriterLock(out)
    try:
        lock.acquire()
    except OSError:
        return  # a folder that cannot hold the lock: the output checks say it
    lock.release()
