"""The event table's vocabulary: ``kind`` (categories of every schema era normalised, e.g. legacy ``Kernel`` and
current ``kernel`` are both ``kernel``), the NULL of its integer columns, and its ``args`` columns."""

from __future__ import annotations

import re

import numpy as np

from profparse.trace.schema import TEXT_ARG_FIELDS

NULL = np.iinfo(np.int64).min  # sentinel for a missing integer inside numpy arrays
STEP_NAME = re.compile(r"^ProfilerStep#(\d+)$")  # the profiler's step ranges

KINDS: tuple[str, ...] = (
    "cpu_op",
    "user_annotation",
    "python_function",
    "cuda_runtime",
    "cuda_driver",
    "kernel",
    "gpu_memcpy",
    "gpu_memset",
    "gpu_user_annotation",
    "cuda_sync",
    "memory",
    "instant",
    "flow_start",
    "flow_end",
    "metadata",
    "other",
)
KIND_CODE = {k: i for i, k in enumerate(KINDS)}

CATEGORY_KIND: dict[str, str] = {
    "cpu_op": "cpu_op",
    "Operator": "cpu_op",
    "user_annotation": "user_annotation",
    "python_function": "python_function",
    "cuda_runtime": "cuda_runtime",
    "Runtime": "cuda_runtime",
    "cuda_driver": "cuda_driver",
    # Kineto's other backends record their runtime and driver calls like CUDA's: their kernels link the same way
    "xpu_runtime": "cuda_runtime",
    "xpu_driver": "cuda_driver",
    "mtia_runtime": "cuda_runtime",
    "mtia_driver": "cuda_driver",
    "privateuse1_runtime": "cuda_runtime",
    "privateuse1_driver": "cuda_driver",
    "kernel": "kernel",
    "Kernel": "kernel",
    "gpu_memcpy": "gpu_memcpy",
    "Memcpy": "gpu_memcpy",
    "gpu_memset": "gpu_memset",
    "Memset": "gpu_memset",
    "gpu_user_annotation": "gpu_user_annotation",
    "cuda_sync": "cuda_sync",
}
GPU_ACTIVITY_KINDS = frozenset({"kernel", "gpu_memcpy", "gpu_memset"})
GPU_TRACK_KINDS = GPU_ACTIVITY_KINDS | {"gpu_user_annotation", "cuda_sync"}
RUNTIME_KINDS = frozenset({"cuda_runtime", "cuda_driver"})

INT_ARG_COLUMNS: tuple[tuple[str, str], ...] = (
    ("correlation", "correlation"),
    ("external_id", "external_id"),
    ("sequence_number", "sequence_number"),
    ("fwd_thread_id", "fwd_thread_id"),
    ("stream", "stream"),
    ("device", "device"),
    ("bytes", "bytes"),
    ("mem_bytes", "mem_bytes"),
    ("mem_total_allocated_bytes", "total_allocated"),
    ("mem_total_reserved_bytes", "total_reserved"),
    ("mem_device_type", "device_type"),
    ("mem_device_id", "device_id"),
    ("mem_addr", "addr"),
    ("python_id", "python_id"),
    ("python_parent_id", "python_parent_id"),
    ("comm_in_nelems", "comm_in_nelems"),
    ("comm_out_nelems", "comm_out_nelems"),
    ("comm_group_size", "comm_group_size"),
    ("comm_seq", "comm_seq"),
    ("wait_on_stream", "wait_on_stream"),
    ("wait_on_event_correlation", "wait_on_event_correlation"),
)
#: args columns in the event table only when the trace has a value (newer Kineto's ``cuda_sync`` events): the
#: tables of every other trace keep their columns
OPTIONAL_ARG_COLUMNS = frozenset({"wait_on_stream", "wait_on_event_correlation"})
#: ``args`` kept as text (schema.TEXT_ARG_FIELDS): categorical string columns of the same names, NaN where absent
TEXT_ARG_COLUMNS: tuple[str, ...] = TEXT_ARG_FIELDS
_LEGACY_RANGE = re.compile(r"^(ProfilerStep#\d+|Optimizer\.(step|zero_grad)#|enumerate\(DataLoader\)#|##)")
_PH_KIND = {
    "M": KIND_CODE["metadata"],
    "s": KIND_CODE["flow_start"],
    "f": KIND_CODE["flow_end"],
    "t": KIND_CODE["flow_end"],
    "i": KIND_CODE["instant"],
    "I": KIND_CODE["instant"],
}


def kind_codes(
    phs: list[str], cats: list[str], names: list[str], ph_code: np.ndarray, cat_code: np.ndarray, name_code: np.ndarray
) -> np.ndarray:
    """The :data:`KIND_CODE` of each event (int8), from its ``ph``, ``cat`` and ``name`` codes into ``phs``,
    ``cats`` and ``names``."""
    ph_kind = np.array([_PH_KIND.get(ph, -1) for ph in phs], dtype=np.int8)
    cat_kind = np.array([KIND_CODE[CATEGORY_KIND.get(c, "other")] for c in cats], dtype=np.int8)
    kind = ph_kind[ph_code]
    complete = kind == -1
    kind[complete] = cat_kind[cat_code[complete]]
    legacy_ops = np.array([c == "Operator" for c in cats], dtype=bool)
    if legacy_ops.any():  # 2021 traces file record_function ranges under "Operator" too
        ranges = np.array([_LEGACY_RANGE.match(n) is not None for n in names], dtype=bool)
        kind[legacy_ops[cat_code] & ranges[name_code]] = KIND_CODE["user_annotation"]
    if "[memory]" in names:
        kind[(kind == KIND_CODE["instant"]) & (name_code == names.index("[memory]"))] = KIND_CODE["memory"]
    return kind
