"""The one tolerance rule (``bench.tolerance_for``): real 16-bit outputs of every CPU variant of
``helpers.ops`` pass it against a float32 reference at the guide's and the default profile's shapes,
deliberately wrong kernels fail it, and no check in the workbook falls back to assert_close's
defaults on a 16-bit dtype."""
import json
import re
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F

from helpers import bench, operator_study, ops

REPO = Path(__file__).resolve().parent.parent
HALF = (torch.float16, torch.bfloat16)
GUIDE_RMS_SHAPE = [1, 4096, 4096]         # the guide's RMSNorm shape (profiles/default.yaml)
DEFAULT_FFN = (4096, 11008)               # profiles/default.yaml 02_ffn_fusion
DEFAULT_PREFILL = 128                     # prefill_tokens of chapters 01 and 02 in the default profile
MODEL_HIDDEN = 576                        # the embedded SmolLM2-135M's hidden size


def test_the_rule_is_k_ulps_of_the_dtype_plus_a_float32_reduction():
    f32 = 2 ** -23
    assert bench.tolerance_for(torch.float16, "norm") == pytest.approx({
        "rtol": 4 * 2 ** -10 + f32, "atol": (4 * 2 ** -10 + f32) * torch.finfo(torch.float16).tiny})
    ref = torch.tensor([-3.0, 2.0])
    tol = bench.tolerance_for(torch.bfloat16, "ffn", ref)
    assert tol == pytest.approx({"rtol": 16 * 2 ** -7 + 2 ** 0.5 * f32, "atol": (16 * 2 ** -7 + 2 ** 0.5 * f32) * 3.0})
    assert bench.tolerance_for(torch.ones(2, dtype=torch.float16), 3, ref)["rtol"] == pytest.approx(
        3 * 2 ** -10 + 2 ** 0.5 * f32)
    assert bench.tolerance_for(torch.float32, "matmul", ref)["rtol"] == pytest.approx((8 + 2 ** 0.5) * f32)
    # a norm over 2,048 values in float32: the reduction term (sqrt(2048) ULPs) outweighs the 4 ULPs
    wide = torch.ones(1, 2048)
    assert bench.tolerance_for(torch.float32, "norm", wide)["rtol"] == pytest.approx((4 + 2048 ** 0.5) * f32)
    assert bench.tolerance_for(torch.float32, "norm", wide, reduce_len=16)["rtol"] == pytest.approx(8 * f32)
    # elementwise kinds reduce nothing: k ULPs alone
    assert bench.tolerance_for(torch.float32, "elementwise", wide)["rtol"] == 2 * f32


def test_a_float32_norm_summed_in_another_order_passes_and_a_wrong_one_fails():
    """Chapter 01's compiled RMSNorm in float32 (quick shape 1x256x2048) differed from the eager
    reference by 8 float32 ULPs on 14 % of its outputs: another summation order, not a wrong
    kernel. The reduction term lets that pass; a weight 1e-4 off (840 ULPs) still fails."""
    x, w, _ = operator_study.rms_norm_inputs([1, 256, 2048], "cpu", torch.float32)
    expected = ops.rms_norm_reference(x, w, 1e-5)
    # the mean of squares summed in 64 chunks of 32, then the partial sums: another order
    parts = x.pow(2).reshape(1, 256, 64, 32).sum(-1)
    reordered = x * torch.rsqrt(parts.sum(-1, keepdim=True) / 2048 + 1e-5) * w
    assert not torch.equal(reordered, expected)
    bench.assert_within(reordered, expected, "norm", what="reordered float32 norm")
    with pytest.raises(AssertionError, match="float32 reference"):
        bench.assert_within(ops.rms_norm_reference(x, w * (1 + 1e-4), 1e-5), expected, "norm")


@pytest.mark.parametrize("op, reference, match", [
    ("norms", None, "op="), (0, torch.ones(1), "op="), (True, torch.ones(1), "op="),
    ("ffn", None, "reference")])
def test_bad_tolerance_arguments_name_the_parameter(op, reference, match):
    with pytest.raises(ValueError, match=match):
        bench.tolerance_for(torch.float16, op, reference)
    with pytest.raises(ValueError, match="dtype="):
        bench.tolerance_for(torch.int8, "norm")


# --- real outputs pass ---------------------------------------------------------------------------

@pytest.mark.parametrize("dtype", HALF)
def test_rms_norm_at_the_guide_shape_passes_in_16_bit(dtype):
    # one guide-shape case per dtype: 16,777,216 values, where assert_close's float16 defaults
    # (rtol 1e-3, atol 1e-5) failed on outputs one or two ulps off
    x, w, x_strided = operator_study.rms_norm_inputs(GUIDE_RMS_SHAPE, "cpu", dtype)
    expected = ops.float32_reference(ops.rms_norm_reference, x, w, 1e-5)
    assert expected.dtype == torch.float32
    for impl in ("reference", "torch"):
        bench.assert_within(ops.rms_norm(x, w, 1e-5, impl=impl), expected, "norm", what=impl)
    bench.assert_within(ops.rms_norm(x_strided, w, 1e-5, impl="torch"), expected, "norm")


@pytest.mark.parametrize("dtype", HALF)
def test_add_rms_norm_and_swiglu_at_the_default_profile_shapes_pass(dtype):
    for t, h in ((DEFAULT_PREFILL, DEFAULT_FFN[0]), (1, MODEL_HIDDEN)):
        x, w, _ = operator_study.rms_norm_inputs([1, t, h], "cpu", dtype)
        variants, expected = operator_study.add_rms_norm_variants(x, w, ["reference", "torch"])
        for labels, fn in variants:
            for got, want in zip(fn(), expected):
                bench.assert_within(got, want, "norm", what=labels["impl"])
    gate_up = torch.randn(1, DEFAULT_PREFILL, 2 * DEFAULT_FFN[1],
                          generator=torch.Generator().manual_seed(0)).to(dtype)
    bench.assert_within(ops.swiglu(gate_up, impl="reference"),
                        ops.float32_reference(ops.swiglu_reference, gate_up), "elementwise")


@pytest.mark.parametrize("dtype", HALF)
def test_ffn_variants_at_llama_7b_shape_pass(dtype):
    hidden, inter = DEFAULT_FFN
    weights = operator_study.ffn_weights(hidden, inter, "cpu", dtype, torch.Generator().manual_seed(1))
    x = torch.randn(1, 1, hidden, generator=torch.Generator().manual_seed(2)).to(dtype)
    expected = ops.float32_reference(operator_study.ffn_reference, x, *weights)
    for name in ("unfused", "merged"):
        bench.assert_within(operator_study.make_ffn(*weights, name, "cpu")(x), expected, "ffn", what=name)


@pytest.mark.parametrize("dtype", HALF)
def test_compiled_variants_pass_at_a_small_shape(dtype):
    # compiled 16-bit kernels take a minute to build on a CPU: a small shape, and the compiled norm
    # and SwiGLU only (the graph variant compiles the same elementwise code around aten matmuls)
    x, w, _ = operator_study.rms_norm_inputs([1, 8, 256], "cpu", dtype)
    bench.assert_within(ops.rms_norm(x, w, 1e-5, impl="compiled"),
                        ops.float32_reference(ops.rms_norm_reference, x, w, 1e-5), "norm")
    weights = operator_study.ffn_weights(256, 512, "cpu", dtype, torch.Generator().manual_seed(3))
    xf = torch.randn(1, 4, 256, generator=torch.Generator().manual_seed(4)).to(dtype)
    expected = ops.float32_reference(operator_study.ffn_reference, xf, *weights)
    bench.assert_within(operator_study.make_ffn(*weights, "fused_act", "cpu")(xf), expected, "ffn")


# --- wrong kernels fail --------------------------------------------------------------------------

def _rms_no_eps(x, w, eps):
    x32 = x.float()
    return w * (x32 * torch.rsqrt(x32.pow(2).mean(-1, keepdim=True))).to(x.dtype)


@pytest.mark.parametrize("dtype", HALF + (torch.float32,))
def test_wrong_norm_kernels_fail(dtype):
    x, w, _ = operator_study.rms_norm_inputs([1, 64, 1024], "cpu", dtype)
    # eps only matters where mean(x^2) is near it: quiet activations of 1e-3
    small = (x.float() * 1e-3).to(dtype)
    with pytest.raises(AssertionError, match="ULPs"):
        bench.assert_within(_rms_no_eps(small, w, 1e-5),
                            ops.float32_reference(ops.rms_norm_reference, small, w, 1e-5), "norm")
    # a weight off by 10 ULPs of the dtype (1 % in float16; bfloat16's ulp is 0.8 % by itself), and in
    # float32, where the reduction term dominates the rule, by 10 x the rule's whole rtol
    rule = bench.tolerance_for(dtype, "norm", x)["rtol"]
    off = (w.float() * (1 + 10 * max(torch.finfo(dtype).eps, rule))).to(dtype)
    with pytest.raises(AssertionError, match="ULPs"):
        bench.assert_within(ops.rms_norm(x, off, 1e-5, impl="torch"),
                            ops.float32_reference(ops.rms_norm_reference, x, w, 1e-5), "norm")
    with pytest.raises(AssertionError):  # the weight ignored (the guide's w = ones hides it)
        bench.assert_within(ops.rms_norm(x, torch.ones_like(w), 1e-5),
                            ops.float32_reference(ops.rms_norm_reference, x, w, 1e-5), "norm")


@pytest.mark.parametrize("dtype", HALF)
def test_wrong_ffn_kernels_fail(dtype):
    w_gate, w_up, w_down = operator_study.ffn_weights(512, 512, "cpu", dtype, torch.Generator().manual_seed(5))
    x = torch.randn(1, 4, 512, generator=torch.Generator().manual_seed(6)).to(dtype)
    expected = ops.float32_reference(operator_study.ffn_reference, x, w_gate, w_up, w_down)
    wrong = {"transposed down weight": operator_study.ffn_reference(x, w_gate, w_up, w_down.t()),
             "gate and up halves swapped": operator_study.ffn_reference(x, w_up, w_gate, w_down)}
    for what, got in wrong.items():
        with pytest.raises(AssertionError, match="ULPs"):
            bench.assert_within(got, expected, "ffn", what=what)


# --- check_and_time uses the rule, and nothing uses assert_close's defaults ------------------------

def test_check_and_time_without_tolerance_uses_the_dtype_rule_on_float16():
    x = torch.linspace(1, 1.9, 64).to(torch.float16).float()
    inf = torch.tensor(float("inf"), dtype=torch.float16)
    ulp_off = torch.nextafter(torch.nextafter(x.to(torch.float16), inf), inf)  # two float16 ulps up
    with pytest.raises(AssertionError):  # assert_close's float16 defaults would fail it
        torch.testing.assert_close(ulp_off, x.to(torch.float16))
    measure = lambda fn, name: bench.Timing(name, [1e-3] * 3)  # noqa: E731
    rows, _ = operator_study.check_and_time([({"impl": "close"}, lambda: ulp_off)], "cpu", expected=x,
                                   measure=measure)
    assert len(rows) == 1
    with pytest.raises(AssertionError, match="float16 is not within 4 ULPs"):
        operator_study.check_and_time([({"impl": "1% off"}, lambda: (x * 1.01).to(torch.float16))], "cpu",
                             expected=x, measure=measure)


def _code_cells():
    for path in sorted((REPO / "notebooks").rglob("*.ipynb")) + sorted((REPO / "solutions").rglob("*.ipynb")):
        for cell in json.loads(path.read_text(encoding="utf-8"))["cells"]:
            if cell["cell_type"] == "code":
                yield path.relative_to(REPO), "".join(cell["source"])
    for path in sorted((REPO / "helpers").rglob("*.py")):
        yield path.relative_to(REPO), path.read_text(encoding="utf-8")


def _call_text(source: str, start: int) -> str:
    depth = 0
    for i in range(start, len(source)):
        depth += {"(": 1, ")": -1}.get(source[i], 0)
        if depth == 0 and source[i] == ")":
            return source[start:i + 1]
    return source[start:]


def test_no_check_uses_assert_close_defaults():
    found = []
    for where, source in _code_cells():
        for m in re.finditer(r"\b(assert_close|allclose|isclose)\(", source):
            call = _call_text(source, m.end() - 1)
            if not re.search(r"\*\*|rtol|rel_tol|tolerance_for", call):
                found.append(f"{where}: {m.group(1)}{call[:80]}")
    assert not found, "checks with the library's default tolerance: " + "; ".join(found)
