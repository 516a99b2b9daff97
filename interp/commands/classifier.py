"""``interp classifier zeroshot``: build a zero-shot classifier file from an open_clip model's text tower (the
file ``--classifier`` takes), for the timm image tower of the same model.

Arguments are checked before torch or open_clip is imported: the classes file (one name a line; blank lines and
``#`` comments skipped; duplicates refused), the checkpoint, the output file.
"""
from __future__ import annotations

import argparse
from dataclasses import dataclass
from pathlib import Path
from typing import List, Optional, Tuple

from ..options import Options, group, option
from ..values import positive_int
from ..paths import existing_file
from .groups import DeviceOption, OutputOptions
from .inputs import RunInputs, command
from .saving import refuse_existing_file

MAX_CLASS_NAME = 200  # characters; a longer "name" is a wrong file (a list on one line, a binary file)


def class_names_file(text: str) -> List[str]:
    """argparse type of ``--classes``: the class names of a UTF-8 text file, one a line, in file order (blank lines
    and lines starting with ``#`` skipped). Refused: no names, a duplicate (both line numbers), a name over
    ``MAX_CLASS_NAME`` characters, a file that is not UTF-8 text."""
    existing_file(text)
    try:
        raw = Path(text).read_bytes()
    except OSError as e:
        raise argparse.ArgumentTypeError(f"cannot read {text!r}: {e.strerror}") from None
    try:
        lines = raw.decode("utf-8-sig").splitlines()
    except UnicodeDecodeError:
        raise argparse.ArgumentTypeError(f"{text!r} is not UTF-8 text; give one class name per line") from None
    seen, names = {}, []
    for number, line in enumerate(lines, 1):
        name = line.strip()
        if not name or name.startswith("#"):
            continue
        if "\0" in name or len(name) > MAX_CLASS_NAME:
            raise argparse.ArgumentTypeError(f"{text!r} line {number} is not a class name (binary or over "
                                             f"{MAX_CLASS_NAME} characters); give one class name per line")
        if name in seen:
            raise argparse.ArgumentTypeError(f"{text!r} names {name!r} twice (lines {seen[name]} and {number}); "
                                             "each class once")
        seen[name] = number
        names.append(name)
    if not names:
        raise argparse.ArgumentTypeError(f"{text!r} holds no class names (one per line; # starts a comment)")
    return names


@dataclass(frozen=True, kw_only=True)
class ZeroshotOptions(Options):
    """The options of ``interp classifier zeroshot``."""

    REQUIRED_GROUPS = ("weights", "classes")

    open_clip: str = option(None, "open_clip model name, e.g. ViT-B-16 (ViT-B-16-quickgelu: QuickGELU, as Jiang et "
                                  "al. run it)", required=True, metavar="NAME")
    pretrained: Optional[str] = option(None, "open_clip pretrained tag, e.g. laion2b_s34b_b88k (downloaded, or "
                                             "open_clip's cache)", metavar="TAG", exclusive="weights")
    checkpoint: Optional[str] = option(None, "local open_clip checkpoint (open_clip_pytorch_model.bin, "
                                             ".safetensors, .pt)", metavar="FILE", parse=existing_file,
                                       exclusive="weights")
    classes: Optional[Tuple[str, ...]] = option(None, "text file, one class name per line (blank lines and # "
                                                      "comments skipped)", metavar="FILE", parse=class_names_file,
                                                exclusive="classes")
    imagenet_classes: bool = option(False, "open_clip's 1000 ImageNet class names (those of its zero-shot "
                                           "evaluation)", exclusive="classes")
    templates: str = option("openai", "prompt templates: openai = open_clip's 80 ImageNet templates (default), "
                                      "simple = its 7", choices=("openai", "simple"))
    out: str = option(None, "classifier file to write (.pt)", required=True, metavar="FILE")
    overwrite: bool = option(False, "replace an existing --out file")
    classes_per_batch: int = option(10, "classes encoded per text forward (all their prompts at once; default 10)",
                                    parse=positive_int, metavar="N")
    device: DeviceOption = group(DeviceOption)
    output: OutputOptions = group(OutputOptions)


def register(sub) -> None:
    p = sub.add_parser("classifier", help="build classifier files (--classifier) for the studies",
                       description="Classifier files for the studies that measure behaviour (--classifier).")
    actions = p.add_subparsers(dest="classifier_command", metavar="ACTION", required=True)
    command(actions, "zeroshot", ZeroshotOptions, run_zeroshot,
            help="a zero-shot classifier from an open_clip model's text tower",
            description="Encode every class name in each prompt template with the open_clip model's text tower, "
                        "average the L2-normalised prompt embeddings per class and normalise again (open_clip's "
                        "build_zero_shot_classifier), and write them with the model's logit scale as a classifier "
                        "file for the timm image tower of the same model (its name is printed). Needs the openclip "
                        "extra: pip install 'interp[openclip]'.")


def run_zeroshot(options: ZeroshotOptions, inputs: RunInputs) -> int:
    o = options
    refuse_existing_file(o.out, o.overwrite)  # before open_clip, torch and the model
    from ..console import info
    from ..models.weights.open_clip_bridge import (load_open_clip, require_open_clip, save_classifier_file, timm_spec,
                                           zeroshot_classifier)
    from .common import check_device

    open_clip = require_open_clip()
    check_device(inputs.device)
    names = list(open_clip.IMAGENET_CLASSNAMES) if o.imagenet_classes else list(o.classes)
    clip, tokenizer, described = load_open_clip(o.open_clip, pretrained=o.pretrained,
                                                checkpoint=o.checkpoint, device=inputs.device)
    name, kwargs = timm_spec(clip)  # refused here, before the text passes, when the tower has no timm twin
    classifier = zeroshot_classifier(clip, tokenizer, names, o.templates, model=name, source=described,
                                     device=inputs.device, classes_per_batch=o.classes_per_batch,
                                     progress=inputs.stage_lines)
    out = save_classifier_file(classifier, o.out)
    info(f"wrote {out}: zero-shot classifier, {classifier.n_classes} classes x {classifier.dim} dims, "
         f"logit scale {classifier.logit_scale:.4g}, {classifier.source} (give it to the studies as "
         "--classifier FILE)")
    weights = o.checkpoint or "the same open_clip checkpoint"
    extra = {k: v for k, v in kwargs.items() if k != "num_classes"}
    if extra:  # a size timm has no name for: its architecture is in the kwargs
        info(f"its image tower in interp: interp.load({name!r}, weights=<{weights}>, num_classes="
             f"{kwargs['num_classes']}, {', '.join(f'{k}={v!r}' for k, v in extra.items())})")
    else:
        info(f"its image tower in interp: {name} --weights <{weights}> (timm converts the open_clip keys; "
             "the head is CLIP's projection)")
    return 0
