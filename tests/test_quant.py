"""INT8 linears, model quantization, calibration and quality metrics (chapter 05)."""
from __future__ import annotations

import math

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

from helpers import int8_study, models, operator_study, quality, quant, versions


def _linear(n=48, k=32, dtype=torch.float32, bias=False, seed=0):
    torch.manual_seed(seed)
    lin = nn.Linear(k, n, bias=bias)
    with torch.no_grad():
        lin.weight.mul_(torch.linspace(0.1, 3.0, n)[:, None])  # channels of very different range
    return lin.to(dtype)


def test_weight_round_trip_error_is_bounded_per_channel():
    w = _linear().weight.detach()
    q, scale = quant.quantize_weight(w)
    assert q.dtype == torch.int8 and scale.shape == (w.shape[0],)
    assert int(q.abs().max()) <= 127
    err = (quant.dequantize_weight(q, scale) - w).abs().amax(dim=1)
    assert torch.all(err <= scale / 2 + 1e-7)
    # each channel uses its full range, so the largest weight is exact
    assert torch.all(q.abs().amax(dim=1) == 127)


def test_dequant_linear_matches_float_linear():
    lin = _linear(bias=True)
    x = torch.randn(2, 5, 32)
    layer = quant.Int8Linear(lin, impl="dequant")
    q, scale = quant.quantize_weight(lin.weight)
    # W8A16 in a float32 model: bfloat16 activations at the linear, the output cast back
    bf = torch.bfloat16
    exact = (F.linear(x.to(bf), q.to(bf)) * scale.to(bf)).float() + lin.bias
    torch.testing.assert_close(layer(x), exact, rtol=1e-5, atol=1e-5)
    # against the unquantized layer the error is the rounding error, small relative to outputs
    ref = lin(x)
    assert (layer(x) - ref).abs().max() < 0.03 * ref.abs().max()


@pytest.mark.skipif(not versions.has_feature("torch._weight_int8pack_mm"), reason="no int8pack kernel")
def test_int8pack_bf16_matches_dequant():
    lin = _linear(dtype=torch.bfloat16)
    x = torch.randn(3, 32, dtype=torch.bfloat16)
    packed = quant.Int8Linear(lin, impl="auto")
    assert packed.impl == "int8pack"
    deq = quant.Int8Linear(lin, impl="dequant")
    torch.testing.assert_close(packed(x).float(), deq(x).float(), rtol=2e-2, atol=2e-2)


@pytest.mark.skipif(not versions.has_feature("torch._weight_int8pack_mm"), reason="no int8pack kernel")
def test_w8a16_in_a_float32_model_never_feeds_float32_to_the_kernel(monkeypatch):
    seen = []
    real = torch._weight_int8pack_mm
    monkeypatch.setattr(torch, "_weight_int8pack_mm", lambda x, q, s: seen.append(x.dtype) or real(x, q, s))
    lin = _linear(dtype=torch.float32)
    layer = quant.Int8Linear(lin, impl="auto")
    assert layer.impl == "int8pack" and layer.act_dtype == torch.bfloat16
    x = torch.randn(3, 32)
    y = layer(x)
    assert seen == [torch.bfloat16] and y.dtype == torch.float32  # cast at the linear and back
    ref = F.linear(x, quant.dequantize_weight(*quant.quantize_weight(lin.weight)))
    torch.testing.assert_close(y, ref, rtol=3e-2, atol=3e-2)
    deq = quant.Int8Linear(lin, impl="dequant")
    assert deq.act_dtype == torch.bfloat16 and deq(x).dtype == torch.float32
    assert "activations=bfloat16" in repr(layer)


def test_the_16bit_activation_cast_is_for_w8a16_on_a_cpu_only():
    assert quant.act_dtype_for("int8pack", "cpu", torch.float32) == torch.bfloat16
    assert quant.act_dtype_for("int8pack", "cpu", torch.bfloat16) == torch.bfloat16
    assert quant.act_dtype_for("emulate", "cpu", torch.float32, scheme="w8a8") == torch.float32
    assert quant.act_dtype_for("dequant", "cuda", torch.float32) == torch.float32
    assert quant.activations_label(torch.bfloat16, torch.float32).startswith("bfloat16 (cast from float32")
    assert quant.activations_label(torch.bfloat16, torch.bfloat16) == "bfloat16"


def test_missing_int8pack_falls_back_to_dequant(monkeypatch):
    real = versions.has_feature
    monkeypatch.setattr(versions, "has_feature",
                        lambda name: False if name == "torch._weight_int8pack_mm" else real(name))
    layer = quant.Int8Linear(_linear(dtype=torch.bfloat16), impl="auto")
    assert layer.impl == "dequant"
    assert layer(torch.randn(2, 32, dtype=torch.bfloat16)).shape == (2, 48)
    with pytest.raises(ValueError, match="int8pack"):
        quant.Int8Linear(_linear(), impl="int8pack")


def test_npu_w8a16_uses_weight_quant_batchmatmul_with_the_transposed_view(fake_torch_npu):
    lin = _linear(dtype=torch.float16, bias=True)
    if "npu_weight_quant_batchmatmul" not in fake_torch_npu.LINE.OPS:  # torch_npu 2.1.0
        with pytest.raises(ValueError, match=r"needs torch_npu\.npu_weight_quant_batchmatmul.*2\.1\.0\.post4"):
            quant.Int8Linear(lin, impl="npu")
        return
    layer = quant.Int8Linear(lin, impl="npu")
    assert layer.qweight.shape == (48, 32) and layer.qweight.is_contiguous()  # (N, K), passed as .t()
    x = torch.randn(2, 3, 32, dtype=torch.float16)
    y = layer(x)
    assert fake_torch_npu.CALLS.count("npu_weight_quant_batchmatmul") == 1
    assert fake_torch_npu.LAST["npu_weight_quant_batchmatmul"]["weight_layout"] == "transposed"
    ref = quant.Int8Linear(lin.float(), impl="dequant")(x.float())
    torch.testing.assert_close(y.float(), ref, rtol=1e-2, atol=1e-2)
    with pytest.raises(ValueError, match="quantized for float16"):
        layer(x.bfloat16())


def test_npu_w8a8_dynamic_matches_cpu_emulation(fake_torch_npu):
    lin = _linear()
    half = _linear(dtype=torch.float16)  # the same seeded weights in float16 (npu ops take 16-bit only)
    if "npu_dynamic_quant" not in fake_torch_npu.LINE.OPS:
        with pytest.raises(ValueError, match="npu_dynamic_quant"):
            quant.Int8Linear(half, impl="npu", scheme="w8a8")
        return
    x = torch.randn(4, 32)
    npu = quant.Int8Linear(half, impl="npu", scheme="w8a8")
    emu = quant.Int8Linear(_linear(dtype=torch.float16).float(), impl="emulate", scheme="w8a8")
    y = npu(x.half())
    assert fake_torch_npu.CALLS[-2:] == ["npu_dynamic_quant", "npu_quant_matmul"]
    assert y.dtype == torch.float16 and fake_torch_npu.LAST["npu_quant_matmul"]["output_dtype"] == torch.float16
    torch.testing.assert_close(y.float(), emu(x.half().float()), rtol=5e-3, atol=5e-3)
    assert (emu(x) - lin(x)).abs().max() < 0.05 * lin(x).abs().max()


def test_static_activation_scale_clips_outliers():
    lin = _linear()
    x = torch.randn(4, 32)
    x[0, 0] = 50.0  # far outside the calibrated range
    static = quant.Int8Linear(lin, impl="emulate", scheme="w8a8", act_scale=4.0 / 127)
    err_static = (static(x) - lin(x)).abs()[0].max()
    dynamic = quant.Int8Linear(lin, impl="emulate", scheme="w8a8")
    assert err_static > 10 * (dynamic(x) - lin(x)).abs()[0].max()


def test_bad_impl_and_scheme_name_the_parameter():
    with pytest.raises(ValueError, match="impl='fast'"):
        quant.resolve_impl("fast", "cpu", torch.float32)
    with pytest.raises(ValueError, match="scheme='w4'"):
        quant.resolve_impl("auto", "cpu", torch.float32, scheme="w4")
    with pytest.raises(ValueError, match="W8A8"):
        quant.resolve_impl("int8pack", "cpu", torch.bfloat16, scheme="w8a8")


def test_quantize_model_replaces_linears_and_keeps_logits(tiny_model):
    import copy

    model, tok = tiny_model
    model = copy.deepcopy(model)
    ids = torch.randint(0, 200, (1, 24))
    ref = model(input_ids=ids).logits
    expected = len(quant.linear_names(model))
    info = quant.quantize_model_int8(model, impl="dequant")
    assert info["layers"] == expected == 2 * 7 + 1
    assert info["bytes_after"] < 0.5 * info["bytes_before"]
    assert not quant.linear_names(model)
    out = model(input_ids=ids).logits
    assert quality.agreement(ref, out)["top1_agreement"] > 0.9
    with pytest.raises(ValueError, match="no nn.Linear"):
        quant.quantize_model_int8(model)


def test_unsupported_dtype_and_empty_model_give_clear_errors(tiny_model):
    import copy

    model = copy.deepcopy(tiny_model[0]).to(torch.float64)
    with pytest.raises(ValueError, match="float64 is not supported"):
        quant.quantize_model_int8(model)
    with pytest.raises(ValueError, match="no nn.Linear"):
        quant.quantize_model_int8(nn.Sequential(nn.ReLU()))
    with pytest.raises(ValueError, match="scheme="):
        quant.quantize_model_int8(model, scheme="int4")


def test_calibration_then_static_w8a8(tiny_model):
    import copy

    model, tok = tiny_model
    model = copy.deepcopy(model)
    amax = quant.calibrate(model, tok, ["hello world, calibration text", "another line"])
    assert set(amax) == set(quant.linear_names(model)) and all(v > 0 for v in amax.values())
    per_channel = quant.calibrate(model, tok, ["hello world, calibration text", "another line"], per_channel=True)
    for name, channels in per_channel.items():
        assert channels.shape == (model.get_submodule(name).in_features,)
        assert float(channels.max()) == pytest.approx(amax[name])
    info = quant.quantize_model_int8(model, scheme="w8a8", act_scales=amax)
    assert info["impl"] == "emulate" and "static" in info["activations"]
    assert torch.isfinite(model(input_ids=torch.randint(0, 200, (1, 8))).logits).all()
    with pytest.raises(ValueError, match="texts"):
        quant.calibrate(model, tok, [])


def test_weight_bytes_counts_tied_weights_once():
    emb = nn.Embedding(10, 4)
    head = nn.Linear(4, 10, bias=False)
    head.weight = emb.weight
    model = nn.ModuleDict({"emb": emb, "head": head})
    assert models.weight_bytes(model) == 10 * 4 * 4


def test_quantize_dynamic_cpu(tiny_model):
    import copy

    model, _ = tiny_model
    q, info = int8_study.quantize_dynamic_cpu(copy.deepcopy(model))
    assert info["bytes_after"] < info["bytes_before"]
    assert torch.isfinite(q(input_ids=torch.randint(0, 200, (1, 8))).logits).all()
    with pytest.raises(ValueError, match="float32"):
        int8_study.quantize_dynamic_cpu(copy.deepcopy(model).to(torch.bfloat16))


def test_perplexity_matches_direct_computation(tiny_model):
    model, tok = tiny_model
    text = "The quick brown fox jumps over the lazy dog. " * 3
    ids = tok(text, return_tensors="pt")["input_ids"][:, :40]
    with torch.no_grad():
        logits = model(input_ids=ids).logits[0]
    nll = F.cross_entropy(logits[:-1], ids[0, 1:])
    assert quant.perplexity(model, tok, text, max_tokens=40) == pytest.approx(math.exp(nll.item()),
                                                                             rel=1e-5)
    # windows: targets at a window start are not scored, the rest are, with fresh context
    w = 16
    nlls = []
    for start in range(0, 40, w):
        chunk = ids[:, start:start + w]
        with torch.no_grad():
            lg = model(input_ids=chunk).logits[0]
        nlls.append(F.cross_entropy(lg[:-1], chunk[0, 1:], reduction="sum"))
    direct = math.exp(float(sum(nlls)) / (39 - 2))
    assert quality.perplexity(model, tok, text, max_tokens=40, window=w) == pytest.approx(direct, rel=1e-5)
    with pytest.raises(ValueError, match="max_tokens"):
        quality.perplexity(model, tok, text, max_tokens=1)


def test_heldout_text_is_shipped_and_long_enough():
    text = quality.load_heldout_text()
    assert not text.startswith("#")
    assert len(text.split()) >= 1500


def test_variant_names_are_checked_and_unavailable_variants_say_why():
    with pytest.raises(ValueError, match="variants contains 'w4'"):
        int8_study.check_variants(["dense", "w4"])
    with pytest.raises(ValueError, match="non-empty list"):
        int8_study.check_variants([])
    with pytest.raises(quant.VariantUnavailable, match="CPU"):
        int8_study.build_variant("quantize_dynamic", "tiny-random", "cuda", torch.float16)
    with pytest.raises(quant.VariantUnavailable, match="calibrate"):
        int8_study.build_variant("w8a8_static", "tiny-random", "cpu", torch.bfloat16)


def test_build_variant_on_tiny_model():
    model, _, info = int8_study.build_variant("w8a16", "tiny-random", "cpu", torch.bfloat16)
    assert info["bytes_after"] < info["bytes_before"] and info["speed_is_meaningful"]
    _, _, info = int8_study.build_variant("w8a8_dynamic", "tiny-random", "cpu", torch.bfloat16)
    assert info["impl"] == "emulate" and not info["speed_is_meaningful"]


def test_ulp_is_the_spacing_of_the_dtype_at_the_value():
    assert operator_study.ulp(1.5, torch.float16) == 2 ** -10  # 9.77e-4: the guide's "< 1e-3" is one fp16 step here
    assert operator_study.ulp(1.0, torch.float16) == 2 ** -10
    assert operator_study.ulp(0.9, torch.float16) == 2 ** -11
    assert operator_study.ulp(-3.0, torch.float16) == 2 ** -9
    assert operator_study.ulp(1.0, torch.bfloat16) == 2 ** -7
    assert operator_study.ulp(1.0, torch.float32) == 2 ** -23


@pytest.mark.parametrize("value, dtype", [(float("nan"), torch.float16), (1.0, torch.int8), ("1", torch.float16)])
def test_ulp_rejects_bad_input(value, dtype):
    with pytest.raises(ValueError, match="value|dtype"):
        operator_study.ulp(value, dtype)


def test_bitsandbytes_config_arguments_checked_both_ways():
    assert int8_study.bitsandbytes_config_takes(("load_in_8bit", "llm_int8_threshold"))["takes"] is True
    out = int8_study.bitsandbytes_config_takes(("load_in_8bit", "load_in_9bit"))
    assert out["takes"] is False and out["missing"] == ["load_in_9bit"]


# --- the CPU W8A16 kernel, chosen by timing --------------------------------------------------

def _krow(kernel, ms, spread=0.2, problem=None):
    return {"kernel": kernel, "decode_ms": ms, "decode_p10_ms": ms - spread, "decode_p90_ms": ms + spread,
            "problem": problem}


def test_the_fastest_int8_kernel_is_picked_and_compared_with_dense():
    rows = [_krow("dense bfloat16", 20.0), _krow("int8pack", 12.0), _krow("dequant", 30.0), _krow("torchao", 31.0)]
    pick = quant.pick_w8a16_kernel(rows)
    assert pick["kernel"] == "int8pack" and pick["beats_dense"] and pick["margin"] == pytest.approx(20 / 12)
    rows = [_krow("dense bfloat16", 12.1, spread=1.0), _krow("int8pack", 12.0), _krow("dequant", 30.0)]
    pick = quant.pick_w8a16_kernel(rows)
    assert pick["kernel"] == "int8pack" and not pick["beats_dense"]  # within the noise of dense
    assert not pick["loses_to_dense"]
    rows = [_krow("dense bfloat16", 8.0), _krow("int8pack", 12.0), _krow("dequant", 30.0)]
    assert quant.pick_w8a16_kernel(rows)["loses_to_dense"]
    rows = [_krow("dense float32", 50.0), _krow("int8pack", 1.0, problem="missing"), _krow("dequant", 40.0)]
    assert quant.pick_w8a16_kernel(rows)["kernel"] == "dequant"
    with pytest.raises(ValueError, match="no usable int8 kernel"):
        quant.pick_w8a16_kernel([_krow("dense float32", 5.0), _krow("int8pack", 1.0, problem="missing")])


def test_kernel_timings_run_every_candidate_on_the_models_own_shapes(tiny_model):
    import copy

    model = copy.deepcopy(tiny_model[0]).to(torch.bfloat16)
    rows = quant.time_w8a16_kernels(model, min_iters=2, min_seconds=0.0)
    names = [r["kernel"] for r in rows]
    assert names == ["dense bfloat16", "int8pack", "dequant", "torchao"]
    shapes = {tuple(m.weight.shape) for m in model.modules() if isinstance(m, nn.Linear)}
    int8_mb = sum(m.weight.numel() for m in model.modules() if isinstance(m, nn.Linear)) / 1e6
    for row in rows:
        if not row["problem"]:
            assert row["decode_p10_ms"] <= row["decode_ms"] <= row["decode_p90_ms"]
            assert row["weight_mb"] == pytest.approx(int8_mb * (2 if row["kernel"].startswith("dense") else 1))
    assert len(shapes) > 1


def test_a_float32_model_gets_no_w8a32_torchao_candidate(tiny_model):
    rows = quant.time_w8a16_kernels(tiny_model[0], kernels=("torchao",), min_iters=2, min_seconds=0.0)
    assert rows[0]["kernel"] == "dense float32" and rows[1]["problem"]


def test_auto_quantization_on_a_cpu_records_the_kernel_timings(tiny_model):
    import copy

    model = copy.deepcopy(tiny_model[0])
    info = quant.quantize_model_int8(model, impl="auto")
    assert info["impl"] in ("int8pack", "dequant") and info["kernel_choice"]["kernel"] == info["impl"]
    assert info["activations"].startswith("bfloat16 (cast from float32")
    assert {r["kernel"] for r in info["kernel_timings"]} >= {"int8pack", "dequant"}
    assert torch.isfinite(model(input_ids=torch.randint(0, 200, (1, 6))).logits).all()


# --- INT4 in groups of 32 (the GGUF's Q4_1 grid) -----------------------------------------------

def _q4_1_grid_weight(n=16, k=64, seed=0):
    """Weights exactly on a Q4_1 grid: q * d + m per block of 32, each block using q = 0 and 15."""
    gen = torch.Generator().manual_seed(seed)
    q = torch.randint(0, 16, (n, k // 32, 32), generator=gen).float()
    q[..., 0], q[..., 1] = 0, 15
    d = torch.rand(n, k // 32, 1, generator=gen) * 0.01 + 0.001
    m = -torch.rand(n, k // 32, 1, generator=gen) * 0.05
    return (q * d + m).reshape(n, k)


def test_int4_groups_represent_a_q4_1_grid_exactly():
    w = _q4_1_grid_weight()
    q, scale, zero = quant.quantize_weight_int4(w)
    assert q.dtype == torch.int32 and int(q.min()) == 0 and int(q.max()) == 15 and scale.shape == (16, 2)
    torch.testing.assert_close(quant.dequantize_weight_int4(q, scale, zero), w, rtol=0, atol=1e-6)
    off_grid = w + 0.003 * torch.randn_like(w)
    err = (quant.dequantize_weight_int4(*quant.quantize_weight_int4(off_grid)) - off_grid).abs()
    assert float(err.max()) > 1e-4  # a weight off the grid moves: the check can fail
    with pytest.raises(ValueError, match="group_size=32"):
        quant.quantize_weight_int4(torch.randn(4, 48))


@pytest.mark.skipif(quant.int4_problem("cpu") is not None, reason="no CPU int4 kernel in this torch")
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_int4_linear_matches_its_dequantized_weights(dtype):
    lin = nn.Linear(64, 16, bias=True)
    with torch.no_grad():
        lin.weight.copy_(_q4_1_grid_weight())
    lin = lin.to(dtype)
    layer = quant.Int4Linear(lin)
    x = torch.randn(3, 64).to(dtype)
    y = layer(x)
    assert y.dtype == dtype and y.shape == (3, 16)
    ref = F.linear(x.float(), quant.dequantize_weight_int4(*quant.quantize_weight_int4(lin.weight.float())),
                   lin.bias.float())
    torch.testing.assert_close(y.float(), ref, rtol=3e-2, atol=3e-2)


@pytest.mark.skipif(quant.int4_problem("cpu") is not None, reason="no CPU int4 kernel in this torch")
def test_quantize_model_int4_replaces_every_linear(tiny_model):
    import copy

    model = copy.deepcopy(tiny_model[0])
    ids = torch.randint(0, 200, (1, 16))
    ref = model(input_ids=ids).logits
    info = quant.quantize_model_int4(model)
    # the byte tokenizer's vocabulary is no multiple of 16: lm_head stays as it is, and says so
    assert info["kept_unquantized"] == ["lm_head"] and quant.linear_names(model) == ["lm_head"]
    assert info["layers"] == 14 and info["scheme"] == "w4a16"
    assert info["bytes_after"] < 0.6 * info["bytes_before"]
    assert quality.agreement(ref, model(input_ids=ids).logits)["top1_agreement"] > 0.7


def test_int4_is_a_cpu_kernel_only():
    assert "CPU kernel" in quant.int4_problem("cuda")
    assert quant.int4_problem("cpu") in (None, "this torch has no _weight_int4pack_mm_for_cpu")


def test_the_npu_kernels_width_limit_does_not_apply_to_the_cpu_kernels():
    """K, N <= 65,535 is a limit of npu_weight_quant_batchmatmul / npu_quant_matmul only: on a CPU a
    linear as wide as Llama-3's lm_head (here N = 65,536) is quantized like any other."""
    model = nn.Sequential(nn.Linear(8, 16), nn.Linear(16, 65536, bias=False))
    x = torch.randn(2, 8)
    ref = model(x)
    info = quant.quantize_model_int8(model, impl="dequant")
    assert info["kept_dense"] == [] and info["layers"] == 2 and not quant.linear_names(model)
    torch.testing.assert_close(model(x), ref, atol=5e-2, rtol=5e-2)
    assert quant.npu_shape_problem(16, 65536) == "N=65536 > 65535, the limit of npu_weight_quant_batchmatmul"


# --- float16 INT8 stays finite, and a non-finite quality figure is an error --------------------

def _large_activation_case():
    """A float16 linear whose input has one activation in the thousands, as SmolLM2-135M's
    down_proj inputs do: the int8 product before the scale (up to 127 per weight) passes 65504."""
    lin = _linear(n=16, k=64, dtype=torch.float16)
    x = torch.randn(3, 64, generator=torch.Generator().manual_seed(1)).to(torch.float16)
    x[1, 5] = 2870.0
    return lin, x


def test_dequant_matmul_in_float16_scales_the_weight_before_the_product():
    from helpers import bench

    lin, x = _large_activation_case()
    q, scale = quant.quantize_weight(lin.weight)
    s16 = scale.to(torch.float16)
    unscaled_first = F.linear(x, q.to(torch.float16)) * s16
    assert not torch.isfinite(unscaled_first).all()  # the order the fix avoids does overflow
    y = quant.dequant_matmul(x, q, s16)
    exact = F.linear(x.float(), quant.dequantize_weight(q, scale))
    bench.assert_within(y, exact, "matmul", what="float16 dequant_matmul")
    module = quant.Int8Linear(lin, impl="dequant")
    assert torch.isfinite(module(x)).all()
    # bfloat16 has float32's range: the cheaper order stays, and stays finite
    yb = quant.dequant_matmul(x.to(torch.bfloat16), q, scale.to(torch.bfloat16))
    bench.assert_within(yb, exact, "matmul", what="bfloat16 dequant_matmul")


def test_a_float16_model_gets_no_torchao_candidate(tiny_model):
    import copy

    model = copy.deepcopy(tiny_model[0]).to(torch.float16)
    rows = quant.time_w8a16_kernels(model, kernels=("dequant", "torchao"), min_iters=2, min_seconds=0.0)
    torchao = next(r for r in rows if r["kernel"] == "torchao")
    assert "overflows float16" in torchao["problem"]
    assert quant.pick_w8a16_kernel(rows)["kernel"] == "dequant"


class _Logits(nn.Module):
    """A stand-in model returning fixed logits, some of them inf or NaN."""

    def __init__(self, logits, dtype=torch.float16):
        super().__init__()
        self.config = type("Config", (), {"max_position_embeddings": 64})()
        self.anchor = nn.Parameter(torch.zeros(1, dtype=dtype))
        self.logits = logits

    def forward(self, input_ids, use_cache=False):
        return type("Out", (), {"logits": self.logits[None, :input_ids.shape[1]]})()


def test_inf_or_nan_logits_raise_with_the_figure_the_model_and_the_reason():
    logits = torch.randn(8, 11)
    logits[2, :4] = float("inf")
    ids = torch.randint(0, 11, (1, 8))
    with pytest.raises(quality.NonFiniteQuality,
                       match=r"perplexity of w8a16 \(float16\): logits contain 4 inf values .*"
                             r"the float16 forward overflowed"):
        quality.evaluate(_Logits(logits.half()), ids, label="w8a16 (float16)")
    nan = logits.clone()
    nan[2, :4] = float("nan")
    with pytest.raises(quality.NonFiniteQuality, match="4 NaN values .*bfloat16 forward"):
        quality.evaluate(_Logits(nan, torch.bfloat16), ids, label="x")
    with pytest.raises(quality.NonFiniteQuality, match="agreement .* of cand"):
        quality.agreement(torch.randn(8, 11), nan, "cand")
    finite = quality.evaluate(_Logits(torch.randn(8, 11)), ids, torch.randn(8, 11), label="ok")
    assert math.isfinite(finite["perplexity"]) and math.isfinite(finite["max_abs_logit_diff"])


def test_a_library_variant_that_overflows_is_listed_as_skipped_with_the_reason(monkeypatch):
    from helpers import int8_study

    bad = torch.randn(8, 11)
    bad[0, 0] = float("inf")
    info = {"dtype": "float16", "impl": "lib", "speed_is_meaningful": False}
    monkeypatch.setattr(int8_study, "build_variant", lambda name, *a, **k: (_Logits(bad.half()), None, info))
    ids = torch.randint(0, 11, (1, 8))
    rows, skipped = int8_study.measure_variants(["torchao"], "m", "cpu", torch.float16, ids, None,
                                                prompt="p", new_tokens=2, batch_sizes=[1], repeats=1)
    assert rows == {} and "inf values" in skipped[0]["reason"]
    with pytest.raises(quality.NonFiniteQuality, match="variant w8a16"):  # the workbook's own kernel
        int8_study.measure_variants(["w8a16"], "m", "cpu", torch.float16, ids, None, prompt="p",
                                    new_tokens=2, batch_sizes=[1], repeats=1)


def test_the_embedded_model_in_float16_int8_has_a_finite_perplexity():
    # SmolLM2-135M's down_proj inputs reach the thousands on the held-out text: before the fix
    # the dequant kernel's float16 product overflowed and the perplexity was nan
    from helpers import int8_study

    lm, tok = models.load_model("smollm2-135m", dtype=torch.float16, device="cpu")
    ids, _ = int8_study.heldout_split(tok, quality.load_heldout_text(), 64)
    dense = quality.evaluate(lm, ids, return_logits=True)
    quant.quantize_model_int8(lm, impl="dequant")
    int8 = quality.evaluate(lm, ids, dense["logits"], label="w8a16 dequant, float16")
    assert math.isfinite(int8["perplexity"])
    assert int8["perplexity"] == pytest.approx(dense["perplexity"], rel=0.1)
    assert int8["top1_agreement"] > 0.8


def test_the_int4_kernel_s_activations_are_chosen_by_timing_at_the_model_s_shapes():
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(64, 32, bias=False), nn.Linear(32, 48, bias=False)).to(torch.float16)
    found = quant.time_int4_activations(model, min_iters=3, min_seconds=0.0)
    names = [r["kernel"] for r in found["rows"]]
    # the dense baseline and both 16-bit activation dtypes; in_features 32 and 64 are whole groups of 32
    assert names == ["dense float16", "int4 g32, bfloat16 activations", "int4 g32, float16 activations"]
    timed = [r for r in found["rows"][1:] if not r["problem"]]
    assert found["act_dtype"] in quant.INT4_ACT_DTYPES and timed
    assert found["kernel"] == min(timed, key=lambda r: r["decode_ms"])["kernel"]
    bf16 = quant.time_int4_activations(model.to(torch.bfloat16), min_iters=3, min_seconds=0.0)
    assert [r["kernel"] for r in bf16["rows"]][1:] == ["int4 g32, bfloat16 activations"]  # float16 may overflow
    info = quant.quantize_model_int4(model.to(torch.float16), act_dtype=torch.float16)
    assert info["activations"] == "float16" and model[0].act_dtype == torch.float16
    with pytest.raises(ValueError, match="act_dtype"):
        quant.Int4Linear(nn.Linear(64, 32), act_dtype=torch.float32)
