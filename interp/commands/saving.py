"""How a command saves what it made and checks its ``--out`` before any work: a study's JSON and figures
(written once, through :func:`interp.plots.save.save_result`), and the refusals of an output that exists
(unless ``--overwrite``) or is not ours to replace."""
from __future__ import annotations

from pathlib import Path

from ..errors import OutputError


def write_outputs(result, out_dir, figures=()) -> None:
    """Write ``<study>.json`` (with the list of its figure files) and the given (name, matplotlib figure)
    pairs as PNGs into ``out_dir`` (:func:`interp.plots.save.save_result`; under the CLI, the staging folder of
    :func:`output.atomic_output_dir`). A study command saves with :func:`save_study` instead."""
    from ..plots.save import save_result

    _said_written(result, out_dir, save_result(result, out_dir, figures=list(figures)))


def save_study(result, out_dir, source, model, **figure_options) -> None:
    """How every ``interp study`` run saves: the figures the plots registry has for the result (map figures drawn
    over the images :meth:`~interp.studies.core.result.StudyResult.figure_images` picks from ``source``; each
    figure takes the ``figure_options`` it names, such as ``n_maps``), then ``<study>.json`` into ``out_dir``,
    written once. The run's facts go in with it: the images ``source`` skipped (the result's ``skipped``), the
    seed of ``--no-pretrained`` weights (``weights_seed``, None for loaded weights), how the weights' position
    table was resampled to the model's size (``pos_resample``, None when it was not) and the preprocessing
    (``preprocess``: "model" or an eval transform's name)."""
    from ..plots.save import save_result

    result.skipped = [{"image": image, "reason": reason} for image, reason in source.skipped]
    extra = {"weights_seed": getattr(model, "init_seed", None), "pos_resample": getattr(model, "pos_resample", None),
             "preprocess": source.preprocess}
    written = save_result(result, out_dir, result.figure_images(source), extra=extra, figure_options=figure_options)
    _said_written(result, out_dir, written)


def _said_written(result, out_dir, written) -> None:
    from ..console import info
    from .output import shown

    info(f"wrote {shown(Path(out_dir) / (result.study + '.json'))}"
         + (f" and {len(written)} figure(s)" if written else ""))


# ------------------------------------------------------------------------------------------ existing outputs


def refuse_existing_file(path, overwrite: bool, flag: str = "--out") -> None:
    """Before any work: an output file that exists (unless ``overwrite``), is a folder, or cannot be written
    is an error."""
    from .output import check_output_file

    check_output_file(path, flag, overwrite=overwrite, example=Path(str(path)).name or "out")


def prepare_study_output(out, result_name: str, overwrite: bool) -> list:
    """Before any work: ``--out`` must be a writable folder, and ``--out/<result_name>.json`` is not replaced
    without ``--overwrite``. Returns the figure files the existing result lists (empty when there is none),
    which the new result replaces once it is complete (a failed run leaves the old result whole)."""
    import json

    from .output import check_output_folder, refuse_special

    check_output_folder(out)
    path = Path(out) / f"{result_name}.json"
    refuse_special(path, "")
    if not path.exists():
        return []
    if not overwrite:
        raise OutputError(f"{str(path)!r} already exists (a {result_name} result); pass --overwrite to replace it "
                         "and the figures it lists, or choose another --out")
    try:
        figures = [str(f) for f in json.loads(path.read_text()).get("figure_files", [])]  # report.save.FIGURES_KEY
    except (OSError, ValueError, AttributeError, TypeError, RecursionError):
        return []
    for name in figures:
        refuse_special(Path(out) / Path(name).name, "")
    return figures


REPORT_MARKER = "report.json"  # moved into place last by interp report: a folder holding it is a report


def prepare_report_dir(out_dir, overwrite: bool) -> list:
    """Before any work: ``out_dir`` must be a writable folder that is new, empty, or a report written before
    (it holds ``report.json``) with ``overwrite``. Returns the files that report lists (they are replaced once
    the new report is complete; nothing else in the folder is touched).

    A non-empty folder without ``report.json`` is refused even with ``overwrite``: it is not ours to clear.
    interp's own staging folders and lock files (left by a killed run) do not count."""
    import json

    from .output import check_output_folder, ours, refuse_special

    out = Path(out_dir)
    check_output_folder(out)
    refuse_special(out / REPORT_MARKER, "")
    if not out.is_dir() or not any(not ours(e.name) for e in out.iterdir()):
        return []
    marker = out / REPORT_MARKER
    if not marker.is_file():
        raise OutputError(f"--out {str(out)!r} is not empty and holds no {REPORT_MARKER}, so it is not a report "
                         "folder; choose a new or empty folder")
    if not overwrite:
        raise OutputError(f"--out {str(out)!r} already holds a report; pass --overwrite to replace it "
                         "or choose another folder")
    try:
        files = json.loads(marker.read_text()).get("files", {})
        listed = [str(f) for f in [files.get("index", "index.html"), *files.get("results", []),
                                   *files.get("figures", [])]]
    except (OSError, ValueError, AttributeError, TypeError, RecursionError):
        listed = ["index.html"]
    for name in listed:
        refuse_special(out / Path(name).name, "")
    return listed
