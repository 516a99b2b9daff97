"""What several sub-commands share: building the model of a run's inputs (checked against the device and the
options' block numbers) and reading --neurons (the option groups: :mod:`.inputs`; writing results:
:mod:`.saving`). Commands import helpers from here, never from each other."""
from __future__ import annotations

from typing import Any, Dict, List, Optional, Sequence

from ..errors import HookNameError, InterpError, UsageError
from ..options import Options
from ..sae_settings import check_sae_size
from ..values import NEURONS_SYNTAX
from .groups import ModelSpec
from .inputs import RunInputs


def option_values(options: Sequence[Options]) -> Dict[str, Any]:
    """Every option of a command's ``options`` objects (their groups' included) by field name, the first object's
    value where two declare one: what the checks shared by several commands read (block numbers, ``--hook``,
    ``--sae``), whichever group or config declares them."""
    values: Dict[str, Any] = {}
    for o in reversed(options):
        values.update(o.values())
    return values


def check_device(device: str) -> str:
    """Before the model is built: ``device`` exists on this machine; else a one-line UsageError naming the
    devices that do and what to pass."""
    import warnings

    import torch

    if device == "cpu":
        return device
    with warnings.catch_warnings():  # a broken driver warns here; the error below says it in one line
        warnings.simplefilter("ignore")
        n_gpus = torch.cuda.device_count() if torch.cuda.is_available() else 0
        mps = bool(getattr(torch.backends, "mps", None) and torch.backends.mps.is_available())
    available = ["cpu"] + [f"cuda:{i}" for i in range(n_gpus)] + (["mps"] if mps else [])
    shown = ", ".join(available)
    if device.startswith("cuda"):
        if n_gpus == 0:
            why = ("this torch build has no CUDA support" if torch.version.cuda is None
                   else "torch finds no NVIDIA GPU or driver")
            raise UsageError(f"--device {device}: no CUDA GPU on this machine ({why}); available: {shown}; "
                             "pass --device cpu")
        index = int(device.partition(":")[2] or 0)
        if index >= n_gpus:
            raise UsageError(f"--device {device}: this machine has {n_gpus} CUDA GPU(s); available: {shown}")
    elif device == "mps" and not mps:
        raise UsageError(f"--device mps: no Apple MPS device on this machine; available: {shown}")
    return device


LAYER_OPTIONS = (("detect_layer", "--detect-layer"), ("highest_layer", "--highest-layer"), ("layer", "--layer"))


def check_model_args(model, spec: ModelSpec, options: Sequence[Options] = ()) -> None:
    """Before any forward pass, on the model's skeleton before the load (:func:`check_before_load`) or on the
    loaded model: an input of at least one patch, block numbers of ``options`` within the model's depth, a
    ``--hook`` that names one of its hooks (close matches otherwise) and ``--hooks`` names or patterns that each
    match one."""
    n = model.n_layers
    given = option_values(options)
    if 0 in tuple(model.layout.grid):  # an input smaller than one patch: timm builds it, the forward fails
        patch = tuple(model.patch_size)
        raise UsageError(f"--img-size {spec.img_size} is smaller than one patch of {spec.name} "
                         f"({'x'.join(map(str, patch)) or '?'} px): give at least {max(patch, default=1)}")
    for attr, flag in LAYER_OPTIONS:
        value = given.get(attr)
        if value is not None and not -n <= int(value) < n:
            raise UsageError(f"{flag} {value} is out of range: {spec.name} has {n} blocks "
                             f"(0..{n - 1}, or -{n}..-1 counted from the end)")
    hooks = given.get("hooks")  # interp cache's names and patterns
    if hooks:
        try:
            model.resolve_hooks(list(hooks))
        except HookNameError as e:
            raise UsageError(f"--hooks: {e}") from None
    hook = given.get("hook")
    if isinstance(hook, str) and hook not in model.hook_names():
        from ..errors import close_matches

        near = close_matches(hook, model.hook_names(), n=3)
        hint = f" Close matches: {', '.join(near)}." if near else ""
        raise UsageError(f"--hook {hook!r} is not a hook of {spec.name}.{hint} "
                         f"List them with `interp hooks {spec.name}`.")
    expansion = given.get("expansion")
    if isinstance(hook, str) and isinstance(expansion, int):
        check_sae_size(expansion, hook_width(model, hook))


def hook_width(model, hook: str) -> int:
    """The width of ``hook``'s vectors from the model's structure (no forward): the MLP's neurons for
    ``mlp.hook_pre`` / ``mlp.hook_post``, the residual stream's width at that block otherwise."""
    layer = model.block_names.block_of(hook)
    layer = model.n_layers - 1 if layer is None else layer
    if hook.endswith(("mlp.hook_pre", "mlp.hook_post")):
        return model.family.d_mlp(layer)
    return model.family.d_model(layer)


def check_top_k(top_k: Optional[int], model, why: str = "") -> None:
    """``--top-k`` register neurons within what ``model`` (loaded, or its skeleton) has: at most half of one
    block's MLP width (``why``: what needs the other half; before: 10**8 ended in a traceback after the first
    studies, and reassess edited all 4608 neurons of a block)."""
    if top_k is None:
        return
    width = min(model.family.d_mlp(layer) for layer in range(model.n_layers))
    if top_k > width // 2:
        name = getattr(model, "model_name", None) or "the model"
        raise UsageError(f"--top-k {top_k} is more than half a block's {width} MLP neurons of {name}"
                         f"{'; ' + why if why else ''}: give --top-k <= {width // 2}")


def rank_device(device: str) -> str:
    """``device`` for this process: under torchrun (``WORLD_SIZE`` > 1) a CUDA device is this rank's own GPU
    (``cuda:LOCAL_RANK``)."""
    import os

    if device.startswith("cuda") and int(os.environ.get("WORLD_SIZE", "1")) > 1:
        return f"cuda:{os.environ.get('LOCAL_RANK', '0')}"
    return device


def timm_kwargs(spec: ModelSpec) -> dict:
    """The ``timm.create_model`` kwargs of ``spec``'s options (``--img-size``, ``--depth``)."""
    kwargs = {}
    if spec.img_size:
        kwargs["img_size"] = spec.img_size
    if spec.depth:
        kwargs["depth"] = spec.depth
    return kwargs


def check_before_load(spec: ModelSpec, options: Sequence[Options] = ()) -> bool:
    """Before the model is loaded (weights read or randomly initialised: seconds to minutes): the checks of
    :func:`check_model_args` on the model's skeleton, its structure built on torch's meta device in ~0.03 s
    (:func:`interp.hooks.load.load_skeleton`). True when the skeleton has the structure the load will give, so the
    check need not run again; False when the check is left to the loaded model: no skeleton could be built (a
    planted model...), or a weight file without ``--img-size`` sets the input size (its position grid), which
    only the file knows (block numbers and hooks are still checked here: a file cannot change them)."""
    from ..hooks.load import load_skeleton

    skeleton = load_skeleton(spec.name, **timm_kwargs(spec))
    if skeleton is None:
        return False
    check_model_args(skeleton, spec, options)
    return not (spec.weights and not spec.img_size)


def load_model(inputs: RunInputs, options: Sequence[Options] = (), spec: Optional[ModelSpec] = None, dtype=None):
    """Load the HookedViT of the run (``spec``, default the run's one model): the device and the arguments of
    ``options`` checked first (on the model's skeleton, :func:`check_before_load`), then the load."""
    return load_models(inputs, options, (spec or inputs.model,), dtype)[0]


def load_models(inputs: RunInputs, options: Sequence[Options] = (), specs: Optional[Sequence[ModelSpec]] = None,
                dtype=None) -> list:
    """Load the HookedViTs of the run (``specs``, default ``inputs.models``), in order: the device and the
    arguments of ``options`` checked first on every model's skeleton (:func:`check_before_load`), so that a bad
    value is refused before any model loads; then the loads."""
    from ..hooks.load import load

    specs = tuple(inputs.models if specs is None else specs)
    device = rank_device(inputs.device)
    check_device(device)
    checked = [check_before_load(spec, options) for spec in specs]
    models = []
    for spec, done in zip(specs, checked):
        model = load(spec.name, pretrained=spec.pretrained, weights=spec.weights, device=device, dtype=dtype,
                     seed=inputs.seed, pos_resample=spec.pos_resample, **timm_kwargs(spec))
        if not done:  # what the skeleton could not stand for: no skeleton, or the input size a weight file sets
            check_model_args(model, spec, options)
        models.append(model)
    return models


def parse_neurons(text: str) -> Dict[int, List[int]]:
    """``"2:17,2:101,5:40"`` -> ``{2: [17, 101], 5: [40]}``; a path to a neurons study's JSON -> its ranked
    neurons. Raises InterpError on bad syntax (the forms of :func:`interp.interventions.neuron_sets.neuron_set`)."""
    from ..interventions.neuron_sets import neuron_set

    text = (text or "").strip()
    if not text:
        raise InterpError(f"--neurons is empty: give {NEURONS_SYNTAX}")
    return neuron_set(text, label="--neurons").neurons
