"""The report's sections (one list for the page, its table of contents and the console's step lines), the
reasons a section is reduced to one line, and the wording helpers the page shares: the outlier-share remark
and the small-sample flag (cosines near 1: :func:`interp.plots.common.near_one`).

>>> [f"{n}. {title}" for n, _, title in numbered()][:2]
['1. High-norm tokens (norms)', '2. Redundant patches (redundancy)']
>>> from interp.plots.common import near_one
>>> near_one(0.9999690170473705), near_one(0.9999999999999999), near_one(0.689)
('0.999969 (1 - 3.1e-05)', '1', '0.689')
"""
from __future__ import annotations

from pathlib import PurePath
from typing import Dict, List, Optional, Tuple

# (study key = the JSON file's stem, title) in page order: first what one unedited pass reads, then the edits
SECTIONS: Tuple[Tuple[str, str], ...] = (
    ("norms", "High-norm tokens (norms)"),
    ("redundancy", "Redundant patches (redundancy)"),
    ("probes", "Linear probes per token group (probes)"),
    ("lost", "LOST object discovery (lost)"),
    ("neurons", "Register neurons (neurons)"),
    ("ablate", "Ablation against random controls (ablate)"),
    ("registers", "Test-time register (registers)"),
    ("relocate", "Relocation onto a smiley (relocate)"),
)
CAUSAL = ("ablate", "registers", "relocate")  # need ranked register neurons
SMALL_SAMPLE = 10  # fewer images: every verdict is flagged as resting on a small sample
PAPERS_OUTLIER_SHARE = 0.02  # Darcet et al.: about 2 % of the tokens of a trained ViT-L are high-norm
FAR_ABOVE_PAPERS = 0.10  # an outlier share above this gets a remark (5x the papers' share)


def number_of(key: str) -> int:
    """The section number of a study key (``"neurons"`` -> 5)."""
    return [k for k, _ in SECTIONS].index(key) + 1


SKIPPED_STAGES = (f"Skipped: the ablation, the test-time register and the relocation need register neurons, and "
                  f"none were ranked (see {number_of('neurons')}.).")


def numbered() -> List[Tuple[int, str, str]]:
    """(number, key, title) of every section, numbered from 1 in page order."""
    return [(i, key, title) for i, (key, title) in enumerate(SECTIONS, start=1)]


def step_line(key: str, detail: str) -> str:
    """The console's line for a section: ``interp report [1/8] High-norm tokens (norms): <detail>``, the same
    number and title as the page's heading."""
    title = dict(SECTIONS)[key]
    return f"interp report [{number_of(key)}/{len(SECTIONS)}] {title}: {detail}"


def small_sample(n_images: int) -> bool:
    """Whether a verdict from ``n_images`` images is flagged as resting on a small sample."""
    return n_images < SMALL_SAMPLE


def outlier_share_remark(s: Dict) -> Optional[str]:
    """A remark when the share of outlier patch tokens is far above the papers' few per cent, naming the image
    with the most outliers (None when the share is not far above)."""
    share = s.get("outlier_fraction") or 0.0
    counts, grid = s.get("outlier_counts") or [], s.get("grid")
    if share <= FAR_ABOVE_PAPERS or not counts:
        return None
    top = max(range(len(counts)), key=lambda i: counts[i])
    ids = s.get("image_ids") or []
    name = PurePath(str(ids[top])).stem if top < len(ids) else f"image {top}"
    per_image = f" ({name}: {counts[top]} of {grid[0] * grid[1]} patches)" if grid else ""
    why = ("the planted register neurons fire on every flat patch by construction, so large plain areas (sky, "
           "background) are outliers" if s.get("synthetic") else
           "check the threshold (--threshold) and the detection block (--detect-layer), or whether these images "
           "have large plain areas")
    return (f"{100 * share:.2f} % of patch tokens are outliers{per_image}: far above the few per cent the papers "
            f"report for trained ViTs (about {100 * PAPERS_OUTLIER_SHARE:.0f} % in Darcet et al.); {why}.")


def one_line_reasons(s: Dict) -> Dict[str, str]:
    """Study key -> why its section says nothing on these data and is shown as one line (absent: shown)."""
    out: Dict[str, str] = dict(s.get("not_run") or {})  # a study the model cannot run: on the page with its reason
    probes = s.get("probes")
    if probes and probes.get("too_few"):
        out["probes"] = f"Not scored: {probes['too_few']} (interp report --images DIR with more images)."
    red = s.get("redundancy")
    if red and red["high_norm"]["median"] is None:
        out["redundancy"] = f"Not compared: no statistic for the high-norm tokens ({red['high_norm']['note']})."
    lost = s.get("lost")
    if lost:
        if s.get("random_weights"):
            planted = " (the planted circuit adds only high-norm tokens)" if s.get("synthetic") else ""
            out["lost"] = ("Not shown: LOST finds objects through the key correlations a trained network learns; "
                           f"{s['model']} has random weights{planted}, so its seeds and boxes are no discovery "
                           "(lost.json holds them).")
        elif lost.get("degenerate"):
            out["lost"] = f"Degenerate result, not drawn: {lost['note'].removeprefix('degenerate: ')}"
    if s.get("skipped"):  # the reason once, in the first causal section
        out.update({key: SKIPPED_STAGES if key == CAUSAL[0] else f"Skipped (see {number_of(CAUSAL[0])}.)."
                    for key in CAUSAL})
    return out


def section_index(s: Dict) -> List[Dict]:
    """report.json's ``sections``: number, key, title, whether the page shows the section in full, and why not."""
    why = one_line_reasons(s)
    return [{"number": n, "key": key, "title": title, "shown": key not in why, "why": why.get(key)}
            for n, key, title in numbered()]
