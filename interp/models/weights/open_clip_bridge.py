"""open_clip -> timm: an open_clip CLIP's image tower as the matching timm ViT, and the zero-shot classifier
matrix its text tower builds (the classifier file format of ``interp.load_classifier``).

open_clip is optional (``pip install 'interp[openclip]'``); it is imported only when a function needs it.

The weights are converted by timm itself: its ``checkpoint_filter_fn`` maps the ``visual.*`` keys of an
open_clip (OpenAI-layout) checkpoint to timm's names, and interp's loader applies it (so ``interp.load(NAME,
weights="open_clip_pytorch_model.bin")`` works on a full checkpoint). This module decides *which* timm
architecture a tower is (:func:`timm_spec`), hands it the ``visual.*`` entries (:func:`vision_tower`), and builds
the class text embeddings with open_clip's own ``build_zero_shot_classifier`` (:func:`zeroshot_classifier`)::

    clip = open_clip.create_model("ViT-B-16", pretrained="laion2b_s34b_b88k")   # or a --checkpoint file
    timm_spec(clip)          # ("vit_base_patch16_clip_224", {"num_classes": 512}); *_quickgelu_* for QuickGELU
    tower = vision_tower(clip)            # timm VisionTransformer; its head is CLIP's projection [b, 512]
    clf = zeroshot_classifier(clip, open_clip.get_tokenizer("ViT-B-16"), ["tench", "goldfish"])  # a Classifier
    clf.apply(tower(x))      # logit_scale * normalize(tower(x)) @ weight.T == open_clip's zero-shot logits [b, 2]
    save_classifier_file(clf, "zeroshot.pt")   # the file --classifier / interp.load_classifier take
"""
from __future__ import annotations

import os
import re
from pathlib import Path
from typing import Any, Dict, Optional, Sequence, Tuple, Union

import torch
from torch import nn

from ...errors import InterpError, ModelLoadError
from ...paths import check_input_path
from ..families import family_of
from ..families.traits import activation_kind

TEMPLATE_SETS = ("openai", "simple")  # open_clip's OPENAI_IMAGENET_TEMPLATES (80) / SIMPLE_IMAGENET_TEMPLATES (7)
PREFIX = "visual."  # open_clip's image tower keys
OPEN_CLIP_HEAD_WIDTH = 64  # open_clip's default width per attention head (CLIPVisionCfg.head_width)

# (width, layers) of open_clip's ViT towers -> timm's size word in vit_<size>_patch<P>_clip[_quickgelu]_<IMG>
_SIZES = {(256, 10): "xsmall", (512, 12): "medium", (640, 12): "betwixt", (768, 12): "base", (1024, 24): "large",
          (1280, 32): "huge", (1408, 40): "giant", (1664, 48): "gigantic"}

Source = Union[nn.Module, Dict[str, torch.Tensor], str, Path]


def require_open_clip():
    """The ``open_clip`` module, or a one-line error saying how to install it."""
    try:
        import open_clip
    except ImportError:
        raise InterpError("open_clip is not installed: pip install 'interp[openclip]'") from None
    return open_clip


# ----------------------------------------------------------------------------------------- the image tower
def _state_dict(source: Source) -> Dict[str, torch.Tensor]:
    from ..loading import read_state_dict

    if isinstance(source, nn.Module):
        return source.state_dict()
    sd = read_state_dict(source) if isinstance(source, (str, Path)) else dict(source)
    if not any(k.startswith(PREFIX) for k in sd) and any(k.startswith("module." + PREFIX) for k in sd):
        sd = {k[len("module."):]: v for k, v in sd.items() if k.startswith("module.")}  # saved from DDP
    return sd


def tower_state_dict(source: Source) -> Dict[str, torch.Tensor]:
    """The image tower's entries (``visual.*``, open_clip's names) of an open_clip model, state dict or checkpoint
    file: what ``interp.load(name, weights=...)`` converts to timm (timm's ``checkpoint_filter_fn``)."""
    sd = _state_dict(source)
    visual = {k: v for k, v in sd.items() if k.startswith(PREFIX)}
    if not visual:
        raise ModelLoadError("this state dict holds no open_clip image tower (no 'visual.*' keys)")
    return visual


def _tower_problem(visual: Dict[str, torch.Tensor]) -> Optional[str]:
    if any(k.startswith(PREFIX + "trunk.") for k in visual):
        return ("its image tower is a timm model inside open_clip ('visual.trunk.*'): load that timm model by "
                "name with weights=FILE (timm converts 'visual.trunk.' keys)")
    if PREFIX + "class_embedding" not in visual or PREFIX + "conv1.weight" not in visual:
        return "its image tower is not a ViT with a class token (a ModifiedResNet or another layout)"
    if any(k.startswith(PREFIX + "attn_pool") for k in visual):
        return "its image tower pools with an attentional pooler (CoCa), which timm's CLIP ViT does not have"
    if any(".ls_1." in k or ".ln_attn." in k or ".ln_inner." in k for k in visual):
        return "its blocks have layer scale or extra norms that timm's CLIP ViT does not have"
    if PREFIX + "ln_pre.weight" not in visual:
        return "its image tower has no ln_pre (no_ln_pre), which timm's CLIP ViT always has"
    if PREFIX + "proj" not in visual:
        return "its image tower has no output projection"
    return None


def tower_config(source: Source, quick_gelu: Optional[bool] = None) -> Dict[str, Any]:
    """The architecture of an open_clip ViT image tower: width, layers, heads, mlp_ratio, patch_size, image_size,
    embed_dim (the projection's output width) and quick_gelu.

    A model gives its activation and head count itself (read from its modules); a state dict does not say which
    activation it was trained with, so ``quick_gelu`` must then be given, and its head count is open_clip's
    default (width / 64) unless timm's architecture of that size says otherwise (see :func:`timm_spec`).
    """
    visual = tower_state_dict(source)
    problem = _tower_problem(visual)
    if problem:
        raise ModelLoadError(f"cannot convert this open_clip model to timm: {problem}")
    width, _, patch, _ = visual[PREFIX + "conv1.weight"].shape
    n_pos = int(visual[PREFIX + "positional_embedding"].shape[-2]) - 1
    grid = int(round(n_pos ** 0.5))
    if grid * grid != n_pos:
        raise ModelLoadError(f"cannot convert this open_clip model to timm: its {n_pos} patch positions are not "
                             "a square grid")
    blocks = {int(m.group(1)) for k in visual if (m := re.match(r"visual\.transformer\.resblocks\.(\d+)\.", k))}
    hidden = int(visual[PREFIX + "transformer.resblocks.0.mlp.c_fc.weight"].shape[0])
    cfg = dict(width=int(width), layers=len(blocks), heads=None, mlp_ratio=hidden / int(width),
               patch_size=int(patch), image_size=grid * int(patch),
               embed_dim=int(visual[PREFIX + "proj"].shape[1]), quick_gelu=quick_gelu)
    if isinstance(source, nn.Module):
        resblock = source.visual.transformer.resblocks[0]  # open_clip's, not timm's
        if type(resblock).__name__ != "ResidualAttentionBlock" or not isinstance(resblock.attn, nn.MultiheadAttention):
            raise ModelLoadError(f"cannot convert this open_clip model to timm: its blocks are "
                                 f"{type(resblock).__name__}, not the standard ResidualAttentionBlock")
        pool = getattr(source.visual, "pool_type", "tok")
        if pool != "tok":
            raise ModelLoadError(f"cannot convert this open_clip model to timm: its image tower pools with "
                                 f"{pool!r}, timm's CLIP ViT with the class token ('tok')")
        kind = activation_kind(resblock.mlp.gelu)
        if kind not in ("gelu", "quick_gelu"):
            raise ModelLoadError(f"cannot convert this open_clip model to timm: its MLP activation is {kind}, "
                                 "timm's CLIP ViTs use GELU or QuickGELU")
        if quick_gelu is not None and quick_gelu != (kind == "quick_gelu"):
            raise InterpError(f"quick_gelu={quick_gelu} disagrees with the model, whose MLP activation is {kind}")
        cfg.update(heads=int(resblock.attn.num_heads), quick_gelu=kind == "quick_gelu")
    elif quick_gelu is None:
        raise InterpError("an open_clip state dict does not say which MLP activation it was trained with: pass "
                          "quick_gelu=True (OpenAI CLIP, *-quickgelu configs) or quick_gelu=False (open_clip GELU)")
    return cfg


def timm_spec(source: Source, quick_gelu: Optional[bool] = None) -> Tuple[str, Dict[str, Any]]:
    """``(timm name, timm kwargs)`` of the timm ViT that holds this open_clip image tower, so that
    ``interp.load(name, weights=CHECKPOINT, **kwargs)`` builds it.

    Standard sizes get timm's own CLIP name (``vit_base_patch16_clip_224``; ``vit_base_patch16_clip_quickgelu_224``
    when the tower uses QuickGELU) and ``num_classes`` = the projection width (timm's head is CLIP's ``proj``);
    other sizes get the same family with the architecture in the kwargs. ``quick_gelu``: see :func:`tower_config`.
    """
    import timm
    from timm.models import is_model

    cfg = tower_config(source, quick_gelu)
    act = "_quickgelu" if cfg["quick_gelu"] else ""
    size = _SIZES.get((cfg["width"], cfg["layers"]))
    name = f"vit_{size}_patch{cfg['patch_size']}_clip{act}_{cfg['image_size']}" if size else None
    if name and is_model(name):
        with torch.device("meta"):  # timm's defaults of that name (no memory), to pass only what differs
            ref = timm.create_model(name, pretrained=False, num_classes=cfg["embed_dim"])
        family = family_of(ref)
        ref_cfg = dict(heads=family.n_heads(0), mlp_ratio=family.d_mlp(0) / cfg["width"])
        kwargs: Dict[str, Any] = {"num_classes": cfg["embed_dim"]}
        if cfg["heads"] is not None and cfg["heads"] != ref_cfg["heads"]:
            kwargs["num_heads"] = cfg["heads"]
        if abs(cfg["mlp_ratio"] - ref_cfg["mlp_ratio"]) > 1e-9:
            kwargs["mlp_ratio"] = cfg["mlp_ratio"]
        return name, kwargs
    heads = cfg["heads"] or max(1, cfg["width"] // OPEN_CLIP_HEAD_WIDTH)
    return f"vit_base_patch16_clip{act}_224", dict(
        embed_dim=cfg["width"], depth=cfg["layers"], num_heads=heads, mlp_ratio=cfg["mlp_ratio"],
        patch_size=cfg["patch_size"], img_size=cfg["image_size"], num_classes=cfg["embed_dim"])


def vision_tower(source: Source, quick_gelu: Optional[bool] = None, device: Union[str, torch.device] = "cpu",
                 dtype=None) -> nn.Module:
    """The open_clip image tower as the timm ViT of :func:`timm_spec`, in eval mode, its weights loaded through
    interp's loader (timm's conversion, strict key check, finite check). ``vision_tower(clip)(x)`` equals
    ``clip.encode_image(x)`` [b, embed_dim]; wrap it with ``HookedViT.from_timm(tower, name=timm_spec(clip)[0])``.
    """
    from timm.models import model_entrypoint

    from ..loading import check_finite, create_timm_vit, load_weights_file

    name, kwargs = timm_spec(source, quick_gelu)
    model = create_timm_vit(name, pretrained=False, **kwargs)
    load_weights_file(model, tower_state_dict(source), model_entrypoint(name).__module__,
                      label="open_clip image tower")
    check_finite(model, "the open_clip image tower")
    model.interp_init_seed = None  # the weights are the open_clip model's, not a random draw
    return model.to(device=device, dtype=dtype)


# ----------------------------------------------------------------------------------------- open_clip models
def load_open_clip(name: str, pretrained: Optional[str] = None, checkpoint: Union[str, Path, None] = None,
                   device: Union[str, torch.device] = "cpu") -> Tuple[nn.Module, Any, str]:
    """``(model, tokenizer, description)`` of open_clip model ``name`` (``ViT-B-16``, ``ViT-B-16-quickgelu``...) in
    eval mode, with the weights of a pretrained ``tag`` (downloaded, or open_clip's local cache when offline) or a
    local ``checkpoint`` file (open_clip's ``load_checkpoint``: strict). Exactly one of them."""
    from ...errors import close_matches
    from ..loading import _hub_reachable

    open_clip = require_open_clip()
    if (pretrained is None) == (checkpoint is None):
        raise InterpError("give the open_clip weights: a pretrained tag or a checkpoint file (exactly one; a "
                          "classifier built from random weights means nothing)")
    if name not in open_clip.list_models():
        hints = close_matches(name, open_clip.list_models(), n=5)
        raise ModelLoadError(f"unknown open_clip model {name!r}" + (f"; did you mean: {', '.join(hints)}?" if hints
                             else "; see open_clip.list_models()"))
    if pretrained is not None:
        tags = open_clip.list_pretrained_tags_by_model(name)
        if pretrained not in tags:
            raise ModelLoadError(f"open_clip has no pretrained tag {pretrained!r} for {name}; its tags: "
                                 f"{', '.join(tags) or 'none'}")
        if _hub_reachable():
            target, why = pretrained, None
        else:  # no network: open_clip would retry its downloads for a minute; look in the caches at once
            target = _cached_open_clip_file(open_clip, name, pretrained)
            why = None if target else "there is no network and the weights are not in the local cache"
        try:
            model = None if why else open_clip.create_model(name, pretrained=target, device=device)
        except Exception as e:
            why = f"{type(e).__name__}: {str(e).splitlines()[0] if str(e).strip() else 'no detail'}"
        if why:
            raise ModelLoadError(f"cannot load open_clip {name} {pretrained}: {why}; download the checkpoint "
                                 "where there is a network and pass --checkpoint FILE (open_clip_pytorch_model.bin "
                                 "or .safetensors)")
        described = f"open_clip {name} {pretrained}"
    else:
        path = Path(checkpoint)
        check_input_path(path, "checkpoint")
        if not path.is_file():
            raise ModelLoadError(f"checkpoint {str(path)!r} does not exist")
        try:  # a file as ``pretrained``: open_clip's strict load_checkpoint, with its format conversions
            model = open_clip.create_model(name, pretrained=str(path), device=device)
        except Exception as e:
            first = next((line.strip() for line in str(e).splitlines()[1:] + str(e).splitlines()[:1]
                          if line.strip()), type(e).__name__)
            raise ModelLoadError(f"checkpoint {str(path)!r} does not fit open_clip {name}: {first}") from None
        described = f"open_clip {name} {path.name}"
    try:
        tokenizer = open_clip.get_tokenizer(name)
    except Exception as e:
        raise ModelLoadError(f"cannot build the tokenizer of open_clip {name}: {type(e).__name__}: {e}") from None
    return model.eval(), tokenizer, described


def _cached_open_clip_file(open_clip, name: str, tag: str) -> Optional[str]:
    """The local file open_clip would download for ``name``/``tag`` when it is already cached (the Hugging Face
    cache, or open_clip's ``~/.cache/clip`` for URL weights), else None. Never touches the network."""
    cfg = open_clip.get_pretrained_cfg(name, tag) or {}
    if cfg.get("file"):
        return cfg["file"] if os.path.isfile(cfg["file"]) else None
    hub = cfg.get("hf_hub", "")
    if hub:
        try:
            from huggingface_hub import try_to_load_from_cache
        except ImportError:
            return None
        repo, filename = os.path.split(hub)  # "org/model/file" or "org/model/" (open_clip's default file name)
        if filename and filename != "open_clip_pytorch_model.bin":
            names = ([filename[:-4] + ".safetensors"] if filename.endswith((".bin", ".pth")) else []) + [filename]
        else:
            names = ["open_clip_model.safetensors", "open_clip_pytorch_model.bin"]
        for candidate in names:
            found = try_to_load_from_cache(repo, candidate)
            if isinstance(found, str):
                return found
        return None
    url = cfg.get("url", "")
    local = os.path.join(os.path.expanduser("~/.cache/clip"), os.path.basename(url)) if url else ""
    return local if local and os.path.isfile(local) else None


# ----------------------------------------------------------------------------------------- the text tower
def prompt_templates(templates: Union[str, Sequence] = "openai") -> tuple:
    """open_clip's ImageNet prompt templates: ``"openai"`` (the 80 of OpenAI's CLIP notebook, what open_clip's
    zero-shot evaluation uses), ``"simple"`` (its 7-prompt subset), or a sequence of your own (``"a photo of a
    {}."`` strings or callables)."""
    if isinstance(templates, str):
        if templates not in TEMPLATE_SETS:
            raise InterpError(f"unknown template set {templates!r}; choose one of {', '.join(TEMPLATE_SETS)}")
        open_clip = require_open_clip()
        return tuple(open_clip.OPENAI_IMAGENET_TEMPLATES if templates == "openai"
                     else open_clip.SIMPLE_IMAGENET_TEMPLATES)
    templates = tuple(templates)
    if not templates:
        raise InterpError("no prompt templates given")
    return templates


def zeroshot_weights(clip: nn.Module, tokenizer, class_names: Sequence[str],
                     templates: Union[str, Sequence] = "openai", device: Union[str, torch.device] = "cpu",
                     classes_per_batch: int = 10, progress: bool = False) -> torch.Tensor:
    """Class text embeddings [C, D] float32: for each class, every template's prompt encoded by ``clip``'s text
    tower and L2-normalised, the mean over templates L2-normalised again (open_clip's
    ``build_zero_shot_classifier``, which this calls; it returns [D, C])."""
    open_clip = require_open_clip()
    names = list(class_names)
    if not names:
        raise InterpError("no class names given")
    w = open_clip.build_zero_shot_classifier(clip, tokenizer, names, prompt_templates(templates),
                                             num_classes_per_batch=classes_per_batch, device=device,
                                             use_tqdm=progress)
    return w.T.float().cpu().contiguous()


def zeroshot_classifier(clip: nn.Module, tokenizer, class_names: Sequence[str],
                        templates: Union[str, Sequence] = "openai", *, model: Optional[str] = None,
                        source: Optional[str] = None, device: Union[str, torch.device] = "cpu",
                        classes_per_batch: int = 10, progress: bool = False):
    """A zero-shot :class:`~interp.models.classifiers.classifier.Classifier` (kind "zeroshot"): ``weight`` [C, D] the class
    embeddings of :func:`zeroshot_weights` (rows L2-normalised), ``logit_scale`` = ``clip.logit_scale.exp()`` (the
    multiplier itself), ``class_names``, ``model`` (the timm name of the image tower, default :func:`timm_spec`'s)
    and ``source`` (free text). Its logits are ``logit_scale * normalize(image_embedding) @ weight.T`` with the
    image embedding = the timm tower's head output; write it with :func:`save_classifier_file`.
    """
    from ..classifiers.classifier import FORMAT_VERSION, load_classifier

    if getattr(clip, "logit_bias", None) is not None:
        raise InterpError("this open_clip model has a logit bias (SigLIP: sigmoid logits); a zero-shot "
                          "classifier file holds softmax-CLIP logits only (scale * cosine)")
    if not hasattr(clip, "logit_scale") or not hasattr(clip, "encode_text"):
        raise InterpError(f"{type(clip).__name__} is not an open_clip CLIP model (no logit_scale/encode_text)")
    names = [str(n) for n in class_names]
    if len(set(names)) != len(names):
        raise InterpError("class names must be distinct")
    chosen = prompt_templates(templates)
    weight = zeroshot_weights(clip, tokenizer, names, chosen, device, classes_per_batch, progress)
    n_templates = f"{len(chosen)} templates" + (f" ({templates})" if isinstance(templates, str) else "")
    return load_classifier({
        "interp_classifier": FORMAT_VERSION, "kind": "zeroshot", "weight": weight,
        "logit_scale": float(clip.logit_scale.detach().float().exp()), "class_names": names,
        "model": model if model is not None else timm_spec(clip)[0],
        "source": f"{source or 'open_clip ' + type(clip).__name__}, {n_templates}"})


def save_classifier_file(classifier, path: Union[str, Path]) -> Path:
    """Write a classifier (a :class:`~interp.models.classifiers.classifier.Classifier` or a file's dict, checked by
    ``load_classifier``) with its own ``save`` (a temporary file renamed into place: a crash leaves either no
    file or the whole one). Returns the path."""
    from ..classifiers.classifier import load_classifier

    return load_classifier(classifier).save(Path(path))  # Classifier.save writes a temporary file renamed into place
