"""torch.profiler readings: the kind of each kernel and kernel time per decode token by kind."""
import math

import pytest
import torch

from helpers import generation, profiling


@pytest.mark.parametrize("name, kind", [
    ("aten::mm", "weight matmul"), ("aten::addmm", "weight matmul"),
    ("mkldnn::_linear_pointwise", "weight matmul"), ("mkl::_mkl_linear", "weight matmul"), ("graph_1_gemm_m1n256k256_kernel", "weight matmul"),
    ("aten::_weight_int8pack_mm", "weight matmul"),
    ("aten::_scaled_dot_product_flash_attention_for_cpu", "attention"),
    ("graph_1_cpp_fused__scaled_dot_product_flash_attention_for_cpu__to_copy", "attention"),
    ("graph_0_cpp_fused_add_mean_mul_pow_rsqrt_0", "other"), ("aten::add", "other"), ("aten::mul", "other"),
])
def test_kernel_kind(name, kind):
    assert profiling.kernel_kind(name) == kind


def test_kernel_time_by_kind_splits_a_decode_step(tiny_model):
    model, tok = tiny_model
    inputs = tok(["hello there"], return_tensors="pt")

    def run(n):
        return generation.generate_tokens(model, tok, inputs, n)

    parts = profiling.kernel_time_by_kind(run, 12, "cpu")
    # Each part is a difference of two profiled runs, which noise can push to or below zero on a
    # busy machine; the split is checked by which kernels it put where, not by how long they took.
    assert math.isfinite(parts["weight_matmul_ms"]) and "other_kernel_ms" in parts
    assert "aten::mm" in parts["matmul_kernels"] or "aten::addmm" in parts["matmul_kernels"]
    with pytest.raises(ValueError, match="new_tokens"):
        profiling.kernel_time_by_kind(run, 1, "cpu")
    assert "torch_npu.profiler" in profiling.kernel_time_by_kind(run, 6, "npu")["kernel_profile"]


def test_decode_step_split_takes_any_classifier_and_leaves_out_what_it_does_not_name(tiny_model):
    model, tok = tiny_model
    inputs = tok(["hello there"], return_tensors="pt")
    resets = []

    def run(n):
        return generation.generate_tokens(model, tok, inputs, n)

    split = profiling.decode_step_split(run, 4, "cpu", part_of=lambda name: "mm" if "mm" in name else None,
                                        device_kernels=False, warm=True, reset=lambda: resets.append(1))
    assert set(split["ms"]) == {"mm"} and isinstance(split["wall_ms"], float)  # a tiny model: noise may win
    assert all("mm" in name for name in split["names"]["mm"])
    assert len(resets) == 4  # before the warm and the profiled run of each length
    with pytest.raises(ValueError, match="repeats"):
        profiling.decode_step_split(run, 4, "cpu", repeats=0)
