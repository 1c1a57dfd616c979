"""helpers.ladder with stub rungs: failures are recorded and the ladder goes on."""
from __future__ import annotations

import pandas as pd
import pytest

from helpers import bench, decide, generation, ladder, mindspeed, models, plots, round_robin


def _measure(latency_ms):
    return lambda variant: {"latency_ms": latency_ms[variant], "tokens_per_s": 100e3 / latency_ms[variant],
                            "peak_memory_bytes": 1000}


def test_failing_rung_is_recorded_and_the_ladder_continues():
    def broken():
        raise RuntimeError("fused op missing\nsecond line")

    def skipped():
        raise round_robin.RungSkipped("runtime options exist only on an NPU")

    rungs = [("eager", "baseline", lambda: "a"), ("broken", "raises", broken),
             round_robin.Rung("npu options", "skipped here", skipped), ("fast", "twice as fast", lambda: "b")]
    seen = []
    table = round_robin.run_ladder(rungs, _measure({"a": 200.0, "b": 100.0}), roofline_tok_s=1000.0,
                              on_rung=seen.append)
    assert list(table["status"]) == ["ok", "failed", "skipped", "ok"]
    assert table.loc[1, "error"] == "RuntimeError: fused op missing"
    assert "runtime options" in table.loc[2, "error"]
    assert table.loc[3, "speedup"] == pytest.approx(2.0)
    assert table.loc[0, "speedup"] == pytest.approx(1.0)
    assert table.loc[3, "roofline_pct"] == pytest.approx(100.0)
    assert pd.isna(table.loc[1, "speedup"])
    assert [r["rung"] for r in seen] == ["eager", "broken", "npu options", "fast"]
    assert list(table["rung_id"]) == ["eager", "broken", "npu options", "fast"]  # no id given: the name
    assert list(table.columns[:len(round_robin.COLUMNS)]) == list(round_robin.COLUMNS)


def test_measure_errors_and_missing_keys_fail_only_their_rung():
    def measure(variant):
        if variant == "bad":
            return {"latency_ms": 5.0}
        return {"latency_ms": 10.0, "tokens_per_s": 10.0, "roofline_tok_s": 20.0}

    freed = []
    table = round_robin.run_ladder([("a", "", lambda: "ok"), ("b", "", lambda: "bad")], measure,
                              cleanup=freed.append)
    assert list(table["status"]) == ["ok", "failed"]
    assert "tokens_per_s" in table.loc[1, "error"]
    assert table.loc[0, "roofline_pct"] == pytest.approx(50.0)
    assert freed == ["ok", "bad"]


def test_first_rung_failing_makes_the_next_ok_rung_the_baseline():
    def boom():
        raise ValueError("no model")

    table = round_robin.run_ladder([("a", "", boom), ("b", "", lambda: "b"), ("c", "", lambda: "c")],
                              _measure({"b": 300.0, "c": 100.0}))
    assert table.loc[1, "speedup"] == pytest.approx(1.0)
    assert table.loc[2, "speedup"] == pytest.approx(3.0)


def test_timings_give_speedup_with_spread():
    slow = bench.Timing("slow", [0.20, 0.21, 0.19])
    fast = bench.Timing("fast", [0.10, 0.11, 0.09])
    timings = {"s": slow, "f": fast}
    table = round_robin.run_ladder(
        [("s", "", lambda: "s"), ("f", "", lambda: "f")],
        lambda v: {"latency_ms": timings[v].median_ms, "tokens_per_s": 1 / timings[v].median,
                   "timing": timings[v]})
    expected = bench.speedup(slow, fast)
    assert table.loc[1, "speedup"] == pytest.approx(expected.ratio)
    assert table.loc[1, "speedup_low"] == pytest.approx(expected.low)
    assert isinstance(table.loc[1, "timing"], dict)  # JSON-able for results.table


def test_bad_rungs_are_rejected_before_any_work():
    with pytest.raises(ValueError, match="rungs is empty"):
        round_robin.run_ladder([], lambda v: {})
    with pytest.raises(ValueError, match="not valid"):
        round_robin.run_ladder([("a", "no callable", None)], lambda v: {})
    with pytest.raises(ValueError, match="unique"):
        round_robin.run_ladder([("a", "", lambda: 1), ("a", "", lambda: 2)], lambda v: {})
    with pytest.raises(ValueError, match="unique"):
        round_robin.run_ladder([round_robin.Rung("a", "", lambda: 1, id="x"), round_robin.Rung("b", "", lambda: 2, id="x")],
                          lambda v: {})


def test_guide_ladder_ratios_and_comparison():
    guide = ladder.guide_ladder()
    assert guide["speedup"].iloc[-1] == pytest.approx(6012 / 2100)
    assert guide["throughput_ratio"].iloc[-1] == pytest.approx(47.2 / 16.6)
    assert guide["memory_ratio"].iloc[-1] == pytest.approx(7.8 / 13.6)
    ours = round_robin.run_ladder([("a", "", lambda: "a"), ("b", "", lambda: "b")], _measure({"a": 2.0, "b": 1.0}))
    both = ladder.compare_with_guide(ours)
    assert set(both["source"]) == {"guide's claim (910B, Llama-2-7B fp16)", "measured here"}
    panels = ladder.beside_the_guide(ours)
    assert [p["title"] for p in panels] == ["guide's claim (910B, Llama-2-7B fp16)", "measured here"]
    assert [v for _, v in panels[1]["rungs"]] == pytest.approx([1.0, 2.0])
    fig = plots.plot_ladder(panels, ladder.BESIDE_THE_GUIDE)
    import matplotlib.pyplot as plt

    plt.close(fig)


def test_framework_detection_names_mindspeed_and_its_commands(monkeypatch):
    monkeypatch.setattr(mindspeed.importlib.util, "find_spec", lambda name: None)
    rows = {r["framework"]: r for r in mindspeed.detect_frameworks()}
    assert rows["MindSpeed-LLM"]["status"] == "not installed here"
    assert "generate_llama2_7b_ptd.sh" in rows["MindSpeed-LLM"]["commands"]
    assert "vLLM-Ascend" not in rows  # serving engines are chapter 07's (helpers.serving)
    monkeypatch.setattr(mindspeed.importlib.util, "find_spec", lambda name: object())
    assert mindspeed.detect_frameworks()[0]["status"] == "installed"


def test_runtime_options_real_ones_applied_invented_one_ignored(fake_torch_npu):
    import torch

    rows = {r["option"].split(" =")[0].split("(")[0]: r for r in
            ladder.apply_runtime_options("npu:0")}
    assert "set_compile_mode(False)" in fake_torch_npu.CALLS
    assert torch.npu.config._options["ALLOW_INTERNAL_FORMAT"] is False
    assert rows["torch.npu.config.enable_auto_mixed_precision"]["status"] == "silently ignored"
    with pytest.raises(round_robin.RungSkipped, match="only in torch_npu"):
        ladder.apply_runtime_options("cpu")


def test_generation_measure_maps_the_generation_contract(monkeypatch, tiny_model):
    calls = []

    def measure_generation(model, tokenizer, prompts, max_new_tokens, device=None, *, repeats=3, chat=False,
                           static_cache=False, warm=False):
        calls.append((len(prompts), max_new_tokens, repeats, static_cache) + (("warm",) if warm else ()))
        graph = {"compiled_graphs": 2, "compile_s": 9.0} if static_cache else {}
        return {"total_ms": 500.0, "tokens_per_s_aggregate": 8.0 * len(prompts), "peak_memory_bytes": 123,
                "batch_size": len(prompts), "ttft_ms": 50.0, "decode_ms_per_token": 45.0,
                "dtype": "float32", "code_path": "stub", "prompt_tokens": 7, "new_tokens": max_new_tokens,
                **graph}

    monkeypatch.setattr(ladder, "measure_generation", measure_generation)
    model, tokenizer = tiny_model
    measure = ladder.generation_measure(tokenizer, ["a"], 4, "cpu", bandwidth_gbps=10.0, repeats=1)
    one = measure(model)
    four = measure((model, ["a"] * 4))
    static = measure(ladder.Variant(model, ["a"] * 2, static_cache=True))
    assert calls == [(1, 4, 1, False), (4, 4, 1, False), (2, 4, 1, True)]
    # a round times a variant that has run: no warm-up generate; the first measurement with rounds is one generate
    measure = ladder.generation_measure(tokenizer, ["a"], 4, "cpu", repeats=3)
    measure.warm(model), measure.again(model)
    assert calls[3:] == [(1, 4, 1, False), (1, 4, 3, False, "warm")]
    assert one["compiled_graphs"] is None and static["compiled_graphs"] == 2 and static["compile_s"] == 9.0
    assert one["latency_ms"] == 500.0 and four["tokens_per_s"] == 32.0
    assert (one["prompt_tokens"], one["new_tokens"]) == (7, 4)  # chapter 07 compares at these lengths
    assert one["weight_bytes"] == models.weight_bytes(model) > 0
    # every roofline counts a step's bytes one way: the weights plus the batch's KV cache at the mean context
    for row, batch in ((one, 1), (four, 4)):
        step_bytes = generation.decode_bytes_per_step(model, batch, 7 + 4 // 2)
        assert row["roofline_tok_s"] == pytest.approx(batch * 10.0e9 / step_bytes)
    assert one["roofline_tok_s"] < four["roofline_tok_s"] < 4 * one["roofline_tok_s"]  # the KV cache grows too


def test_batch_rung_speedup_is_a_throughput_ratio():
    metrics = {"b1": {"latency_ms": 100.0, "tokens_per_s": 10.0, "batch_size": 1},
               "b4": {"latency_ms": 150.0, "tokens_per_s": 26.0, "batch_size": 4}}
    table = round_robin.run_ladder([("b1", "", lambda: "b1"), ("b4", "", lambda: "b4")], lambda v: metrics[v])
    assert table.loc[1, "speedup"] == pytest.approx(2.6)


def test_run_script_times_a_script_and_reports_failures(tmp_path):
    from helpers import ladder

    ok = tmp_path / "ok.sh"
    ok.write_text("sleep 0.3; echo generated text in $(pwd)\n")
    out = mindspeed.run_script(str(ok), parameter="mindspeed_script")
    assert out["returncode"] == 0 and f"generated text in {tmp_path}" in out["output_tail"]
    assert out["wall_s"] >= 0.3  # the script's whole run is timed, not the start of the process
    bad = tmp_path / "bad.sh"
    bad.write_text("echo broken >&2; exit 3\n")
    with pytest.raises(RuntimeError, match="exited with 3"):
        mindspeed.run_script(str(bad), parameter="mindspeed_script")
    with pytest.raises(ValueError, match="mindspeed_script="):
        mindspeed.run_script(str(tmp_path / "missing.sh"), parameter="mindspeed_script")


# the decode samples a default chapter 06 rung pools: 3 rounds x 3 repeats x 15 steps of 16 new tokens
POOLED = 3 * 3 * 15


def _ladder_table():
    metrics = {"eager": {"latency_ms": 100.0, "tokens_per_s": 10.0, "batch_size": 1, "decode_samples": POOLED},
               "graph": {"latency_ms": 50.0, "tokens_per_s": 20.0, "batch_size": 1, "decode_samples": POOLED},
               "int8": {"latency_ms": 40.0, "tokens_per_s": 25.0, "batch_size": 1, "decode_samples": POOLED},
               "batch 8": {"latency_ms": 80.0, "tokens_per_s": 100.0, "batch_size": 8, "decode_samples": POOLED}}
    rungs = [(name, "", (lambda n=name: n)) for name in metrics]
    rungs.insert(1, ("broken", "", lambda: 1 / 0))
    return round_robin.run_ladder(rungs, lambda v: metrics[v])


def test_headline_figures_never_mix_batch1_latency_and_batch_throughput():
    table = _ladder_table()
    best = ladder.best_batch1_speedup(table)
    assert best["rung"] == "int8" and best["speedup"] == pytest.approx(2.5)  # not the batch rung's 10x
    batch = ladder.batch_throughput_ratio(table)
    # like with like: over the batch-1 rung it builds on (int8, 25 tok/s), not native eager's 10 tok/s
    assert batch["rung"] == "batch 8" and batch["ratio"] == pytest.approx(4.0) and batch["batch_size"] == 8
    assert batch["over"] == "int8"
    row = table[table["rung"] == "batch 8"].iloc[0]
    assert row["speedup"] == pytest.approx(4.0) and row["speedup_over"] == "int8"
    assert best["decision"] == "no gain beyond the noise"  # latencies without spreads: the noise is unknown
    only_batch1 = table[table["rung"] != "batch 8"]
    assert ladder.batch_throughput_ratio(only_batch1) is None
    assert ladder.best_batch1_speedup(table[table["rung"] == "eager"]) is None


def test_guide_comparison_shows_only_batch1_rungs():
    comparison = ladder.compare_with_guide(_ladder_table())
    ours = comparison[comparison["source"] == "measured here"]
    assert "batch 8" not in " ".join(ours["label"])
    assert list(ours["label"]) == ["eager", "broken (failed)", "graph", "int8"]


def test_graph_rungs_above_two_graphs_are_reported():
    metrics = {"eager": {"latency_ms": 10.0, "tokens_per_s": 10.0},
               "graph": {"latency_ms": 5.0, "tokens_per_s": 20.0, "compiled_graphs": 2},
               "recompiling": {"latency_ms": 5.0, "tokens_per_s": 20.0, "compiled_graphs": 9}}
    table = round_robin.run_ladder([(n, "", (lambda n=n: n)) for n in metrics], lambda v: metrics[v])
    assert ladder.graph_count_problems(table) == ["recompiling: 9 graphs built, more than 2 for one shape"]
    assert ladder.graph_count_problems(table[table["rung"] != "recompiling"]) == []


# --- beside the ladder: llama.cpp and float32 eager ------------------------------------------------

# the ids rungs.rungs gives the rungs these tests name (any other name is its own id)
RUNG_IDS = {"native eager": "native_eager", "+ graph mode": "graph_mode", "+ INT8": "int8_weights",
            "+ INT4 g32": "int4_weights"}


def _row(rung, ms, spread=0.5, batch=1, status="ok", samples=POOLED, **extra):
    # as a round-robin rung records it: rounds, and the per-token decode samples pooled over them
    return {"rung": rung, "rung_id": RUNG_IDS.get(rung, rung), "status": status, "batch_size": batch, "tokens_per_s": batch * 1e3 / ms,
            "decode_ms_per_token": ms, "decode_p10_ms": ms - spread, "decode_p90_ms": ms + spread,
            "rounds": 3, "decode_samples": samples, **extra}


def _table(*rows):
    return pd.DataFrame(list(rows))


def test_decode_ratio_keeps_the_spread_of_both():
    r = ladder.decode_ratio(_row("a", 20.0, 1.0), {"decode_ms_per_token": 10.0, "decode_p10_ms": 9.0,
                                                  "decode_p90_ms": 11.0})
    assert r["ratio"] == pytest.approx(0.5) and r["low"] == pytest.approx(9 / 21) and r["high"] == pytest.approx(11 / 19)
    assert ladder.decode_ratio({"rung": "x"}, {"decode_ms_per_token": 10.0}) is None


def test_the_goal_decision_goes_three_ways():
    assert ladder.GOAL_FRACTION_OF_LLAMACPP == 1.0  # at least llama.cpp's decode, not a share of it
    n = {"n_samples": POOLED}
    assert ladder.goal_decision({"ratio": 1.1, "low": 1.02, "high": 1.2, **n}) == "met"
    assert ladder.goal_decision({"ratio": 0.7, "low": 0.65, "high": 0.75, **n}) == "not met"
    assert ladder.goal_decision({"ratio": 1.0, "low": 0.95, "high": 1.05, **n}) == "within the noise of the goal"
    assert ladder.goal_decision({"ratio": 0.6, "low": 0.52, "high": 0.7, **n}, fraction=0.5) == "met"
    # the same spreads from too few samples (or an unrecorded count) decide nothing
    assert decide.is_too_few(ladder.goal_decision({"ratio": 1.1, "low": 1.02, "high": 1.2, "n_samples": 3}))
    assert decide.is_too_few(ladder.goal_decision({"ratio": 0.7, "low": 0.65, "high": 0.75}))
    assert ladder.goal_decision(None) == "not measured"


def test_reference_columns_skip_rungs_at_another_batch_and_failed_rungs():
    table = _table(_row("eager", 40.0), _row("fast", 10.0), _row("broken", 1.0, status="failed"),
                   _row("batch 8", 20.0, batch=8))
    ref = {"decode_ms_per_token": 10.0, "decode_p10_ms": 9.5, "decode_p90_ms": 10.5}
    out = ladder.reference_columns(table, ref, "llamacpp")
    assert out.loc[0, "vs_llamacpp"] == pytest.approx(0.25) and out.loc[1, "vs_llamacpp"] == pytest.approx(1.0)
    assert out.loc[2, "vs_llamacpp"] is None and out.loc[3, "vs_llamacpp"] is None
    assert "vs_llamacpp" not in table  # the ladder's own table is not changed
    assert ladder.reference_columns(table, None, "llamacpp")["vs_llamacpp"].isna().all()


def test_rung_effect_reads_the_spreads():
    table = _table(_row("eager", 40.0), _row("+ graph mode", 20.0), _row("+ INT8", 15.0),
                   _row("+ same", 15.1, spread=1.0))
    assert ladder.rung_effect(table, "int8_weights")["verdict"] == "faster"
    assert ladder.rung_effect(table, "+ same")["verdict"] == "no_difference"
    slower = _table(_row("eager", 40.0), _row("+ INT8", 45.0))
    assert ladder.rung_effect(slower, "int8_weights")["verdict"] == "slower"
    assert ladder.rung_effect(slower, "+ INT8") is None  # asked by id; the name is a label
    # the count is the pooled decode samples, not the row's 3 rounds; from 3 samples no direction
    assert ladder.rung_effect(table, "int8_weights")["n_samples"] == POOLED
    few = _table(_row("eager", 40.0, samples=3), _row("+ INT8", 15.0))
    assert ladder.rung_effect(few, "int8_weights")["verdict"] == "too_few"
    assert ladder.rung_effect(slower, "missing") is None and ladder.rung_effect(slower, "eager") is None


def test_step_parts_are_named_from_profiler_events():
    assert ladder.step_part("aten::_weight_int8pack_mm") == "matmul kernels"
    assert ladder.step_part("graph_1_gemm_m1n1536k576_kernel") == "matmul kernels"
    assert ladder.step_part("graph_1_kernel") == "matmul kernels"
    assert ladder.step_part("aten::_scaled_dot_product_flash_attention_for_cpu") == "attention"
    assert ladder.step_part("graph_1_cpp_fused_mul_silu_view_7") == "other kernels"
    assert ladder.step_part("## Call CompiledFxGraph abc") is None
    assert ladder.step_part("TorchDynamo Cache Lookup") is None


def test_what_stands_in_the_way_goes_both_ways():
    parts = {"matmul kernels": 25.0, "attention": 2.0, "other kernels": 1.0, "framework and Python": 2.0}
    assert ladder.what_stands_in_the_way(parts, 10.0, 0.5)["blocker"] == "matmul kernels"  # 25 > 20 ms target
    parts = {"matmul kernels": 12.0, "attention": 3.0, "other kernels": 2.0, "framework and Python": 6.0}
    assert ladder.what_stands_in_the_way(parts, 10.0)["blocker"] == "matmul kernels"  # at 1.0x: 12 > 10 ms
    found = ladder.what_stands_in_the_way(parts, 10.0, 0.5)
    assert found["blocker"] == "the rest of the step" and found["over_ms"] == pytest.approx(3.0)
    with pytest.raises(ValueError, match="reference_ms"):
        ladder.what_stands_in_the_way(parts, 0.0)


def _llama(ms=10.0):
    return {"status": "ok", "version": "0.3.36", "quantization": "Q4_1", "threads": 2, "prompt_tokens": 7,
            "new_tokens": 16, "tokens_per_s": 1e3 / ms, "decode_ms_per_token": ms, "decode_p10_ms": ms - 0.2,
            "decode_p90_ms": ms + 0.2, "ttft_ms": 30.0, "ttft_p10_ms": 29.0, "ttft_p90_ms": 31.0, "note": "",
            "code_path": "llama-cpp-python 0.3.36", "rounds": 3, "repeats": 9,
            "decode_samples_ms": [ms - 0.2, ms, ms + 0.2] * 45}


class _Recorder:
    def __init__(self):
        self.m = {}

    def record(self, key, value, unit="", **context):
        self.m[key] = {"value": value, "unit": unit, **context}


def test_references_facts_and_their_recorded_figures_both_ways():
    parts = dict(matmul_ms=25.0, attention_ms=2.0, other_ms=1.0, framework_ms=2.0)
    table = _table(_row("native eager", 40.0, dtype="bfloat16", **parts), _row("+ INT8", 30.0, **parts))
    fp32 = {"decode_ms_per_token": 60.0, "decode_p10_ms": 59.0, "decode_p90_ms": 61.0, "rounds": 3, "repeats": 9,
            "decode_samples_ms": [59.0, 60.0, 61.0] * 45}
    facts = ladder.reference_facts(table, _llama(10.0), fp32)
    assert facts["best"]["decision"] == "not met" and facts["blocker"]["blocker"] == "matmul kernels"
    out = _Recorder()
    ladder.record_reference_figures(out, facts, _llama(10.0), fp32, "cpu", "bfloat16", 16)
    assert out.m["llamacpp_decode_tok_s"]["value"] == pytest.approx(100.0)
    vs = out.m["ladder_best_batch1_vs_llamacpp"]
    assert vs["value"] == pytest.approx(1 / 3) and vs["rung"] == "+ INT8" and vs["goal"] == ladder.GOAL_FRACTION_OF_LLAMACPP
    assert vs["blocker"] == "matmul kernels" and vs["matmul_ms"] == 25.0 and vs["target_ms"] == pytest.approx(10.0)
    assert "quantized dot products" in vs["instead"]  # what llama.cpp runs there instead
    assert out.m["float32_vs_native_rung"]["value"] == pytest.approx(1.5)  # 60 / 40 ms: the dtype's share
    assert out.m["int8_rung_step"]["value"] == pytest.approx(40 / 30) and out.m["int8_rung_step"]["low"] > 1
    # the same samples as the ladder's own step from graph mode to INT8, so the page decides it once
    assert out.m["int8_rung_step"]["n_samples"] == ladder.ladder_steps(table)[0]["n_samples"] == POOLED
    fast = _table(_row("native eager", 40.0), _row("+ INT4 g32", 8.0))
    facts = ladder.reference_facts(fast, _llama(10.0), None)
    assert facts["best"]["decision"] == "met" and facts["blocker"] is None
    # a step within llama.cpp's whose spread straddles the goal: no part stands in the way, the noise does
    noisy = _table(_row("native eager", 40.0), _row("+ INT4 g32", 9.5, spread=2.0, matmul_ms=6.0,
                                                    attention_ms=1.0, other_ms=1.0, framework_ms=1.5))
    facts = ladder.reference_facts(noisy, _llama(10.0), None)
    assert facts["best"]["decision"] == "within the noise of the goal" and facts["blocker"] is None
    missing = _Recorder()
    ladder.record_reference_figures(missing, ladder.reference_facts(fast, {"status": "unavailable",
                                    "reason": "no C++ compiler"}, None), {"status": "unavailable",
                                    "reason": "no C++ compiler"}, None, "cpu", "float32", 16)
    assert missing.m["llamacpp_decode_tok_s"]["value"] is None
    assert missing.m["llamacpp_decode_tok_s"]["reason"] == "no C++ compiler"
    assert "ladder_best_batch1_vs_llamacpp" not in missing.m and "float32_eager_decode_tok_s" not in missing.m


def test_ladder_steps_and_the_best_rung_from_the_speedup_spreads():
    from helpers import bench

    def timed(name, ms, spread):
        return {"latency_ms": ms * 16, "tokens_per_s": 1e3 / ms, "batch_size": 1, "decode_ms_per_token": ms,
                "decode_p10_ms": ms - spread, "decode_p90_ms": ms + spread,
                "timing": bench.Timing(name, [(ms - spread) / 1e3, ms / 1e3, (ms + spread) / 1e3] * 15),
                "decode_samples": 45}

    metrics = {"native eager": timed("a", 40.0, 1.0), "+ graph mode": timed("b", 20.2, 1.0),
               "+ INT8": timed("c", 20.0, 1.0)}
    table = round_robin.run_ladder([(n, "", (lambda n=n: n)) for n in metrics], lambda v: metrics[v])
    best = ladder.best_batch1_speedup(table)
    row = table[table["rung"] == "+ INT8"].iloc[0]
    assert best["rung"] == "+ INT8" and best["speedup"] == pytest.approx(row["speedup"])  # the table's ratio
    assert best["speedup"] == pytest.approx(best["tokens_per_s"] / best["baseline_tokens_per_s"])
    assert best["decision"] == "best, tied" and best["tied"] == ["+ graph mode"]
    steps = ladder.ladder_steps(table)
    assert [s["rung"] for s in steps] == ["+ graph mode", "+ INT8"] and steps[1]["previous"] == "+ graph mode"
    assert steps[0]["low"] > 1 and steps[1]["low"] < 1 < steps[1]["high"]


def test_llamacpp_reference_says_why_it_did_not_run():
    assert ladder.llamacpp_reference(False, "cpu", "smollm2-135m", [1], 4, 1)["reason"] == "the llamacpp parameter is off"
    assert "CPU reference" in ladder.llamacpp_reference(True, "cuda", "smollm2-135m", [1], 4, 1)["reason"]
    assert "embedded GGUF" in ladder.llamacpp_reference(True, "cpu", "tiny-random", [1], 4, 1)["reason"]


def test_int8_skip_reason_quotes_the_kernel_figures():
    rows = [{"kernel": "dense bfloat16", "decode_ms": 10.0, "decode_p10_ms": 9.8, "decode_p90_ms": 10.2, "problem": None},
            {"kernel": "int8pack", "decode_ms": 10.5, "decode_p10_ms": 10.0, "decode_p90_ms": 11.0, "problem": None}]
    text = ladder.int8_skip_reason(rows)
    assert "int8pack 10.50 ms" in text and "against 10.00 ms" in text and "dense bfloat16" in text


def test_weight_format_check_measures_agreement(tiny_model):
    import copy

    from helpers import quant

    model, tok = tiny_model
    before = copy.deepcopy(model)
    after = copy.deepcopy(model)
    quant.quantize_model_int8(after, impl="dequant")
    out = ladder.weight_format_check(before, after, tok, tokens=32)
    assert out["tokens"] == 32 and 0.5 < out["top1_agreement"] <= 1.0
    assert ladder.weight_format_check(before, before, tok, tokens=32)["top1_agreement"] == 1.0


def test_a_measured_rung_gets_its_step_split_and_the_loop_names_itself():
    from helpers.model_files import tiny_llama

    model, tok = tiny_llama(seed=2)
    measure = ladder.generation_measure(tok, ["a short prompt"], 6, "cpu", repeats=1, profile_steps=3)
    row = measure(ladder.Variant(model, static_cache=True, greedy_loop=True))
    assert row["greedy_loop"] and "hand-written greedy loop" in row["code_path"]
    parts = [row[f"{k.split()[0]}_ms"] for k in ladder.STEP_PARTS]
    # a part is a difference of two profiled runs: on a busy machine a small model's matmul share can
    # come out at 0 (clamped), so the test checks the split's shape, not how long a part took
    assert all(part >= 0 for part in parts) and sum(parts) == pytest.approx(row["decode_ms_per_token"])
    plain = measure(ladder.Variant(model))  # the loop is taken off again for a rung without it
    assert not plain["greedy_loop"] and plain["code_path"].startswith("transformers generate")


def test_an_int8_rung_that_is_not_faster_is_explained_from_the_kernel_figures():
    table = _table(_row("native eager", 40.0), _row("+ graph mode", 20.0, spread=2.0),
                   _row("+ INT8", 19.8, spread=2.0))
    kernels = [{"kernel": "dense bfloat16", "decode_ms": 9.0, "decode_p10_ms": 8.9, "decode_p90_ms": 9.2},
               {"kernel": "int8pack", "decode_ms": 8.6, "decode_p10_ms": 8.5, "decode_p90_ms": 8.8},
               {"kernel": "dequant", "decode_ms": 30.0, "decode_p10_ms": 29.0, "decode_p90_ms": 31.0}]
    facts = ladder.reference_facts(table, _llama(10.0), None, int8_kernels=kernels)
    assert facts["int8"]["verdict"] == "no_difference"
    out = _Recorder()
    ladder.record_reference_figures(out, facts, _llama(10.0), None, "cpu", "bfloat16", 16)
    step = out.m["int8_rung_step"]
    assert step["kernel"] == "int8pack" and step["kernel_ms"] == 8.6 and step["saving_ms"] == pytest.approx(0.4)
    assert step["spread_ms"] == pytest.approx(4.0) and step["low"] < 1 < step["high"]


def test_the_ladder_figures_carry_the_batch1_protocol_and_the_table_s_ratio():
    from helpers import bench

    class _Results(_Recorder):
        def __init__(self):
            super().__init__()
            self.tables, self.notes = {}, []

        def table(self, name, rows):
            self.tables[name] = rows

        def note(self, text):
            self.notes.append(text)

    class _Chapter:
        results = _Results()

        def record(self, key, value, unit="", **context):
            self.results.record(key, value, unit, **context)

    def timed(ms, batch=1):
        return {"latency_ms": ms * 16, "tokens_per_s": batch * 1e3 / ms, "batch_size": batch, "decode_ms_per_token": ms,
                "decode_p10_ms": ms - 1, "decode_p90_ms": ms + 1, "prompt_tokens": 7, "new_tokens": 16,
                "timing": bench.Timing("t", [(ms - 1) / 1e3, ms / 1e3, (ms + 1) / 1e3] * 15), "decode_samples": 45}

    metrics = {"native eager": timed(40.0), "+ INT8": {**timed(20.0), "compiled_graphs": 2}, "+ skipped": None,
               "+ batch 4": timed(30.0, 4)}

    def prepare(name):
        if metrics[name] is None:
            raise round_robin.RungSkipped("off")
        return name

    table = round_robin.run_ladder([(n, "", (lambda n=n: prepare(n))) for n in metrics], lambda v: metrics[v])
    ch = _Chapter()
    ladder.record_ladder_figures(ch, table, 16)
    m = ch.results.m
    assert m["ladder_tok_s_INT8"]["shape"] == "batch 1, 7-token prompt, 16 new tokens"
    assert m["ladder_tok_s_INT8"]["prompt_tokens"] == 7 and m["ladder_tok_s_INT8"]["new_tokens"] == 16
    # each tok/s figure's spread is in tok/s: the decode p90 and p10 step times, not the speedup's
    assert (m["ladder_tok_s_INT8"]["low"], m["ladder_tok_s_INT8"]["high"]) == pytest.approx((1e3 / 21, 1e3 / 19))
    assert m["ladder_tok_s_INT8"]["low"] < m["ladder_tok_s_INT8"]["value"] < m["ladder_tok_s_INT8"]["high"]
    assert (m["ladder_tok_s_batch_4"]["low"], m["ladder_tok_s_batch_4"]["high"]) == pytest.approx((4e3 / 31, 4e3 / 29))
    best = m["ladder_best_batch1_speedup"]
    assert best["rung"] == "+ INT8" and best["decision"] == "best, clear"
    assert best["value"] == pytest.approx(float(table.loc[table["rung"] == "+ INT8", "speedup"].iloc[0]))
    # over + INT8 (20 ms per token), the batch-1 rung the batch rung builds on
    assert m["ladder_batch_throughput_ratio"]["value"] == pytest.approx(4 * 20 / 30)
    assert m["ladder_batch_throughput_ratio"]["over"] == "+ INT8"
    assert [s["rung"] for s in ch.results.tables["ladder_steps"]] == ["+ INT8"]
    # counts from columns with gaps (pandas holds them as floats) are recorded as whole numbers
    recorded = {r["rung"]: r for r in ch.results.tables["ladder"]}
    assert recorded["+ INT8"]["compiled_graphs"] == 2 and type(recorded["+ INT8"]["compiled_graphs"]) is int
    assert recorded["+ batch 4"]["batch_size"] == 4 and type(recorded["+ batch 4"]["batch_size"]) is int
    assert recorded["+ skipped"]["batch_size"] is None and recorded["native eager"]["compiled_graphs"] is None
    assert list(ladder.shown(table, ("rung", "compile_s", "speedup")).columns) == ["rung", "speedup"]


class _RoundMeasure:
    """A measure with again / pooled: logs the order of the timings, each round's decode ms from a
    script (the machine slowing down for every rung alike in round 2)."""

    def __init__(self, ms: dict):
        self.ms, self.log, self.rounds = ms, [], 0

    def __call__(self, name):
        self.log.append(("build", name))
        return {"latency_ms": 999.0, "tokens_per_s": 1.0, "batch_size": 1, "decode_ms_per_token": 999.0}

    def again(self, name):
        self.log.append(("round", name))
        slow = 2.0 if sum(1 for kind, _ in self.log if kind == "round") > len(self.ms) else 1.0
        return {"decode_ms": self.ms[name] * slow}

    def pooled(self, name, outs, row):
        samples = [o["decode_ms"] / 1e3 for o in outs]
        t = bench.Timing("decode", samples)
        return {"latency_ms": t.median * 16e3, "tokens_per_s": 1 / t.median, "decode_ms_per_token": t.median * 1e3,
                "decode_p10_ms": t.p10 * 1e3, "decode_p90_ms": t.p90 * 1e3, "timing": t}


def test_rounds_time_every_rung_round_robin_after_all_are_built():
    measure = _RoundMeasure({"a": 40.0, "b": 20.0, "c": 10.0})
    between = []
    rungs = [(n, "", (lambda n=n: n)) for n in measure.ms]
    table = round_robin.run_ladder(rungs, measure, rounds=2, between_rounds=lambda i: between.append((i, len(measure.log))))
    builds = [("build", n) for n in "abc"]
    assert measure.log == builds + [("round", n) for n in "abc"] * 2
    assert between == [(0, 3), (1, 6)]  # the references run before each round
    # the figures are the rounds', not the build's 999 ms; the slow round hit every rung alike
    assert table["decode_ms_per_token"].tolist() == pytest.approx([60.0, 30.0, 15.0])
    assert table["rounds"].tolist() == [2, 2, 2]
    assert table.loc[2, "speedup"] == pytest.approx(4.0)
    with pytest.raises(ValueError, match="rounds"):
        round_robin.run_ladder(rungs, lambda v: {"latency_ms": 1.0, "tokens_per_s": 1.0}, rounds=2)
    with pytest.raises(ValueError, match="rounds=-1"):
        round_robin.run_ladder(rungs, measure, rounds=-1)


def test_a_round_robin_rung_is_decided_on_its_pooled_decode_samples_not_its_rounds():
    class _PerToken(_RoundMeasure):  # each round's generates give 15 per-token samples, as a real one does
        def pooled(self, name, outs, row):
            return {**super().pooled(name, outs, row), "decode_samples": 15 * len(outs)}

    measure = _PerToken({"a": 40.0, "b": 20.0})
    table = round_robin.run_ladder([(n, "", (lambda n=n: n)) for n in measure.ms], measure, rounds=3)
    assert table["rounds"].tolist() == [3, 3] and table["decode_samples"].tolist() == [45, 45]
    effect = ladder.rung_effect(table, "b")
    assert effect["n_samples"] == 45 and effect["verdict"] == "faster"  # 3 rounds alone would be too few
    assert ladder.best_batch1_speedup(table)["decision"] == "best, clear"
    # without the pooled count the rounds' own timing (3 samples here) is what stands behind the spread
    plain = round_robin.run_ladder([(n, "", (lambda n=n: n)) for n in measure.ms], _RoundMeasure(measure.ms), rounds=3)
    assert ladder.rung_effect(plain, "b")["verdict"] == "too_few"


def test_a_rung_failing_in_a_round_is_recorded_and_the_others_go_on():
    measure = _RoundMeasure({"a": 40.0, "b": 20.0})
    real = measure.again

    def again(name):
        if name == "b":
            raise RuntimeError("lost its cache")
        return real(name)

    measure.again = again
    table = round_robin.run_ladder([(n, "", (lambda n=n: n)) for n in measure.ms], measure, rounds=2)
    assert table["status"].tolist() == ["ok", "failed"] and "lost its cache" in table.loc[1, "error"]


def test_llamacpp_runs_of_the_rounds_pool_their_samples():
    from helpers import llamacpp

    runs = [{"status": "ok", "decode_samples_ms": [10.0, 11.0], "ttft_samples_ms": [5.0, 5.0], "repeats": 2,
             "code_path": "llama.cpp"},
            {"status": "ok", "decode_samples_ms": [12.0, 13.0], "ttft_samples_ms": [6.0, 6.0], "repeats": 2,
             "code_path": "llama.cpp"}]
    out = llamacpp.pool(runs)
    assert out["decode_samples_ms"] == [10.0, 11.0, 12.0, 13.0] and out["rounds"] == 2 and out["repeats"] == 4
    assert out["decode_ms_per_token"] == pytest.approx(11.5) and out["tokens_per_s"] == pytest.approx(1e3 / 11.5)
    assert llamacpp.pool([{"status": "unavailable", "reason": "no compiler"}])["reason"] == "no compiler"


def test_llamacpp_bytes_per_step_read_from_the_gguf():
    import gguf

    from helpers import llamacpp
    from helpers.model_files import locate_embedded_gguf

    path = locate_embedded_gguf()
    tensors = {t.name: int(t.n_bytes) for t in gguf.GGUFReader(str(path)).tensors}
    out = llamacpp.bytes_per_step(path, 100)
    assert "output.weight" not in tensors  # tied: token_embd is the output matrix, read whole once
    assert out["weight_bytes"] == sum(tensors.values())
    assert out["kv_cache_bytes"] == 2 * 30 * 3 * 64 * 100 * 2  # K and V, layers, kv heads, head dim, f16
    assert llamacpp.bytes_per_step(path, 200)["kv_cache_bytes"] == 2 * out["kv_cache_bytes"]
    with pytest.raises(ValueError, match="context_len"):
        llamacpp.bytes_per_step(path, -1)


def test_roofline_share_of_the_rungs_and_llamacpp_against_one_bandwidth():
    share = ladder.roofline_share(100e6, 10.0, 20.0)  # 100 MB per 10 ms step = 10 GB/s of 20
    assert share["achieved_gbps"] == pytest.approx(10.0) and share["roofline_share"] == pytest.approx(0.5)
    assert ladder.roofline_share(100e6, None, 20.0) == {"achieved_gbps": None, "roofline_share": None}
    assert ladder.roofline_share(100e6, 10.0, None)["roofline_share"] is None
    table = _table(_row("native eager", 20.0, bytes_per_step=200e6, **ladder.roofline_share(200e6, 20.0, 20.0)),
                   _row("+ INT4 g32", 10.0, bytes_per_step=60e6, **ladder.roofline_share(60e6, 10.0, 20.0)),
                   _row("broken", 1.0, status="failed"))
    llama = {"status": "ok", "quantization": "Q4_1", "tokens_per_s": 125.0, "decode_ms_per_token": 8.0,
             "bytes_per_step": 97e6, **ladder.roofline_share(97e6, 8.0, 20.0)}
    rows = ladder.roofline_rows(table, llama)
    assert [r["rung"] for r in rows] == ["native eager", "+ INT4 g32", "llama.cpp"]
    assert rows[0]["roofline_share"] == pytest.approx(0.5) and rows[1]["roofline_share"] == pytest.approx(0.3)
    assert rows[2]["roofline_share"] == pytest.approx(97e6 / 8e-3 / 1e9 / 20)
    runs = ladder.roofline_runs(rows, 20.0)
    assert runs[2][2] == pytest.approx(20e9 / 97e6) and runs[2][3] == pytest.approx(100 * rows[2]["roofline_share"])
