"""Interventions are explicit: a live source runs its forwards under the interventions it is given, and every
batch is sliced with the layout of the forward that produced it (input size and edits in force)."""
import pytest
import torch

import interp
from interp.interventions import TestTimeRegister
from interp.models.planted import planted_truth
from interp.models.inputs.samples import sample_image_paths
from interp.studies import open_source
from interp.studies.artifacts.norms import norms_study


@pytest.fixture(scope="module")
def planted():
    model = interp.load("planted_vit")
    truth = planted_truth(model)
    return model, TestTimeRegister({truth.layer: list(truth.neurons)})


def _summary(result):
    return result.artifacts_found, result.threshold, result.outlier_counts


def test_a_source_built_outside_an_intervention_slices_with_the_edited_layout(planted, one_thread):
    """The register takes over the planted neurons: no artifacts. Before, a source built before
    ``model.intervene(ttr)`` and used inside it counted the register as a patch (artifacts, threshold 141.9)."""
    model, ttr = planted
    paths = sample_image_paths()
    explicit = norms_study(open_source(model=model, images=paths, interventions=[ttr]), progress=False)
    assert explicit.artifacts_found is False and explicit.threshold is None
    outside = open_source(model=model, images=paths)
    with model.intervene(ttr):
        built_outside = norms_study(outside, progress=False)
        built_inside = open_source(model=model, images=paths)
        used_inside = norms_study(built_inside, progress=False)
    used_outside = norms_study(built_inside, progress=False)  # the same source, the edit gone
    plain = norms_study(open_source(model=model, images=paths), progress=False)
    assert _summary(built_outside) == _summary(used_inside) == _summary(explicit)
    assert plain.artifacts_found is True and _summary(used_outside) == _summary(plain)


def test_each_batch_carries_the_layout_of_its_own_forward(planted):
    model, ttr = planted
    x = torch.rand(2, 3, 224, 224)
    source = open_source(model=model, images=x)
    base = source.layout
    hook = "blocks.0.hook_resid_post"
    plain, = source.batches([hook])
    edited, = source.batches([hook], interventions=[ttr])
    assert plain.layout == base and edited.layout.n_prefix == base.n_prefix + 1
    assert edited.acts[hook].shape[1] == base.n_tokens + 1
    # the source's own interventions count in its layout, also before any forward
    with_ttr = open_source(model=model, images=x, interventions=[ttr])
    assert with_ttr.layout.n_prefix == base.n_prefix + 1 and model.layout_for((224, 224)) == base
    big = open_source(model=model, images=torch.rand(1, 3, 256, 256))
    assert big.layout.grid == (16, 16) and source.layout.grid == (14, 14)  # no size remembered from a forward


def test_a_cache_refuses_interventions(planted, tmp_path):
    from interp.errors import InterpError

    model, ttr = planted
    x = torch.rand(2, 3, 224, 224)
    interp.cache.write(model, x, hooks=["blocks.0.hook_resid_post"], path=tmp_path / "a.h5", progress=False)
    with pytest.raises(InterpError, match="interventions need"):
        open_source(cache=tmp_path / "a.h5", interventions=[ttr])
    with pytest.raises(InterpError, match="interventions need a live source"):
        next(open_source(cache=tmp_path / "a.h5").batches(["blocks.0.hook_resid_post"], interventions=[ttr]))


def test_a_cache_counts_the_models_blocks_not_the_cached_ones(planted, tmp_path):
    """detect_layer=-1 is the model's last block on a cache as live (before: the last cached block)."""
    model, _ = planted
    interp.cache.write(model, torch.rand(2, 3, 224, 224), hooks=["blocks.1.hook_resid_post"], path=tmp_path / "a.h5",
                       progress=False)
    cached = open_source(cache=tmp_path / "a.h5")
    assert cached.n_layers == model.n_layers == 6
