"""Derived tables, computed from the linked and attributed event table.

- :mod:`~profparse.tables.rows`: the row tables (events, kernels, ops) and the column helpers they share
  (:func:`~profparse.tables.rows.nullable`, :func:`~profparse.tables.rows.stage_categorical`);
- :mod:`~profparse.tables.host_time`: host wall time per stage, split into levels;
- :mod:`~profparse.tables.gpu_time`: GPU busy, overlap and idle time per stage;
- :mod:`~profparse.tables.stage_summary`: the per step x stage summary of both;
- :mod:`~profparse.tables.registry` and :mod:`~profparse.tables.parsed`: every table's declaration, and the
  :class:`~profparse.tables.parsed.ParsedTrace` that computes them on first use.

The interval math they use lives in :mod:`profparse.base.intervals`. Nothing is re-exported here.
"""
