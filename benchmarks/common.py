"""Timing helpers shared by the benchmarks: interleaved runs, median ratios (machines here are noisy)."""
from __future__ import annotations

import json
import platform
import statistics
import time
from pathlib import Path
from typing import Callable, Dict

import torch

RESULTS = Path(__file__).resolve().parent / "results"


def interleaved_times(fns: Dict[str, Callable[[], object]], repeats: int, warmup: int = 2) -> Dict[str, list]:
    """Run every fn once per round, ``repeats`` rounds (after ``warmup``), so drift hits all alike."""
    for _ in range(warmup):
        for fn in fns.values():
            fn()
    times = {k: [] for k in fns}
    for _ in range(repeats):
        for key, fn in fns.items():
            if torch.cuda.is_available():
                torch.cuda.synchronize()
            start = time.perf_counter()
            fn()
            if torch.cuda.is_available():
                torch.cuda.synchronize()
            times[key].append(time.perf_counter() - start)
    return times


def median_ratio(times: Dict[str, list], numerator: str, denominator: str) -> float:
    """Median over rounds of the per-round ratio (robust to slow phases of the machine)."""
    return statistics.median(a / b for a, b in zip(times[numerator], times[denominator]))


def machine() -> dict:
    return {"python": platform.python_version(), "torch": torch.__version__, "threads": torch.get_num_threads(),
            "cpu": platform.processor() or platform.machine()}


def write_results(name: str, data: dict) -> Path:
    RESULTS.mkdir(parents=True, exist_ok=True)
    path = RESULTS / f"{name}.json"
    path.write_text(json.dumps({**data, "machine": machine()}, indent=2))
    return path
