"""The option choices and defaults the verbs' parsers need, without importing the modules that define them.

Building the command line must not import pandas, numpy or pyarrow, most of a cached ``summarize``'s time: it
prints its stored text without them (docs/performance.md). Each constant here equals the library's own
(``tests/test_cli_choices.py`` checks that), which stays the source of truth.
"""

from __future__ import annotations

from profparse.outputs.views import KINDS

SUMMARY_FORMATS = ("text", "json", "csv", "markdown")  # profparse.outputs.summary.FORMATS
SUMMARY_TOP_N = 5  # profparse.outputs.summary.TOP_N
DIFF_FORMATS = ("text", "json", "markdown")  # profparse.diff.FORMATS
DIFF_TOP_N = 10  # profparse.diff.TOP_N
PLOT_KINDS = KINDS  # the views registry (importing it imports no view)
PLOT_FORMATS = ("png", "svg")  # profparse.outputs.plots.FORMATS
PLOT_MAX_PIXELS = 16_000_000  # profparse.outputs.plots.MAX_PIXELS
METRICS = ("host_wall", "host_ops", "gpu_time", "gpu_busy", "gpu_idle")  # profparse.ranks.METRICS
DEFAULT_METRIC = "host_wall"  # profparse.ranks.DEFAULT_METRIC
