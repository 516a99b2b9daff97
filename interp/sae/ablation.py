"""The conditions of an ablation of SAE features against random controls (``interp study ablate --sae DIR
--features 12,40``; docs/sae.md): the target :class:`~interp.interventions.SAEFeatureAblation` and one per control
set, each set as many live features of the SAE matched to the chosen ones by firing rate and by firing on the high-norm
tokens at its hook (:func:`~interp.sae.controls.control_features`; their firing is read from the same images)."""
from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any, Dict, List, Sequence

from ..errors import InterpError
from ..interventions.sae_features import SAEFeatureAblation
from .controls import ALIGNED_COS, aligned_features, coinciding_controls, matched_controls
from .features import source_feature_report
from .model import load


@dataclass
class FeatureConditions:
    """target: the ablation of the chosen features; controls: one per control set (``control_features``: their
    feature lists); pool: what the draw was made from and how (``n_alive``, ``n_high_norm_tokens``, the
    detection's ``artifacts_found`` at the SAE's hook, ``tokens`` (the kind ablated: the SAE's), ``matched_by``,
    the high-norm firing rates of targets and controls, ``excluded_aligned`` (features left out of the pool for
    writing along the artifact direction, cosine >= ``aligned_cos``), ``coinciding_controls`` (pairs of identical sets), ``matched``
    (per set: every feature within the matching calipers), a ``note`` saying either, ``artifact_subspace_coverage``; the reconstruction's
    share of the effect: ``target_coverage`` (the share of the high-norm tokens' excess over the mean normal patch
    that the chosen features' contributions hold, what their zero ablation removes at the hook),
    ``reconstruction_coverage`` (what the SAE's whole reconstruction holds: the most any features can remove; the
    rest is its error, which the ablation keeps) and ``share_of_reconstruction`` (their ratio))."""

    sae: str
    hook: str
    features: List[int]
    target: SAEFeatureAblation
    controls: List[SAEFeatureAblation]
    control_features: List[List[int]]
    pool: Dict[str, Any]

    def with_mode(self, mode: str, seed: int = 0) -> List[SAEFeatureAblation]:
        """The target's and the controls' ablations with replacement ``mode`` (zero, mean, resample), on the same
        features: ``[target, control 0, ...]``."""
        return [replace(a, mode=mode, seed=seed) for a in [self.target] + self.controls]


def _share(report: Dict[str, Any]) -> Any:
    """The chosen features' share of what the SAE's reconstruction holds of the high-norm tokens' excess."""
    whole = (report["artifact_subspace"] or {}).get("reconstruction_coverage")
    part = report["target_coverage"]
    return None if whole is None or part is None or whole <= 0 else part / whole


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
    report = source_feature_report(sae, source, progress=progress, targets=features)
    drawn, matched = matched_controls(report, features, n_controls, seed)
    same = coinciding_controls(drawn)
    notes = []  # coinciding sets are said by the ablation study's own notes (they hold for neuron controls too)
    if not all(matched):
        notes.append(f"{matched.count(False)} control set(s) have no feature firing like the targets (on the "
                     "high-norm tokens and overall): their nearest features stand in, and such controls cannot "
                     "show that firing on the high-norm tokens is enough to remove outliers")
    rates = {f["feature"]: f["rates"].get("high_norm") for f in report["features"]}
    layout = source.layout
    prefix = {"cls_index": layout.cls_index, "n_registers": layout.n_registers}

    def ablation(chosen):  # on the token kind the SAE was trained on
        return SAEFeatureAblation(sae, chosen, mode=mode, prefix=prefix)

    return FeatureConditions(
        sae=str(sae_dir), hook=sae.hook, features=features, target=ablation(features),
        controls=[ablation(c) for c in drawn], control_features=drawn,
        pool={"n_alive": report["n_alive"], "artifacts_found": report["artifacts_found"],
              "n_high_norm_tokens": report["n_tokens"]["high_norm"], "tokens": sae.tokens,
              "silent_features": [f["feature"] for f in report["features"] if f["feature"] in features
                                  and not f["alive"]],  # never fire on these images: ablating them does nothing
              "matched_by": "firing rate and firing rate on the high-norm tokens",
              "control_high_norm_rates": [[rates[f] for f in c] for c in drawn],
              "target_high_norm_rates": [rates[f] for f in features],
              "excluded_aligned": [f for f in aligned_features(report) if f not in features],
              "aligned_cos": ALIGNED_COS,
              "coinciding_controls": same, "matched": matched, "note": "; ".join(notes) or None,
              "artifact_subspace_coverage": (report["artifact_subspace"] or {}).get("coverage"),
              "target_coverage": report["target_coverage"],
              "reconstruction_coverage": (report["artifact_subspace"] or {}).get("reconstruction_coverage"),
              "share_of_reconstruction": _share(report)})
