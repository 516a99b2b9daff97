"""``interp report``: the whole artifact battery on one model, written as JSON, PNGs and one HTML page.

Sections (``sections.SECTIONS``, numbered alike on the page and the console): high-norm tokens (norms),
redundant patches, linear probes, LOST and register neurons from one unedited pass, then ablation against random
controls -> test-time register -> relocation onto a smiley (docs/methods.md sections 1-2). The causal stages use
the neurons the neuron study ranked; when it ranks none (no high-norm tokens), they are skipped with a note,
never invented.

Modules: ``battery`` (running the stages on one source), ``summary`` (report.json and the planted-truth
comparison), ``sections`` (the section list and the page's wording rules), ``html`` (the page).

Example (not a doctest: a report takes ~20 s; ``tests/report/test_report.py`` runs it)::

    summary = run_report()                      # the planted synthetic model on the bundled photos
    summary["planted"]["all_neurons_recovered"]  # True
"""
from .battery import DISPLAY_LIMIT, N_STAGES, BatteryResults, ReportOptions, run_battery, run_report
from .html import study_explanations, summary_rows, write_html
from .summary import SYNTHETIC_NOTE, build_summary, planted_comparison

__all__ = ["run_report", "run_battery", "ReportOptions", "BatteryResults", "write_html", "summary_rows",
           "study_explanations", "build_summary", "planted_comparison", "SYNTHETIC_NOTE", "N_STAGES",
           "DISPLAY_LIMIT"]
