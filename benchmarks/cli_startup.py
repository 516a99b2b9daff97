"""How fast the ``interp`` command line answers: ``interp --help``, ``interp study norms --help``, an argument
error, the first error of a mistyped model name and of an empty image folder (pre-checks before torch), and the
fixed start cost of a study command before its first forward (imports + model build + source), each the median
of N fresh processes; plus the top ``python -X importtime`` offenders of a study command's imports and the
import time of a whole ``interp study norms`` run per top-level package (self times summed, whoever imported
the module). Writes ``benchmarks/results/cli_startup.json``.

    python benchmarks/cli_startup.py [--runs 5]
"""
from __future__ import annotations

import argparse
import json
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

RESULTS = Path(__file__).parent / "results" / "cli_startup.json"

# The fixed start cost of ``interp study norms planted_vit --images ONE_IMAGE``: everything up to the first
# forward (CLI parse, torch/timm import, model build, the source over one image).
START_COST = """
import sys, time
t0 = time.perf_counter()
from interp.cli import build_parser
args = build_parser().parse_args(["study", "norms", "planted_vit", "--images", sys.argv[1], "--out", "unused"])
from interp.commands.common import load_model
from interp.commands.inputs import RunInputs
from interp.commands.study import open_study_source
options, config = args.func.parse(args)
model = load_model(RunInputs.of((options, config), []), (options, config))
source = open_study_source(options, model, config)
print(time.perf_counter() - t0)
"""


def median_seconds(command, runs: int) -> float:
    """Median wall time of ``runs`` fresh processes of ``command`` (exit status ignored: errors are timed too)."""
    times = []
    for _ in range(runs):
        t0 = time.perf_counter()
        subprocess.run(command, capture_output=True)
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def import_offenders(top: int = 8):
    """The ``top`` modules with the largest cumulative import time (us) when a study command runs."""
    code = "import interp.commands.study, interp.studies.artifacts.norms, interp.hooks.load"
    err = subprocess.run([sys.executable, "-X", "importtime", "-c", code], capture_output=True, text=True).stderr
    rows = []
    for line in err.splitlines():
        if not line.startswith("import time:") or "cumulative" in line:
            continue
        _, cumulative, name = (part.strip() for part in line[len("import time:"):].split("|"))
        if "." not in name.strip():  # top-level packages only: their cumulative time includes submodules
            rows.append((int(cumulative), name.strip()))
    return [{"module": n, "cumulative_ms": round(us / 1000, 1)} for us, n in sorted(rows, reverse=True)[:top]]


def import_breakdown(argv, top: int = 12):
    """Seconds of import time per top-level package (self times summed) of ``python -m interp *argv``."""
    err = subprocess.run([sys.executable, "-X", "importtime", "-m", "interp", *argv], capture_output=True,
                         text=True).stderr
    totals = {}
    for line in err.splitlines():
        if not line.startswith("import time:") or "cumulative" in line:
            continue
        self_us, _, name = (part.strip() for part in line[len("import time:"):].split("|"))
        package = name.split(".")[0]
        totals[package] = totals.get(package, 0) + int(self_us)
    rows = sorted(totals.items(), key=lambda kv: -kv[1])
    return {"total_s": round(sum(totals.values()) / 1e6, 2),
            "packages_s": {name: round(us / 1e6, 2) for name, us in rows[:top]}}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=5)
    runs = parser.parse_args().runs
    from interp.models import sample_image_paths

    interp_cmd = [sys.executable, "-m", "interp"]
    image = str(sample_image_paths()[0])
    scratch = Path(tempfile.mkdtemp(prefix="interp-cli-startup-"))
    empty, out = scratch / "empty", scratch / "out"
    empty.mkdir()
    start = [float(subprocess.run([sys.executable, "-c", START_COST, image], capture_output=True, text=True,
                                  check=True).stdout) for _ in range(runs)]
    figures = {
        "runs": runs,
        "help_s": round(median_seconds([*interp_cmd, "--help"], runs), 3),
        "study_norms_help_s": round(median_seconds([*interp_cmd, "study", "norms", "--help"], runs), 3),
        "argument_error_s": round(median_seconds([*interp_cmd, "study", "norms", "--bogus"], runs), 3),
        "python_startup_s": round(median_seconds([sys.executable, "-c", "pass"], runs), 3),
        "mistyped_model_error_s": round(median_seconds(
            [*interp_cmd, "study", "norms", "vit_tiny_patch16_2244", "--images", image, "--out", str(out)], runs), 3),
        "empty_folder_error_s": round(median_seconds(
            [*interp_cmd, "study", "norms", "vit_tiny_patch16_224", "--images", str(empty), "--out", str(out)],
            runs), 3),
        "study_start_cost_s": round(statistics.median(start), 3),
        "import_offenders": import_offenders(),
        "study_norms_imports": import_breakdown(["study", "norms", "planted_vit", "--images", image, "--out",
                                                 str(out / "norms"), "--quiet"]),
    }
    shutil.rmtree(scratch, ignore_errors=True)
    RESULTS.parent.mkdir(exist_ok=True)
    RESULTS.write_text(json.dumps(figures, indent=1))
    print(json.dumps(figures, indent=1))


if __name__ == "__main__":
    main()
