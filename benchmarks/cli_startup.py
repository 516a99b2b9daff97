"""How fast the ``interp`` command line answers: ``interp --help``, ``interp study norms --help``, an argument
error, and the fixed start cost of a study command before its first forward (imports + model build +
source), each the median of N fresh processes; plus the top ``python -X importtime`` offenders of a study
command's imports. Writes ``benchmarks/results/cli_startup.json``.

    python benchmarks/cli_startup.py [--runs 5]
"""
from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
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
from interp.commands.common import model_from_args, source_from_args
model = model_from_args(args)
source = source_from_args(args, model)
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
    code = "import interp.commands.study_artifacts, interp.studies.artifacts.norms, interp.api"
    err = subprocess.run([sys.executable, "-X", "importtime", "-c", code], capture_output=True, text=True).stderr
    rows = []
    for line in err.splitlines():
        if not line.startswith("import time:") or "cumulative" in line:
            continue
        _, cumulative, name = (part.strip() for part in line[len("import time:"):].split("|"))
        if "." not in name.strip():  # top-level packages only: their cumulative time includes submodules
            rows.append((int(cumulative), name.strip()))
    return [{"module": n, "cumulative_ms": round(us / 1000, 1)} for us, n in sorted(rows, reverse=True)[:top]]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=5)
    runs = parser.parse_args().runs
    from interp.models import sample_image_paths

    interp_cmd = [sys.executable, "-m", "interp"]
    image = str(sample_image_paths()[0])
    start = [float(subprocess.run([sys.executable, "-c", START_COST, image], capture_output=True, text=True,
                                  check=True).stdout) for _ in range(runs)]
    figures = {
        "runs": runs,
        "help_s": round(median_seconds([*interp_cmd, "--help"], runs), 3),
        "study_norms_help_s": round(median_seconds([*interp_cmd, "study", "norms", "--help"], runs), 3),
        "argument_error_s": round(median_seconds([*interp_cmd, "study", "norms", "--bogus"], runs), 3),
        "python_startup_s": round(median_seconds([sys.executable, "-c", "pass"], runs), 3),
        "study_start_cost_s": round(statistics.median(start), 3),
        "import_offenders": import_offenders(),
    }
    RESULTS.parent.mkdir(exist_ok=True)
    RESULTS.write_text(json.dumps(figures, indent=1))
    print(json.dumps(figures, indent=1))


if __name__ == "__main__":
    main()
