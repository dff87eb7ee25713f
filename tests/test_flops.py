"""FLOPs and bytes of known shapes, computed by hand; torch's formulas agree; the peak table matches Kineto's names."""

from __future__ import annotations

import json

import pytest

from profparse.analysis.flops import builtin_cost, has_formula, op_cost, torch_flops
from profparse.analysis.peaks import PEAKS, find_peak

BF16, F32 = "c10::BFloat16", "float"


def cost(name, dims, types, concrete=None, use_torch=False):
    concrete = concrete if concrete is not None else [""] * len(dims)
    return op_cost(name, json.dumps(dims), json.dumps(types), json.dumps(concrete), use_torch=use_torch)


# (name, dims, types, concrete, FLOPs by hand, bytes by hand)
KNOWN = [
    ("aten::mm", [[64, 32], [32, 16]], [F32, F32], None, 2 * 64 * 32 * 16, (64 * 32 + 32 * 16 + 64 * 16) * 4),
    (
        "aten::addmm",
        [[1000], [512, 512], [512, 1000], [], []],
        [BF16, BF16, BF16, "Scalar", "Scalar"],
        ["", "", "", "1", "1"],
        2 * 512 * 512 * 1000,
        (1000 + 512 * 512 + 512 * 1000 + 512 * 1000) * 2,  # bias read too
    ),
    ("aten::bmm", [[4, 8, 16], [4, 16, 32]], [F32, F32], None, 2 * 4 * 8 * 16 * 32, (512 + 2048 + 1024) * 4),
    (
        "aten::baddbmm",
        [[4, 8, 32], [4, 8, 16], [4, 16, 32], [], []],
        [F32, F32, F32, "Scalar", "Scalar"],
        ["", "", "", "1", "1"],
        2 * 4 * 8 * 16 * 32,
        (1024 + 512 + 2048 + 1024) * 4,
    ),
    # matmul broadcasts a 3-D activation against a 2-D weight: batch 2 x 10 rows
    ("aten::matmul", [[2, 10, 64], [64, 32]], [F32, F32], None, 2 * 20 * 64 * 32, (1280 + 2048 + 640) * 4),
    ("aten::matmul", [[64], [64, 32]], [F32, F32], None, 2 * 64 * 32, (64 + 2048 + 32) * 4),
    ("aten::linear", [[2, 10, 64], [32, 64], [32]], [F32, F32, F32], None, 2 * 20 * 64 * 32, None),
    # ResNet's first conv: 224x224, 7x7, stride 2, pad 3 -> 112x112
    (
        "aten::convolution",
        [[8, 3, 224, 224], [64, 3, 7, 7], [], [], [], [], [], [], []],
        [BF16, BF16, "", "ScalarList", "ScalarList", "ScalarList", "Scalar", "ScalarList", "Scalar"],
        ["", "", "", "[2, 2]", "[3, 3]", "[1, 1]", "False", "[0, 0]", "1"],
        2 * 8 * 112 * 112 * 64 * 3 * 7 * 7,
        (8 * 3 * 224 * 224 + 64 * 3 * 49 + 8 * 64 * 112 * 112) * 2,
    ),
    # miopen_convolution puts padding before stride
    (
        "aten::miopen_convolution",
        [[8, 3, 224, 224], [64, 3, 7, 7], [], [], [], [], [], [], []],
        [BF16, BF16, "", "ScalarList", "ScalarList", "ScalarList", "Scalar", "Scalar", "Scalar"],
        ["", "", "", "[3, 3]", "[2, 2]", "[1, 1]", "1", "False", "True"],
        2 * 8 * 112 * 112 * 64 * 3 * 7 * 7,
        None,
    ),
    # grouped 3x3, stride 1, pad 1: C_in per group = weight's dim 1
    (
        "aten::conv2d",
        [[2, 32, 16, 16], [32, 8, 3, 3], [], [], [], [], []],
        [F32, F32, "", "ScalarList", "ScalarList", "ScalarList", "Scalar"],
        ["", "", "", "[1, 1]", "[1, 1]", "[1, 1]", "4"],
        2 * 2 * 16 * 16 * 32 * 8 * 9,
        None,
    ),
    # only grad_weight asked for: one forward's FLOPs
    (
        "aten::convolution_backward",
        [[8, 64, 112, 112], [8, 3, 224, 224], [64, 3, 7, 7], [], [], [], [], [], [], [], []],
        [
            BF16,
            BF16,
            BF16,
            "ScalarList",
            "ScalarList",
            "ScalarList",
            "ScalarList",
            "Scalar",
            "ScalarList",
            "Scalar",
            "",
        ],
        ["", "", "", "[0]", "[2, 2]", "[3, 3]", "[1, 1]", "False", "[0, 0]", "1", "[False, True, False]"],
        2 * 8 * 112 * 112 * 64 * 3 * 7 * 7,
        None,
    ),
    # attention: b=2, h=4, s=16, d=8: q@k^T and p@v, 2*b*h*s*s*d each
    (
        "aten::_scaled_dot_product_efficient_attention",
        [[2, 4, 16, 8], [2, 4, 16, 8], [2, 4, 16, 8], [], [], []],
        [F32, F32, F32, "", "Scalar", "Scalar"],
        ["", "", "", "", "False", "0."],
        2 * (2 * 2 * 4 * 16 * 16 * 8),
        4 * 2 * 4 * 16 * 8 * 4,
    ),
    (
        "aten::_scaled_dot_product_flash_attention_for_cpu",
        [[2, 4, 16, 8], [2, 4, 16, 8], [2, 4, 16, 8], [], []],
        [BF16, BF16, BF16, "Scalar", "Scalar"],
        None,
        2 * (2 * 2 * 4 * 16 * 16 * 8),
        None,
    ),
    # flash kernels take (batch, seq, heads, dim); GQA: 4 query heads over 2 key/value heads
    (
        "aten::_flash_attention_forward",
        [[2, 16, 4, 8], [2, 16, 2, 8], [2, 16, 2, 8]],
        [BF16, BF16, BF16],
        None,
        2 * (2 * 2 * 4 * 16 * 16 * 8),
        None,
    ),
    # backward: five matmuls of the same size (recomputed scores, two for dV/dP, two for dQ/dK)
    (
        "aten::_scaled_dot_product_efficient_attention_backward",
        [[2, 4, 16, 8], [2, 4, 16, 8], [2, 4, 16, 8], [2, 4, 16, 8]],
        [F32] * 4,
        None,
        5 * (2 * 2 * 4 * 16 * 16 * 8),
        None,
    ),
    (
        "aten::_flash_attention_backward",
        [[2, 16, 4, 8], [2, 16, 4, 8], [2, 16, 4, 8], [2, 16, 4, 8]],
        [BF16] * 4,
        None,
        5 * (2 * 2 * 4 * 16 * 16 * 8),
        None,
    ),
    (
        "aten::native_layer_norm",
        [[4, 10, 64], [], [64], [64], []],
        [F32, "ScalarList", F32, F32, "Scalar"],
        None,
        7 * 4 * 10 * 64,
        (2560 + 64 + 64 + 2560) * 4,
    ),
    (
        "aten::rms_norm",
        [[4, 10, 64], [], [64], []],
        [BF16, "ScalarList", BF16, ""],
        None,
        4 * 2560,
        (2 * 2560 + 64) * 2,
    ),
    ("aten::_softmax", [[8, 128], [], []], [F32, "Scalar", "Scalar"], None, 5 * 1024, 2 * 1024 * 4),
    # embedding: 6 token ids gather rows of 32 (read and written), plus the int64 ids
    (
        "aten::embedding",
        [[100, 32], [2, 3], [], [], []],
        [F32, "long int", "Scalar", "Scalar", "Scalar"],
        None,
        0,
        2 * 6 * 32 * 4 + 6 * 8,
    ),
    # elementwise: broadcast [4, 1] + [1, 5] -> [4, 5]; reads both, writes the output
    ("aten::add", [[4, 1], [1, 5], []], [F32, F32, "Scalar"], None, 20, (4 + 5 + 20) * 4),
    ("aten::add_", [[512, 7, 7], [512, 7, 7], []], [BF16, BF16, "Scalar"], None, 25088, 3 * 25088 * 2),
    ("aten::copy_", [[64, 64], [64, 64], []], [BF16, F32, "Scalar"], None, 0, 4096 * 4 + 4096 * 2 + 4096 * 2),
    ("aten::sum", [[5, 128], [], [], []], [F32, "ScalarList", "Scalar", ""], None, 640, 640 * 4),
    # _foreach_*: the per-tensor op over every tensor of the first list (lists record no element type: 4 bytes);
    # the mi250_minitoy SGD step: p.add_(grad, alpha=-lr) over a 128 x 128 weight and its 128 bias
    (
        "aten::_foreach_add_",
        [[[128, 128], [128]], [[128, 128], [128]], []],
        ["TensorList", "TensorList", "Scalar"],
        None,
        128 * 128 + 128,
        3 * (128 * 128 + 128) * 4,  # both lists read, the first written
    ),
    ("aten::_foreach_mul", [[[3, 4], [5]], []], ["TensorList", "ScalarList"], None, 17, 2 * 17 * 4),
    ("aten::_foreach_zero_", [[[10, 10]]], ["TensorList"], None, 0, 100 * 4),  # written, not read
    ("aten::_foreach_norm", [[[6], [2, 2]], []], ["TensorList", "Scalar"], None, 10, 10 * 4),
]


@pytest.mark.parametrize(("name", "dims", "types", "concrete", "flops", "nbytes"), KNOWN, ids=[k[0] for k in KNOWN])
def test_known_shapes(name, dims, types, concrete, flops, nbytes):
    found = cost(name, dims, types, concrete)
    assert found is not None and found.source == "builtin"
    assert found.flops == flops
    if nbytes is not None:
        assert found.bytes == nbytes


def test_dtype_family_and_backward_flag():
    mm = cost("aten::mm", [[2, 3], [3, 4]], [BF16, BF16])
    assert (mm.dtype, mm.family, mm.backward) == ("bf16", "matmul", False)
    bwd = cost("aten::_flash_attention_backward", [[1, 4, 2, 8]] * 4, [F32] * 4)
    assert (bwd.dtype, bwd.family, bwd.backward) == ("fp32", "attention", True)


@pytest.mark.parametrize(
    ("name", "dims", "types"),
    [
        ("aten::mm", [[2, 3], [4, 5]], [F32, F32]),  # inner sizes differ
        ("aten::bmm", [[2, 3, 4], [3, 4, 5]], [F32, F32]),  # batch sizes differ
        ("aten::mm", [[], []], [F32, F32]),  # shapes not recorded
        ("aten::_flash_attention_forward", [[10, 4, 8], [10, 4, 8], [10, 4, 8]], [BF16] * 3),  # nested (varlen)
        ("aten::_foreach_add_", [[], [], []], ["TensorList", "TensorList", "Scalar"]),  # long lists written as []
        ("aten::_foreach_frobnicate_", [[[4]]], ["TensorList"]),  # no per-tensor formula
        ("my_lib::fused_op", [[4, 4]], [F32]),
        ("aten::linear", [[2, 64], [32, 63]], [F32, F32]),
    ],
)
def test_unfit_shapes_have_no_cost(name, dims, types):
    assert cost(name, dims, types) is None


def test_views_cost_nothing_and_every_formula_is_known():
    view = cost("aten::view", [[4, 4], []], [F32, "ScalarList"])
    assert (view.flops, view.bytes, view.family) == (0, 0, "view")
    for name, *_ in KNOWN:
        assert has_formula(name), name
    assert has_formula("aten::_foreach_addcdiv_") and has_formula("aten::_foreach_sqrt")
    assert not has_formula("aten::_foreach_frobnicate_") and not has_formula("my_lib::fused_op")


def test_malformed_texts_have_no_cost():
    assert op_cost("aten::mm", "[[2, 3", "[]", None) is None
    assert op_cost("aten::mm", None, None, None) is None


# torch's own formulas, on the same inputs (skipped without torch)
TORCH_CASES = [
    k
    for k in KNOWN
    if k[0].split("::")[1]
    in {
        "mm",
        "addmm",
        "bmm",
        "baddbmm",
        "convolution",
        "convolution_backward",
        "_scaled_dot_product_efficient_attention",
        "_scaled_dot_product_efficient_attention_backward",
    }
]


@pytest.mark.parametrize(
    ("name", "dims", "types", "concrete", "flops", "nbytes"), TORCH_CASES, ids=[k[0] for k in TORCH_CASES]
)
def test_torch_formulas_agree_with_builtin(name, dims, types, concrete, flops, nbytes):
    pytest.importorskip("torch.utils.flop_counter")
    concrete = concrete if concrete is not None else [""] * len(dims)
    assert torch_flops(name, dims, concrete) == builtin_cost(name, dims, types, concrete).flops == flops
    assert cost(name, dims, types, concrete, use_torch=True).source == "torch"


def test_torch_counts_a_real_module_like_the_builtin_table():
    """FlopCounterMode on a live conv + linear equals the built-in count of the shapes Kineto would record."""
    torch = pytest.importorskip("torch")
    from torch.utils.flop_counter import FlopCounterMode

    conv, lin = torch.nn.Conv2d(3, 16, 3, stride=2, padding=1), torch.nn.Linear(16 * 8 * 8, 10)
    x = torch.randn(2, 3, 16, 16)
    with FlopCounterMode(display=False) as counter:
        lin(conv(x).flatten(1))
    conv_dims = [[2, 3, 16, 16], [16, 3, 3, 3], [16], [], [], [], [], [], []]
    conv_args = ["", "", "", "[2, 2]", "[1, 1]", "[1, 1]", "False", "[0, 0]", "1"]
    builtin = cost("aten::convolution", conv_dims, [F32] * 3 + [""] * 6, conv_args).flops
    builtin += cost("aten::addmm", [[10], [2, 1024], [1024, 10], [], []], [F32] * 3 + ["Scalar"] * 2).flops
    assert counter.get_total_flops() == builtin


@pytest.mark.parametrize(
    ("name", "device", "bf16"),
    [
        ("Tesla V100-SXM2-32GB", "V100 SXM2/DGXS", 125),
        ("Tesla V100-DGXS-32GB", "V100 SXM2/DGXS", 125),
        ("Tesla V100-PCIE-16GB", "V100 PCIe", 112),
        ("NVIDIA A100-SXM4-40GB", "A100 40GB (SXM/PCIe)", 312),
        ("NVIDIA A100-PG509-200", "A100 40GB (SXM/PCIe)", 312),
        ("NVIDIA A100-SXM4-80GB", "A100 80GB SXM", 312),
        ("NVIDIA A100 80GB PCIe", "A100 80GB PCIe", 312),
        ("NVIDIA H100 80GB HBM3", "H100 SXM", 989.5),
        ("NVIDIA H100 PCIe", "H100 PCIe", 756.5),
        ("NVIDIA H200", "H200 SXM", 989.5),
        ("NVIDIA B200", "B200", 2250),
        ("NVIDIA L4", "L4", 121),
        ("NVIDIA A10", "A10", 125),
        ("AMD Instinct MI300X", "MI300X", 1307.4),
        ("AMD Instinct MI325X", "MI325X", 1307.4),
        ("AMD Instinct MI250X", "MI250X (one GCD)", 191.5),
    ],
)
def test_peak_table_matches_kineto_names(name, device, bf16):
    peak = find_peak({"name": name})
    assert peak is not None and peak.device == device
    assert peak.tflops_for("bf16") == bf16 and peak.tflops_for("fp16") == bf16
    assert peak.memory_gbps > 0 and peak.source


def test_peak_table_does_not_confuse_similar_names():
    assert find_peak({"name": "NVIDIA L40S"}) is None
    assert find_peak({"name": "NVIDIA A10G"}) is None
    assert find_peak({"name": "Fake GPU"}) is None


def test_bare_amd_name_matches_by_architecture():
    """The shared MI250 trace names its device "AMD Radeon Graphics": gfx90a (9.0) with 104 CUs is one MI250 GCD."""
    props = {"name": "AMD Radeon Graphics", "computeMajor": 9, "computeMinor": 0, "numSms": 104}
    assert find_peak(props).device == "MI250 (one GCD)"
    assert find_peak({**props, "numSms": 110}).device == "MI250X (one GCD)"
    assert find_peak({**props, "numSms": 80}) is None


def test_every_peak_row_is_dense_and_sourced():
    for peak in PEAKS:
        assert peak.tflops["fp32"] <= peak.tflops["bf16"], peak.device
        assert peak.tflops_for("fp64") <= peak.tflops_for("fp32") * 2, peak.device
        assert "datasheet" in peak.source
