"""One fresh interpreter for the tests about what a fresh process imports, run once as an early launch
(tests/early.py): an interpreter start with torch's imports costs about 5 s of CPU, so the checks share one.

In order, each on the state the one before leaves:

1. ``import interp`` loads none of the heavy packages (tests/contract/test_imports.py);
2. ``matplotlib.cm`` imported, then interp loads overcomplete's SAE modules without running overcomplete's package
   ``__init__`` (which patches matplotlib) and leaves no bare ``overcomplete`` package behind
   (tests/sae/test_sae_train.py);
3. every public name of ``interp`` resolves (tests/contract/test_imports.py).

A check that raises records its traceback and the later ones still run, so that only its own test fails.
"""
from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import early

NAME = "fresh interpreter"
HEAVY = ("torch", "timm", "nnsight", "transformer_lens", "h5py", "matplotlib")

CODE = f"""
import json, sys, traceback
import interp
found = {{"heavy": sorted(m for m in {HEAVY!r} if m in sys.modules)}}
try:
    import matplotlib.cm
    before = getattr(matplotlib.cm, "get_cmap", None)
    from interp.sae import modules
    oc = modules.overcomplete()
    found["overcomplete"] = {{"TopKSAE": bool(oc.TopKSAE),
                             "get_cmap_unchanged": getattr(matplotlib.cm, "get_cmap", None) is before,
                             "bare_package_loaded": "overcomplete" in sys.modules,
                             "sae_module_loaded": "overcomplete.sae" in sys.modules}}
except Exception:
    found["overcomplete"] = {{"error": traceback.format_exc()}}
try:
    found["names"] = {{n: type(getattr(interp, n)).__name__ for n in interp.__all__}}
    found["patch_save"] = callable(interp.patch.save)
except Exception:
    found["names"] = {{"error": traceback.format_exc()}}
print(json.dumps(found))
"""


@early.launcher(NAME)
def launch(workdir: Path) -> early.Launch:
    # the interp (and tests/) this session imports, whatever the environment's PYTHONPATH says
    return early.Launch([sys.executable, "-c", CODE], env={"PYTHONPATH": os.pathsep.join(sys.path)})


def checks() -> dict:
    """What the fresh interpreter found (waiting for it): ``heavy``, ``overcomplete``, ``names``, ``patch_save``."""
    run = early.result(NAME)
    assert run.returncode == 0, run.stderr[-3000:]
    return json.loads(run.stdout.strip().splitlines()[-1])
