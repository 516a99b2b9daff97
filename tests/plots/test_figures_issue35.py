"""Report figures a reader can read (issue 35, items 16-17): the pooled cosine as its distance from 1 on a log axis,
"block 2, neuron 17" instead of "L2:17", the SAE ablation's target bar named "SAE features", the relocation maps
at most 4 images wide, "first n of N images" on every map figure that shows fewer, and a full-size link per
figure in the report page."""
from __future__ import annotations


import numpy as np

from interp.plots.causal import ablation_bars, neuron_scores, relocation_maps
from interp.plots.objects import lost_boxes
from interp.report.html import embedded_image
from interp.studies.artifacts.ablate import AblateResult
from interp.studies.artifacts.neurons import NeuronsResult
from interp.studies.artifacts.relocate import RelocateResult
from interp.studies.objects.lost import LostResult

DPI = 110  # interp.plots.save writes every figure at this resolution


def _ablation(**extra):
    cond = {"outlier_count": 10, "max_norm": 600.0, "pooled_cosine": 1.0}
    target = {**cond, "pooled_cosine": 0.99969}
    controls = [{**cond, "pooled_cosine": c} for c in (0.9999991, 0.9999995)]
    summary = {m: {"baseline": cond[m], "target": target[m], "control_mean": float(np.mean([c[m] for c in controls])),
                   "control_std": float(np.std([c[m] for c in controls]))} for m in cond}
    return AblateResult(model="m", fingerprint="", params={}, seed=0, neurons={2: [1]}, n_images=2,
                        controls=[{2: [3]}, {2: [4]}], conditions={"baseline": cond, "target": target,
                                                                   "control_0": controls[0], "control_1": controls[1]},
                        summary=summary, **extra)


def test_the_pooled_cosine_is_shown_as_its_distance_from_one_on_a_log_axis():
    fig = ablation_bars(_ablation())
    ax = next(a for a in fig.axes if "pooled cosine" in a.get_title())
    assert ax.get_yscale() == "log"
    heights = [p.get_height() for p in ax.patches]
    assert heights[1] > 100 * heights[2] > 0  # 3.1e-4 vs 7e-7: apart by decades, not both "1.0"
    assert any("0.99969" in t.get_text() for t in ax.texts)


def test_the_target_bar_says_what_was_ablated():
    neurons = [t.get_text() for t in ablation_bars(_ablation()).axes[0].get_xticklabels()]
    sae = ablation_bars(_ablation(features=[12, 40], sae="runs/sae"))
    assert "register\nneurons" in neurons
    assert all("SAE\nfeatures" in [t.get_text() for t in ax.get_xticklabels()] for ax in sae.axes
               if ax.get_xticklabels())


def test_neuron_labels_name_block_and_neuron():
    r = NeuronsResult(model="m", fingerprint="", params={}, seed=0, neurons=[{"layer": 2, "neuron": 17, "score": 3.0}],
                      layer_max_score=[0.1, 0.2, 3.0], highest_layer=2)
    labels = [t.get_text() for t in neuron_scores(r).axes[0].get_yticklabels()]
    assert labels == ["block 2, neuron 17"]


def test_relocation_maps_stay_readable_for_many_images():
    n, grid = 16, (4, 4)
    maps = np.zeros((n, *grid), dtype=int).tolist()
    r = RelocateResult(model="m", fingerprint="", params={}, seed=0, ids=[f"img{i}.png" for i in range(n)],
                       target=np.eye(4, dtype=bool).tolist(), outlier_maps_before=maps, outlier_maps_after=maps,
                       iou=[0.5] * n, mean_iou=0.5)
    fig = relocation_maps(r)
    assert fig.get_size_inches()[0] * DPI <= 1250  # was 2274 px, shown at <= 1250 px
    assert "first 8 of 16 images" in fig._suptitle.get_text()


def test_lost_maps_say_how_many_images_they_show():
    n = 12
    r = LostResult(model="m", fingerprint="", params={}, seed=0, ids=[f"i{k}.png" for k in range(n)], grid=[4, 4],
                   hook="blocks.5.attn.hook_k", k=100, seeds=[0] * n, boxes=[[0, 0, 1, 1]] * n, box_cells=[[0, 0, 1, 1]] * n,
                   degenerate=[False] * n, hits=[], masks=[[[1] * 4] * 4] * n)
    assert "first 8 of 12 images" in lost_boxes(r)._suptitle.get_text()


def test_each_report_figure_opens_at_full_size_on_a_click(tmp_path):
    from PIL import Image

    Image.new("RGB", (4, 4)).save(tmp_path / "relocation_maps.png")
    tag = embedded_image(tmp_path, "relocation_maps.png")
    assert "classList.toggle('full')" in tag and "full size" in tag and "href" not in tag  # still one file


def test_as_weights_names_what_plain_timm_can_load():
    from interp.commands.inputs import ModelSpec
    from interp.commands.patch import weights_recipe

    planted = weights_recipe(ModelSpec("planted_vit"))
    assert "timm.create_model" not in planted and "interp.models.planted_vit()" in planted  # timm raised "Unknown model"
    real = weights_recipe(ModelSpec("vit_small_patch16_224", depth=2))
    assert "timm.create_model('vit_small_patch16_224', depth=2)" in real


def test_lost_maps_wrap_after_four_images():
    n = 8
    r = LostResult(model="m", fingerprint="", params={}, seed=0, ids=[f"i{k}.png" for k in range(n)], grid=[4, 4],
                   hook="blocks.5.attn.hook_k", k=100, seeds=[0] * n, boxes=[[0, 0, 1, 1]] * n,
                   box_cells=[[0, 0, 1, 1]] * n, degenerate=[False] * n, hits=[], masks=[[[1] * 4] * 4] * n)
    assert lost_boxes(r).get_size_inches()[0] * DPI <= 1250  # 8 in a row: 2036 px


def test_the_report_table_names_blocks_and_neurons():
    from interp.report.summary_table import neuron_list_text as _neuron_list

    entries = [{"layer": 2, "neuron": 17}, {"layer": 2, "neuron": 101}, {"layer": 5, "neuron": 40}]
    assert _neuron_list(entries) == "block 2: neurons 17, 101; block 5: neuron 40"
