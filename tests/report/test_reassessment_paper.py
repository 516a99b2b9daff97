"""The reassessment's rows as the paper defines them (issue 47 item 7): the pixel probe's MSE (R^2 beside it),
claim 5's attention on the artifacts for a model without CLS as the mean attention each token receives, and under
the paper's p98 preset the paper's numbers on every model, the two-mode verdict beside them."""
from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch

import interp
from interp.detection.detection import DetectionSpec
from interp.errors import InterpError
from interp.report.reassessment import ReassessSettings, reassess_models
from interp.report.reassessment_attention import received_attention
from interp.report.reassessment_cells import ARTIFACT_ROWS, NO_ARTIFACTS, TWO_MODE_NOTE, _attention_cell

MODELS = ("swin",)


@pytest.fixture(scope="module")
def paper(photos16):
    """a random Swin-v2 (no CLS, windows of 4 on a 64 px input) and a random ViT under the paper's preset (p98
    at the last block): neither has a separated high-norm mode."""
    models = [interp.load("swinv2_tiny_window8_256", pretrained=False, img_size=64, embed_dim=24,
                          depths=(2, 2, 2, 2), num_heads=(1, 2, 3, 4), window_size=4),
              interp.load("vit_small_patch16_224", pretrained=False, img_size=64, depth=2)]
    settings = ReassessSettings(detection=DetectionSpec(preset="reassessment"), probe_tokens=200,
                                probe_options={"min_steps": 20}, progress=False)
    return models, reassess_models(models, photos16, settings, names=[*MODELS, "vit"])


def _last_block(model, photos):
    """(the mean attention each patch of the last block receives, computed from the full token x token matrix the
    windows (Swin) or the whole grid (PVTv2's last stage, no spatial reduction) make: [N, P]; the patches above the
    98th percentile of the last block's patch norms: Bool[N, P]), from one pass."""
    source = interp.runtime.open.open_source(model=model, images=photos)
    last = model.n_layers - 1
    hook, out = model.block_names.attn_pattern(last), model.block_names.resid_post(last)
    batches = list(source.batches([hook, out], 16))
    pattern = torch.cat([b.acts[hook] for b in batches]).double()
    norms = torch.cat([b.acts[out] for b in batches]).norm(dim=-1)
    high = norms > torch.quantile(norms.flatten().double(), 0.98).float()
    if pattern.ndim == 4:  # [N, h, t, t]
        return pattern.mean(1).mean(1), high
    idx = model.family.window_tokens(last, tuple(source.image_size))  # [n_w, S]
    t = int((idx >= 0).sum())
    full = torch.zeros(pattern.shape[0], t, t, dtype=torch.float64)  # query x key, head mean
    seen = torch.zeros(t, t, dtype=torch.bool)
    p = pattern.mean(2)  # [N, n_w, S, S]
    for w in range(idx.shape[0]):
        for i, qi in enumerate(idx[w].tolist()):
            for j, kj in enumerate(idx[w].tolist()):
                if qi >= 0 and kj >= 0:
                    full[:, qi, kj] = p[:, w, i, j]
                    seen[qi, kj] = True
    return full.sum(1) / seen.sum(0), high  # over the queries that can attend to each key


def test_cls_less_models_get_the_mean_received_attention(paper, photos16):
    models, table = paper
    for model, name in zip(models, MODELS):
        cell = table.cell("artifact_attention", name)
        assert cell.why.startswith("mean attention received per token (no CLS token)"), (name, cell)
        received, outliers = _last_block(model, photos16)
        shares = [(r * o).sum() / r.sum() for r, o in zip(received, outliers) if o.any()]
        assert cell.values["on_artifacts"] == pytest.approx(float(sum(shares) / len(shares)), rel=1e-4)
        assert 0 < cell.values["on_artifacts"] < 1 and 0 < cell.values["uniform"] < 1
    assert table.cell("artifact_attention", "vit").why.startswith("CLS->patch row")


def test_pvt_last_stage_receives_per_token_and_a_pooled_stage_is_refused(photos16):
    """PVTv2's last stage (no spatial reduction): the mean over heads and queries of its pattern; a block whose
    keys are pooled (sr 8, stage 0) has no per-token received attention, said in one line."""
    model = interp.load("pvt_v2_b0", pretrained=False, img_size=64)
    photos = sorted(str(p) for p in photos16.iterdir())[:4]
    got, why = received_attention(interp.runtime.open.open_source(model=model, images=photos))
    assert why is None
    torch.testing.assert_close(got.double(), _last_block(model, photos)[0])
    with pytest.raises(InterpError, match="pooled"):
        model.family.received_attention(0, torch.ones(1, 1, 256, 4))


def test_the_pixel_probe_is_mse_with_r2_beside_it(paper):
    _, table = paper
    for name, row in zip(table.models, table.compare_rows):
        cell = table.cell("pixel_probe", name)
        if name == "swin":  # 64 tokens in all at the last stage: no probe score, and the cell says why
            assert cell.values["normal"] is None and "too few" in cell.why
            continue
        assert cell.values["normal"] == row["pix_mse_normal"] and cell.values["high_norm"] == row["pix_mse_high"]
        assert cell.values["r2_normal"] == row["pix_normal"] and cell.values["r2_high_norm"] == row["pix_high"]
        assert cell.values["normal"] > 0 and "(R^2 " in cell.text, (name, cell)


def test_the_p98_preset_gives_the_papers_numbers_with_the_verdict_beside(paper):
    """The random models have no separated mode: "no" artifacts by the two-mode test, yet every row of claims
    3-5 holds the paper's figure on their tokens above p98, and says the verdict beside it."""
    _, table = paper
    rows = {"vit": ("redundancy", "position_probe", "pixel_probe", "artifact_attention"),
            "swin": ("redundancy", "artifact_attention")}  # Swin's last stage, 2x2 tokens: too few for probes
    for name in table.models:
        assert table.cell("artifacts", name).text == "no" and table.cell("artifacts", name).why == TWO_MODE_NOTE
        for row in rows[name]:
            cell = table.cell(row, name)
            assert cell.text != NO_ARTIFACTS and TWO_MODE_NOTE in cell.why, (name, row, cell)
            assert any(v is not None for v in cell.values.values()), (name, row, cell)
        assert all(table.cell(row, name).text != NO_ARTIFACTS for row in ARTIFACT_ROWS)
    assert table.cell("ttr_attention", "vit").values["without"] is not None  # the test-time register ran


def test_the_attention_cell_follows_its_definition():
    """A CLS row wins; without one the received attention; a grid that is not the detection's is n/a."""
    outliers = torch.tensor([[True, False, False, False]])
    cls = torch.tensor([[0.2, 0.1, 0.1, 0.0]])
    received = torch.tensor([[0.1, 0.1, 0.1, 0.1]])
    run = SimpleNamespace(cls_attention=cls, received_attention=received, received_why=None, outliers=outliers)
    assert _attention_cell(run).values == pytest.approx({"on_artifacts": 0.5, "uniform": 0.25})
    run.cls_attention = None
    cell = _attention_cell(run)
    assert cell.values["on_artifacts"] == pytest.approx(0.25) and "received" in cell.why
    run.received_attention, run.received_why = None, "no received attention per token: keys pooled"
    assert _attention_cell(run).text == "n/a" and "pooled" in _attention_cell(run).why
    run.received_attention = torch.ones(1, 9)
    assert "not the last block" in _attention_cell(run).why
