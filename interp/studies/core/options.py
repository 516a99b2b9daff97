"""Options several studies share, torch-free (:mod:`interp.studies.declaration`): the classifier of the behaviour
metrics and the register neurons an edit uses (fields a config declares with :func:`classifier_option`,
:func:`neurons_option`, :func:`force_option`), the linear probes' budget (:class:`ProbeBudget`, an option group a
config holds with :func:`~interp.options.group`); and the hooks a Patch Score reads (:func:`needed_hooks`). What
counts as a high-norm token is the group :class:`~interp.detection.spec.DetectionSpec`.

>>> from interp.detection.spec import DetectionSpec
>>> from interp.studies.artifacts.configs import NormsConfig
>>> NormsConfig(detection=DetectionSpec(threshold="3.5")).detection.threshold   # a number given as text: a norm
3.5
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, ClassVar, Dict, List, Optional, Tuple

from ...errors import InterpError, UsageError
from ...options import Options, option
from ...values import NEURONS_SYNTAX, nonnegative_float, open_fraction, positive_float, positive_int
from ...paths import classifier_source

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


CLASSIFIER_HELP = ("classifier file (zero-shot matrix, linear head, or a DINOv2 released linear head; or a transformers "
                   "Dinov2ForImageClassification folder) whose class "
                   "logits give top-1 agreement and accuracy (accuracy only when the image folders name its "
                   "classes); without it they exist only for a classification head (else the pooled vector's "
                   "cosine to the unedited one)")


def classifier_option() -> Any:
    """The ``--classifier FILE`` field of a study or command whose behaviour metrics read class logits
    (:mod:`interp.models.classifier`)."""
    return option(None, CLASSIFIER_HELP, parse=classifier_source, metavar="FILE")


@dataclass(frozen=True, kw_only=True)
class ClassifierFile(Options):
    """The class logits of the behaviour metrics (:mod:`interp.models.classifiers.classifier`): ``--classifier FILE``."""

    classifier: Optional[str] = classifier_option()


def neurons_option(help: str = f"the register neurons to edit (required): {NEURONS_SYNTAX}") -> Any:
    """The ``--neurons`` field of a study that edits register neurons (``{layer: [neuron, ...]}``, ``"L:N,..."``
    text, a neurons.json path or a neurons result)."""
    return option(None, help)


def force_option() -> Any:
    """The ``--force`` field that goes with :func:`neurons_option`."""
    return option(False, "use a neurons.json ranked on another model's weights (refused by default)")


def required_neurons(study: str, neurons: Any) -> Any:
    """``neurons`` as given; an error naming ``--neurons`` when there are none (exit 1: the option is missing,
    not malformed). A config that edits neurons calls it from ``check_inputs``, its study before any forward."""
    if neurons is None or (isinstance(neurons, str) and not neurons.strip()):
        raise InterpError(f"interp study {study} needs --neurons: {NEURONS_SYNTAX}; find them with "
                          "`interp study neurons MODEL --images DIR --out DIR` and pass DIR/neurons.json")
    return neurons


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
