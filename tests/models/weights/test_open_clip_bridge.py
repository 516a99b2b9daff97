"""open_clip -> timm: the image tower converted through interp's loader and the zero-shot matrix give open_clip's
own zero-shot logits (random-init open_clip models, never downloaded)."""
from __future__ import annotations

import json
import math

import numpy as np
import pytest
import torch
import torch.nn.functional as F

import interp
from interp.errors import InterpError, ModelLoadError

open_clip = pytest.importorskip("open_clip")  # the `test` extra installs it; CI runs these

from interp.models.weights.open_clip_bridge import (save_classifier_file, timm_spec, tower_state_dict,  # noqa: E402
                                                    vision_tower, zeroshot_classifier, zeroshot_weights)

TINY_CFG = {"embed_dim": 48, "vision_cfg": {"image_size": 64, "layers": 2, "width": 128, "head_width": 64,
                                            "patch_size": 16},
            "text_cfg": {"context_length": 77, "vocab_size": 49408, "width": 64, "heads": 2, "layers": 2}}
CLASSES = ["tench", "goldfish", "great white shark"]


def tiny_clip(quick_gelu: bool = False, seed: int = 0) -> torch.nn.Module:
    """A small random-init open_clip CLIP (ViT image tower, open_clip's text tower and BPE tokenizer)."""
    torch.manual_seed(seed)
    clip = open_clip.CLIP(**TINY_CFG, quick_gelu=quick_gelu).eval()
    with torch.no_grad():  # open_clip's init gives a 1/0.07 scale and near-orthogonal random embeddings
        clip.logit_scale.fill_(math.log(100.0))
    return clip


def photos(size: int) -> torch.Tensor:
    """The bundled sample photos, resized to ``size`` and normalised with CLIP's mean and std: [2, 3, s, s]."""
    from PIL import Image

    mean = torch.tensor(open_clip.OPENAI_DATASET_MEAN).view(3, 1, 1)
    std = torch.tensor(open_clip.OPENAI_DATASET_STD).view(3, 1, 1)
    out = []
    for path in interp.models.sample_image_paths()[:2]:
        img = Image.open(path).convert("RGB").resize((size, size), Image.BICUBIC)
        x = torch.from_numpy(np.asarray(img, dtype=np.float32)).permute(2, 0, 1) / 255
        out.append((x - mean) / std)
    return torch.stack(out)


def open_clip_logits(clip, tokenizer, x, names, templates):
    """open_clip's own zero-shot logits, written out here (encode_image/encode_text, per-prompt normalisation,
    mean over templates, re-normalisation, logit_scale.exp())."""
    with torch.no_grad():
        image = F.normalize(clip.encode_image(x), dim=-1)
        rows = []
        for name in names:
            emb = clip.encode_text(tokenizer([t(name) for t in templates]), normalize=True).mean(0)
            rows.append(F.normalize(emb, dim=-1))
        return clip.logit_scale.exp() * image @ torch.stack(rows).T


def study_logits(model, x, path):
    """Class logits [b, C] as the studies read them: the classifier file through interp.load_classifier, applied
    to a forward of the HookedViT by the studies' forward primitive."""
    from interp.runtime.forward import run_hooks

    return run_hooks(model, x, classifier=interp.load_classifier(path)).logits


@pytest.mark.parametrize("quick_gelu", [False, True])
def test_a_small_open_clip_tower_and_matrix_give_open_clips_zero_shot_logits(tmp_path, quick_gelu):
    clip = tiny_clip(quick_gelu)
    tokenizer = open_clip.get_tokenizer("ViT-B-16")
    name, kwargs = timm_spec(clip)
    assert name == ("vit_base_patch16_clip_quickgelu_224" if quick_gelu else "vit_base_patch16_clip_224")
    assert kwargs == dict(embed_dim=128, depth=2, num_heads=2, mlp_ratio=4.0, patch_size=16, img_size=64,
                          num_classes=48)
    # the whole open_clip state dict (text tower included) as a checkpoint file, through interp.load
    path = tmp_path / "open_clip_tiny.pt"
    torch.save(clip.state_dict(), path)
    model = interp.load(name, weights=path, **kwargs)
    assert model.init_seed is None
    arch = {k: v for k, v in kwargs.items() if k != "num_classes"}  # the head is sized to CLIP's proj
    assert interp.load(name, weights=path, **arch).timm_model.num_classes == 48
    x = photos(64)
    with torch.no_grad():
        ours, theirs = model(x), clip.encode_image(x)
    assert ours.shape == (2, 48) and torch.allclose(ours, theirs, atol=1e-5, rtol=1e-5)
    with torch.no_grad():
        assert torch.allclose(vision_tower(clip)(x), theirs, atol=1e-5, rtol=1e-5)  # the in-memory converter
    classifier = zeroshot_classifier(clip, tokenizer, CLASSES, "simple", source="tiny test")
    assert (classifier.kind, classifier.class_names, classifier.model) == ("zeroshot", CLASSES, name)
    assert classifier.logit_scale == pytest.approx(100.0, rel=1e-6)
    assert classifier.source == "tiny test, 7 templates (simple)"
    assert torch.allclose(classifier.weight.norm(dim=1), torch.ones(3), atol=1e-6)
    file = save_classifier_file(classifier, tmp_path / "zs.pt")
    back = torch.load(file, weights_only=True)  # the agreed file format
    assert back["interp_classifier"] == 1 and back["kind"] == "zeroshot" and back["class_names"] == CLASSES
    assert torch.equal(back["weight"], classifier.weight) and back["logit_scale"] == classifier.logit_scale
    assert not list(tmp_path.glob(".*.tmp"))
    expected = open_clip_logits(clip, tokenizer, x, CLASSES, open_clip.SIMPLE_IMAGENET_TEMPLATES)
    got = study_logits(model, x, file)
    assert torch.allclose(got, expected, atol=1e-4 * float(expected.abs().max()), rtol=0)
    assert float(expected.abs().max()) > 1.0  # logits large enough for the comparison to mean something
    assert torch.allclose(classifier.apply(ours), expected, atol=1e-4 * float(expected.abs().max()), rtol=0)


def test_the_state_dict_path_needs_the_activation_and_matches_the_model():
    clip = tiny_clip(quick_gelu=True)
    with pytest.raises(InterpError, match="quick_gelu=True"):
        timm_spec(clip.state_dict())
    assert timm_spec(clip.state_dict(), quick_gelu=True) == timm_spec(clip)
    with pytest.raises(InterpError, match="disagrees with the model"):
        timm_spec(clip, quick_gelu=False)
    assert set(tower_state_dict({"module." + k: v for k, v in clip.state_dict().items()})) == {
        k for k in clip.state_dict() if k.startswith("visual.")}
    with pytest.raises(ModelLoadError, match="no open_clip image tower"):
        tower_state_dict({"blocks.0.norm1.weight": torch.ones(3)})


def test_towers_timm_cannot_hold_are_refused_in_one_line():
    torch.manual_seed(0)
    resnet = open_clip.CLIP(embed_dim=32, vision_cfg={"layers": [1, 1, 1, 1], "width": 16, "image_size": 64},
                            text_cfg=TINY_CFG["text_cfg"])
    with pytest.raises(ModelLoadError, match="not a ViT with a class token"):
        timm_spec(resnet)
    pooled = open_clip.CLIP(embed_dim=48, vision_cfg={**TINY_CFG["vision_cfg"], "pool_type": "avg"},
                            text_cfg=TINY_CFG["text_cfg"])
    with pytest.raises(ModelLoadError, match="pools with 'avg'"):
        timm_spec(pooled)
    scaled = open_clip.CLIP(embed_dim=48, vision_cfg={**TINY_CFG["vision_cfg"], "ls_init_value": 0.1},
                            text_cfg=TINY_CFG["text_cfg"])
    with pytest.raises(ModelLoadError, match="layer scale"):
        timm_spec(scaled)


def test_zeroshot_weights_are_open_clips_build_zero_shot_classifier_transposed():
    clip, tokenizer = tiny_clip(), open_clip.get_tokenizer("ViT-B-16")
    w = zeroshot_weights(clip, tokenizer, CLASSES, "simple", classes_per_batch=2)
    ref = open_clip.build_zero_shot_classifier(clip, tokenizer, CLASSES, open_clip.SIMPLE_IMAGENET_TEMPLATES)
    # the class batches differ (2 here, open_clip's default there): equal up to float32 rounding
    assert w.shape == (3, 48) and torch.allclose(w, ref.T, rtol=0, atol=1e-6)
    assert zeroshot_classifier(clip, tokenizer, ["cat"], "openai").source.endswith(", 80 templates (openai)")
    with pytest.raises(InterpError, match="unknown template set"):
        zeroshot_weights(clip, tokenizer, CLASSES, "fancy")
    with pytest.raises(InterpError, match="distinct"):
        zeroshot_classifier(clip, tokenizer, ["cat", "cat"])


@pytest.mark.slow  # ViT-B-16's image tower (86M parameters, random init): ~6 s of CPU
def test_vit_b16_converted_through_interp_load_gives_open_clips_zero_shot_logits(tmp_path):
    """open_clip's ViT-B-16 image tower (its own config, as ``open_clip.create_model("ViT-B-16")`` builds it)
    under timm's name with timm's defaults; the text tower only makes the class embeddings, which both sides
    share, so it is the small one of TINY_CFG (ViT-B-16's 63M-parameter text tower took half the test's time)."""
    torch.manual_seed(0)
    config = open_clip.get_model_config("ViT-B-16")
    assert config["vision_cfg"] == {"image_size": 224, "layers": 12, "width": 768, "patch_size": 16}
    clip = open_clip.CLIP(embed_dim=config["embed_dim"], vision_cfg=config["vision_cfg"],
                          text_cfg=TINY_CFG["text_cfg"]).eval()
    with torch.no_grad():
        clip.logit_scale.fill_(math.log(100.0))  # CLIP's trained value; random init has 1/0.07
    tokenizer = open_clip.get_tokenizer("ViT-B-16")
    name, kwargs = timm_spec(clip)
    assert (name, kwargs) == ("vit_base_patch16_clip_224", {"num_classes": 512})
    path = tmp_path / "vit_b16_visual.pt"
    torch.save({k: v for k, v in clip.state_dict().items() if k.startswith("visual.")}, path)
    model = interp.load(name, weights=path)  # the head is sized to CLIP's projection from the file
    x = photos(224)
    file = save_classifier_file(zeroshot_classifier(clip, tokenizer, CLASSES, "simple"), tmp_path / "zs.pt")
    got = study_logits(model, x, file)
    expected = open_clip_logits(clip, tokenizer, x, CLASSES, open_clip.SIMPLE_IMAGENET_TEMPLATES)
    diff = float((got - expected).abs().max())
    print(f"ViT-B-16 zero-shot logits, timm (interp.load) vs open_clip: max abs diff {diff:.3e} "
          f"(max |logit| {float(expected.abs().max()):.3g})")
    assert diff <= 1e-4 * float(expected.abs().max())


# ------------------------------------------------------------------------------------------ the command
@pytest.fixture
def tiny_checkpoint(tmp_path, monkeypatch):
    """open_clip knows a model 'interp-test-tiny' (TINY_CFG, GELU) and a checkpoint of it exists."""
    cfg_dir = tmp_path / "cfg"
    cfg_dir.mkdir()
    (cfg_dir / "interp-test-tiny.json").write_text(json.dumps(TINY_CFG))
    open_clip.add_model_config(cfg_dir)
    clip = tiny_clip()
    path = tmp_path / "tiny.pt"
    torch.save(clip.state_dict(), path)
    return clip, path


def test_classifier_zeroshot_command_writes_the_classifier_file(tmp_path, tiny_checkpoint, capsys):
    from interp.cli import main

    clip, ckpt = tiny_checkpoint
    classes = tmp_path / "classes.txt"
    classes.write_text("# three fish\ntench\n\ngoldfish\n  great white shark  \n")
    out = tmp_path / "zs.pt"
    argv = ["classifier", "zeroshot", "--open-clip", "interp-test-tiny", "--checkpoint", str(ckpt),
            "--classes", str(classes), "--templates", "simple", "--out", str(out)]
    assert main(argv) == 0
    shown = capsys.readouterr().out
    assert "3 classes x 48 dims" in shown and "interp.load('vit_base_patch16_clip_224'" in shown
    written = torch.load(out, weights_only=True)
    expected = zeroshot_classifier(clip, open_clip.get_tokenizer("interp-test-tiny"), CLASSES, "simple")
    assert written["class_names"] == CLASSES and written["model"] == "vit_base_patch16_clip_224"
    assert torch.allclose(written["weight"], expected.weight, atol=1e-6)
    assert written["logit_scale"] == pytest.approx(100.0, rel=1e-6)
    assert written["source"] == "open_clip interp-test-tiny tiny.pt, 7 templates (simple)"
    assert main(argv) == 1  # the file exists: refused before any work
    assert "already exists" in capsys.readouterr().err
    assert main(argv + ["--overwrite", "--quiet"]) == 0 and capsys.readouterr().out == ""
    assert torch.equal(torch.load(out, weights_only=True)["weight"], written["weight"])


@pytest.mark.parametrize("text,message", [
    ("cat\ndog\ncat\n", "names 'cat' twice (lines 1 and 3)"),
    ("# only a comment\n\n", "holds no class names"),
])
def test_bad_classes_files_are_refused_while_parsing(tmp_path, capsys, text, message):
    from interp.cli import main

    classes = tmp_path / "classes.txt"
    classes.write_text(text)
    rc = main(["classifier", "zeroshot", "--open-clip", "ViT-B-16", "--pretrained", "openai", "--classes",
               str(classes), "--out", str(tmp_path / "zs.pt")])
    err = capsys.readouterr().err
    assert rc == 2 and message in err and err.count("\n") == 1


def test_weights_and_classes_are_required_one_of_each(tmp_path, capsys):
    from interp.cli import main

    rc = main(["classifier", "zeroshot", "--open-clip", "ViT-B-16", "--imagenet-classes", "--out",
               str(tmp_path / "zs.pt")])
    assert rc == 2 and "--pretrained --checkpoint" in capsys.readouterr().err.replace("/", " ").replace(
        "one of the arguments ", "")


def test_without_open_clip_the_command_says_how_to_install_it(tmp_path, monkeypatch, capsys):
    import sys

    from interp.cli import main

    monkeypatch.setitem(sys.modules, "open_clip", None)  # `import open_clip` raises ImportError
    rc = main(["classifier", "zeroshot", "--open-clip", "ViT-B-16", "--pretrained", "openai",
               "--imagenet-classes", "--out", str(tmp_path / "zs.pt")])
    err = capsys.readouterr().err
    assert rc == 1 and err == "interp: error: open_clip is not installed: pip install 'interp[openclip]'\n"


def test_a_pretrained_tag_offline_and_unknown_names_get_one_line(tmp_path, monkeypatch, capsys):
    import interp.models.loading as loading
    from interp.cli import main

    monkeypatch.setattr(loading, "_hub_reachable", lambda *a, **k: False)
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "empty-hub-cache"))
    base = ["classifier", "zeroshot", "--imagenet-classes", "--out", str(tmp_path / "zs.pt")]
    assert main(base + ["--open-clip", "ViT-B-16", "--pretrained", "laion2b_s34b_b88k"]) == 1
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "cannot load open_clip ViT-B-16 laion2b_s34b_b88k" in err
    assert "pass --checkpoint FILE" in err
    assert main(base + ["--open-clip", "ViT-B-16", "--pretrained", "nope"]) == 1
    err = capsys.readouterr().err
    assert "no pretrained tag 'nope' for ViT-B-16" in err and "laion2b_s34b_b88k" in err
    assert main(base + ["--open-clip", "ViT-B-61", "--pretrained", "openai"]) == 1
    assert "unknown open_clip model 'ViT-B-61'; did you mean: ViT-B-16" in capsys.readouterr().err
    assert not (tmp_path / "zs.pt").exists()


def test_offline_a_cached_checkpoint_is_found_without_the_network(tmp_path, monkeypatch):
    import huggingface_hub

    from interp.models.weights.open_clip_bridge import _cached_open_clip_file

    asked = []
    cached = tmp_path / "open_clip_model.safetensors"
    cached.write_bytes(b"x")

    def lookup(repo, filename, **kw):
        asked.append((repo, filename))
        return str(cached) if filename == "open_clip_model.safetensors" else None

    monkeypatch.setattr(huggingface_hub, "try_to_load_from_cache", lookup)
    hub = open_clip.get_pretrained_cfg("ViT-B-16", "laion2b_s34b_b88k")["hf_hub"]
    assert _cached_open_clip_file(open_clip, "ViT-B-16", "laion2b_s34b_b88k") == str(cached)
    assert asked == [(hub.rstrip("/"), "open_clip_model.safetensors")]
    monkeypatch.setattr(huggingface_hub, "try_to_load_from_cache", lambda *a, **k: None)
    assert _cached_open_clip_file(open_clip, "ViT-B-16", "laion2b_s34b_b88k") is None
