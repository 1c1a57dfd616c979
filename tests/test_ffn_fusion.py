"""Chapter 02's helpers: the guide's FFN line, the variants checked and timed, the elementwise
share, the precision claims, the fused model and the two plots (on CPU, small shapes)."""
from __future__ import annotations

import pandas as pd
import pytest
import torch

from helpers import bench, operator_study, ops, plots


def _timing(name, *samples_ms):
    return bench.Timing(name, [s / 1e3 for s in samples_ms])


def _fake_measure(times_ms):
    """A ``measure(fn, name)`` that runs ``fn`` once and returns the given samples for that name."""
    def measure(fn, name):
        fn()
        return _timing(name, *times_ms[name])
    return measure


def test_the_guides_ffn_line_fails_and_the_corrected_one_runs():
    line = operator_study.guide_ffn_line()
    assert line["runs"] is False and line["error"].startswith("RuntimeError")
    assert "14336" in line["error"]
    assert line["llama2_7b_intermediate"] == 11008
    assert line["corrected_weight"] == "11008x4096" and line["corrected_output"] == "1x4096x11008"
    widths = {row["config defaults"].split("(")[0]: row["intermediate"] for row in line["sizes"]}
    assert widths == {"LlamaConfig": 11008, "MistralConfig": 14336}


@pytest.mark.parametrize("device, compile_ops, names", [
    ("cpu", True, ["unfused", "merged", "fused_act", "graph"]),
    ("cpu", False, ["unfused", "merged"]),
    ("npu:0", False, ["unfused", "merged", "fused_act"]),
    ("npu:0", True, ["unfused", "merged", "fused_act", "graph"]),
])
def test_variant_names_follow_the_device_and_compile_ops(device, compile_ops, names):
    assert operator_study.ffn_variant_names(device, compile_ops) == names


def test_ffn_cases_share_weights_per_shape_and_scale_them_by_fan_in():
    info = {"name": "tiny", "hidden_size": 16, "intermediate_size": 40}
    shapes = operator_study.ffn_shapes(32, 96, info)
    assert shapes == {"large H=32 I=96": (32, 96), "tiny H=16 I=40": (16, 40)}
    cases = operator_study.ffn_cases(shapes, (1, 8), "cpu", torch.float32)
    assert list(cases) == ["large H=32 I=96, T=1", "large H=32 I=96, T=8", "tiny H=16 I=40, T=1",
                           "tiny H=16 I=40, T=8"]
    (x1, w1), (x8, w8) = cases["large H=32 I=96, T=1"], cases["large H=32 I=96, T=8"]
    assert x1.shape == (1, 1, 32) and x8.shape == (1, 8, 32) and w1 is w8
    assert [tuple(w.shape) for w in w1] == [(96, 32), (96, 32), (32, 96)]
    big = operator_study.ffn_weights(256, 512, "cpu", torch.float32, torch.Generator().manual_seed(0))
    assert big[0].std().item() == pytest.approx(256 ** -0.5, rel=0.05)
    assert big[2].std().item() == pytest.approx(512 ** -0.5, rel=0.05)


def _ffn_case():
    cases = operator_study.ffn_cases({"s": (16, 40)}, (4,), "cpu", torch.float32)
    return cases["s, T=4"]


def test_check_time_count_checks_times_counts_and_keeps_spreads():
    x, weights = _ffn_case()
    variants = operator_study.ffn_variants(x, weights, ["unfused", "merged"], "cpu", "s, T=4")
    measure = _fake_measure({"s, T=4 / unfused": (2.0, 2.0, 2.1), "s, T=4 / merged": (1.0, 1.0, 1.05)})
    rows, timings = operator_study.check_time_count(
        variants, "cpu", expected=ops.float32_reference(operator_study.ffn_reference, x, *weights),
        baseline="unfused", tolerance="ffn", measure=measure, count=lambda fn: {
            "ops": 3, "by_op": {"aten::linear": 3}})
    assert [r["variant"] for r in rows] == ["unfused", "merged"] and rows[0]["case"] == "s, T=4"
    assert rows[0]["speedup_vs_unfused"] == 1.0 and rows[0]["max_abs_diff_vs_unfused"] == 0.0
    merged = rows[1]
    assert merged["speedup_vs_unfused"] == pytest.approx(2.0)
    assert merged["speedup_vs_unfused_low"] == pytest.approx(2.0 / 1.05, rel=0.02)
    assert merged["speedup_vs_unfused_high"] == pytest.approx(2.1 / 1.0, rel=0.02)
    assert merged["ops_per_call"] == 3 and merged["ops"] == "aten::linear x3"
    assert merged["max_abs_diff_vs_unfused"] < 1e-5
    assert set(timings) == {("s, T=4", "unfused"), ("s, T=4", "merged")}


def test_check_time_count_fails_a_wrong_variant_and_a_missing_baseline():
    x, weights = _ffn_case()
    expected = operator_study.ffn_reference(x, *weights)
    wrong = [({"variant": "unfused"}, lambda: expected), ({"variant": "bad"}, lambda: expected * 1.1)]
    measure = _fake_measure({"unfused": (1.0,), "bad": (1.0,)})
    with pytest.raises(AssertionError):
        operator_study.check_time_count(wrong, "cpu", expected=expected, baseline="unfused", measure=measure,
                               tolerance="ffn")
    with pytest.raises(ValueError, match="baseline='eager'"):
        operator_study.check_time_count(wrong[:1], "cpu", expected=expected, baseline="eager", measure=measure)


def test_ffn_tolerance_scales_with_the_dtype_and_the_output():
    ref = torch.tensor([4.0, -2.0], dtype=torch.bfloat16)
    tol = bench.tolerance_for(ref, "ffn", ref)
    rtol = 16 * 2 ** -7 + 2 ** 0.5 * 2 ** -23  # 16 bfloat16 ULPs + the float32 reduction term
    assert tol["rtol"] == pytest.approx(rtol) and tol["atol"] == pytest.approx(4 * rtol)
    # float32: 16 ULPs plus the float32 reduction term over the reference's last dimension (2 here)
    assert bench.tolerance_for(ref.float(), "ffn", ref)["rtol"] == pytest.approx((16 + 2 ** 0.5) * 2 ** -23)


def test_elementwise_share_names_the_best_only_beyond_the_noise():
    x, weights = _ffn_case()
    case = "s, T=4"
    # 5 samples per variant, as bench.measure's min_iters gives: enough for decide to name a best
    timings = {(case, "unfused"): _timing("u", 10, 10, 10, 10.5, 10.5),
               (case, "merged"): _timing("m", 8, 8, 8, 8.2, 8.2), (case, "graph"): _timing("g", 12, 12, 12, 13, 13)}
    measure = _fake_measure({f"silu*mul / {case}": (1.0, 1.0)})
    row = operator_study.elementwise_share_rows({case: (x, weights)}, timings, ["unfused", "merged", "graph"],
                                     measure)[0]
    assert row["elementwise_share_pct"] == pytest.approx(10.0)
    assert row["best_variant"] == "merged" and row["best_clear"] is True
    assert row["best_speedup"] == pytest.approx(10 / 8)
    assert row["saved_pct_merged"] == pytest.approx(20.0) and row["saved_pct_graph"] == pytest.approx(-20.0)
    few = {key: _timing(t.name, *[x * 1e3 for x in t.samples[:3]]) for key, t in timings.items()}
    row = operator_study.elementwise_share_rows({case: (x, weights)}, few, ["unfused", "merged", "graph"],
                                                measure)[0]  # the same spreads from 3 samples each: no best
    assert row["best_variant"] == "merged" and row["best_clear"] is False
    timings[case, "merged"] = _timing("m", 8, 8, 8, 11, 11)  # now inside unfused's spread
    row = operator_study.elementwise_share_rows({case: (x, weights)}, timings, ["unfused", "merged", "graph"],
                                     measure)[0]
    assert row["best_variant"] == "merged" and row["best_clear"] is False


def test_precision_compares_float16_variants_against_float64():
    weights = operator_study.ffn_weights(64, 160, "cpu", torch.float32, torch.Generator().manual_seed(0))
    rows, facts = operator_study.ffn_precision(weights, "cpu", "merged")
    assert [r["guide threshold"] for r in rows] == ["< 1e-3", "", "", "> 1e-2 if misaligned"]
    assert facts["weight_contiguous_at_op"] is False
    assert facts["noncontig_vs_contig"] < 1e-2  # the strides are honoured
    assert 0 < facts["unfused_vs_float64"] < 1e-2 and facts["fused_vs_float64"] < 1e-2
    assert facts["ulp_at_output"] == pytest.approx(
        2.0 ** (torch.tensor(facts["output_max_abs"]).log2().floor().item() - 10))
    assert facts["fused_vs_unfused_ulps"] == pytest.approx(facts["fused_vs_unfused"] / facts["ulp_at_output"])
    assert rows[0]["max_abs_diff"] == facts["fused_vs_unfused"]


def test_residual_norm_variants_compare_eager_with_a_compiled_function():
    cases = operator_study.residual_norm_cases(4, 32, 16, "cpu", torch.float32)
    assert list(cases) == ["prefill, large 1x4x32", "decode, model 1x1x16"]
    case, inputs = next(iter(cases.items()))
    variants = operator_study.residual_norm_variants(inputs, ops.add_rms_norm_reference, "stand-in", case)
    assert [labels["mode"] for labels, _ in variants] == ["eager", "graph (stand-in)"]
    measure = _fake_measure({f"{case} / eager": (2.0,), f"{case} / graph (stand-in)": (1.0,)})
    rows, _ = operator_study.check_time_count(variants, "cpu", expected=ops.add_rms_norm_reference(*inputs, 1e-5),
                                     baseline="eager", measure=measure)
    assert rows[1]["speedup_vs_eager"] == pytest.approx(2.0)


def test_fused_model_check_keeps_the_logits(tiny_model):
    import copy

    model = copy.deepcopy(tiny_model[0])
    seen = []

    def measure(fn, name):
        seen.append(name)
        fn()
        return _timing(name, 1.0, 1.1)

    result = operator_study.fused_model_check(model, 8, measure)
    assert seen == ["model forward, original modules", "model forward, fused modules"]
    assert result["counts"]["mlp"] == model.config.num_hidden_layers
    assert result["top1_agreement"] == 1.0 and result["max_abs_diff"] < 1e-4
    assert isinstance(model.model.layers[0].mlp, ops.FusedLlamaMLP)


def _ffn_table():
    return pd.DataFrame([
        {"case": "a, T=1", "variant": "unfused", "median_ms": 2.0, "ops_per_call": 5},
        {"case": "a, T=1", "variant": "merged", "median_ms": 1.5, "ops_per_call": 4},
        {"case": "b, T=8", "variant": "unfused", "median_ms": 20.0, "ops_per_call": 5},
        {"case": "b, T=8", "variant": "merged", "median_ms": 30.0, "ops_per_call": 4}])


def test_ffn_variant_plot_draws_each_median_with_its_op_count():
    fig = operator_study.plot_ffn_variants(_ffn_table(), "title")
    for ax, medians, counts in zip(fig.axes, ([2.0, 1.5], [20.0, 30.0]), (["5 ops", "4 ops"],) * 2):
        assert [p.get_height() for p in ax.patches] == medians
        assert [t.get_text() for t in ax.texts] == counts
        assert ax.get_yscale() == "log"


def test_fusion_savings_plot_clips_a_far_negative_bar_and_labels_it():
    share = pd.DataFrame([{"case": "a, T=1", "elementwise_share_pct": 12.0, "saved_pct_merged": 5.0,
                           "saved_pct_graph": -400.0}])
    assert [c for c, _ in plots.fusion_saving_bars(share, ["unfused", "merged", "graph"])] == [
        "elementwise_share_pct", "saved_pct_merged", "saved_pct_graph"]
    fig = plots.plot_fusion_savings(share, ["unfused", "merged", "graph"])
    ax = fig.axes[0]
    assert [p.get_width() for p in ax.patches] == [12.0, 5.0, -150.0]
    assert [t.get_text() for t in ax.texts] == ["-400%"]
    assert ax.get_xlim()[0] == -150.0 and "clipped at -150%" in ax.get_xlabel()
    mild = share.assign(saved_pct_graph=-20.0)
    ax = plots.plot_fusion_savings(mild, ["unfused", "merged", "graph"]).axes[0]
    assert [p.get_width() for p in ax.patches] == [12.0, 5.0, -20.0] and not ax.texts
    assert "clipped" not in ax.get_xlabel()
