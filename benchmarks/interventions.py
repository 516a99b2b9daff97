"""Forward-time overhead of each intervention: median over interleaved runs of time(with) / time(without).

ViT-S/16 (``vit_small_patch16_224``, random init), batch 32, ``torch.no_grad``. For each intervention the
runs alternate (without, with, without, with, ...) so slow drifts of the machine hit both alike; the
ratio of each pair is taken and the median reported (by process CPU time on CPU, where other processes
make the wall clock noisy, and by wall clock on CUDA; both are stored). Two paths are measured: the hooked model
(``model.run_with_interventions``) against the plain hooked forward, and the patched plain timm module
(``interp.patch.apply``) against the unpatched timm module.

    python benchmarks/interventions.py --threads 1          # CPU, float32 -> results/interventions.json
    python benchmarks/interventions.py --device cuda --dtype bfloat16

Targets: SelectiveCLS <= 1.05, TestTimeRegister <= 1.10, AttentionBias <= 1.05.
"""
from __future__ import annotations

import argparse
import copy
import statistics
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
import interp  # noqa: E402
from interp.interventions import export as patch  # noqa: E402
from common import median_ratio, write_results  # noqa: E402
from interp.interventions import (AttentionBias, NeuronAblation, Relocation, SelectiveCLS,  # noqa: E402
                                  TestTimeRegister, masks)

TARGETS = {"SelectiveCLS": 1.05, "TestTimeRegister": 1.10, "AttentionBias": 1.05}
DTYPES = {"float32": torch.float32, "fp32": torch.float32, "bfloat16": torch.bfloat16, "bf16": torch.bfloat16,
          "float16": torch.float16, "fp16": torch.float16}


def sync(device: str) -> None:
    if device.startswith("cuda"):
        torch.cuda.synchronize()


def timed(fn, device: str):
    """(wall seconds, process CPU seconds) of one call."""
    sync(device)
    wall, cpu = time.perf_counter(), time.process_time()
    fn()
    sync(device)
    return time.perf_counter() - wall, time.process_time() - cpu


def compare(base_fn, with_fn, device: str, reps: int, warmup: int) -> dict:
    """Interleaved runs (base, with, base, with, ...); median per-pair ratio by wall clock and by CPU time.

    On a shared CPU machine other processes stretch the wall clock of single runs by tens of per cent;
    the process CPU time is much less sensitive to them (with ``--threads 1`` no spinning worker threads
    add to it), so it is the primary figure on CPU. On CUDA the wall clock is the primary figure.
    (``common.interleaved_times`` records the wall clock only, hence this loop.)
    """
    for _ in range(warmup):
        base_fn(), with_fn()
    wall, cpu = {"base": [], "with": []}, {"base": [], "with": []}
    for _ in range(reps):
        for key, fn in (("base", base_fn), ("with", with_fn)):
            w, c = timed(fn, device)
            wall[key].append(w)
            cpu[key].append(c)
    primary = wall if device.startswith("cuda") else cpu
    return {"median_ratio": round(median_ratio(primary, "with", "base"), 4),
            "clock": "wall" if device.startswith("cuda") else "process_cpu",
            "median_ratio_wall": round(median_ratio(wall, "with", "base"), 4),
            "median_ratio_cpu": round(median_ratio(cpu, "with", "base"), 4),
            "ratios": [round(a / b, 4) for a, b in zip(primary["with"], primary["base"])],
            "median_base_wall_s": round(statistics.median(wall["base"]), 4),
            "median_with_wall_s": round(statistics.median(wall["with"]), 4)}


def build_interventions(model, device: str):
    """The benchmarked interventions: 10 register-neuron candidates in blocks 5-6 (as OpenCLIP B/16)."""
    neurons = {5: [11, 57, 203, 460, 901], 6: [3, 88, 640, 1200, 1501]}
    calibration = torch.randn(8, 3, 224, 224, generator=torch.Generator().manual_seed(1))
    dtype = next(model.parameters()).dtype
    return {
        "SelectiveCLS": [SelectiveCLS(k=1)],
        "TestTimeRegister": [TestTimeRegister(neurons)],
        "AttentionBias": [AttentionBias.calibrate(model, calibration.to(device, dtype), neurons, batch_size=8)],
        "NeuronAblation": [NeuronAblation(neurons)],
        "Relocation": [Relocation(neurons, target=masks.smiley(model.layout.grid))],
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--dtype", default="float32", choices=sorted(DTYPES))
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--reps", type=int, default=7)
    parser.add_argument("--warmup", type=int, default=1)
    parser.add_argument("--model", default="vit_small_patch16_224")
    parser.add_argument("--threads", type=int, default=None,
                        help="torch CPU threads (default: torch's); 1 gives the steadiest CPU-time ratios on a "
                             "shared machine")
    parser.add_argument("--no-plain", action="store_true", help="skip the patched plain-module measurements")
    parser.add_argument("--only", nargs="+", default=None, metavar="NAME",
                        help="benchmark only these interventions (e.g. SelectiveCLS AttentionBias)")
    args = parser.parse_args()

    dtype = DTYPES[args.dtype]
    if args.threads:
        torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    model = interp.load(args.model, pretrained=False, device=args.device, dtype=dtype)
    plain_base = copy.deepcopy(model.timm_model)
    x = torch.randn(args.batch_size, 3, *model.img_size, generator=torch.Generator().manual_seed(0))
    x = x.to(args.device, dtype)
    results = {}
    with torch.no_grad():
        for label, interventions in build_interventions(model, args.device).items():
            if args.only and label not in args.only:
                continue
            entry = {"hooked": compare(lambda: model(x), lambda: model.run_with_interventions(x, interventions),
                                       args.device, args.reps, args.warmup)}
            if not args.no_plain:
                patched = patch.apply_interventions(copy.deepcopy(plain_base), interventions)
                entry["plain_patched"] = compare(lambda: plain_base(x), lambda: patched(x), args.device,
                                                 args.reps, args.warmup)
            if label in TARGETS:
                entry["target"] = TARGETS[label]
                entry["meets_target"] = entry["hooked"]["median_ratio"] <= TARGETS[label]
            results[label] = entry
            print(f"{label:17s} hooked {entry['hooked']['median_ratio']:.3f}"
                  + (f"  plain {entry['plain_patched']['median_ratio']:.3f}" if "plain_patched" in entry else "")
                  + (f"  (target <= {TARGETS[label]})" if label in TARGETS else ""), flush=True)

    report = {
        "model": args.model, "batch_size": args.batch_size, "device": args.device, "dtype": str(dtype),
        "reps": args.reps, "gpu": torch.cuda.get_device_name() if args.device.startswith("cuda") else None,
        "results": results,
    }
    name = ("interventions" if args.device == "cpu" and dtype == torch.float32
            else f"interventions_{args.device.replace(':', '')}_{str(dtype).replace('torch.', '')}")
    print(f"wrote {write_results(name, report)}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
