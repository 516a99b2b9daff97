"""The sparse-autoencoder studies' declarations (docs/sae.md, docs/methods.md section 8). Torch-free: the SAE's
hook is read from ``DIR/sae.json`` as text, so ``interp study sae-features --help`` and the cache check import no
torch.

    interp study sae-features planted_vit --sae out/sae --cache out/sae-acts.h5 --out out/sae-study
    interp study sae-features planted_vit --sae out/sae --images photos/ --out out/sae-study --neurons 2:17,2:101
"""
from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import ClassVar, Dict, List, Optional, Union

from ...errors import InterpError, UsageError
from ...sae_settings import SAE_CONFIG
from ...values import NEURONS_SYNTAX, positive_int
from ...paths import check_input_path, existing_path
from ...detection.spec import DetectionSpec
from ...options import group
from ..declaration import StudyConfig, declare, option



def sae_hook(directory: Union[str, Path]) -> str:
    """The hook an SAE was trained on, from ``DIR/sae.json`` (no torch); a one-line error for a folder without
    a readable description (the weights are checked when the study loads them)."""
    path = Path(directory) / SAE_CONFIG
    check_input_path(path, "SAE description")
    try:
        hook = json.loads(path.read_text(encoding="utf-8")).get("hook")
    except (OSError, UnicodeDecodeError, ValueError, AttributeError, RecursionError) as e:
        raise InterpError(f"{str(path)!r} is not a readable SAE description ({type(e).__name__}); train one with "
                          "`interp sae train MODEL --cache FILE --hook HOOK --out DIR`") from None
    if not isinstance(hook, str):
        raise InterpError(f"{str(path)!r} names no hook; train the SAE again with `interp sae train`")
    return hook


@dataclass(frozen=True, kw_only=True)
class SaeDetection(DetectionSpec):
    """The sae-features study's detection group: a :class:`DetectionSpec` decided at the SAE's own hook, so its
    block is the SAE's (another is refused)."""

    detect_layer: Optional[int] = option(
        None, "the SAE's block (the default; the high-norm tokens are decided at the SAE's own hook, another block "
              "is refused)")


@declare
@dataclass(frozen=True, kw_only=True)
class SaeFeaturesConfig(StudyConfig):
    """SAE features on the high-norm tokens: firing rates, artifact features, their directions

    Encode every token of the SAE's hook with the SAE of --sae (interp sae train); per feature its firing rate on
    normal patch, high-norm patch, CLS and register tokens; the artifact features (docs/methods.md section 8) with
    their unit directions, cosine to the mean high-norm token and to the --neurons' fc2 write directions. The
    high-norm tokens are the detection's on the patch-token norms at the SAE's own hook."""

    name: ClassVar[str] = "sae-features"
    module: ClassVar[str] = "interp.studies.sae.sae_features"
    function: ClassVar[str] = "sae_features_study"
    result: ClassVar[str] = "SaeFeaturesResult"
    inputs: ClassVar[str] = "images_or_cache"
    cache_doc: ClassVar[str] = "the SAE's hook (`hook` of `--sae DIR/sae.json`)"

    detection: DetectionSpec = group(SaeDetection)
    sae: Optional[str] = option(None, "folder of a trained SAE (sae.json + sae.safetensors, written by "
                                      "`interp sae train`; required)", metavar="DIR", parse=existing_path)
    neurons: Union[str, Dict[int, List[int]], None] = option(
        None, f"register neurons whose fc2 write directions the artifact features are compared with: "
              f"{NEURONS_SYNTAX}; without it only the cosine to the mean high-norm token is given")
    n_top: int = option(8, "strongest patch tokens kept per artifact feature for its figure (default 8)",
                        parse=positive_int)
    n_maps: int = option(4, "images whose feature maps are drawn (default 4)", parse=positive_int)

    def check(self) -> None:
        super().check()
        if self.sae is None or not str(self.sae).strip():
            raise UsageError("interp study sae-features needs --sae DIR: a folder written by `interp sae train "
                             "MODEL --cache FILE --hook HOOK --out DIR`")
        check_input_path(Path(self.sae) / SAE_CONFIG, "--sae")  # a FIFO there: refused before it is read
        if not (Path(self.sae) / SAE_CONFIG).is_file():
            raise UsageError(f"--sae {self.sae}: no {SAE_CONFIG} there; give the --out folder of `interp sae train`")

    def hooks(self, blocks) -> List[str]:
        """The SAE's hook only: the high-norm tokens are decided on its own patch-token norms."""
        return [sae_hook(self.sae)]
