"""The training curve marks where AuxK starts (issue 52, item 5: the loss jumped from 0.002 to 10 at step 200,
unlabelled)."""
from __future__ import annotations

from interp.sae.curve import curve_figure

CURVE = {"step": list(range(1, 301)), "loss": [0.002] * 199 + [10.0] * 101, "explained_variance": [0.9] * 300,
         "l0": [8.0] * 300, "dead_fraction": [0.0] * 199 + [0.6] * 101}


def _texts(fig):
    return [t.get_text() for ax in fig.axes for t in ax.texts]


def test_the_auxk_start_is_marked_on_the_loss_and_dead_panels():
    texts = _texts(curve_figure(CURVE, "topk SAE", auxk_from=200))
    assert texts.count(" AuxK on dead features from step 200") == 2


def test_no_mark_without_auxk_or_before_it_can_start():
    assert _texts(curve_figure(CURVE, "relu SAE")) == []
    assert _texts(curve_figure(dict(CURVE, step=CURVE["step"][:100], **{k: v[:100] for k, v in CURVE.items()
                                                                         if k != "step"}), "topk", auxk_from=200)) == []
