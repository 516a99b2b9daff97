"""The conditions of an ablation of SAE features against random controls (``interp study ablate --sae DIR
--features 12,40``; docs/sae.md): the target :class:`~interp.interventions.SAEFeatureAblation` and one per control
set, each set as many live features of the SAE that do not fire on the high-norm tokens at its hook
(:func:`~interp.sae.features.control_features`; their firing is read from the same images)."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Dict, List, Sequence

from ..errors import InterpError
from ..interventions.sae_features import SAEFeatureAblation
from .features import control_features, source_feature_report
from .model import load


@dataclass
class FeatureConditions:
    """target: the ablation of the chosen features; controls: one per control set (``control_features``: their
    feature lists); pool: what the draw was made from (``n_alive``, ``n_high_norm_tokens``, the detection's
    ``artifacts_found`` at the SAE's hook)."""

    sae: str
    hook: str
    features: List[int]
    target: SAEFeatureAblation
    controls: List[SAEFeatureAblation]
    control_features: List[List[int]]
    pool: Dict[str, Any]


def feature_conditions(sae_dir: str, features: Sequence[int], source, *, n_controls: int, seed: int,
                       mode: str = "zero", progress: bool = False) -> FeatureConditions:
    """Load the SAE of ``sae_dir`` (refused for another model), check ``features``, read the features' firing
    over ``source`` (a live source: two passes at the SAE's hook) and draw the controls.

    Raises:
        InterpError (one line): an SAE of another model or of a hook that is not a block output, a feature that
        does not exist, too few live features off the high-norm tokens for the controls.
    """
    sae = load(sae_dir, model=source.model)
    features = [int(f) for f in features]
    bad = [f for f in features if not 0 <= f < sae.n_features]
    if bad or not features or len(set(features)) != len(features):
        raise InterpError(f"--features {','.join(map(str, features))}: give distinct features of the SAE in "
                          f"{str(sae_dir)!r} (0..{sae.n_features - 1})")
    sae.ablation_state()  # a hook that is not a block output is refused here, before any pass
    report = source_feature_report(sae, source, progress=progress)
    drawn = control_features(report, features, n_controls, seed)
    layout = source.layout
    prefix = {"cls_index": layout.cls_index, "n_registers": layout.n_registers}

    def ablation(chosen):  # on the token kind the SAE was trained on
        return SAEFeatureAblation(sae, chosen, mode=mode, prefix=prefix)

    return FeatureConditions(
        sae=str(sae_dir), hook=sae.hook, features=features, target=ablation(features),
        controls=[ablation(c) for c in drawn], control_features=drawn,
        pool={"n_alive": report["n_alive"], "artifacts_found": report["artifacts_found"],
              "n_high_norm_tokens": report["n_tokens"]["high_norm"], "tokens": sae.tokens})
