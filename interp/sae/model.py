"""A trained SAE on disk (``DIR/sae.safetensors`` + ``DIR/sae.json``) and in memory (:class:`SAE`).

Example (not run as a doctest: it needs a trained SAE)::

    sae = interp.sae.load("runs/sae", model=model)   # refuses an SAE of another model
    codes = sae.encode(acts)                          # [..., d] in the hook's units -> [..., n_features]
    recon = sae.decode(codes)                         # [..., d] in the hook's units (normalisation undone)
    directions = sae.directions                       # [n_features, d] decoder rows in the hook's units

"""
from __future__ import annotations

import hashlib
import json
import math
from pathlib import Path
from typing import Any, Dict, Optional, Union

import torch

from ..errors import InterpError, InterpWarning
from ..hooks.names import block_of, block_prefix
from ..interventions.sae_features import ARCHS, SparseCodes
from ..models.fingerprint import architecture_fingerprint, weights_fingerprint
from ..sae_settings import SAE_CONFIG, SAE_WEIGHTS
from ..paths import check_input_path
from .files import write_atomic
from .modules import architecture

FORMAT, FORMAT_VERSION = "interp-sae", 1
REQUIRED = ("w_enc", "b_enc", "dictionary", "mean", "scale", "feature_means")


class SAE:
    """A trained sparse autoencoder on one hook of one model.

    Attributes:
        config: the parsed ``sae.json`` (arch, hook, model fingerprints, tokens, normalisation, training, metrics).
        tensors: w_enc [n, d], b_enc [n], dictionary [n, d] (normalised units), mean [d], scale [1],
            feature_means [n] (mean code on the training tokens), threshold (batchtopk [1], jumprelu [n]).
    """

    def __init__(self, config: Dict[str, Any], tensors: Dict[str, torch.Tensor], path: Optional[Path] = None):
        self.config, self.tensors, self.path = config, tensors, path
        self.codes = SparseCodes(config.get("codes") or architecture(config["arch"]).codes, tensors, config.get("k"))

    hook = property(lambda self: self.config["hook"])
    arch = property(lambda self: self.config["arch"])
    k = property(lambda self: self.config.get("k"))
    d = property(lambda self: self.codes.d)
    n_features = property(lambda self: self.codes.n_features)
    scale = property(lambda self: float(self.tensors["scale"].reshape(())))
    mean = property(lambda self: self.tensors["mean"])

    def to(self, device) -> "SAE":
        """This SAE with its tensors on ``device`` (a new object; encode and decode then run there)."""
        return SAE(self.config, {k: v.to(device) for k, v in self.tensors.items()}, self.path)

    @torch.no_grad()
    def encode(self, x: torch.Tensor) -> torch.Tensor:
        """Codes [..., n_features] of activations [..., d] in the hook's units."""
        return self.codes(x.float())

    @torch.no_grad()
    def decode(self, codes: torch.Tensor) -> torch.Tensor:
        """Reconstruction [..., d] in the hook's units: ``mean + scale * codes @ dictionary``."""
        return self.mean + self.scale * (codes.float() @ self.tensors["dictionary"])

    @property
    def directions(self) -> torch.Tensor:
        """[n_features, d]: what one unit of each feature's code adds at the hook (hook units)."""
        return self.scale * self.tensors["dictionary"]

    def check_model(self, model) -> None:
        """Refuse (one line) a model whose weights are not those the SAE was trained on."""
        module = getattr(model, "timm_model", model)
        mine = self.config["model"]
        fp = weights_fingerprint(module)
        if fp != mine.get("weights_fingerprint"):
            same = architecture_fingerprint(module) == mine.get("architecture_fingerprint")
            raise InterpError(f"the SAE {self._where()} was trained on model {mine.get('model_name')!r} (weights "
                              f"{mine.get('weights_fingerprint')}); this model has {'other weights' if same else 'another architecture'} "
                              f"({fp}): load the model it was trained on, or train one for this model")

    def check_source(self, source) -> None:
        """Refuse (one line) activations of another model: an activation source's model when it has one, else
        the weights fingerprint its cache records."""
        model = source.weights_model
        if model is not None:
            self.check_model(model)
        elif self.config["model"].get("weights_fingerprint") != source.fingerprint:
            raise InterpError(f"the SAE {self._where()} was trained on weights "
                              f"{self.config['model'].get('weights_fingerprint')}; these activations come from "
                              f"{source.fingerprint}: use the model (or a cache of the model) it was trained on")

    def check_hook(self, hook: str, d: Optional[int] = None) -> None:
        """Refuse (one line) another hook, or activations of another width ``d``."""
        if hook != self.hook:
            raise InterpError(f"the SAE {self._where()} reads {self.hook!r}, not {hook!r}: use it on its own hook or "
                              "train one for this hook (`interp sae train ... --hook HOOK`)")
        if d is not None and d != self.d:
            raise InterpError(f"the SAE {self._where()} reads vectors of width {self.d}; {hook} has width {d}")

    def ablation_state(self, layout=None) -> Dict[str, Any]:
        """What ``SAEFeatureAblation`` keeps: block (``layer``, or ``block``: the prefix of a pyramid's block), code rule, k, the token kind trained on, the model's prefix
        layout (``{"cls_index", "n_registers"}``: recorded at training, else from ``layout``, a TokenLayout) and
        the tensors it needs."""
        block = block_prefix(self.hook)
        if block is None or self.hook != f"{block}.hook_resid_post":
            raise InterpError(f"feature ablation edits a block output (blocks.N.hook_resid_post, or "
                              f"stages.S.blocks.J.hook_resid_post in a pyramid); this SAE reads {self.hook!r}")
        layer = block_of(self.hook)  # a pyramid's block is found by its prefix when the edit is made
        names = ("w_enc", "b_enc", "dictionary", "mean", "scale", "feature_means", "threshold")
        prefix = self.config.get("layout")
        if prefix is None and layout is not None:
            prefix = {"cls_index": layout.cls_index, "n_registers": layout.n_registers}
        return {"layer": layer, "block": None if layer is not None else block, "codes": self.codes.rule.name,
                "k": self.k, "tokens": self.tokens,
                "prefix": prefix, "tensors": {n: self.tensors[n] for n in names if n in self.tensors}}

    @property
    def tokens(self) -> str:
        """The token kind the SAE was trained on: patches, all, cls or registers."""
        return self.config.get("tokens") or "patches"

    def _where(self) -> str:
        return f"in {str(self.path)!r}" if self.path else "given"

    def __repr__(self) -> str:
        return f"SAE({self.arch}, {self.n_features} features x {self.d}, hook={self.hook!r})"


def _digest(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def _json_ready(value):
    """Non-finite floats (an explained variance of a constant batch) as None: sae.json stays strict JSON."""
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, dict):
        return {k: _json_ready(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_json_ready(v) for v in value]
    return value


def _described(config: Dict[str, Any], tensors: Dict[str, torch.Tensor]):
    """(``sae.json`` as :func:`load` will read it, the safetensors bytes, the tensors as stored) of an SAE."""
    from safetensors.torch import save as to_bytes

    tensors = {k: v.detach().float().contiguous().cpu() for k, v in tensors.items()}
    data = to_bytes(tensors)
    config = {"format": FORMAT, "version": FORMAT_VERSION, **config, "weights_sha256": _digest(data)}
    config["config_sha256"] = config_digest(config)
    return json.loads(json.dumps(_json_ready(config), allow_nan=False)), data, tensors


def save_problem(config: Dict[str, Any], tensors: Dict[str, torch.Tensor]) -> Optional[str]:
    """Why :func:`load` would refuse the SAE :func:`save` would write from ``config`` and ``tensors``
    (:func:`loader_problem`: non-finite weights, a k or threshold that does not fit, ...); None when it loads."""
    problem = loader_problem(*_described(config, tensors)[::2])
    return problem[1] if problem else None


def save(out: Union[str, Path], config: Dict[str, Any], tensors: Dict[str, torch.Tensor]) -> Path:
    """Write ``out/sae.safetensors`` then ``out/sae.json`` (with the weights' SHA-256), each atomically.

    Raises:
        InterpError (one line, nothing written): :func:`load` would refuse the SAE (:func:`save_problem`)."""
    out = Path(out)
    config, data, tensors = _described(config, tensors)
    problem = loader_problem(config, tensors)
    if problem:
        raise InterpError(f"not writing the SAE into {str(out)!r}: its own loader would refuse it ({problem[1]})")
    write_atomic(out / SAE_WEIGHTS, data, "SAE weights")
    write_atomic(out / SAE_CONFIG, (json.dumps(config, indent=1) + "\n").encode(), "SAE description")
    return out


MIN_SCALE = 1e-6  # the normalisation's scale is the tokens' RMS norm (about 1-1000 in ViTs): 0 or 1e-30 is damage
DECISIVE = ("arch", "codes", "k", "hook", "tokens", "high_norm", "layout", "n_features", "d", "model",
            "normalisation", "weights_sha256")  # what the SAE means; sae.json's config_sha256 covers them


def config_digest(config: Dict[str, Any]) -> str:
    """sha256 of the decisive fields of ``sae.json`` (:data:`DECISIVE`), canonical JSON: an edit of the hook, arch,
    k or token choice after training is refused on load."""
    decisive = {key: config.get(key) for key in DECISIVE}
    return _digest(json.dumps(_json_ready(decisive), sort_keys=True, separators=(",", ":")).encode())


def _shape(t: torch.Tensor) -> tuple:
    return tuple(int(s) for s in t.shape)


def tensor_problem(config: Dict[str, Any], tensors: Dict[str, torch.Tensor]) -> Optional[tuple]:
    """``("weights", why)`` when the tensors are not an SAE's: a missing one, another dtype than float, shapes
    that do not fit together (w_enc [n, d], b_enc [n], dictionary [n, d], mean [d], scale [1], feature_means [n],
    threshold [1] for batchtopk or [n] for jumprelu), a non-finite value, a scale that is not a positive RMS
    norm; None when they are."""
    missing = [n for n in REQUIRED if n not in tensors]
    if missing:
        return "weights", f"missing tensor(s) {missing}"
    for name, t in tensors.items():
        if not t.is_floating_point():
            return "weights", f"tensor {name!r} has dtype {str(t.dtype).replace('torch.', '')}; SAE tensors are floats"
    if tensors["w_enc"].ndim != 2:
        return "weights", f"w_enc has shape {list(_shape(tensors['w_enc']))}, not [n_features, d]"
    n, d = _shape(tensors["w_enc"])
    want = {"b_enc": (n,), "dictionary": (n, d), "mean": (d,), "scale": (1,), "feature_means": (n,)}
    if "threshold" in tensors:
        want["threshold"] = (n,) if config.get("arch") == "jumprelu" else (1,)
    wrong = [f"{name} {list(_shape(tensors[name]))} (expected {list(shape)})" for name, shape in want.items()
             if _shape(tensors[name]) != shape]
    if wrong:
        return "weights", f"tensor shapes do not fit w_enc [{n}, {d}]: {', '.join(wrong)}"
    if not all(bool(torch.isfinite(t).all()) for t in tensors.values()):
        return "weights", "non-finite weights"
    scale = float(tensors["scale"][0])
    if not scale >= MIN_SCALE:
        return "weights", f"normalisation scale {scale:g}: it is the tokens' RMS norm, a positive number >= {MIN_SCALE:g}"
    return None


def config_problem(config: Dict[str, Any], tensors: Dict[str, torch.Tensor]) -> Optional[tuple]:
    """``("config", why)`` when ``sae.json`` does not describe these tensors or was edited after training: its
    sizes, k, token choice, normalisation scale, or its ``config_sha256`` over the decisive fields."""
    from .data import HIGH_NORM_CHOICES, TOKEN_CHOICES

    n, d = _shape(tensors["w_enc"])
    for key, value in (("n_features", n), ("d", d)):
        if key in config and config[key] != value:
            return "config", f"{key} {config[key]!r} but the weights have {value}"
    k = config.get("k")
    if config["arch"] in ("topk", "batchtopk", "archetypal") and not (
            isinstance(k, int) and not isinstance(k, bool) and 1 <= k <= n):
        return "config", f"k {k!r}: a {config['arch']} SAE needs a whole number 1..{n}"
    if config.get("tokens", "patches") not in TOKEN_CHOICES:
        return "config", f"tokens {config.get('tokens')!r}: one of {', '.join(TOKEN_CHOICES)}"
    if config.get("high_norm", "include") not in HIGH_NORM_CHOICES:
        return "config", f"high_norm {config.get('high_norm')!r}: one of {', '.join(HIGH_NORM_CHOICES)}"
    recorded = (config.get("normalisation") or {}).get("scale") if isinstance(config.get("normalisation"), dict) else None
    scale = float(tensors["scale"][0])
    if isinstance(recorded, (int, float)) and not math.isclose(recorded, scale, rel_tol=1e-5):
        return "config", f"its normalisation scale {recorded!r} differs from the weights' {scale:g}"
    if "config_sha256" not in config:
        return "config", ("its description has no config_sha256, the checksum of its hook, arch, k, tokens, model "
                          "and normalisation, so an edit cannot be told apart")
    if config["config_sha256"] != config_digest(config):
        return "config", ("its description was edited after training (config_sha256 does not match the hook, "
                          "arch, k, tokens, model or normalisation it holds)")
    return None


def loader_problem(config: Any, tensors: Dict[str, torch.Tensor]) -> Optional[tuple]:
    """``("config" | "weights", why)`` for everything :func:`load` refuses in a parsed ``sae.json`` and its
    tensors (the weights' SHA-256 against their bytes aside); None when it would load them. :func:`save` runs it
    too: an SAE that its own loader would refuse is never written."""
    if not isinstance(config, dict) or config.get("format") != FORMAT:
        return "config", f"no {FORMAT!r} format key"
    version = config.get("version")
    if not isinstance(version, int) or isinstance(version, bool) or version > FORMAT_VERSION:
        return "config", f"format version {version!r}; this interp reads up to {FORMAT_VERSION}"
    problems = [key for key, kind in (("arch", str), ("hook", str), ("model", dict), ("weights_sha256", str))
                if not isinstance(config.get(key), kind)]
    if config.get("arch") not in ARCHS:
        problems.append("arch")
    if problems:
        return "config", f"missing or invalid {', '.join(sorted(set(problems)))}"
    problem = tensor_problem(config, tensors) or config_problem(config, tensors)
    if problem:
        return problem
    try:
        SAE(config, tensors)
    except InterpError as e:
        return "weights", str(e)
    return None


POOR_EXPLAINED_VARIANCE = 0.5  # below it the SAE's features describe too little of the hook to be read


def quality_notes(config: Dict[str, Any]) -> list:
    """What makes an SAE's features unreliable, from its ``sae.json``: the warnings its training recorded, else a
    held-out (or training-sample) explained variance below :data:`POOR_EXPLAINED_VARIANCE`."""
    recorded = config.get("warnings")
    if isinstance(recorded, list) and recorded:
        return [str(w) for w in recorded]
    metrics = config.get("metrics") if isinstance(config.get("metrics"), dict) else {}
    stats = metrics.get("held_out") or metrics.get("train_sample") or {}
    ev = stats.get("explained_variance") if isinstance(stats, dict) else None
    if isinstance(ev, (int, float)) and ev < POOR_EXPLAINED_VARIANCE:
        return [f"held-out explained variance {ev:.3f} < {POOR_EXPLAINED_VARIANCE}: it reconstructs too little of "
                "the hook for its features (and 'artifact features') to mean much; train it longer (docs/sae.md)"]
    return []


def _bad(path: Path, why: str) -> InterpError:
    return InterpError(f"{str(path)!r} is not a readable SAE ({why}); train it again with `interp sae train`")


def load(directory: Union[str, Path], model=None, hook: Optional[str] = None) -> SAE:
    """The SAE in ``directory`` (``sae.json`` + ``sae.safetensors``), checked.

    Args:
        model: if given, refuse an SAE trained on other weights (weights fingerprint).
        hook: if given, refuse an SAE trained on another hook.

    Raises:
        InterpError (one line): missing or malformed files, weights that do not match their description, an SAE
        of another model or hook.
    """
    from safetensors.torch import load as load_bytes

    directory = Path(directory)
    cfg_path, w_path = directory / SAE_CONFIG, directory / SAE_WEIGHTS
    for path in (cfg_path, w_path):
        check_input_path(path, "SAE file")
    if not cfg_path.is_file() or not w_path.is_file():
        raise InterpError(f"{str(directory)!r} holds no SAE (needs {SAE_CONFIG} and {SAE_WEIGHTS}); train one with "
                          "`interp sae train MODEL --cache FILE --hook HOOK --out DIR`")
    try:
        config = json.loads(cfg_path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError, RecursionError) as e:
        raise _bad(cfg_path, f"not JSON: {type(e).__name__}") from None
    if not isinstance(config, dict) or config.get("format") != FORMAT:
        raise _bad(cfg_path, f"no {FORMAT!r} format key")
    if not isinstance(config.get("weights_sha256"), str):
        raise _bad(cfg_path, "missing or invalid weights_sha256")
    data = w_path.read_bytes()
    if _digest(data) != config["weights_sha256"]:
        raise _bad(w_path, f"its SHA-256 does not match {SAE_CONFIG}: corrupt, truncated or from another run")
    try:
        tensors = load_bytes(data)
    except Exception as e:  # safetensors raises its own error types for a damaged header
        raise _bad(w_path, f"{type(e).__name__}") from None
    problem = loader_problem(config, tensors)
    if problem:
        raise _bad(w_path if problem[0] == "weights" else cfg_path, problem[1])
    sae = SAE(config, tensors, directory)
    if model is not None:
        sae.check_model(model)
    if hook is not None:
        sae.check_hook(hook)
    import warnings

    for note in quality_notes(config):  # every command and study that reads a poor SAE says so
        warnings.warn(f"the SAE in {str(directory)!r}: {note}", InterpWarning)
    return sae
