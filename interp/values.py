"""argparse ``type=`` checks shared by every sub-command: a bad value is refused while the command line is
parsed, in one line, before torch is imported or a model is built.

Each function takes the option's text and returns the value, or raises ``argparse.ArgumentTypeError`` with
what was expected (argparse prefixes the option name). Nothing here imports torch.
"""
from __future__ import annotations

import argparse
import math
import re
from pathlib import Path
from typing import Any, Union

from .errors import UsageError
from .paths import readable_input

SAE_ARCHS = ("topk", "batchtopk", "jumprelu", "relu", "archetypal", "matryoshka")  # interp sae train --arch
NEURONS_SYNTAX = "LAYER:NEURON pairs separated by commas, e.g. 2:17,2:101,5:40 (or a neurons.json file)"
DEVICE_SYNTAX = "cpu, cuda, cuda:N (N = GPU index, e.g. cuda:0) or mps"


def _fail(text: str, expected: str) -> argparse.ArgumentTypeError:
    return argparse.ArgumentTypeError(f"{expected}, got {text!r}")


def _int(text: str, expected: str) -> int:
    try:
        return int(str(text).strip())
    except ValueError:
        raise _fail(text, expected) from None


def _float(text: str, expected: str) -> float:
    try:
        value = float(str(text).strip())
    except ValueError:
        raise _fail(text, expected) from None
    if not math.isfinite(value):
        raise _fail(text, expected)
    return value


def _bounded(name: str, parse, accept, expected: str, doc: str):
    """An argparse type: ``parse`` the text (``_int``/``_float``), then refuse values ``accept`` rejects."""
    def check(text: str):
        value = parse(text, expected)
        if not accept(value):
            raise _fail(text, expected)
        return value

    check.__name__, check.__doc__ = name, doc
    return check


positive_int = _bounded("positive_int", _int, lambda v: v >= 1, "expected a whole number >= 1",
                        "A whole number >= 1 (counts and sizes: --batch-size, --top-k, --depth, ...).")
port_number = _bounded("port_number", _int, lambda v: 0 <= v <= 65535, "expected a port 0..65535 (0: any free port)",
                       "A TCP port 0..65535 (--port; 0: any free one).")
nonnegative_int = _bounded("nonnegative_int", _int, lambda v: v >= 0, "expected a whole number >= 0",
                           "A whole number >= 0 (--controls, --seed, --n-maps).")
MAX_CONTROLS = 100  # each control set is one more edited pass over every image; 1000000 ran 447 s, then failed
control_count = _bounded("control_count", _int, lambda v: 0 <= v <= MAX_CONTROLS,
                         f"expected a whole number 0..{MAX_CONTROLS} (each control is one more edited pass; 5-10 "
                         "is usual)", f"Random control sets of an ablation 0..{MAX_CONTROLS} (--controls).")
MAX_TOP_K = 1024  # register neurons an edit takes (published: 10-50; half of ViT-g's 6144-wide MLP is 3072)
top_k_arg = _bounded("top_k_arg", _int, lambda v: 1 <= v <= MAX_TOP_K,
                     f"expected a whole number 1..{MAX_TOP_K} (register neurons; 10-50 is usual)",
                     f"Register neurons a run edits 1..{MAX_TOP_K} (--top-k of report and reassess); the model's "
                     "MLP width is checked on its skeleton.")
MAX_SEED = 2**32 - 1  # every RNG interp seeds takes it (torch, numpy); 2**70 overflowed torch's seed
SEED_HELP = ("seed of every random draw of the run: the random weights of --no-pretrained (the same seed gives the "
             "same model in every command) and the study's own sampling (default 0)")
seed_arg = _bounded("seed_arg", _int, lambda v: 0 <= v <= MAX_SEED, f"expected a whole number 0..{MAX_SEED}",
                    "A random seed 0..2**32-1 (--seed).")
MAX_IMG_SIZE = 4096  # 85,000 tokens at patch 14 already; 100000 px asked timm for a 30 GB position embedding
image_size_arg = _bounded("image_size_arg", _int, lambda v: 1 <= v <= MAX_IMG_SIZE,
                          f"expected an input size in pixels 1..{MAX_IMG_SIZE}",
                          "An input size in pixels (--img-size); at least one patch is checked once the model is built.")
positive_float = _bounded("positive_float", _float, lambda v: v > 0, "expected a number > 0",
                          "A finite number > 0 (--sigma, --eps, --blur-sigma).")
nonnegative_float = _bounded("nonnegative_float", _float, lambda v: v >= 0, "expected a number >= 0",
                             "A finite number >= 0 (--tol).")


def finite_float(text: str) -> float:
    """Any finite number (--k-std)."""
    return _float(text, "expected a finite number")


def fraction(text: str) -> float:
    """A share in (0, 1] (--max-box-fraction)."""
    value = _float(text, "expected a number in (0, 1]")
    if not 0 < value <= 1:
        raise _fail(text, "expected a number in (0, 1]")
    return value


def open_fraction(text: str) -> float:
    """A share in (0, 1) (--test-fraction, --level)."""
    value = _float(text, "expected a number strictly between 0 and 1")
    if not 0 < value < 1:
        raise _fail(text, "expected a number strictly between 0 and 1")
    return value


def fraction_below_one(text: str) -> float:
    """A share in [0, 1) (--fractions: 0 is the unmasked run; --holdout: 0 holds nothing out)."""
    value = _float(text, "expected a number in [0, 1)")
    if not 0 <= value < 1:
        raise _fail(text, "expected a number in [0, 1)")
    return value


def threshold_arg(text: str) -> Union[float, str]:
    """The one threshold parser (``--threshold`` of every command and study): ``auto``, ``pNN`` with 0 < NN < 100
    (returned as that text, lower-cased), or a norm value > 0 (returned as a float)."""
    expected = "expected auto, pNN with 0 < NN < 100 (e.g. p98) or a norm value > 0"
    t = str(text).strip().lower()
    if t == "auto":
        return t
    if t.startswith("p"):
        try:
            q = float(t[1:])
        except ValueError:
            raise _fail(text, expected) from None
        if not 0 < q < 100:
            raise _fail(text, expected)
        return t
    try:
        value = float(t)
    except ValueError:
        raise _fail(text, expected) from None
    if not (math.isfinite(value) and value > 0):
        raise _fail(text, expected)
    return value


def device_arg(text: str) -> str:
    """``cpu``, ``cuda``, ``cuda:N`` or ``mps`` (lower-cased). Whether the device exists is checked later, once
    torch is imported, before the model is built (:func:`interp.commands.common.check_device`)."""
    t = str(text).strip().lower()
    if re.fullmatch(r"cpu|cuda|cuda:\d+|mps", t):
        return t
    hint = " (a GPU is 'cuda')" if t in ("gpu", "nvidia") or t.startswith("gpu") else ""
    raise _fail(text, f"expected {DEVICE_SYNTAX}{hint}")


MAX_REGISTERS = 256  # each test-time register is one more token through every block; 20000 asked for 78 GB


def register_count(text: str) -> int:
    """A number of test-time register tokens: 1..MAX_REGISTERS (--n-registers)."""
    value = positive_int(text)
    if value > MAX_REGISTERS:
        raise _fail(text, f"expected at most {MAX_REGISTERS} test-time registers (published models use 1-16)")
    return value


MAX_EXPANSION = 128  # SAE features per hook dimension: 2000 x 384 wanted > 5 GB of weights and Adam state
MAX_SAE_WEIGHTS = 2**26  # features x hook width of one SAE (each of w_enc, the dictionary): --expansion 64 at width
# 1024; with gradients and Adam state about 2 GB of float32 (--expansion 128 at 1024 asked for twice that)
MAX_SAE_BATCH = 2**20  # tokens per SAE training step (the data bound, tokens available, is checked once it is read)
expansion_arg = _bounded("expansion_arg", _int, lambda v: 1 <= v <= MAX_EXPANSION,
                         f"expected a whole number 1..{MAX_EXPANSION} (SAEs use 4-64)",
                         f"SAE features per hook dimension 1..{MAX_EXPANSION} (--expansion).")
sae_batch_arg = _bounded("sae_batch_arg", _int, lambda v: 1 <= v <= MAX_SAE_BATCH,
                         f"expected a whole number 1..{MAX_SAE_BATCH} (tokens per step)",
                         f"Tokens per SAE training step 1..{MAX_SAE_BATCH} (--tokens-per-step of `interp sae train`).")


def transform_arg(text: str) -> str:
    """``--transform``: ``model`` or ``resizeN[-cropM]`` (checked without torch), returned lower-cased."""
    from ._transforms import parse_transform_name

    try:
        parse_transform_name(text)
    except ValueError as e:
        raise argparse.ArgumentTypeError(str(e)) from None
    return text.strip().lower()


def sae_feature_ids(text) -> tuple:
    """SAE feature ids for ``--features``: ``12,40`` or a JSON file: ``sae_features.json`` of ``interp study
    sae-features`` (its artifact subspace's features, else its artifact features) or a plain list of ids."""
    if isinstance(text, (tuple, list)):
        return index_list(",".join(str(int(v)) for v in text))
    path = Path(str(text).strip())
    readable_input(str(path), folder_ok=False)
    if path.suffix.lower() != ".json" and not path.is_file():
        return index_list(text)
    import json

    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, ValueError, RecursionError) as e:
        raise _fail(str(text), f"a readable sae_features.json or a JSON list of feature ids ({type(e).__name__})") from None
    if isinstance(data, dict):
        subspace = data.get("artifact_subspace") or {}
        ids = subspace.get("features") if isinstance(subspace, dict) and subspace.get("features") else \
            [f.get("feature") for f in data.get("artifact_features") or [] if isinstance(f, dict)]
    else:
        ids = data
    if not isinstance(ids, list) or not ids or not all(isinstance(v, int) and not isinstance(v, bool) for v in ids):
        raise _fail(str(text), "a sae_features.json with artifact features (or a JSON list of feature ids); this one "
                               "lists none")
    return index_list(",".join(str(v) for v in ids))


def index_list(text: str) -> tuple:
    """Distinct whole numbers >= 0 separated by commas (--features 12,40: SAE feature indices)."""
    items = [item.strip() for item in str(text).split(",")]
    if not items or not all(re.fullmatch(r"\d+", item) for item in items):
        raise _fail(text, "expected whole numbers >= 0 separated by commas, e.g. 12,40")
    values = tuple(int(item) for item in items)
    if len(set(values)) != len(values):
        raise _fail(text, "expected distinct numbers")
    return values


def threshold_value(value: Any) -> Union[float, str, None]:
    """A threshold as the studies take it, from the command line or from Python: a float for a norm
    (``"3.5"`` -> 3.5), else ``"auto"`` / ``"pNN"``; None stays None.

    Raises:
        UsageError: the text is not a threshold (the same words as :func:`threshold_arg`'s).
    """
    if value is None or isinstance(value, (int, float)):
        return None if value is None else float(value)
    try:
        return threshold_arg(value)
    except argparse.ArgumentTypeError as e:
        raise UsageError(f"--threshold: {e}") from None
