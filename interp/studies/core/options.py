"""Option groups several studies share, as torch-free config dataclasses a study's config inherits from
(:mod:`interp.studies.declaration`): the detection contract, the classifier of the behaviour metrics, the
register neurons an edit uses, the linear probes' budget; and the hooks a Patch Score reads (:func:`needed_hooks`).

>>> from interp.studies.artifacts.configs import NormsConfig
>>> NormsConfig(threshold="3.5").threshold       # a number given as text becomes a norm
3.5
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, ClassVar, Dict, List, Optional, Tuple, Union

from ...errors import InterpError, UsageError
from ...options import Options
from ...values import (NEURONS_SYNTAX, existing_file, nonnegative_float, open_fraction, positive_float, positive_int,
                       threshold_arg, threshold_value)
from ..declaration import StudyConfig, option
from ...detection.presets import PRESETS, resolve_preset
from ...hooks.names import resolve_block

FINAL = "hook_norm_final"  # the final normed tokens: the Patch Score's default tokens and its CLS vector
REFERENCES = ("cls", "pooled", "selective")  # the Patch Score's global vectors
SCORE_DOC = "`--hook` (default `hook_norm_final`) and `hook_norm_final` (`hook_pooled` with `--reference pooled`)"


def needed_hooks(hook: str, reference: str) -> List[str]:
    """Hooks a Patch Score map needs: the patch tokens' hook plus what the reference vector is read from."""
    if reference not in REFERENCES:
        raise InterpError(f"reference={reference!r} is not one of {list(REFERENCES)}")
    hooks = [hook]
    extra = "hook_pooled" if reference == "pooled" else FINAL
    if extra not in hooks:
        hooks.append(extra)
    return hooks


CLASSIFIER_HELP = ("classifier file (zero-shot matrix, linear head, or a DINOv2 released linear head) whose class "
                   "logits give top-1 agreement and accuracy (accuracy only when the image folders name its "
                   "classes); without it they exist only for a classification head (else the pooled vector's "
                   "cosine to the unedited one)")


@dataclass(frozen=True, kw_only=True)
class DetectionFields(Options):
    """What counts as a high-norm token (:class:`~interp.detection.detection.DetectionSpec`): a threshold at
    the detection block, filled in by a preset where not given. The option group of the studies
    (:class:`DetectionOptions`) and of ``interp report`` / ``interp compare``."""

    threshold: Union[float, str, None] = option(
        None, "outlier norm threshold: a norm value > 0, pNN (e.g. p98) or auto (default, or the preset's)",
        parse=threshold_arg)
    preset: Optional[str] = option(None, f"published settings: {', '.join(PRESETS)} (explicit flags win)")
    detect_layer: Optional[int] = option(
        None, "block whose output decides outliers (default: last; negative counts from the end)")

    def __post_init__(self) -> None:
        object.__setattr__(self, "threshold", threshold_value(self.threshold))
        super().__post_init__()

    def detection_options(self) -> Dict[str, Any]:
        """The three as the detection functions take them (``threshold``, ``detect_layer``, ``preset``)."""
        return {"threshold": self.threshold, "detect_layer": self.detect_layer, "preset": self.preset}

    def detect_block(self, n_layers: int) -> int:
        """The detection block (0-based) on an ``n_layers``-block model, the preset's when not given."""
        layer = resolve_preset(self.preset, detect_layer=self.detect_layer).get("detect_layer")
        return resolve_block(layer, n_layers, -1)


@dataclass(frozen=True, kw_only=True)
class DetectionOptions(DetectionFields, StudyConfig):
    """A study's detection options (:class:`DetectionFields`)."""


@dataclass(frozen=True, kw_only=True)
class ClassifierFile(Options):
    """The class logits of the behaviour metrics (:mod:`interp.models.classifiers.classifier`): ``--classifier FILE``."""

    classifier: Optional[str] = option(None, CLASSIFIER_HELP, parse=existing_file, metavar="FILE")


@dataclass(frozen=True, kw_only=True)
class ClassifierOption(ClassifierFile, StudyConfig):
    """A study's ``--classifier`` (:class:`ClassifierFile`)."""


@dataclass(frozen=True, kw_only=True)
class NeuronsOptions(ClassifierOption):
    """The register neurons an edit uses (``--neurons``), required by a run (a config without them still says
    which hooks it reads: ``required_hooks("ablate", n)`` answers that it re-runs the model)."""

    neurons: Union[str, Dict[int, List[int]], None] = option(
        None, f"the register neurons to edit (required): {NEURONS_SYNTAX}")
    force: bool = option(False, "use a neurons.json ranked on another model's weights (refused by default)")

    def check_inputs(self, images: Optional[Any], cache: Optional[str]) -> None:
        super().check_inputs(images, cache)
        self.required_neurons()

    def required_neurons(self) -> Any:
        """``neurons`` as given (dict, ``"L:N,..."`` text, neurons.json path or a neurons result); an error naming
        ``--neurons`` when there are none."""
        if self.neurons is None or (isinstance(self.neurons, str) and not self.neurons.strip()):
            # exit 1, as before the declarations (the option is missing, not malformed)
            raise InterpError(f"interp study {self.name} needs --neurons: {NEURONS_SYNTAX}; find them with "
                              "`interp study neurons MODEL --images DIR --out DIR` and pass DIR/neurons.json")
        return self.neurons


PROBE_BUDGET_GROUP = "probe budget (position and label probes; the pixel probe is closed-form ridge)"


@dataclass(frozen=True, kw_only=True)
class ProbeBudget(Options):
    """The linear probes' budget and schedule (``interp study probes``, ``interp compare``): each option given
    overrides the probes' own default (:meth:`probe_budget`, the probes' ``probe_options``)."""

    BUDGET: ClassVar[Tuple[str, ...]] = ("epochs", "min_steps", "lr", "weight_decay", "ridge", "patience",
                                         "val_fraction")

    epochs: Optional[int] = option(None, "passes over the training tokens (default 30)", parse=positive_int,
                                   group=PROBE_BUDGET_GROUP)
    min_steps: Optional[int] = option(None, "at least this many Adam steps (default 300; interp compare: 100)",
                                      parse=positive_int, group=PROBE_BUDGET_GROUP)
    lr: Optional[float] = option(None, "Adam learning rate, cosine-decayed (default 0.01)", parse=positive_float,
                                 group=PROBE_BUDGET_GROUP)
    weight_decay: Optional[float] = option(None, "AdamW weight decay (default 0)", parse=nonnegative_float,
                                           group=PROBE_BUDGET_GROUP)
    ridge: Optional[float] = option(None, "relative L2 penalty of the pixel probe (default 1e-4)",
                                    parse=nonnegative_float, group=PROBE_BUDGET_GROUP)
    patience: Optional[int] = option(
        None, "early stopping: stop after this many passes without a better validation loss", parse=positive_int,
        group=PROBE_BUDGET_GROUP)
    val_fraction: Optional[float] = option(
        None, "share of the training images set aside as the validation set of --patience (default 0.1)",
        parse=open_fraction, group=PROBE_BUDGET_GROUP)

    def check(self) -> None:
        super().check()
        if self.val_fraction is not None and self.patience is None:
            raise UsageError("--val-fraction sets the validation set of early stopping; give --patience N too")

    def probe_budget(self) -> Dict[str, Any]:
        """The budget options given (None: the probes' default), as the probes' ``probe_options``."""
        return {k: getattr(self, k) for k in self.BUDGET if getattr(self, k) is not None}


@dataclass(frozen=True, kw_only=True)
class ProbeBudgetOptions(ProbeBudget, StudyConfig):
    """A study's probe budget (:class:`ProbeBudget`)."""
