"""What a study is, declared once: a torch-free config dataclass per study (its options, their defaults, help
text, parsers and checks), registered with :func:`declare`, and the study function bound to it with
:func:`study`. The ``interp study NAME`` command line, ``interp cache --for``, the cache check, the docs'
cache table and API list are all generated from these declarations; nothing else names a study.

One name per study: the config's ``name`` (``patch-score``) is the command and, in its underscore form
(``patch_score``), the stem of its JSON file. The config names, as literals a reader (or a tool) can follow, the
module that defines the study (``module``), its function there (``function``) and its result class (``result``);
:mod:`interp.studies.catalog` lists the themes and derives the rest.

A study's config lives in its theme's ``configs.py`` (torch-free: ``interp --help`` reads every config without
importing torch); its function, result class and figures import torch and live in the study's module::

    # interp/studies/artifacts/configs.py
    @declare
    @dataclass(frozen=True, kw_only=True)
    class NormsConfig(StudyConfig):
        \"\"\"high-norm tokens: per-block norms, outliers, emergence layer

        Per-block patch-token norms of the un-normalised residual stream, ...\"\"\"
        name: ClassVar[str] = "norms"
        module: ClassVar[str] = "interp.studies.artifacts.norms"
        function: ClassVar[str] = "norms_study"
        result: ClassVar[str] = "NormsResult"
        detection: DetectionSpec = group(DetectionSpec)   # --threshold, --preset, --detect-layer
        emergence_factor: float = 2.0
        def hooks(self, n_layers): ...

    # interp/studies/artifacts/norms.py
    @study(NormsConfig)
    def norms_study(source, config, *, detection, progress=True) -> NormsResult: ...

    norms_study(source, emergence_factor=3.0, progress=False)        # keyword options build the config
    norms_study(source, detection=DetectionSpec(threshold="p98"))     # a spec: the config's detection group
    norms_study(source, detection=found)                              # a Detection made by detect(): no pass

A config's option groups are fields (:func:`~interp.options.group`), not base classes: a study that counts
high-norm tokens holds ``detection: DetectionSpec = group(DetectionSpec)`` and its function takes ``detection``
(what :func:`study` hands it: the Detection the caller passed, else the config's spec; the function resolves it
with :func:`interp.detection.detection.detect`). No study takes ``threshold=``, ``detect_layer=`` or
``preset=``: they are the spec's.
"""
from __future__ import annotations

import dataclasses
import functools
import inspect
from dataclasses import dataclass
from typing import Any, Callable, ClassVar, Dict, List, Optional, Type, Union

from ..detection.spec import DetectionSpec, refuse_loose_fields
from ..errors import InterpError
from ..hooks.names import BlockNames
from ..options import Options, group, option
from ..values import SEED_HELP, seed_arg

LIVE_DOC = "none: they re-run the model (`--images`)"


@dataclass(frozen=True, kw_only=True)
class StudyConfig(Options):
    """The options of one study (subclass it, set ``name``, declare the fields with :func:`~interp.options.option`;
    the command line and the checks come from :class:`~interp.options.Options`).

    Class attributes:
        name: the study's one name (``patch-score``).
        module: the module that defines its function and result class
            (``interp.studies.aggregation.patch_score``).
        function: its function's name there (``patch_score_study``), bound to the config with :func:`study`.
        result: its result class's name there (``PatchScoreResult``).
        inputs: what the command line reads: ``"images"`` (the study re-runs the model), ``"images_or_cache"``,
            or ``"images_and_cache"`` (``--images`` adds to a ``--cache`` run what ``cache_images_help`` says).
        full_vectors: a ``--norms-only`` cache cannot serve it.
        cache_doc: the hooks it reads, in words, for the docs' cache table.
    """

    name: ClassVar[str] = ""
    module: ClassVar[str] = ""
    function: ClassVar[str] = ""
    result: ClassVar[str] = ""
    inputs: ClassVar[str] = "images"
    full_vectors: ClassVar[bool] = True
    cache_doc: ClassVar[str] = LIVE_DOC
    cache_images_help: ClassVar[str] = ""

    seed: int = option(0, SEED_HELP, parse=seed_arg)

    # ------------------------------------------------------------------ what a study overrides
    def check_inputs(self, images: Optional[Any], cache: Optional[str]) -> None:
        """Refuse a run whose images / cache this study cannot take, before the model is built."""

    def source_images(self, images: Any) -> Any:
        """The images a live run opens, given ``--images`` (a study may widen them, e.g. by held-out images)."""
        return images

    def hooks(self, blocks: BlockNames) -> Optional[List[str]]:
        """The hooks it reads from a cache of a model with these blocks (:class:`~interp.hooks.names.BlockNames`);
        None: it re-runs the model."""
        return None

    def run_keywords(self, images: Any, cache: Optional[str]) -> Dict[str, Any]:
        """Keywords the study function takes from the run's inputs rather than its options (torch-free values,
        e.g. the image folders whose class names label the images); none by default."""
        return {}

    # ------------------------------------------------------------------ derived
    @classmethod
    def live_only(cls) -> bool:
        """True when the study re-runs the model (no cache serves it)."""
        return cls.inputs == "images"

    @classmethod
    def json_name(cls) -> str:
        """Stem of its JSON file and name of its module (``patch_score``)."""
        return cls.name.replace("-", "_")

    @classmethod
    def summary(cls) -> str:
        """One line: what it measures (the docstring's first line)."""
        return (cls.__doc__ or "").strip().splitlines()[0].strip()

    @classmethod
    def description(cls) -> str:
        """What ``interp study NAME --help`` says about it (the docstring after its first line)."""
        lines = (cls.__doc__ or "").strip().splitlines()[1:]
        return " ".join(line.strip() for line in lines if line.strip()) or cls.summary()

    def required_hooks(self, blocks: Union[BlockNames, int]) -> List[str]:
        """:meth:`hooks`, without repeats (``blocks``: the model's block names, or a number of ``blocks.{i}``
        blocks); an error for a study that re-runs the model."""
        blocks = blocks if isinstance(blocks, BlockNames) else BlockNames.flat(int(blocks))
        hooks = None if self.live_only() else self.hooks(blocks)
        if hooks is None:
            cacheable = ", ".join(c.name for c in declared_configs() if not c.live_only())
            raise InterpError(f"interp study {self.name} re-runs the model with an edit, so it reads no cache; "
                              f"give it --images (cacheable studies: {cacheable})")
        return list(dict.fromkeys(hooks))

# ---------------------------------------------------------------------------------------------- registry
_DECLARED: Dict[str, Type[StudyConfig]] = {}
_FUNCTIONS: Dict[Type[StudyConfig], Callable] = {}


def declare(cls: Type[StudyConfig]) -> Type[StudyConfig]:
    """Class decorator: register a study's config under its ``name`` (one class per name)."""
    missing = [a for a in ("name", "module", "function", "result") if not getattr(cls, a)]
    if missing:
        raise TypeError(f"{cls.__name__} declares no {', '.join(missing)} (class attributes of StudyConfig)")
    if not cls.module.startswith(cls.__module__.rpartition(".")[0] + "."):
        raise TypeError(f"{cls.__name__}.module {cls.module!r} is not in its theme {cls.__module__.rpartition('.')[0]}")
    known = _DECLARED.get(cls.name)
    if known is not None and known.__qualname__ != cls.__qualname__:
        raise TypeError(f"study {cls.name!r} is declared twice: {known.__module__}.{known.__qualname__} and "
                        f"{cls.__module__}.{cls.__qualname__}")
    _DECLARED[cls.name] = cls
    return cls


def study(config_class: Type[StudyConfig]) -> Callable[[Callable], Callable]:
    """Function decorator: the study function of ``config_class``. The function takes ``(source, config,
    **keywords)``; the decorated function also takes the config's options as keywords
    (``norms_study(source, emergence_factor=3.0)``), with or without a config to start from; an option of one of
    the config's groups goes into its group (``pib_study(source, boxes="b.csv", n_boot=200)``:
    :meth:`~interp.options.Options.build`), or the group whole under its field's name.

    A config with a ``detection`` group (a :class:`~interp.detection.spec.DetectionSpec`) makes ``detection=``
    the study's one way to say what counts as a high-norm token: a DetectionSpec given becomes the config's
    group; the function is always handed ``detection``: the Detection given (made by
    :func:`~interp.detection.detection.detect` on the same source), else the config's spec. A Detection given
    with a config whose spec is not the default is refused (the detection is said once). A config without the
    group takes no ``detection=``."""
    homes = config_class.keyword_homes()  # its fields', its groups' fields' (at any depth)
    names = set(homes)
    detects = "detection" in names and homes["detection"] is None

    def bind(function: Callable) -> Callable:
        parameters = set(inspect.signature(function).parameters)
        if ("detection" in parameters) != detects:
            raise TypeError(f"{function.__name__} must take detection= exactly when {config_class.__name__} "
                            "holds a detection group")
        shared = sorted((parameters - {"source", "config", "detection"}) & names)
        if shared:
            raise TypeError(f"{function.__name__}'s keyword {shared[0]}= is also an option of "
                            f"{config_class.__name__}: rename one")

        @functools.wraps(function)
        def run(source: Any, config: Optional[StudyConfig] = None, /, **keywords: Any) -> Any:
            refuse_loose_fields(function.__name__, [k for k in keywords if homes.get(k, "detection") == "detection"])
            given = keywords.pop("detection", None)
            options = {k: keywords.pop(k) for k in list(keywords) if k in names}
            if isinstance(given, DetectionSpec):
                options["detection"], given = given, None
            if config is None:
                config = config_class.build(**options)
            elif not isinstance(config, config_class):
                raise TypeError(f"{function.__name__} takes a {config_class.__name__}, got "
                                f"{type(config).__name__}; pass options by keyword")
            elif options:
                config = config.with_options(**options)
            if detects:
                if given is not None and config.detection != default_detection(config_class):
                    raise InterpError(f"{function.__name__}: give the detection once, a Detection (detection=) or "
                                      "the config's DetectionSpec, not both")
                keywords["detection"] = config.detection if given is None else given
            elif given is not None:
                raise InterpError(f"{function.__name__} counts no high-norm tokens: it takes no detection=")
            return function(source, config, **keywords)

        run.config_class = config_class
        _FUNCTIONS[config_class] = run
        return run

    return bind


def default_detection(config_class: Type[StudyConfig]) -> DetectionSpec:
    """The detection group a config of ``config_class`` holds when none is given."""
    return next(f for f in dataclasses.fields(config_class) if f.name == "detection").default_factory()


def declared_configs() -> List[Type[StudyConfig]]:
    """The configs declared so far (in declaration order); :func:`interp.studies.catalog.declared` imports every
    theme's first."""
    return list(_DECLARED.values())


def function_of(config: Type[StudyConfig]) -> Callable:
    """The function :func:`study` bound to ``config`` (its module must have been imported)."""
    try:
        return _FUNCTIONS[config]
    except KeyError:
        raise InterpError(f"{config.module} binds no function to {config.__name__} (decorate "
                          f"{config.function} with @study({config.__name__}))") from None
