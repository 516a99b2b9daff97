"""The artifact studies' declarations (docs/methods.md sections 1-2): their options, the hooks they read from a
cache, and what the command line says of them. Torch-free: ``interp study NAME --help`` reads them at once.

norms, neurons and redundancy read a live model (``--images``) or a cache (``--cache``); ablate, relocate and
registers re-run the model with an edit, so they take ``--images`` and the neurons to edit (``--neurons``).

    interp study neurons vit_small_patch14_dinov2 --images photos/ --out runs/dino --top-k 50
    interp study ablate vit_small_patch14_dinov2 --images photos/ --out runs/dino --neurons runs/dino/neurons.json
    interp study relocate planted_vit --images photos/ --out runs/p --neurons 2:17,2:101 --target box:2,2,3,3
"""
from __future__ import annotations

from argparse import ArgumentTypeError
from dataclasses import dataclass
from typing import Any, ClassVar, Dict, List, Optional, Tuple, Union

from ...hooks.names import EMBED, PATCH_EMBED, RESID_STAGES, BlockNames
from ...errors import InterpError, UsageError
from ...values import (NEURONS_SYNTAX, control_count, nonnegative_int, positive_float, positive_int, register_count,
                       sae_feature_ids)
from ...paths import existing_path
from ..core.options import classifier_option, force_option, neurons_option, required_neurons
from ...detection.presets import resolve_preset
from ...detection.spec import DetectionSpec
from ..declaration import StudyConfig, declare, option
from ...options import group
from ...hooks.names import resolve_block


REPLACE_MODES = ("zero", "mean", "noise", "shuffle")  # interp study replace
ABLATION_REPLACEMENTS = ("zero", "mean", "resample")  # interp study ablate


def mode_list(choices: Tuple[str, ...]):
    """The parser of a comma-separated list of distinct values of ``choices`` (``--modes``, ``--replacements``)."""
    def parse(text) -> Tuple[str, ...]:
        modes = tuple(m.strip() for m in (text.split(",") if isinstance(text, str) else text) if m.strip())
        if not modes or any(m not in choices for m in modes) or len(set(modes)) != len(modes):
            raise ArgumentTypeError(f"expected distinct values of {', '.join(choices)}, got {text!r}")
        return modes

    return parse


@declare
@dataclass(frozen=True, kw_only=True)
class NormsConfig(StudyConfig):
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

    detection: DetectionSpec = group(DetectionSpec)
    emergence_factor: float = 2.0
    attention: bool = True

    def hooks(self, blocks: BlockNames) -> List[str]:
        """Per-block residual stream after attention and after the MLP (attention maps are optional extras)."""
        return [blocks.resid_stage(i, stage) for i in range(len(blocks)) for stage in RESID_STAGES]


@declare
@dataclass(frozen=True, kw_only=True)
class NeuronsConfig(StudyConfig):
    """rank register neurons (MLP neurons firing on high-norm tokens)

    Score every MLP neuron of blocks <= --highest-layer by its mean |activation| on the outlier patches and keep
    the --top-k best."""

    name: ClassVar[str] = "neurons"
    module: ClassVar[str] = "interp.studies.artifacts.neurons"
    function: ClassVar[str] = "neurons_study"
    result: ClassVar[str] = "NeuronsResult"
    inputs: ClassVar[str] = "images_or_cache"
    cache_doc: ClassVar[str] = "`blocks.{D}.hook_resid_post`, `blocks.{0..H}.mlp.hook_post`"

    detection: DetectionSpec = group(DetectionSpec)
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
        detect = self.detection.detect_block(n_layers)
        highest = resolve_preset(self.detection.preset, highest_layer=self.highest_layer).get("highest_layer")
        highest = detect if highest is None else resolve_block(min(int(highest), n_layers - 1), n_layers, detect)
        return [blocks.resid_post(detect)] + [blocks.mlp_post(i) for i in range(highest + 1)]


@declare
@dataclass(frozen=True, kw_only=True)
class RedundancyConfig(StudyConfig):
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

    detection: DetectionSpec = group(DetectionSpec)
    bins: int = 40  # histogram bins over [-1, 1]
    min_tokens: int = 16  # fewer tokens in a group: no statistic, a note instead
    embedding: str = option("patch", "patch: the patch-embedding output before the position embedding "
                                     "(hook_patch_embed; default, the paper's); position: after it (hook_embed)",
                            choices=("patch", "position"))

    def hooks(self, blocks: BlockNames) -> List[str]:
        """The input patch embedding (``hook_embed`` for ``embedding="position"``) and the detection block's
        output."""
        embed = EMBED if self.embedding == "position" else PATCH_EMBED
        return [embed, blocks.resid_post(self.detection.detect_block(len(blocks)))]


@declare
@dataclass(frozen=True, kw_only=True)
class AblateConfig(StudyConfig):
    """ablate register neurons vs random same-size controls

    Zero (or mean-ablate) --neurons and --controls random neuron sets from the same blocks; compare outliers, max
    norm and top-1 with the unablated model. With --sae DIR --features F,... instead: remove those SAE features
    (SAEFeatureAblation, on the token kind the SAE was trained on) against random sets of as many features
    matched to them by firing rate and by firing on the high-norm tokens."""

    name: ClassVar[str] = "ablate"
    module: ClassVar[str] = "interp.studies.artifacts.ablate"
    function: ClassVar[str] = "ablate_study"
    result: ClassVar[str] = "AblateResult"

    detection: DetectionSpec = group(DetectionSpec)
    classifier: Optional[str] = classifier_option()
    neurons: Union[str, Dict[int, List[int]], None] = option(
        None, f"the register neurons to ablate (required unless --sae DIR --features F,...): {NEURONS_SYNTAX}")
    force: bool = force_option()
    controls: int = option(5, "random control neuron sets of the same size and blocks (default 5)",
                           parse=control_count)
    mode: str = option("zero", "the replacement the headline rests on: zero (default), mean (each neuron's mean over "
                               "the images; an SAE feature's mean code) or resample (another image's values)",
                       choices=ABLATION_REPLACEMENTS)
    replacements: Tuple[str, ...] = option(
        ABLATION_REPLACEMENTS, "the ablation also runs with these replacements, each against its own random controls "
                               "(default zero,mean,resample; SAE features: mean is the feature's mean code)",
        parse=mode_list(ABLATION_REPLACEMENTS), metavar="R,...")
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

    def check_inputs(self, images: Optional[Any], cache: Optional[str]) -> None:
        self.required_neurons()

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
class RelocateConfig(StudyConfig):
    """move the high-norm tokens onto a chosen mask

    Write the register neurons' maximum on the --target patches and zero them elsewhere; measure the IoU of the
    new outliers with the target."""

    name: ClassVar[str] = "relocate"
    module: ClassVar[str] = "interp.studies.artifacts.relocate"
    function: ClassVar[str] = "relocate_study"
    result: ClassVar[str] = "RelocateResult"

    detection: DetectionSpec = group(DetectionSpec)
    classifier: Optional[str] = classifier_option()
    neurons: Union[str, Dict[int, List[int]], None] = neurons_option()
    force: bool = force_option()
    target: object = option("smiley", "smiley (default), box:TOP,LEFT,HEIGHT,WIDTH or indices:I,J,... (flat patch "
                                      "indices)")
    value: str = option("neuron_max", "value written on the target (default neuron_max)",
                        choices=("neuron_max", "layer_max"))

    def check_inputs(self, images: Optional[Any], cache: Optional[str]) -> None:
        required_neurons(self.name, self.neurons)


@declare
@dataclass(frozen=True, kw_only=True)
class RegistersConfig(StudyConfig):
    """test-time register: move the high norm into an extra token

    Append test-time register token(s) fed by the register neurons; compare patch outliers and norms with and
    without."""

    name: ClassVar[str] = "registers"
    module: ClassVar[str] = "interp.studies.artifacts.registers"
    function: ClassVar[str] = "registers_study"
    result: ClassVar[str] = "RegistersResult"

    detection: DetectionSpec = group(DetectionSpec)
    classifier: Optional[str] = classifier_option()
    neurons: Union[str, Dict[int, List[int]], None] = neurons_option()
    force: bool = force_option()
    n_registers: int = option(1, "test-time register tokens (default 1)", parse=register_count)
    value: str = option("layer_max", "value written into the register (default layer_max, as the reference code)",
                        choices=("layer_max", "neuron_max"))

    def check_inputs(self, images: Optional[Any], cache: Optional[str]) -> None:
        required_neurons(self.name, self.neurons)


@declare
@dataclass(frozen=True, kw_only=True)
class MassiveConfig(StudyConfig):
    """massive activations: the largest |activation| per block against the median, which channels and tokens

    Per block, the top-1/2/3 |activation| of the residual stream over tokens x channels against the median |activation|
    (Sun et al. 2024), the channels and token kinds that carry the largest one, the attention logits those
    tokens receive in the next block, and the same after the final norm (which divides each token by its own scale
    and so hides them)."""

    name: ClassVar[str] = "massive"
    module: ClassVar[str] = "interp.studies.artifacts.massive"
    function: ClassVar[str] = "massive_study"
    result: ClassVar[str] = "MassiveResult"
    inputs: ClassVar[str] = "images_or_cache"
    cache_doc: ClassVar[str] = ("`blocks.{0..N-1}.hook_resid_post` (full vectors; `blocks.{1..N-1}.attn.hook_attn_scores` "
                                "and `hook_norm_final` when cached)")

    min_value: float = option(100.0, "an activation is massive above this magnitude (Sun et al.: 100)",
                              parse=positive_float)
    min_ratio: float = option(1000.0, "... and at least this many times the block's median |activation| (Sun et "
                                      "al.: about 1,000)", parse=positive_float)
    attention: bool = True  # the attention logits the largest activation's token receives in the next block

    def hooks(self, blocks: BlockNames) -> List[str]:
        """Every block's output (full vectors)."""
        return [blocks.resid_post(i) for i in range(len(blocks))]


@declare
@dataclass(frozen=True, kw_only=True)
class ReplaceConfig(StudyConfig):
    """token replacement: is a token's content needed, or only its presence? zero vs mean, noise, shuffle

    Replace a token set (--target: registers, cls, register:I, patches:I,J or random:K) at every block's output by
    zero, its calibration mean, matched Gaussian noise and another image's tokens (Parodi et al. 2026), against K
    random patches zeroed as a control; per condition the behaviour, the CLS->patch attention's Jensen-Shannon
    divergence to the intact model, the patch features' effective rank and the outliers left; for a token set of
    several tokens, the sum of each token zeroed alone beside all zeroed together."""

    name: ClassVar[str] = "replace"
    module: ClassVar[str] = "interp.studies.artifacts.replace"
    function: ClassVar[str] = "replace_study"
    result: ClassVar[str] = "ReplaceResult"

    detection: DetectionSpec = group(DetectionSpec)
    classifier: Optional[str] = classifier_option()
    target: str = option("auto", "the tokens replaced: registers, cls, register:I, patches:I,J,... or random:K "
                                 "(default auto: the registers, else CLS)")
    modes: Tuple[str, ...] = option(REPLACE_MODES, "replacements, comma-separated (default zero,mean,noise,shuffle)",
                                    parse=mode_list(REPLACE_MODES), metavar="M,...")
    singles: bool = option(True, "also zero each token of the set alone (the sum of single effects against the "
                                 "collective one)")
