"""The explorer's SAE panel (``interp explore --sae DIR``): the SAE's artifact features on the session's images
(the sae-features study, with a map per image) and their ablation as an edit the page toggles.

The page sends ``{"kind": "SAEFeatureAblation", "features": [12, 40], "mode": "zero"}``; the SAE's tensors stay
on the server (a patch file carries them: ``/api/export`` writes them with the edit).
"""
from __future__ import annotations

from typing import Any, Dict, List, Optional

from ..errors import InterpError
from ..interventions import SAEFeatureAblation
from ..sae.model import load
from ..studies.sae.sae_features import sae_features_study

KIND = "SAEFeatureAblation"


def is_sae_entry(entry: Any) -> bool:
    """Whether a spec entry is a feature ablation the panel builds (the page's form: features, no tensors)."""
    return isinstance(entry, dict) and entry.get("kind") == KIND


class SaePanel:
    """The SAE of ``sae_dir`` on a session's ``source`` (held images): its sae-features result and the edits.

    Args:
        neurons: the session's listed register neurons ({layer: [neuron]}) to compare the features with, or None.
    """

    def __init__(self, sae_dir: str, source, neurons: Optional[Dict[int, List[int]]], progress: bool = False):
        self.sae = load(sae_dir, model=source.model)
        self.result = sae_features_study(source, sae=str(sae_dir), neurons=neurons or None, n_top=1,
                                         n_maps=len(source), progress=progress)

    def info(self) -> Dict[str, Any]:
        """What the page lists: the SAE, the headline and each artifact feature's rates, cosines and maps
        ([images][patches] codes)."""
        r = self.result
        return {"sae": r.sae, "hook": r.hook, "n_features": r.n_features, "n_alive": r.n_alive,
                "message": r.message,
                "features": [{"feature": f["feature"], "rates": f["rates"], "cos_mean_high_norm": f["cos_mean_high_norm"],
                              "cos_register_neurons_max": f["cos_register_neurons"].get("max"), "maps": f["maps"]}
                             for f in r.artifact_features]}

    def ablation(self, entry: Dict[str, Any]) -> SAEFeatureAblation:
        """The feature ablation of one spec entry (unknown fields refused, as the library refuses them)."""
        extra = sorted(set(entry) - {"kind", "features", "mode", "tokens"})
        if extra:
            raise InterpError(f"{KIND} takes features, mode and tokens here, not {', '.join(extra)}")
        try:
            return SAEFeatureAblation(self.sae, entry.get("features") or [], mode=entry.get("mode", "zero"),
                                      tokens=entry.get("tokens"))
        except ValueError as e:
            raise InterpError(f"{KIND}: {e}") from None
