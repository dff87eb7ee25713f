"""Analyses on a parsed trace, one module each; results are DataFrames (internal ``NULL`` sentinels).

- :mod:`~profparse.analysis.load`: loading sub-steps (rules in :mod:`~profparse.analysis.load_rules`);
- :mod:`~profparse.analysis.levels`: the stage x level matrix (Python, ops, runtime, device, launch latency);
- :mod:`~profparse.analysis.modules`: forward/backward time per ``nn.Module`` instance;
- :mod:`~profparse.analysis.memory`: allocator timeline and memory per stage and step;
- :mod:`~profparse.analysis.runtime`: runtime/driver calls per stage and step;
- :mod:`~profparse.analysis.comm`: collectives and exposed communication per stage and step;
- :mod:`~profparse.analysis.efficiency`: FLOPs per op (formulas in :mod:`~profparse.analysis.flops`), achieved
  TFLOP/s, MFU/HFU per step x stage and module (peaks in :mod:`~profparse.analysis.peaks`), GEMM shapes.

:class:`Analyses` computes each on first use and keeps it; ``ParsedTrace`` exposes the public (nullable) versions
and the Parquet writer the internal ones.
"""

from __future__ import annotations

from functools import cached_property
from typing import Any

import numpy as np
import pandas as pd

from profparse.trace.events import NULL

TABLES = (
    "load_breakdown",
    "stage_levels",
    "modules",
    "memory",
    "memory_by_stage",
    "runtime_calls",
    "collectives",
    "comm_exposure",
    "flops",
    "efficiency",
    "gemms",
)


class Analyses:
    """The analysis tables of one :class:`~profparse.api.ParsedTrace`, computed lazily."""

    def __init__(self, parsed: Any) -> None:
        self.parsed = parsed

    @property
    def _inputs(self) -> tuple[pd.DataFrame, Any, Any]:
        return self.parsed.raw.events, self.parsed.links, self.parsed.attribution

    @cached_property
    def substeps(self) -> Any:
        from profparse.analysis.load import load_substeps

        return load_substeps(*self._inputs)

    @cached_property
    def load_breakdown(self) -> pd.DataFrame:
        from profparse.analysis.load import load_breakdown

        return load_breakdown(*self._inputs, self.substeps)

    @cached_property
    def stage_levels(self) -> pd.DataFrame:
        from profparse.analysis.levels import stage_levels

        summary = self.parsed.stage_summary.copy(deep=False)
        if isinstance(summary["step"].dtype, pd.Int64Dtype):
            summary["step"] = summary["step"].fillna(NULL).to_numpy(dtype=np.int64)
        return stage_levels(*self._inputs, summary, self.parsed._host_time)

    @cached_property
    def modules(self) -> pd.DataFrame:
        from profparse.analysis.modules import module_table

        return module_table(*self._inputs)

    @cached_property
    def memory(self) -> pd.DataFrame:
        from profparse.analysis.memory import memory_timeline

        return memory_timeline(*self._inputs)

    @cached_property
    def memory_by_stage(self) -> pd.DataFrame:
        from profparse.analysis.memory import memory_by_stage

        return memory_by_stage(self.memory)

    @cached_property
    def runtime_calls(self) -> pd.DataFrame:
        from profparse.analysis.runtime import runtime_calls

        return runtime_calls(*self._inputs, self.parsed._stage_summary)

    @cached_property
    def collectives(self) -> pd.DataFrame:
        from profparse.analysis.comm import collectives

        return collectives(*self._inputs, self.parsed.header)

    @cached_property
    def comm_exposure(self) -> pd.DataFrame:
        from profparse.analysis.comm import comm_exposure

        return comm_exposure(self.parsed.raw.events, self.collectives, self.parsed.attribution)

    @cached_property
    def flop_counts(self) -> Any:
        from profparse.analysis.efficiency import count_flops

        return count_flops(*self._inputs)

    @cached_property
    def flops(self) -> pd.DataFrame:
        from profparse.analysis.efficiency import flop_table

        return flop_table(*self._inputs, self.flop_counts)

    @cached_property
    def peak(self) -> Any:
        """The peak MFU is measured against (``options["peak_tflops"]`` overrides the device table)."""
        from profparse.analysis.efficiency import choose_peak

        override = self.parsed.options.get("peak_tflops")
        return choose_peak(self.parsed.header, self.parsed.raw.events, self.flops, override)

    @cached_property
    def efficiency(self) -> pd.DataFrame:
        from profparse.analysis.efficiency import efficiency_table

        return efficiency_table(self.parsed, self.flops, self.peak)

    @cached_property
    def gemms(self) -> pd.DataFrame:
        from profparse.analysis.efficiency import gemm_table

        return gemm_table(self.parsed.raw.events, self.flops, self.peak)

    def tables(self) -> dict[str, pd.DataFrame]:
        """Every analysis table by name (internal NULL sentinels), for writers."""
        return {name: getattr(self, name) for name in TABLES}

    def add_substage(self, events: pd.DataFrame) -> pd.DataFrame:
        """``events`` (one row per raw event, in order) with ``substage`` and ``substage_rule`` columns added."""
        out = events.copy(deep=False)
        substage = self.substeps.substage_column()
        rule = self.substeps.rule_column()
        raw_index = self.parsed.raw.events["trace_index"].to_numpy()
        index = out["trace_index"].to_numpy()
        if len(index) != len(raw_index) or not np.array_equal(index, raw_index):
            pos = np.searchsorted(raw_index, index)
            substage, rule = substage[pos], rule[pos]
        out["substage"] = substage
        out["substage_rule"] = rule
        return out


__all__ = ["Analyses", "TABLES"]
