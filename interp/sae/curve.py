"""The training-curve figure of an SAE run: loss, explained variance, L0 and dead features per step."""
from __future__ import annotations

import io
from pathlib import Path
from typing import Dict, List

from .files import write_atomic


def draw(curve: Dict[str, List[float]], path: Path, title: str) -> Path:
    """Four panels over ``curve["step"]`` saved as a PNG (matplotlib's object API: no global pyplot state)."""
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
        ax.grid(alpha=0.3)
    fig.suptitle(title, fontsize=10)
    fig.tight_layout()
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=110)
    write_atomic(Path(path), buf.getvalue(), "training-curve figure",
                 "The SAE itself is written (sae.json, sae.safetensors); free disk space to draw the figure again")  # a full disk: one line, no traceback
    return path
