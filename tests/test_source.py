"""Activation sources: the layout of a cache's kept token rows."""
from conftest import make_model


def test_cache_source_layout_follows_the_kept_token_rows():
    from interp.studies.source import stored_layout

    lay = make_model("dinov2_reg").layout  # 5 prefix (CLS + 4 registers), 16x16 patches
    assert stored_layout(lay, None) == lay and stored_layout(lay, [0, lay.n_tokens]) == lay
    patches = stored_layout(lay, [5, lay.n_tokens])
    assert (patches.n_prefix, patches.cls_index, patches.grid, patches.patch_slice) == (0, None, (16, 16), slice(0, 256))
    cls = stored_layout(lay, [0, 1])
    assert (cls.n_prefix, cls.cls_index, cls.n_patches) == (1, 0, 0)


def test_studies_that_rerun_the_model_refuse_a_cache_source():
    import pytest

    from interp.errors import InterpError
    from interp.studies.ablate import ablation_study

    class CacheLike:  # what a CacheSource offers: activations, no model
        model = None

    with pytest.raises(InterpError, match="re-runs the model.*--images"):
        ablation_study(CacheLike(), {0: [1]})
