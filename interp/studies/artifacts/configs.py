"""The artifact studies' declarations (docs/methods.md sections 1-2): their options, the hooks they read from a
cache, and what the command line says of them. Torch-free: ``interp study NAME --help`` reads them at once.

norms, neurons and redundancy read a live model (``--images``) or a cache (``--cache``); ablate, relocate and
registers re-run the model with an edit, so they take ``--images`` and the neurons to edit (``--neurons``).

    interp study neurons vit_small_patch14_dinov2 --images photos/ --out runs/dino --top-k 50
    interp study ablate vit_small_patch14_dinov2 --images photos/ --out runs/dino --neurons runs/dino/neurons.json
    interp study relocate planted_vit --images photos/ --out runs/p --neurons 2:17,2:101 --target box:2,2,3,3
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, ClassVar, Dict, List, Optional, Tuple, Union

from ...hooks.names import EMBED, PATCH_EMBED, RESID_STAGES, BlockNames
from ...errors import InterpError, UsageError
from ...values import (NEURONS_SYNTAX, control_count, existing_path, positive_int, register_count,
                       sae_feature_ids)
from ..core.options import DetectionOptions, NeuronsOptions
from ...detection.presets import resolve_preset
from ..declaration import declare, option
from ...hooks.names import resolve_block


@declare
@dataclass(frozen=True, kw_only=True)
class NormsConfig(DetectionOptions):
    """high-norm tokens: per-block norms, outliers, emergence layer

    Per-block patch-token norms of the un-normalised residual stream, outlier maps at the detection block, the
    emergence layer and CLS attention."""

    name: ClassVar[str] = "norms"
    module: ClassVar[str] = "interp.studies.artifacts.norms"
    function: ClassVar[str] = "norms_study"
    result: ClassVar[str] = "NormsResult"
    inputs: ClassVar[str] = "images_or_cache"
    full_vectors: ClassVar[bool] = False
    cache_doc: ClassVar[str] = ("`blocks.{0..N-1}.hook_resid_mid`, `blocks.{0..N-1}.hook_resid_post` "
                                "(a `--norms-only` cache is enough)")

    emergence_factor: float = 2.0
    attention: bool = True

    def hooks(self, blocks: BlockNames) -> List[str]:
        """Per-block residual stream after attention and after the MLP (attention maps are optional extras)."""
        return [blocks.resid_stage(i, stage) for i in range(len(blocks)) for stage in RESID_STAGES]


@declare
@dataclass(frozen=True, kw_only=True)
class NeuronsConfig(DetectionOptions):
    """rank register neurons (MLP neurons firing on high-norm tokens)

    Score every MLP neuron of blocks <= --highest-layer by its mean |activation| on the outlier patches and keep
    the --top-k best."""

    name: ClassVar[str] = "neurons"
    module: ClassVar[str] = "interp.studies.artifacts.neurons"
    function: ClassVar[str] = "neurons_study"
    result: ClassVar[str] = "NeuronsResult"
    inputs: ClassVar[str] = "images_or_cache"
    cache_doc: ClassVar[str] = "`blocks.{D}.hook_resid_post`, `blocks.{0..H}.mlp.hook_post`"

    highest_layer: Optional[int] = option(None, "last block scored (default: the detection block)")
    top_k: Optional[int] = option(None, "neurons kept (default 10, or the preset's)", parse=positive_int)
    sparsity_filter: Optional[bool] = option(
        None, "the reference's filter: per image, a neuron scores 0 unless its activation is below 0.5 on at least "
              "half of the image's tokens (same as --sparsity per_image)")
    sparsity: Optional[str] = option(
        None, "sparsity filter: per_image (reference), pooled (over all images at once) or none",
        choices=("per_image", "pooled", "none"))
    positions: Optional[str] = option(
        None, "outlier positions: all tokens above the threshold (default, reference) or patches only",
        choices=("all", "patches"))
    max_images: Optional[int] = option(None, "score on a seeded random subset of this many images",
                                       parse=positive_int)

    def hooks(self, blocks: BlockNames) -> List[str]:
        """The detection block's output plus the MLP activations of every block up to ``highest_layer``."""
        n_layers = len(blocks)
        detect = self.detect_block(n_layers)
        highest = resolve_preset(self.preset, highest_layer=self.highest_layer).get("highest_layer")
        highest = detect if highest is None else resolve_block(min(int(highest), n_layers - 1), n_layers, detect)
        return [blocks.resid_post(detect)] + [blocks.mlp_post(i) for i in range(highest + 1)]


@declare
@dataclass(frozen=True, kw_only=True)
class RedundancyConfig(DetectionOptions):
    """cosine of each input patch embedding to its 4 neighbours, normal vs high-norm tokens

    Cosine similarity of each patch token's input patch embedding to its 4 grid neighbours, normal vs high-norm
    tokens (Darcet et al., Fig. 5a)."""

    name: ClassVar[str] = "redundancy"
    module: ClassVar[str] = "interp.studies.artifacts.redundancy"
    function: ClassVar[str] = "redundancy_study"
    result: ClassVar[str] = "RedundancyResult"
    inputs: ClassVar[str] = "images_or_cache"
    cache_doc: ClassVar[str] = ("`hook_patch_embed` (`hook_embed` with `--embedding position`), "
                                "`blocks.{D}.hook_resid_post`")

    bins: int = 40  # histogram bins over [-1, 1]
    min_tokens: int = 16  # fewer tokens in a group: no statistic, a note instead
    embedding: str = option("patch", "patch: the patch-embedding output before the position embedding "
                                     "(hook_patch_embed; default, the paper's); position: after it (hook_embed)",
                            choices=("patch", "position"))

    def hooks(self, blocks: BlockNames) -> List[str]:
        """The input patch embedding (``hook_embed`` for ``embedding="position"``) and the detection block's
        output."""
        embed = EMBED if self.embedding == "position" else PATCH_EMBED
        return [embed, blocks.resid_post(self.detect_block(len(blocks)))]


@declare
@dataclass(frozen=True, kw_only=True)
class AblateConfig(NeuronsOptions, DetectionOptions):
    """ablate register neurons vs random same-size controls

    Zero (or mean-ablate) --neurons and --controls random neuron sets from the same blocks; compare outliers, max
    norm and top-1 with the unablated model. With --sae DIR --features F,... instead: remove those SAE features
    (SAEFeatureAblation, on the token kind the SAE was trained on) against random sets of as many features
    matched to them by firing rate and by firing on the high-norm tokens."""

    name: ClassVar[str] = "ablate"
    module: ClassVar[str] = "interp.studies.artifacts.ablate"
    function: ClassVar[str] = "ablate_study"
    result: ClassVar[str] = "AblateResult"

    neurons: Union[str, Dict[int, List[int]], None] = option(
        None, f"the register neurons to ablate (required unless --sae DIR --features F,...): {NEURONS_SYNTAX}")
    controls: int = option(5, "random control neuron sets of the same size and blocks (default 5)",
                           parse=control_count)
    mode: str = option("zero", "zero: set the neurons to 0 (default); mean: to their mean activation over the "
                               "images", choices=("zero", "mean"))
    sae: Optional[str] = option(None, "ablate features of this trained SAE (interp sae train) instead of neurons "
                                      "(with --features; an alternative to --neurons); mean: the feature's mean "
                                      "code", metavar="DIR", parse=existing_path)
    features: Optional[Tuple[int, ...]] = option(
        None, "the SAE features to ablate with --sae: ids (12,40) or the sae_features.json of interp study "
              "sae-features (its artifact subspace)", parse=sae_feature_ids, metavar="F,...|FILE.json")

    def check(self) -> None:
        super().check()
        if self.sae is not None and self.neurons is not None:
            raise UsageError("--neurons and --sae are alternatives: ablate register neurons or SAE features, not both")
        if (self.sae is None) != (self.features is None):
            raise UsageError("--sae DIR and --features F,... go together: the SAE and the features of it to ablate")

    def required_neurons(self) -> Any:
        """``neurons`` as given; None when SAE features are ablated (``--sae``); an error naming both when
        neither is given."""
        if self.sae is not None:
            return None
        if self.neurons is None or (isinstance(self.neurons, str) and not self.neurons.strip()):
            raise InterpError(f"interp study ablate needs --neurons: {NEURONS_SYNTAX}; find them with `interp study "
                              "neurons MODEL --images DIR --out DIR` and pass DIR/neurons.json (or ablate SAE "
                              "features: --sae DIR --features F,...)")
        return self.neurons


@declare
@dataclass(frozen=True, kw_only=True)
class RelocateConfig(NeuronsOptions, DetectionOptions):
    """move the high-norm tokens onto a chosen mask

    Write the register neurons' maximum on the --target patches and zero them elsewhere; measure the IoU of the
    new outliers with the target."""

    name: ClassVar[str] = "relocate"
    module: ClassVar[str] = "interp.studies.artifacts.relocate"
    function: ClassVar[str] = "relocate_study"
    result: ClassVar[str] = "RelocateResult"

    target: object = option("smiley", "smiley (default), box:TOP,LEFT,HEIGHT,WIDTH or indices:I,J,... (flat patch "
                                      "indices)")
    value: str = option("neuron_max", "value written on the target (default neuron_max)",
                        choices=("neuron_max", "layer_max"))


@declare
@dataclass(frozen=True, kw_only=True)
class RegistersConfig(NeuronsOptions, DetectionOptions):
    """test-time register: move the high norm into an extra token

    Append test-time register token(s) fed by the register neurons; compare patch outliers and norms with and
    without."""

    name: ClassVar[str] = "registers"
    module: ClassVar[str] = "interp.studies.artifacts.registers"
    function: ClassVar[str] = "registers_study"
    result: ClassVar[str] = "RegistersResult"

    n_registers: int = option(1, "test-time register tokens (default 1)", parse=register_count)
    value: str = option("layer_max", "value written into the register (default layer_max, as the reference code)",
                        choices=("layer_max", "neuron_max"))
