"""Checks that hold for every planted pyramid (planted_pvt, planted_swin): their test files call them on their own
shared model and source, so that the planted model is built once per file."""
from __future__ import annotations

import torch

import interp

PLANTED = [17, 101, 402, 655]  # the register neurons of layers/stages 3, block 0 (flat block 6)


def check_ablation_against_random_controls(source) -> None:
    """Ablating the planted neurons removes every outlier; random neurons of the same block remove none."""
    from interp.studies.artifacts.ablate import ablate_study

    result = ablate_study(source, neurons=",".join(f"6:{n}" for n in PLANTED), controls=2, progress=False)
    counts = result.summary["outlier_count"]
    assert counts["baseline"] > 0 and counts["target"] == 0 and counts["control_mean"] == counts["baseline"]


def check_patch_file_on_plain_timm(model, source, build_plain, tmp_path) -> None:
    """The ablation saved as a patch file and applied to the plain timm model (``build_plain()``) gives the hooked
    model's edited output, and the edit changes the output."""
    from interp.interventions import NeuronAblation

    path = interp.patch.save([NeuronAblation({6: PLANTED})], tmp_path / "ablate.safetensors", model)
    plain = interp.patch.apply(build_plain(), path)
    x = next(iter(source.image_batches()))[1]
    with torch.no_grad():
        edited = model.run_with_interventions(x, interp.patch.load(path))
        torch.testing.assert_close(plain(x), edited, atol=1e-4, rtol=0)
        assert (edited - model(x)).abs().max() > 1e-3
