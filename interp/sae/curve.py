"""The training-curve figure of an SAE run: loss, explained variance, L0 and dead features per step."""
from __future__ import annotations

import io
from pathlib import Path
from typing import Dict, List, Optional

from .files import write_atomic


def draw(curve: Dict[str, List[float]], path: Path, title: str, auxk_from: Optional[int] = None) -> Path:
    """:func:`curve_figure` saved as a PNG at ``path``."""
    fig = curve_figure(curve, title, auxk_from)
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=110)
    write_atomic(Path(path), buf.getvalue(), "training-curve figure",
                 "The SAE itself is written (sae.json, sae.safetensors); free disk space to draw the figure again")  # a full disk: one line, no traceback
    return path


def curve_figure(curve: Dict[str, List[float]], title: str, auxk_from: Optional[int] = None):
    """Four panels over ``curve["step"]`` (matplotlib's object API: no global pyplot state). ``auxk_from``: the
    first step the AuxK term can act (``dead_window``: no feature is dead before), marked on the loss and
    dead-feature panels, where the loss jumps when it starts."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    fig = Figure(figsize=(10, 6.5))
    FigureCanvasAgg(fig)
    panels = (("loss", "training loss (normalised units)", True), ("explained_variance", "explained variance", False),
              ("l0", "L0 (active features per token)", False), ("dead_fraction", "dead-feature fraction", False))
    for i, (key, label, log) in enumerate(panels):
        ax = fig.add_subplot(2, 2, i + 1)
        ax.plot(curve["step"], curve[key], lw=1.2)
        ax.set_xlabel("step")
        ax.set_ylabel(label)
        if log and min(curve[key], default=1.0) > 0:
            ax.set_yscale("log")
        if auxk_from is not None and key in ("loss", "dead_fraction") and curve["step"] and \
                auxk_from <= curve["step"][-1]:
            ax.axvline(auxk_from, color="0.4", ls="--", lw=1)
            ax.text(auxk_from, 0.97, f" AuxK on dead features from step {auxk_from}", fontsize=7, va="top",
                    color="0.3", transform=ax.get_xaxis_transform())
        ax.grid(alpha=0.3)
    fig.suptitle(title, fontsize=10)
    fig.tight_layout()
    return fig
