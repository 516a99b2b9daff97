"""Which files an image argument names (imports neither torch nor PIL, so the command line checks ``--images``
before torch loads): a folder (searched recursively), a ``.txt``/``.lst`` list of paths, or one image file."""
from __future__ import annotations

from pathlib import Path
from typing import List, Sequence, Union

from ..errors import ImageError, InputPathError
from ..paths import check_input_path

IMAGE_SUFFIXES = (".jpg", ".jpeg", ".png", ".bmp", ".gif", ".tif", ".tiff", ".webp", ".ppm", ".pgm")
LIST_SUFFIXES = (".txt", ".lst")

PathLike = Union[str, Path]


def readable_image_path(path: PathLike) -> None:
    """:func:`~interp.paths.check_input_path` for an image, a list file or an image folder, as an
    :class:`ImageError` (an unreadable image is skipped and listed like a broken one, not the end of a run)."""
    try:
        check_input_path(path, "image path", folder_ok=True)
    except InputPathError as e:
        raise ImageError(str(e)) from None


def list_images(source: Union[PathLike, Sequence[PathLike]]) -> List[Path]:
    """Image files of a directory (recursively, sorted), a text file listing paths, or a list of paths."""
    if isinstance(source, (str, Path)):
        source = Path(source)
        readable_image_path(source)
        if source.is_dir():
            # a dangling symlink is listed (as a missing file: --strict refuses it, a run skips it and says so)
            files = sorted(p for p in source.rglob("*") if p.suffix.lower() in IMAGE_SUFFIXES
                           and (p.is_file() or (p.is_symlink() and not p.exists())))
            if not files:
                raise ImageError(f"no image files ({', '.join(IMAGE_SUFFIXES)}) under {str(source)!r}")
            return files
        if source.suffix.lower() in LIST_SUFFIXES:
            base = source.parent
            lines = [l.strip() for l in source.read_text().splitlines() if l.strip() and not l.startswith("#")]
            return [Path(l) if Path(l).is_absolute() else base / l for l in lines]
        if not source.exists():
            kind = "image file" if source.suffix.lower() in IMAGE_SUFFIXES else "folder or image file"
            raise ImageError(f"{kind} {str(source)!r} does not exist (current folder: {Path.cwd()}); give "
                             "an image folder, a list file (.txt) or image paths")
        return [source]
    return [Path(p) for p in source]
