"""helpers.ops and helpers.profiling: fused paths equal their references; NPU paths via the fake."""
from __future__ import annotations

import copy
import json
import sys
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F

from helpers import backend, operator_study, ops, profiling

TOL = {torch.float32: dict(atol=1e-5, rtol=1e-5), torch.bfloat16: dict(atol=2e-2, rtol=2e-2),
       torch.float16: dict(atol=2e-3, rtol=2e-3)}
SHAPES = [(3, 5, 7), (2, 13), (4, 3, 576)]


def _x(shape, dtype, noncontig=False, seed=0):
    g = torch.Generator().manual_seed(seed)
    if noncontig:  # same logical shape, last two dims transposed in memory
        base = torch.randn(*shape[:-2], shape[-1], shape[-2], generator=g).to(dtype)
        x = base.transpose(-1, -2)
        assert not x.is_contiguous()
        return x
    return torch.randn(*shape, generator=g).to(dtype)


def _w(n, dtype, seed=1):
    return (1 + 0.1 * torch.randn(n, generator=torch.Generator().manual_seed(seed))).to(dtype)


def _manual_rms(x, w, eps):
    x64 = x.double()
    return (x64 / torch.sqrt(x64.pow(2).mean(-1, keepdim=True) + eps) * w.double())


# --- RMSNorm and add + RMSNorm on CPU ------------------------------------------------------------

def test_reference_matches_the_formula_and_llama_module():
    from transformers.models.llama.modeling_llama import LlamaRMSNorm

    x, w = _x((2, 3, 16), torch.float32), _w(16, torch.float32)
    torch.testing.assert_close(ops.rms_norm_reference(x, w, 1e-5), _manual_rms(x, w, 1e-5).float())
    hf = LlamaRMSNorm(16, eps=1e-5)
    hf.weight.data.copy_(w)
    torch.testing.assert_close(ops.rms_norm_reference(x, w, 1e-5), hf(x), atol=0, rtol=0)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
@pytest.mark.parametrize("shape", SHAPES)
@pytest.mark.parametrize("noncontig", [False, True])
def test_rms_norm_torch_impl_matches_reference(dtype, shape, noncontig):
    if noncontig and len(shape) < 2:
        pytest.skip("needs two dims to transpose")
    x, w = _x(shape, dtype, noncontig), _w(shape[-1], dtype)
    ref = ops.rms_norm_reference(x, w, 1e-6)
    out = ops.rms_norm(x, w, 1e-6, impl="torch")
    assert out.dtype == dtype and out.shape == x.shape
    torch.testing.assert_close(out, ref, **TOL[dtype])
    torch.testing.assert_close(ops.rms_norm(x, w, 1e-6, impl="auto"), ref, **TOL[dtype])


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_add_rms_norm_torch_impl_matches_reference(dtype):
    x, r, w = _x((2, 5, 24), dtype), _x((2, 5, 24), dtype, seed=3), _w(24, dtype)
    y_ref, s_ref = ops.add_rms_norm_reference(x, r, w, 1e-5)
    y, s = ops.add_rms_norm(x, r, w, 1e-5, impl="torch")
    torch.testing.assert_close(s, x + r, atol=0, rtol=0)
    torch.testing.assert_close(y, y_ref, **TOL[dtype])
    torch.testing.assert_close(y_ref.double(), _manual_rms(x + r, w, 1e-5), **TOL[dtype])


def test_compiled_rms_and_add_rms_match_reference_including_noncontiguous():
    x, w = _x((4, 6, 32), torch.float32, noncontig=True), _w(32, torch.float32)
    torch.testing.assert_close(ops.rms_norm(x, w, 1e-6, impl="compiled"), ops.rms_norm_reference(x, w, 1e-6),
                               **TOL[torch.float32])
    r = _x((4, 6, 32), torch.float32, seed=5)
    y, s = ops.add_rms_norm(x, r, w, 1e-6, impl="compiled")
    y_ref, s_ref = ops.add_rms_norm_reference(x, r, w, 1e-6)
    torch.testing.assert_close(y, y_ref, **TOL[torch.float32])
    torch.testing.assert_close(s, s_ref)


def test_torch_impl_falls_back_to_reference_without_f_rms_norm(monkeypatch):
    monkeypatch.delattr(torch.nn.functional, "rms_norm")
    assert ops.resolve_impl("torch", "cpu") == "reference"
    assert ops.resolve_impl("auto", "cpu") == "reference"
    x, w = _x((3, 8), torch.float32), _w(8, torch.float32)
    torch.testing.assert_close(ops.rms_norm(x, w, impl="torch"), ops.rms_norm_reference(x, w), atol=0, rtol=0)
    y, s = ops.add_rms_norm(x, x, w, impl="auto")
    torch.testing.assert_close(y, ops.rms_norm_reference(x + x, w), atol=0, rtol=0)


# --- NPU paths through the fake torch_npu ---------------------------------------------------------

@pytest.mark.parametrize("dtype", [torch.float16, torch.float32])
def test_npu_rms_norm_calls_the_real_signature(fake_torch_npu, dtype):
    x, w = _x((2, 3, 16), dtype), _w(16, dtype)
    out = ops.rms_norm(x, w, 1e-5, impl="npu")
    assert isinstance(out, torch.Tensor), "npu_rms_norm returns (y, rstd); the helper must take [0]"
    assert fake_torch_npu.CALLS == ["npu_rms_norm"]
    torch.testing.assert_close(out, ops.rms_norm_reference(x, w, 1e-5), **TOL[dtype])


def test_npu_add_rms_norm_returns_norm_and_new_residual(fake_torch_npu):
    x, r, w = _x((2, 4, 16), torch.float16), _x((2, 4, 16), torch.float16, seed=9), _w(16, torch.float16)
    if "npu_add_rms_norm" not in fake_torch_npu.LINE.OPS:  # torch_npu 2.1.0: only npu_rms_norm
        with pytest.raises(RuntimeError, match=r"npu_add_rms_norm.*torch_npu 2\.1\.0\.post4.*impl='auto'"):
            ops.add_rms_norm(x, r, w, 1e-6, impl="npu")
        return
    y, s = ops.add_rms_norm(x, r, w, 1e-6, impl="npu")
    assert fake_torch_npu.CALLS == ["npu_add_rms_norm"]
    torch.testing.assert_close(s, x + r, atol=0, rtol=0)
    torch.testing.assert_close(y, ops.add_rms_norm_reference(x, r, w, 1e-6)[0], **TOL[torch.float16])


def test_npu_swiglu_and_ffn_fused_act(fake_torch_npu):
    gate_up = _x((2, 3, 20), torch.float32)
    if "npu_swiglu" not in fake_torch_npu.LINE.OPS:
        with pytest.raises(RuntimeError, match="needs torch_npu.npu_swiglu"):
            ops.swiglu(gate_up, impl="npu")
        return
    torch.testing.assert_close(ops.swiglu(gate_up, impl="npu"), ops.swiglu_reference(gate_up))
    assert fake_torch_npu.CALLS == ["npu_swiglu"]
    wg, wu, wd = _x((10, 8), torch.float32, seed=1), _x((10, 8), torch.float32, seed=2), _x((8, 10), torch.float32, seed=3)
    x = _x((1, 4, 8), torch.float32, seed=4)
    out = operator_study.ffn_merged(x, ops.merge_gate_up(wg, wu), wd, impl="npu")
    torch.testing.assert_close(out, operator_study.ffn_reference(x, wg, wu, wd), **TOL[torch.float32])


def test_npu_gamma_shape_checked_before_the_call(fake_torch_npu):
    with pytest.raises(ValueError, match="weight"):
        ops.rms_norm(torch.randn(2, 16), torch.ones(8), impl="npu")
    assert fake_torch_npu.CALLS == []


def test_auto_resolves_to_npu_for_npu_devices_where_the_line_has_the_op(fake_torch_npu):
    has = fake_torch_npu.LINE.OPS
    assert ops.resolve_impl("auto", "npu", "rms_norm") == "npu"
    assert ops.resolve_impl("auto", "npu:1", "swiglu") == ("npu" if "npu_swiglu" in has else "reference")
    impl, why = ops.explain_impl("auto", "npu", "add_rms_norm")
    assert impl == ("npu" if "npu_add_rms_norm" in has else "torch") and "npu_add_rms_norm" in why
    assert ops.resolve_impl("auto", "cpu", "swiglu") == "reference"


def test_auto_on_an_npu_without_torch_npu_falls_back(monkeypatch):
    monkeypatch.setattr(backend, "_NPU_IMPORT", backend.NpuImport(error="torch_npu is not installed"))
    impl, why = ops.explain_impl("auto", "npu", "swiglu")
    assert impl == "reference" and "not loaded" in why


def test_npu_impl_without_torch_npu_says_why(monkeypatch):
    monkeypatch.setattr(backend, "_NPU_IMPORT", backend.NpuImport(error="torch_npu is not installed"))
    with pytest.raises(RuntimeError, match="torch_npu is not installed"):
        ops.rms_norm(torch.randn(2, 4), torch.ones(4), impl="npu")


# --- FFN ------------------------------------------------------------------------------------------

def _ffn_weights(h=16, i=24, dtype=torch.float32, noncontig=False):
    g = torch.Generator().manual_seed(0)
    make = (lambda o, n: torch.randn(n, o, generator=g).t()) if noncontig else (lambda o, n: torch.randn(o, n, generator=g))
    return [(w * 0.2).to(dtype) for w in (make(i, h), make(i, h), make(h, i))]


@pytest.mark.parametrize("variant", operator_study.FFN_VARIANTS)
def test_ffn_variants_match_reference(variant):
    wg, wu, wd = _ffn_weights()
    f = operator_study.make_ffn(wg, wu, wd, variant)
    for t in (1, 7):
        x = _x((1, t, 16), torch.float32, seed=t)
        torch.testing.assert_close(f(x), operator_study.ffn_reference(x, wg, wu, wd), **TOL[torch.float32])


def test_ffn_noncontiguous_weights_give_the_same_result():
    wg, wu, wd = _ffn_weights(noncontig=True)
    assert not wg.is_contiguous()
    x = _x((1, 3, 16), torch.bfloat16)
    wg_c, wu_c, wd_c = (w.contiguous().to(torch.bfloat16) for w in (wg, wu, wd))
    ref = operator_study.ffn_reference(x, wg_c, wu_c, wd_c)
    out = operator_study.make_ffn(wg.to(torch.bfloat16), wu.to(torch.bfloat16), wd.to(torch.bfloat16), "merged")(x)
    torch.testing.assert_close(out, ref, **TOL[torch.bfloat16])


def test_ffn_bad_shapes_and_variant():
    wg, wu, wd = _ffn_weights()
    with pytest.raises(ValueError, match="variant"):
        operator_study.make_ffn(wg, wu, wd, "fastest")
    # the guide's layout: (in, out) instead of nn.Linear's (out, in)
    with pytest.raises(ValueError, match="w_gate"):
        operator_study._check_ffn(torch.randn(1, 16), wg.t(), wu.t(), wd)
    with pytest.raises(ValueError, match="w_down"):
        operator_study._check_ffn(torch.randn(1, 16), wg, wu, wd.t())
    # make_ffn checks it on the first call: the guide's whole (in, out) set gets the same clear error
    for variant in ("unfused", "merged"):
        with pytest.raises(ValueError, match="w_gate"):
            operator_study.make_ffn(wg.t(), wu.t(), wd.t(), variant)(torch.randn(1, 16))
    with pytest.raises(ValueError, match="even"):
        ops.swiglu(torch.randn(2, 5))


# --- bad input ------------------------------------------------------------------------------------

def test_bad_inputs_name_the_parameter():
    x = torch.randn(2, 8)
    with pytest.raises(ValueError, match=r"weight \(gamma\) must have shape \(8,\)"):
        ops.rms_norm(x, torch.ones(7))
    with pytest.raises(ValueError, match="weight"):
        ops.rms_norm(x, torch.ones(2, 8))
    with pytest.raises(ValueError, match="impl='fast'.*'reference'"):
        ops.rms_norm(x, torch.ones(8), impl="fast")
    with pytest.raises(ValueError, match="eps"):
        ops.rms_norm(x, torch.ones(8), eps=0)
    with pytest.raises(ValueError, match="residual"):
        ops.add_rms_norm(x, torch.randn(2, 9), torch.ones(8))
    with pytest.raises(ValueError, match="impl"):
        ops.apply_fused_modules(torch.nn.Linear(2, 2), impl="gpu")


# --- whole model ------------------------------------------------------------------------------------

def _logits(model, ids):
    with torch.no_grad():
        return model(input_ids=ids).logits


@pytest.mark.parametrize("impl,tol", [("reference", dict(atol=0, rtol=0)), ("auto", dict(atol=1e-4, rtol=1e-4))])
def test_apply_fused_modules_keeps_logits(tiny_model, impl, tol):
    model, _ = tiny_model
    ids = torch.tensor([[5, 17, 99, 3, 42, 7]])
    before = _logits(model, ids)
    fused = copy.deepcopy(model)
    counts = ops.apply_fused_modules(fused, impl=impl)
    layers = model.config.num_hidden_layers
    assert counts["rmsnorm"] == 2 * layers + 1 and counts["mlp"] == layers
    assert isinstance(fused.model.layers[0].mlp, ops.FusedLlamaMLP)
    assert isinstance(fused.model.norm, ops.FusedRMSNorm)
    assert fused.model.layers[0].mlp.gate_up_proj.weight.shape == (2 * model.config.intermediate_size,
                                                                     model.config.hidden_size)
    torch.testing.assert_close(_logits(fused, ids), before, **tol)


def test_apply_fused_modules_npu_path_in_bf16(tiny_model, fake_torch_npu):
    model, _ = tiny_model
    ids = torch.tensor([[1, 2, 3, 4]])
    ref = copy.deepcopy(model).to(torch.bfloat16)
    fused = copy.deepcopy(ref)
    if "npu_swiglu" not in fake_torch_npu.LINE.OPS:
        with pytest.raises(RuntimeError, match="npu_swiglu"):
            ops.apply_fused_modules(fused, impl="npu")
        return
    counts = ops.apply_fused_modules(fused, impl="npu")
    assert counts["impl"] == "npu" and counts["swiglu_impl"] == "npu"
    out = _logits(fused, ids)
    assert "npu_rms_norm" in fake_torch_npu.CALLS and "npu_swiglu" in fake_torch_npu.CALLS
    torch.testing.assert_close(out.float(), _logits(ref, ids).float(), atol=5e-2, rtol=5e-2)


# --- graph mode selection ---------------------------------------------------------------------------

def test_graph_mode_on_npu_uses_torchair_backend(fake_torch_npu):
    """Each line's torchair (tests/fakes/fake_torchair.py) gets the graph; modes per line are in
    test_npu_lines.py."""
    torch._dynamo.reset()

    def residual_norm(x, r, w):
        s = x + r
        return s * torch.rsqrt(s.pow(2).mean(-1, keepdim=True) + 1e-6) * w

    compiled, name = ops.graph_mode(residual_norm, "npu", mode="max-autotune")
    assert name == "torchair"
    x = torch.randn(2, 8)
    torch.testing.assert_close(compiled(x, x, torch.ones(8)), residual_norm(x, x, torch.ones(8)))
    assert fake_torch_npu.torchair.CALLS == ["torchair:max-autotune"], \
        "torch.compile did not hand the graph to torchair's backend"
    torch._dynamo.reset()


def test_graph_mode_without_torchair_fails_clearly(monkeypatch):
    monkeypatch.setitem(sys.modules, "torchair", None)  # import raises ImportError
    with pytest.raises(RuntimeError, match="torchair"):
        ops.graph_mode(torch.nn.Identity(), "npu")


def test_graph_mode_on_cpu_is_inductor_and_checks_device():
    _, name = ops.graph_mode(torch.nn.Identity(), "cpu")
    assert name == "inductor"
    with pytest.raises(ValueError, match="device"):
        ops.graph_mode(torch.nn.Identity(), "tpu")


# --- profiler counts --------------------------------------------------------------------------------

def test_count_ops_sees_fusion():
    x, r, w = torch.randn(1, 8, 64), torch.randn(1, 8, 64), torch.ones(64)
    unfused = profiling.count_ops(lambda: ops.add_rms_norm(x, r, w, impl="reference"))
    # add, pow, mean, add(eps), rsqrt, mul, mul; float() / to() are no-ops in float32
    assert unfused["by_op"] == {"aten::add": 2, "aten::mul": 2, "aten::pow": 1, "aten::mean": 1, "aten::rsqrt": 1}
    assert unfused["ops"] == 7
    fused = profiling.count_ops(lambda: ops.add_rms_norm(x, r, w, impl="compiled"))
    assert fused["ops"] < unfused["ops"] and fused["by_op"].get("inductor kernel", 0) >= 1
    half = profiling.count_ops(lambda: ops.rms_norm_reference(x.half(), w.half()))
    assert "aten::to" in half["by_op"] or "aten::_to_copy" in half["by_op"]


def test_apply_fused_modules_auto_on_cpu_is_bit_exact_in_bf16(tiny_model):
    model, _ = tiny_model
    ids = torch.tensor([[5, 17, 99, 3]])
    ref = copy.deepcopy(model).to(torch.bfloat16)
    fused = copy.deepcopy(ref)
    counts = ops.apply_fused_modules(fused, impl="auto")
    assert counts["impl"] == "reference" and counts["swiglu_impl"] == "reference"
    torch.testing.assert_close(_logits(fused, ids), _logits(ref, ids), atol=0, rtol=0)


def test_llama_rmsnorm_formula_check_can_fail(monkeypatch):
    from transformers.models.llama import modeling_llama

    assert operator_study.llama_rmsnorm_matches_formula()["matches"] is True

    class Biased(modeling_llama.LlamaRMSNorm):
        def __init__(self, *a, **k):
            super().__init__(*a, **k)
            self.bias = torch.nn.Parameter(torch.zeros(a[0]))

    monkeypatch.setattr(modeling_llama, "LlamaRMSNorm", Biased)
    out = operator_study.llama_rmsnorm_matches_formula()
    assert out["has_bias"] is True and out["matches"] is False


def test_a_case_label_names_the_guides_shape_only_when_it_was_timed():
    """The quick profile's add + RMSNorm case read "guide shape 1x256x2048": the guide's tensor is
    1x4096x4096, so the label must say which shape the run timed."""
    run = operator_study.shape_label([1, 256, 2048])
    assert run == "run's shape 1x256x2048 (the guide's is 1x4096x4096)" and not run.startswith("guide")
    assert operator_study.shape_label(torch.Size([1, 4096, 4096])) == "guide's shape 1x4096x4096"
    cells = json.loads((Path(__file__).resolve().parent.parent / "notebooks" / "01_operator_verification.ipynb")
                       .read_text(encoding="utf-8"))["cells"]
    code = "\n".join("".join(c["source"]) for c in cells if c["cell_type"] == "code")
    assert '"guide shape"' not in code and "operator_study.shape_label(rms_shape)" in code
