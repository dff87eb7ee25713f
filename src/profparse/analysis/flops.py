"""FLOPs and bytes of one CPU op from its recorded shapes (``Input Dims``, ``Input type``, ``Concrete Inputs``).

:func:`op_cost` is a pure function of the op's name and the three arg texts. The built-in table below covers the
matmul family, convolution, attention (forward and backward), norms, softmax, embedding, elementwise ops and
reductions, so the core works without torch; where torch is loaded (or ``PROFPARSE_TORCH_FLOPS=1``),
``torch.utils.flop_counter``'s formula is used for the ops it knows (its count wins; tests check both agree).
Conventions:

- a multiply-add is 2 FLOPs (``2*M*N*K`` for a matmul); bias adds are not counted (as in torch's counter);
- attention counts its two matmuls (``4*b*h*s_q*s_k*d``), its backward five (2.5x); causal masks are ignored;
- norms, softmax, elementwise ops and reductions count a few FLOPs per element (``VECTOR_FLOPS``); their
  cost is mostly bytes: inputs read plus output written (output = the broadcast of the inputs, or the first
  input for in-place ops);
- ops whose shapes do not fit the formula get no cost (``None``): the caller lists them as not counted.
"""

from __future__ import annotations

import json
import math
import os
import re
import sys
from dataclasses import dataclass, replace
from functools import lru_cache
from typing import Any

DTYPE_BYTES: dict[str, int] = {
    "double": 8,
    "float": 4,
    "c10::Half": 2,
    "c10::BFloat16": 2,
    "c10::Float8_e4m3fn": 1,
    "c10::Float8_e5m2": 1,
    "c10::Float8_e4m3fnuz": 1,
    "c10::Float8_e5m2fnuz": 1,
    "long int": 8,
    "int": 4,
    "short int": 2,
    "signed char": 1,
    "unsigned char": 1,
    "bool": 1,
    "c10::complex<float>": 8,
    "c10::complex<double>": 16,
}
PEAK_DTYPE: dict[str, str] = {  # Kineto's type name -> the peak table's dtype key
    "double": "fp64",
    "float": "fp32",
    "c10::Half": "fp16",
    "c10::BFloat16": "bf16",
    "c10::Float8_e4m3fn": "fp8",
    "c10::Float8_e5m2": "fp8",
    "c10::Float8_e4m3fnuz": "fp8",
    "c10::Float8_e5m2fnuz": "fp8",
    "signed char": "int8",
}
VECTOR_FLOPS: dict[str, int] = {  # rough FLOPs per element of the (main) input
    "layer_norm": 7,  # mean, subtract, square, sum, scale by rstd, weight, bias
    "native_layer_norm": 7,
    "native_layer_norm_backward": 14,
    "rms_norm": 4,  # square, sum, scale by rstd, weight
    "_fused_rms_norm": 4,
    "_fused_rms_norm_backward": 8,
    "softmax": 5,  # max, subtract, exp, sum, divide
    "_softmax": 5,
    "log_softmax": 5,
    "_log_softmax": 5,
    "_softmax_backward_data": 4,
    "_log_softmax_backward_data": 4,
    "native_batch_norm": 7,
    "batch_norm": 7,
    "native_batch_norm_backward": 14,
}
COPIES = frozenset({"copy_", "fill_", "zero_", "clone", "contiguous", "_to_copy", "to", "masked_fill_", "index_put_"})
ELEMENTWISE = frozenset(
    "add sub mul div neg abs exp log sqrt rsqrt pow sigmoid tanh relu gelu silu clamp clamp_min clamp_max "
    "threshold_backward gelu_backward silu_backward sigmoid_backward tanh_backward where masked_fill lerp addcmul "
    "addcdiv reciprocal sign square erf native_dropout native_dropout_backward dropout hardtanh leaky_relu mse_loss "
    "mse_loss_backward maximum minimum eq ne lt le gt ge cos sin".split()
)
VIEWS = frozenset(  # no arithmetic and no data moved (metadata, allocation without writing)
    "view reshape _reshape_alias _unsafe_view t transpose permute expand as_strided unsqueeze squeeze slice select "
    "split split_with_sizes chunk narrow flatten unflatten detach alias empty empty_like empty_strided resize_ "
    "lift_fresh result_type unbind numpy_T".split()
)
GATHER_SCATTER = frozenset(  # bytes ~ read and write the largest argument once; one FLOP per element of it
    "nll_loss_backward embedding_dense_backward embedding_backward index_select gather scatter_add_ index_add_ "
    "max_pool2d_with_indices max_pool2d_with_indices_backward avg_pool2d avg_pool2d_backward adaptive_avg_pool2d "
    "_adaptive_avg_pool2d _adaptive_avg_pool2d_backward".split()
)
REDUCTIONS = frozenset("sum mean amax amin max min norm linalg_vector_norm var std argmax prod nll_loss".split())
ATTENTION_FWD = {  # name -> layout of q/k/v: "bhsd" or "bshd" (flash/efficient kernels take batch, seq, heads, dim)
    "scaled_dot_product_attention": "bhsd",
    "_scaled_dot_product_attention_math": "bhsd",
    "_scaled_dot_product_flash_attention": "bhsd",
    "_scaled_dot_product_flash_attention_for_cpu": "bhsd",
    "_scaled_dot_product_efficient_attention": "bhsd",
    "_scaled_dot_product_cudnn_attention": "bhsd",
    "_flash_attention_forward": "bshd",
    "_efficient_attention_forward": "bshd",
}
ATTENTION_BWD = {
    "_scaled_dot_product_flash_attention_backward": "bhsd",
    "_scaled_dot_product_flash_attention_for_cpu_backward": "bhsd",
    "_scaled_dot_product_efficient_attention_backward": "bhsd",
    "_scaled_dot_product_cudnn_attention_backward": "bhsd",
    "_flash_attention_backward": "bshd",
    "_efficient_attention_backward": "bshd",
}
# convolution ops: positions of (bias, stride, padding, dilation, transposed, groups) in their arguments, -1 = none
CONV_ARGS: dict[str, tuple[int, int, int, int, int, int]] = {
    "conv1d": (2, 3, 4, 5, -1, 6),
    "conv2d": (2, 3, 4, 5, -1, 6),
    "conv3d": (2, 3, 4, 5, -1, 6),
    "convolution": (2, 3, 4, 5, 6, 8),
    "_convolution": (2, 3, 4, 5, 6, 8),
    "convolution_overrideable": (2, 3, 4, 5, 6, 8),
    "cudnn_convolution": (-1, 3, 2, 4, -1, 5),
    "miopen_convolution": (2, 4, 3, 5, -1, 6),
    "mkldnn_convolution": (2, 4, 3, 5, -1, 6),
}


@dataclass(frozen=True)
class OpCost:
    """What one op computes: FLOPs, bytes moved, the dtype that decides its peak, and its formula family."""

    flops: int
    bytes: int
    dtype: str  # peak table key (fp32, bf16, ...); "" when unknown
    family: str  # matmul, conv, attention, norm, softmax, embedding, elementwise, reduction, gather, view
    backward: bool = False
    source: str = "builtin"  # or "torch" (torch.utils.flop_counter's formula)


def base_name(name: str) -> str:
    """``aten::mm`` -> ``mm``; other namespaces are kept (``my_lib::op``)."""
    return name[6:] if name.startswith("aten::") else name


def parse_args(text: Any) -> list[Any]:
    """The JSON text of an arg list (``[[64], [128, 64]]``), or ``[]`` when missing or malformed."""
    if not isinstance(text, str) or not text:
        return []
    try:
        value = json.loads(text)
    except ValueError:
        return []
    return value if isinstance(value, list) else []


def _ints(value: Any) -> list[int] | None:
    """A shape or an int list (from dims or from a concrete text like ``"[1, 1]"``), else None."""
    if isinstance(value, str):
        value = parse_args(value) if value.startswith("[") else None
    if isinstance(value, list) and all(isinstance(v, int) and not isinstance(v, bool) for v in value):
        return value
    return None


def _bools(text: Any) -> list[bool] | None:
    """A Python bool list as Kineto writes it (``"[False, True, True]"``), else None."""
    if not isinstance(text, str) or not text.startswith("["):
        return None
    items = [item.strip() for item in text.strip("[]").split(",")]
    return [item == "True" for item in items] if all(i in ("True", "False") for i in items) else None


def _numel(shape: list[int]) -> int:
    return math.prod(shape)


def _size(t: str) -> int:
    return DTYPE_BYTES.get(t, 4)


def _tensors(dims: list[Any], types: list[Any]) -> list[tuple[list[int], str]]:
    """The (shape, type) of each plain tensor argument (TensorLists flattened; scalars and None left out)."""
    out = []
    for i, shape in enumerate(dims):
        t = types[i] if i < len(types) and isinstance(types[i], str) else ""
        if t in ("", "Scalar", "ScalarList", "GenericList", "None") or (shape == [] and t not in DTYPE_BYTES):
            continue  # scalars and lists (legacy traces name them Int, Bool, Double, with dims [])
        if t == "TensorList" and isinstance(shape, list):
            out.extend((s, "") for s in shape if _ints(s) is not None)
        elif _ints(shape) is not None:
            out.append((shape, t))
    return out


def dominant_dtype(types: list[Any]) -> str:
    """The peak-table dtype of the first floating tensor argument ("" when none)."""
    for t in types:
        if isinstance(t, str) and t in PEAK_DTYPE and t != "signed char":
            return PEAK_DTYPE[t]
    return next((PEAK_DTYPE[t] for t in types if isinstance(t, str) and t in PEAK_DTYPE), "")


def _matmul(a: list[int], b: list[int]) -> tuple[int, list[int]] | None:
    """FLOPs and output shape of ``torch.matmul(a, b)`` (1-D operands and batch broadcasting included)."""
    if not a or not b:
        return None
    a2, b2 = ([1, *a] if len(a) == 1 else a), ([*b, 1] if len(b) == 1 else b)
    m, k, k2, n = a2[-2], a2[-1], b2[-2], b2[-1]
    if k != k2:
        return None
    batch = _broadcast(a2[:-2], b2[:-2])
    if batch is None:
        return None
    out = [*batch, *([m] if len(a) > 1 else []), *([n] if len(b) > 1 else [])]
    return 2 * _numel(batch) * m * n * k, out


def _broadcast(a: list[int], b: list[int]) -> list[int] | None:
    out = []
    for x, y in zip([1] * (len(b) - len(a)) + a, [1] * (len(a) - len(b)) + b, strict=True):
        if x != y and 1 not in (x, y):
            return None
        out.append(max(x, y))
    return out


def _matmul_cost(name: str, shapes: list[list[int]], t: str) -> tuple[int, int] | None:
    """FLOPs and bytes of mm, addmm, bmm, baddbmm, matmul, linear."""
    read = sum(_numel(s) for s in shapes)  # every input, the bias of addmm/linear included
    if name in ("addmm", "baddbmm", "addbmm") and len(shapes) >= 3:
        shapes = shapes[1:3]
    if name == "linear" and len(shapes) >= 2:
        x, w = shapes[0], shapes[1]
        if len(w) != 2 or not x or x[-1] != w[1]:
            return None
        out = [*x[:-1], w[0]]
        flops = 2 * _numel(x[:-1]) * w[0] * w[1]
    elif len(shapes) >= 2:
        a, b = shapes[0], shapes[1]
        if name in ("mm", "addmm") and (len(a) != 2 or len(b) != 2):
            return None
        if name in ("bmm", "baddbmm") and (len(a) != 3 or len(b) != 3 or a[0] != b[0]):
            return None
        found = _matmul(a, b)
        if found is None:
            return None
        flops, out = found
    else:
        return None
    return flops, (read + _numel(out)) * _size(t)


def _conv_geometry(
    name: str, dims: list[Any], concrete: list[Any]
) -> tuple[list[int], list[int], list[int], bool] | None:
    """Input, weight and output shapes of a forward convolution, and whether it is transposed."""
    x, w = (_ints(dims[0]), _ints(dims[1])) if len(dims) >= 2 else (None, None)
    _, s_at, p_at, d_at, tr_at, _ = CONV_ARGS.get(name, CONV_ARGS["convolution"])
    if not x or not w or len(x) != len(w) or len(x) < 3 or len(concrete) <= max(s_at, p_at):
        return None  # without ``Concrete Inputs`` (traces before 2022) stride and padding are unknown
    nd = len(x) - 2

    def arg(at: int, default: int) -> list[int]:
        found = _ints(concrete[at]) if 0 <= at < len(concrete) else None
        found = found or [default]  # "valid" (and missing) padding is 0; "same" is handled below
        return found * nd if len(found) == 1 else found

    stride, padding, dilation = arg(s_at, 1), arg(p_at, 0), arg(d_at, 1)
    transposed = 0 <= tr_at < len(concrete) and concrete[tr_at] in ("True", "1", "true")
    geometry = zip(x[2:], stride, padding, dilation, w[2:], strict=False)
    if transposed:
        spatial = [(i - 1) * s - 2 * p + d * (k - 1) + 1 for i, s, p, d, k in geometry]
        out = [x[0], w[1], *spatial]
    elif 0 <= p_at < len(concrete) and concrete[p_at] == "same":
        out = [x[0], w[0], *x[2:]]
    else:
        out = [x[0], w[0], *[(i + 2 * p - d * (k - 1) - 1) // s + 1 for i, s, p, d, k in geometry]]
    return (x, w, out, transposed) if min(out) > 0 else None


def conv_output_shape(name: str, dims: list[Any], concrete: list[Any]) -> list[int] | None:
    """The output shape of a forward convolution (torch's formula needs it; the trace does not record it)."""
    found = _conv_geometry(base_name(name), dims, concrete)
    return found[2] if found else None


def _conv_cost(name: str, dims: list[Any], concrete: list[Any], t: str) -> tuple[int, int] | None:
    """FLOPs and bytes of a forward convolution (torch's count: ``2 * N * out_spatial * C_out * C_in/g * k``;
    a transposed one counts over the input's spatial size, as torch does)."""
    found = _conv_geometry(name, dims, concrete)
    if found is None:
        return None
    x, w, out, transposed = found
    spatial = x[2:] if transposed else out[2:]
    flops = 2 * x[0] * _numel(spatial) * _numel(w[2:]) * w[0] * w[1]
    return flops, (_numel(x) + _numel(w) + _numel(out)) * _size(t)


def _conv_backward_cost(dims: list[Any], concrete: list[Any], t: str) -> tuple[int, int] | None:
    """``convolution_backward(grad_out, input, weight, ..., output_mask)``: one forward's FLOPs per gradient."""
    if len(dims) < 3:
        return None
    forward = _conv_cost("convolution", [dims[1], dims[2]], ["", "", "", *concrete[4:10]], t)  # its layout
    if forward is None:
        return None
    mask = _bools(concrete[10]) if len(concrete) > 10 else None
    grads = sum(mask[:2]) if mask else 2  # grad_input, grad_weight (the bias gradient is a reduction)
    g, x, w = (_ints(d) or [] for d in dims[:3])
    return forward[0] * grads, (2 * _numel(g) + _numel(x) + 2 * _numel(w)) * _size(t)


def _attention_cost(layout: str, shapes: list[list[int]], t: str, backward: bool) -> tuple[int, int] | None:
    """Attention: the ``q @ k^T`` and ``p @ v`` matmuls forward; five matmuls backward (torch's count)."""
    qkv = shapes[1:4] if backward else shapes[:3]
    if len(qkv) < 3 or any(len(s) != 4 for s in qkv):
        return None
    q, k, v = ([s[0], s[2], s[1], s[3]] if layout == "bshd" else s for s in qkv)
    b, h, s_q, d_q = q
    s_k, d_v = k[2], v[3]
    if k[0] != b or v[0] != b or k[3] != d_q or v[2] != s_k or k[1] == 0 or h % k[1]:
        return None
    forward = 2 * b * h * s_q * s_k * d_q + 2 * b * h * s_q * s_k * d_v
    flops = 2 * b * h * s_q * s_k * d_q + 4 * b * h * s_q * s_k * d_v + 4 * b * h * s_q * s_k * d_q
    flops = flops if backward else forward
    moved = sum(_numel(s) for s in qkv) + b * h * s_q * d_v  # q, k, v read, out written
    return flops, (2 * moved if backward else moved) * _size(t)


def foreach_base(name: str) -> str | None:
    """The per-tensor op of a ``_foreach_*`` op (``_foreach_addcdiv_`` -> ``addcdiv_``) when the built-in table
    has an elementwise, copy or reduction formula for it, else None."""
    base = base_name(name)
    if not base.startswith("_foreach_"):
        return None
    op = base.removeprefix("_foreach_")
    plain = op.removesuffix("_")
    return op if plain in ELEMENTWISE or op in COPIES or plain in REDUCTIONS else None


def _foreach_cost(op: str, dims: list[Any], types: list[Any]) -> OpCost | None:
    """A ``_foreach_*`` op (the optimizers' multi-tensor kernels): its per-tensor op over every tensor of its first
    list, as that op's formula counts one tensor. The lists record no element type: 4 bytes (fp32) assumed."""
    lists = [[s for s in d if _ints(s)] for d, t in zip(dims, types, strict=False) if t == "TensorList"]
    if not lists or not lists[0]:
        return None  # shapes not recorded (long lists are written as [])
    first = sum(_numel(s) for s in lists[0])
    read = sum(_numel(s) for shapes in lists for s in shapes)
    plain = op.removesuffix("_")
    if plain in REDUCTIONS:  # _foreach_norm: one scalar out per tensor
        return OpCost(first, 4 * read, "", "reduction")
    flops = 0 if op in COPIES else first
    return OpCost(flops, 4 * ((0 if op in ("fill_", "zero_") else read) + first), "", "elementwise")


def _vector_cost(name: str, dims: list[Any], types: list[Any]) -> OpCost | None:
    """Norms, softmax, embedding, elementwise ops and reductions: bytes, and a few FLOPs per element."""
    if name in VIEWS:
        return OpCost(0, 0, dominant_dtype(types), "view")
    foreach = foreach_base(name)
    if foreach is not None:
        return _foreach_cost(foreach, dims, types)
    tensors = _tensors(dims, types)
    if not tensors:
        return None
    shape, t = tensors[0]
    size = _size(t)
    dtype = dominant_dtype(types)
    read = sum(_numel(s) * _size(tt or t) for s, tt in tensors)
    if name == "embedding" and len(tensors) >= 2:  # rows gathered: read and written once each, plus the indices
        weight, indices = tensors[0][0], tensors[1][0]
        return OpCost(0, 2 * _numel(indices) * weight[-1] * size + _numel(indices) * 8, dtype, "embedding")
    if name in VECTOR_FLOPS:
        family = "softmax" if "softmax" in name else "norm"
        return OpCost(
            VECTOR_FLOPS[name] * _numel(shape),
            read + _numel(shape) * size,
            dtype,
            family,
            name.endswith(("_backward", "_backward_data")),
        )
    if name.endswith("_") and name[:-1] in ELEMENTWISE or name in COPIES:
        out = _numel(shape) * size  # in place (or a copy): writes its first argument's size
        flops = 0 if name in COPIES else _numel(shape)
        return OpCost(flops, (read if name not in ("fill_", "zero_") else 0) + out, dtype, "elementwise")
    if name in ELEMENTWISE:
        out_shape: list[int] | None = []
        for s, _ in tensors:
            out_shape = _broadcast(out_shape, s) if out_shape is not None else None
        if out_shape is None:
            return None
        return OpCost(
            _numel(out_shape), read + _numel(out_shape) * size, dtype, "elementwise", name.endswith("_backward")
        )
    if name in REDUCTIONS:
        return OpCost(_numel(shape), read, dtype, "reduction")
    if name in GATHER_SCATTER:
        largest = max(tensors, key=lambda st: _numel(st[0]))
        return OpCost(_numel(largest[0]), 2 * _numel(largest[0]) * size, dtype, "gather", "backward" in name)
    return None


def has_formula(name: str) -> bool:
    """Whether the built-in table has a formula for op ``name`` (its shapes may still not fit it)."""
    name = base_name(name)
    known = (
        VECTOR_FLOPS,
        COPIES,
        ELEMENTWISE,
        REDUCTIONS,
        ATTENTION_FWD,
        ATTENTION_BWD,
        CONV_ARGS,
        VIEWS,
        GATHER_SCATTER,
    )
    matmul = ("mm", "addmm", "bmm", "baddbmm", "matmul", "linear", "convolution_backward", "embedding")
    in_place = name.endswith("_") and name[:-1] in ELEMENTWISE
    return name in matmul or any(name in table for table in known) or in_place or foreach_base(name) is not None


def builtin_cost(name: str, dims: list[Any], types: list[Any], concrete: list[Any]) -> OpCost | None:
    """The built-in table's cost of op ``name`` (``aten::`` prefix optional), or None without a formula."""
    name = base_name(name)
    dtype = dominant_dtype(types)
    t = next((x for x in types if isinstance(x, str) and PEAK_DTYPE.get(x) == dtype), "float") if dtype else "float"
    if name in ("mm", "addmm", "bmm", "baddbmm", "matmul", "linear"):
        shapes = [s for s, _ in _tensors(dims, types)]
        found = _matmul_cost(name, shapes, t)
        return OpCost(found[0], found[1], dtype, "matmul") if found else None
    if name in CONV_ARGS:
        found = _conv_cost(name, dims, concrete, t)
        return OpCost(found[0], found[1], dtype, "conv") if found else None
    if name == "convolution_backward":
        found = _conv_backward_cost(dims, concrete, t)
        return OpCost(found[0], found[1], dtype, "conv", True) if found else None
    if name in ATTENTION_FWD or name in ATTENTION_BWD:
        backward = name in ATTENTION_BWD
        shapes = [_ints(d) or [] for d in dims]
        found = _attention_cost((ATTENTION_BWD if backward else ATTENTION_FWD)[name], shapes, t, backward)
        return OpCost(found[0], found[1], dtype, "attention", backward) if found else None
    return _vector_cost(name, dims, types)


TORCH_ENV = "PROFPARSE_TORCH_FLOPS"  # "1": import torch for its formulas even when the process has not loaded it


def _torch_registry() -> dict[str, Any]:
    """torch's flop formulas by aten name (those that take shapes); {} without torch.

    Used when torch is already loaded (a notebook, a training script) or ``PROFPARSE_TORCH_FLOPS=1``: importing
    torch only for this costs 5-15 s per CLI run, and the built-in table gives the same counts (tests check it)."""
    if "torch" not in sys.modules and os.environ.get(TORCH_ENV) != "1":
        return {}
    return _load_torch_registry()


@lru_cache(maxsize=1)
def _load_torch_registry() -> dict[str, Any]:
    try:
        from torch.utils.flop_counter import flop_registry
    except Exception:  # torch absent or broken: the built-in table stands alone
        return {}
    out = {}
    for target, formula in flop_registry.items():
        name = getattr(target, "__name__", "")
        if name and getattr(formula, "__wrapped__", None) is not None:  # shape_wrapper-ed: takes shapes
            out[name] = formula
    return out


TORCH_TENSOR_ARGS = {"mm": 2, "bmm": 2, "addmm": 3, "baddbmm": 3}  # torch's matmul formulas take only the tensors


def torch_flops(name: str, dims: list[Any], concrete: list[Any]) -> int | None:
    """FLOPs by ``torch.utils.flop_counter``'s formula for ``name`` (None: no torch, no formula, shapes unfit)."""
    name = base_name(name)
    formula = _torch_registry().get(name)
    if formula is None:
        return None
    padded = [*concrete, *[""] * len(dims)]
    args: list[Any] = [
        _ints(d) or (parse_args(c) if c.startswith("[") else c) for d, c in zip(dims, padded, strict=False)
    ]
    args = args[: TORCH_TENSOR_ARGS.get(name, len(args))]
    out_shape = conv_output_shape(name, dims, concrete) if name in CONV_ARGS else None
    if name in ("convolution", "_convolution", "convolution_overrideable") and len(args) > 6:
        args[6] = args[6] in ("True", "1")  # transposed
    if name == "convolution_backward" and len(args) > 10:
        args[7], args[10] = args[7] in ("True", "1"), _bools(concrete[10])
        args, out_shape = args[:11], [args[1], args[2], None]  # its outputs: grad_input, grad_weight, grad_bias
    try:
        value = formula(*args, out_val=out_shape)
    except Exception:  # a formula that rejects these shapes (asserts, unpacking): no torch count
        return None
    return int(value) if isinstance(value, int) else None


def op_cost(name: str, dims_text: Any, types_text: Any, concrete_text: Any, use_torch: bool = True) -> OpCost | None:
    """The cost of one op from its arg texts; torch's FLOPs replace the built-in ones where torch has a formula."""
    dims, types, concrete = parse_args(dims_text), parse_args(types_text), parse_args(concrete_text)
    cost = builtin_cost(name, dims, types, concrete)
    if cost is None or not use_torch or cost.family not in ("matmul", "conv", "attention"):
        return cost
    flops = torch_flops(name, dims, [c if isinstance(c, str) else "" for c in concrete])
    return cost if flops is None else replace(cost, flops=flops, source="torch")


BACKWARD_NODE = re.compile(r"^(?:autograd::engine::evaluate_function: )?(\w+?)Backward\d*$")
MATMUL_BACKWARD_FACTOR = 2.0  # a matmul's backward computes two matmuls of the forward's size
ATTENTION_BACKWARD_FACTOR = 2.5  # five matmuls against the forward's two


def backward_factor(family: str) -> float:
    """Backward FLOPs per forward FLOP for a linked autograd node whose own ops recorded no shapes."""
    return ATTENTION_BACKWARD_FACTOR if family == "attention" else MATMUL_BACKWARD_FACTOR


TENSOR_FAMILIES = frozenset({"matmul", "conv", "attention"})  # tensor-core work: counted at the innermost such op


def gemm_dims(name: str, dims_text: Any, types_text: Any) -> tuple[int, int, int, int] | None:
    """(batch, M, N, K) of a matmul-family op from its recorded shapes, or None."""
    name = base_name(name)
    shapes = [s for s, _ in _tensors(parse_args(dims_text), parse_args(types_text))]
    if name in ("addmm", "baddbmm", "addbmm") and len(shapes) >= 3:
        shapes = shapes[1:3]
    if len(shapes) < 2 or not shapes[0] or not shapes[1]:
        return None
    a, b = shapes[0], shapes[1]
    if name == "linear":
        return (1, _numel(a[:-1]), b[0], a[-1]) if len(b) == 2 and a[-1] == b[1] else None
    a2, b2 = ([1, *a] if len(a) == 1 else a), ([*b, 1] if len(b) == 1 else b)
    batch = _broadcast(a2[:-2], b2[:-2])
    if batch is None or a2[-1] != b2[-2]:
        return None
    return _numel(batch), a2[-2], b2[-1], a2[-1]
