"""What several sub-commands share: model and study arguments, building the model and the activation source
from them, reading --threshold, and writing a study's outputs. Commands import helpers from here, never
from each other."""
from __future__ import annotations

import argparse
import re
from pathlib import Path
from typing import Dict, List

from ..console import add_output_args
from ..errors import InterpError


def add_model_args(parser: argparse.ArgumentParser, model_optional: bool = False) -> None:
    """MODEL positional plus --weights, --pretrained/--no-pretrained, --device, --img-size, --depth, --seed."""
    if model_optional:
        parser.add_argument("model", nargs="?", default=None, help="timm model name")
    else:
        parser.add_argument("model", help="timm model name, e.g. vit_small_patch14_reg4_dinov2")
    parser.add_argument("--weights", default=None, help="local .safetensors/.pth/.bin state dict for MODEL")
    parser.add_argument("--pretrained", dest="pretrained", action="store_true", default=True,
                        help="load hub weights (default; local HF cache when offline)")
    parser.add_argument("--no-pretrained", dest="pretrained", action="store_false",
                        help="random weights (no download)")
    parser.add_argument("--device", default="cpu", help="cpu, cuda, cuda:1 ...")
    parser.add_argument("--img-size", type=int, default=None, help="input size (timm img_size kwarg)")
    parser.add_argument("--depth", type=int, default=None, help="keep only the first N blocks (quick tests)")
    parser.add_argument("--seed", type=int, default=0,
                        help="seed of every random draw of the run: the random weights of --no-pretrained (the same "
                             "seed gives the same model in every command) and the study's own sampling (default 0)")


def model_from_args(args: argparse.Namespace, dtype=None):
    """Load the HookedViT the model arguments describe."""
    from ..api import load

    kwargs = {}
    if getattr(args, "img_size", None):
        kwargs["img_size"] = args.img_size
    if getattr(args, "depth", None):
        kwargs["depth"] = args.depth
    return load(args.model, pretrained=args.pretrained, weights=args.weights, device=args.device, dtype=dtype,
                seed=getattr(args, "seed", None), **kwargs)


def threshold_value(text: str):
    """The --threshold text as the studies take it: a float for a number, else the text ('auto', 'p98')."""
    from ..studies.outliers import parse_threshold

    method, value = parse_threshold(text)  # raises InterpError on a bad value
    return value if method == "fixed" else text


def add_study_args(parser: argparse.ArgumentParser, cache_ok: bool = True) -> None:
    """Arguments of every ``interp study NAME``: model args, --images/--cache, --out, --batch-size, --seed,
    --strict, --overwrite, --no-progress, --quiet."""
    add_model_args(parser)
    src = parser.add_mutually_exclusive_group(required=True)
    src.add_argument("--images", help="image directory (DIR/<class>/img gives labels), list file or image")
    if cache_ok:
        src.add_argument("--cache", help="an interp cache file (.h5) to read activations from")
    parser.add_argument("--out", required=True, help="output directory for <study>.json and PNGs")
    parser.add_argument("--batch-size", type=int, default=16)
    add_strict_arg(parser)
    add_overwrite_arg(parser, "an existing <study>.json in --out (and the figures it lists)")
    add_output_args(parser)


def add_strict_arg(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--strict", action="store_true",
                        help="stop at the first unreadable image (default: skip it, warn, list it under 'skipped')")


def add_overwrite_arg(parser: argparse.ArgumentParser, what: str) -> None:
    parser.add_argument("--overwrite", action="store_true", help=f"replace {what}")


def source_from_args(args: argparse.Namespace, model):
    """The activation source the study arguments describe (live images or a cache checked against model).

    A cache is checked up front against the hooks the study reads (``registry.required_hooks``), so a cache
    that cannot serve the study fails before any work. Unreadable images are skipped and kept in
    ``args.skipped`` (written into the study's JSON), or stop the run with ``--strict``."""
    from ..studies.source import open_source
    from .registry import STUDIES, check_cache_serves

    source = open_source(model=model, images=args.images, cache=getattr(args, "cache", None),
                         batch_size=args.batch_size, strict=getattr(args, "strict", False))
    study = getattr(args, "study", None)
    if not source.is_live and study in STUDIES:
        check_cache_serves(source, study, model.n_layers, vars(args))
    args.skipped = [{"image": image, "reason": reason} for image, reason in source.skipped]
    args.weights_seed = getattr(model, "init_seed", None)
    return source


def write_outputs(result, out_dir, figures=()) -> None:
    """Write ``<study>.json`` (with the list of its figure files) and the given (name, matplotlib figure)
    pairs as PNGs into ``out_dir`` (:func:`interp.report.save.save_result`)."""
    from pathlib import Path

    from ..console import info
    from ..report.save import save_result

    written = save_result(result, out_dir, figures=list(figures))
    info(f"wrote {Path(out_dir) / (result.study + '.json')}" + (f" and {len(written)} figure(s)" if written else ""))


# ------------------------------------------------------------------------------------------ existing outputs


def refuse_existing_file(path, overwrite: bool, flag: str = "--out") -> None:
    """Before any work: an existing output file is an error unless ``overwrite``."""
    from pathlib import Path

    from ..errors import InterpError

    if Path(path).exists() and not overwrite:
        raise InterpError(f"{flag} {str(path)!r} already exists; pass --overwrite to replace it "
                          "or choose another path")


def prepare_study_output(args: argparse.Namespace, result_name: str) -> list:
    """Before any work: refuse to replace ``--out/<result_name>.json`` without ``--overwrite``. Returns the
    figure files the existing result lists (empty when there is none): :func:`remove_stale_figures` removes
    those the new result does not write again, once it is written (a failed run leaves the old result whole)."""
    import json
    from pathlib import Path

    from ..errors import InterpError

    path = Path(args.out) / f"{result_name}.json"
    if not path.exists():
        return []
    if not getattr(args, "overwrite", False):
        raise InterpError(f"{str(path)!r} already exists (a {result_name} result); pass --overwrite to replace it "
                          "and the figures it lists, or choose another --out")
    try:
        return list(json.loads(path.read_text()).get("figure_files", []))  # report.save.FIGURES_KEY
    except (OSError, ValueError):
        return []


def remove_stale_figures(out_dir, result_name: str, old_figures: list) -> None:
    """Remove the figures of a replaced result that the new ``<result_name>.json`` no longer lists."""
    import json
    from pathlib import Path

    path = Path(out_dir) / f"{result_name}.json"
    try:
        kept = set(json.loads(path.read_text()).get("figure_files", []))  # report.save.FIGURES_KEY
    except (OSError, ValueError):
        return
    for name in old_figures:
        if name not in kept:
            (Path(out_dir) / Path(name).name).unlink(missing_ok=True)


REPORT_MARKER = "report.json"  # written last by interp report: a folder holding it is a report


def prepare_report_dir(out_dir, overwrite: bool) -> None:
    """Before any work: ``out_dir`` must be new, empty, or a report written before (it holds ``report.json``)
    with ``overwrite``; then the files that report lists (and report.json) are removed, nothing else.

    A non-empty folder without ``report.json`` is refused even with ``overwrite``: it is not ours to clear."""
    import json
    from pathlib import Path

    from ..errors import InterpError

    out = Path(out_dir)
    if out.exists() and not out.is_dir():
        raise InterpError(f"--out {str(out)!r} is a file; give a folder for the report")
    if not out.is_dir() or not any(out.iterdir()):
        return
    marker = out / REPORT_MARKER
    if not marker.is_file():
        raise InterpError(f"--out {str(out)!r} is not empty and holds no {REPORT_MARKER}, so it is not a report "
                          "folder; choose a new or empty folder")
    if not overwrite:
        raise InterpError(f"--out {str(out)!r} already holds a report; pass --overwrite to replace it "
                          "or choose another folder")
    try:
        files = json.loads(marker.read_text()).get("files", {})
    except (OSError, ValueError):
        files = {}
    names = [files.get("index", "index.html"), *files.get("results", []), *files.get("figures", [])]
    for name in names:
        (out / Path(str(name)).name).unlink(missing_ok=True)
    marker.unlink()


def record_skipped(args: argparse.Namespace, result_name: str) -> None:
    """Add ``"skipped": [{"image", "reason"}]`` (unreadable images left out) and ``"weights_seed"`` (the seed of
    --no-pretrained random weights, None for loaded weights) to the study JSON just written."""
    import json
    from pathlib import Path

    path = Path(args.out) / f"{result_name}.json"
    if path.exists() and hasattr(args, "skipped"):
        data = json.loads(path.read_text())
        data["skipped"] = args.skipped
        data["weights_seed"] = getattr(args, "weights_seed", None)
        path.write_text(json.dumps(data, indent=1))


NEURONS_SYNTAX = "LAYER:NEURON pairs separated by commas, e.g. 2:17,2:101,5:40 (or a neurons.json file)"


def parse_neurons(text: str) -> Dict[int, List[int]]:
    """``"2:17,2:101,5:40"`` -> ``{2: [17, 101], 5: [40]}``; a path to a neurons study's JSON -> its ranked
    neurons. Raises InterpError on bad syntax (the forms of :func:`interp.interventions.neuron_sets.neuron_set`)."""
    from ..interventions.neuron_sets import neuron_set

    text = (text or "").strip()
    if not text:
        raise InterpError(f"--neurons is empty: give {NEURONS_SYNTAX}")
    return neuron_set(text).neurons
