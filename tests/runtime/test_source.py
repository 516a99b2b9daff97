"""Activation sources: the layout of a cache's kept token rows."""
from conftest import make_model


def test_cache_source_layout_follows_the_kept_token_rows():
    from interp.runtime.cache_source import stored_layout

    lay = make_model("dinov2_reg").layout  # 5 prefix (CLS + 4 registers), 16x16 patches
    assert stored_layout(lay, None) == lay and stored_layout(lay, [0, lay.n_tokens]) == lay
    patches = stored_layout(lay, [5, lay.n_tokens])
    assert (patches.n_prefix, patches.cls_index, patches.grid, patches.patch_slice) == (0, None, (16, 16), slice(0, 256))
    cls = stored_layout(lay, [0, 1])
    assert (cls.n_prefix, cls.cls_index, cls.n_patches) == (1, 0, 0)


def test_studies_that_rerun_the_model_refuse_a_cache_source():
    import pytest

    from interp.errors import InterpError
    from interp.studies.artifacts.ablate import ablate_study

    class CacheLike:  # what a CacheSource offers: activations, no model
        model = None

    with pytest.raises(InterpError, match="re-runs the model.*--images"):
        ablate_study(CacheLike(), neurons={0: [1]})


def test_sources_answer_what_studies_ask(tmp_path):
    """patch size, image size, data config, live or not, display images and ids: from the source, for a live
    model and for a cache of it alike."""
    import torch

    import interp.cache
    from interp.models import data_config
    from interp.models.inputs.preprocessing import tensor_image_id
    from interp.studies import open_source

    model = make_model("dinov2")  # patch 14, 224 px: a 16x16 grid
    x = torch.rand(2, 3, 224, 224)
    live = open_source(model=model, images=x)
    interp.cache.write(model, x, hooks=["blocks.1.hook_resid_post"], path=tmp_path / "a.h5", progress=False)
    cached = open_source(cache=tmp_path / "a.h5", model=model)
    assert live.is_live and not cached.is_live
    for src in (live, cached):
        assert src.patch_size == (14, 14) and src.image_size == (224, 224)
        assert tuple(src.data_config()["mean"]) == tuple(data_config(model)["mean"])
        assert src.ids == [tensor_image_id(0), tensor_image_id(1)] == ["tensor:0", "tensor:1"]
    shown = live.display_images(1)
    cfg = data_config(model)
    std = torch.tensor(cfg["std"]).view(1, 3, 1, 1)
    mean = torch.tensor(cfg["mean"]).view(1, 3, 1, 1)
    assert shown.shape == (1, 3, 224, 224) and torch.allclose(shown, (x[:1] * std + mean).clamp(0, 1))
    import pytest

    from interp.errors import InterpError

    with pytest.raises(InterpError, match="no images to show"):
        cached.display_images()


def test_a_held_source_decodes_each_image_once(tmp_path, monkeypatch):
    from PIL import Image

    import interp.runtime.live_source as source_mod
    from interp.studies import open_source

    folder = tmp_path / "photos"
    for cls in ("a", "b"):
        (folder / cls).mkdir(parents=True)
        Image.new("RGB", (64, 48), (40, 90, 200) if cls == "a" else (200, 10, 10)).save(folder / cls / "x.png")
    decoded = []
    real = source_mod.load_images
    monkeypatch.setattr(source_mod, "load_images", lambda paths, model, **kw: decoded.extend(paths) or real(paths, model, **kw))
    src = open_source(model=make_model("vit"), images=folder, batch_size=1)
    streamed = [x for _, x in src.image_batches()] + [x for _, x in src.image_batches()]
    assert len(decoded) == 4  # a streaming source decodes on every pass
    held = src.held()
    assert len(decoded) == 6 and held.ids == src.ids and held.labels == src.labels == [0, 1]
    for _ in range(3):
        again = [x for _, x in held.image_batches()]
    assert len(decoded) == 6  # ... a held one never again
    assert all(torch_equal(a, b) for a, b in zip(again, streamed[:2]))
    assert len(list(held.batches(["blocks.0.hook_resid_post"]))) == 2 and len(decoded) == 6


def torch_equal(a, b) -> bool:
    import torch

    return torch.equal(a, b)


def test_hook_name_builders_spell_the_model_names():
    from interp.hooks import names

    model = make_model("vit")
    known = set(model.hook_names())
    builders = [names.resid_pre, names.resid_mid, names.resid_post, names.attn_out, names.mlp_out, names.mlp_pre,
                names.mlp_post, names.attn_q, names.attn_k, names.attn_v, names.attn_z, names.attn_scores,
                names.attn_pattern]
    for build in builders:
        assert build(1) in known, build(1)
        assert names.block_of(build(1)) == 1
    assert names.block_of("hook_embed") is None
    assert model.resolve_hooks(names.resid_post(names.EVERY_BLOCK)) == [names.resid_post(0), names.resid_post(1)]


def test_truncated_image_is_skipped_and_recorded_strict_stops(tmp_path):
    import shutil

    import pytest

    import interp
    from interp.errors import ImageError
    from interp.models import sample_image_paths
    from interp.studies import open_source

    for path in sample_image_paths()[:2]:
        shutil.copy(path, tmp_path / path.name)
    data = (tmp_path / "astronaut.jpg").read_bytes()
    (tmp_path / "truncated.jpg").write_bytes(data[: len(data) // 3])  # a valid header, missing pixels
    model = interp.load("planted_vit")
    with pytest.warns(UserWarning, match=r"truncated\.jpg"):
        source = open_source(model=model, images=tmp_path)
    assert [p for p, _ in source.skipped] == [str(tmp_path / "truncated.jpg")]
    assert "truncated" in source.skipped[0][1]
    assert sum(len(x) for _, x in source.image_batches()) == len(source.ids) == 2
    with pytest.raises(ImageError, match=r"truncated\.jpg.*strict"):
        open_source(model=model, images=tmp_path, strict=True)


def test_a_cache_of_image_files_shows_its_images_and_one_of_tensors_does_not(tmp_path):
    """The figures of a cached run (the SAE's top patches, the maps) were empty boxes although the images were on
    disk (issue 52, item 5): a cache whose ids are image files here decodes them again as the model saw them."""
    import pytest
    import torch

    import interp.cache
    from interp.models import sample_image_paths
    from interp.studies import open_source

    model = make_model("vit")
    photos = sample_image_paths()[:2]
    interp.cache.write(model, photos, hooks=["blocks.1.hook_resid_post"], path=tmp_path / "f.h5", progress=False)
    cached = open_source(cache=tmp_path / "f.h5")
    live = open_source(model=model, images=photos)
    assert cached.shows_images and live.shows_images
    torch.testing.assert_close(cached.display_images(2), live.display_images(2), atol=1e-5, rtol=0)
    interp.cache.write(model, torch.randn(2, 3, 224, 224), hooks=["blocks.1.hook_resid_post"], path=tmp_path / "t.h5",
                       progress=False)
    tensors = open_source(cache=tmp_path / "t.h5")
    assert not tensors.shows_images
    with pytest.raises(Exception, match="no images to show"):
        tensors.display_images(1)
