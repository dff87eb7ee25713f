"""Analyses on a parsed trace, one module each; results are DataFrames (internal ``NULL`` sentinels).

- :mod:`~profparse.analysis.load`: loading sub-steps (rules in :mod:`~profparse.analysis.load_rules`);
- :mod:`~profparse.analysis.levels`: the stage x level matrix (Python, ops, runtime, device, launch latency);
- :mod:`~profparse.analysis.modules`: forward/backward time per ``nn.Module`` instance;
- :mod:`~profparse.analysis.memory`: allocator timeline and memory per stage and step;
- :mod:`~profparse.analysis.runtime`: runtime/driver calls per stage and step;
- :mod:`~profparse.analysis.comm`: collectives and exposed communication per stage and step;
- :mod:`~profparse.analysis.efficiency`: FLOPs per op (formulas in :mod:`~profparse.analysis.flops`), achieved
  TFLOP/s, MFU/HFU per step x stage and module (peaks in :mod:`~profparse.analysis.peaks`), GEMM shapes.

Each table is declared in :data:`profparse.tables.registry.TABLES` (its function and what it needs), and
:class:`~profparse.tables.parsed.ParsedTrace` computes it on first use.
"""
