"""helpers.ladder with stub rungs: failures are recorded and the ladder goes on."""
from __future__ import annotations

import pandas as pd
import pytest

from helpers import bench, ladder, models


def _measure(latency_ms):
    return lambda variant: {"latency_ms": latency_ms[variant], "tokens_per_s": 100e3 / latency_ms[variant],
                            "peak_memory_bytes": 1000}


def test_failing_rung_is_recorded_and_the_ladder_continues():
    def broken():
        raise RuntimeError("fused op missing\nsecond line")

    def skipped():
        raise ladder.RungSkipped("runtime options exist only on an NPU")

    rungs = [("eager", "baseline", lambda: "a"), ("broken", "raises", broken),
             ladder.Rung("npu options", "skipped here", skipped), ("fast", "twice as fast", lambda: "b")]
    seen = []
    table = ladder.run_ladder(rungs, _measure({"a": 200.0, "b": 100.0}), roofline_tok_s=1000.0,
                              on_rung=seen.append)
    assert list(table["status"]) == ["ok", "failed", "skipped", "ok"]
    assert table.loc[1, "error"] == "RuntimeError: fused op missing"
    assert "runtime options" in table.loc[2, "error"]
    assert table.loc[3, "speedup"] == pytest.approx(2.0)
    assert table.loc[0, "speedup"] == pytest.approx(1.0)
    assert table.loc[3, "roofline_pct"] == pytest.approx(100.0)
    assert pd.isna(table.loc[1, "speedup"])
    assert [r["rung"] for r in seen] == ["eager", "broken", "npu options", "fast"]
    assert ladder.total_speedup(table) == pytest.approx(2.0)
    assert list(table.columns[:len(ladder.COLUMNS)]) == list(ladder.COLUMNS)


def test_measure_errors_and_missing_keys_fail_only_their_rung():
    def measure(variant):
        if variant == "bad":
            return {"latency_ms": 5.0}
        return {"latency_ms": 10.0, "tokens_per_s": 10.0, "roofline_tok_s": 20.0}

    freed = []
    table = ladder.run_ladder([("a", "", lambda: "ok"), ("b", "", lambda: "bad")], measure,
                              cleanup=freed.append)
    assert list(table["status"]) == ["ok", "failed"]
    assert "tokens_per_s" in table.loc[1, "error"]
    assert table.loc[0, "roofline_pct"] == pytest.approx(50.0)
    assert freed == ["ok", "bad"]
    assert ladder.total_speedup(table) is None


def test_first_rung_failing_makes_the_next_ok_rung_the_baseline():
    def boom():
        raise ValueError("no model")

    table = ladder.run_ladder([("a", "", boom), ("b", "", lambda: "b"), ("c", "", lambda: "c")],
                              _measure({"b": 300.0, "c": 100.0}))
    assert table.loc[1, "speedup"] == pytest.approx(1.0)
    assert table.loc[2, "speedup"] == pytest.approx(3.0)


def test_timings_give_speedup_with_spread():
    slow = bench.Timing("slow", [0.20, 0.21, 0.19])
    fast = bench.Timing("fast", [0.10, 0.11, 0.09])
    timings = {"s": slow, "f": fast}
    table = ladder.run_ladder(
        [("s", "", lambda: "s"), ("f", "", lambda: "f")],
        lambda v: {"latency_ms": timings[v].median_ms, "tokens_per_s": 1 / timings[v].median,
                   "timing": timings[v]})
    expected = bench.speedup(slow, fast)
    assert table.loc[1, "speedup"] == pytest.approx(expected.ratio)
    assert table.loc[1, "speedup_low"] == pytest.approx(expected.low)
    assert isinstance(table.loc[1, "timing"], dict)  # JSON-able for results.table


def test_bad_rungs_are_rejected_before_any_work():
    with pytest.raises(ValueError, match="rungs is empty"):
        ladder.run_ladder([], lambda v: {})
    with pytest.raises(ValueError, match="not valid"):
        ladder.run_ladder([("a", "no callable", None)], lambda v: {})
    with pytest.raises(ValueError, match="unique"):
        ladder.run_ladder([("a", "", lambda: 1), ("a", "", lambda: 2)], lambda v: {})


def test_guide_ladder_ratios_and_comparison():
    guide = ladder.guide_ladder()
    assert guide["speedup"].iloc[-1] == pytest.approx(6012 / 2100)
    assert guide["throughput_ratio"].iloc[-1] == pytest.approx(47.2 / 16.6)
    assert guide["memory_ratio"].iloc[-1] == pytest.approx(7.8 / 13.6)
    ours = ladder.run_ladder([("a", "", lambda: "a"), ("b", "", lambda: "b")], _measure({"a": 2.0, "b": 1.0}))
    both = ladder.compare_with_guide(ours)
    assert set(both["source"]) == {"guide's claim (910B, Llama-2-7B fp16)", "measured here"}
    fig = ladder.plot_comparison(ours)
    import matplotlib.pyplot as plt

    plt.close(fig)


def test_framework_detection_names_mindspeed_and_its_commands(monkeypatch):
    monkeypatch.setattr(ladder.importlib.util, "find_spec", lambda name: None)
    rows = {r["framework"]: r for r in ladder.detect_frameworks()}
    assert rows["MindSpeed-LLM"]["status"] == "not installed here"
    assert "generate_llama2_7b_ptd.sh" in rows["MindSpeed-LLM"]["commands"]
    assert "vLLM-Ascend" not in rows  # serving engines are chapter 07's (helpers.serving)
    monkeypatch.setattr(ladder.importlib.util, "find_spec", lambda name: object())
    assert ladder.detect_frameworks()[0]["status"] == "installed"


def test_runtime_options_real_ones_applied_invented_one_ignored(fake_torch_npu):
    import torch

    rows = {r["option"].split(" =")[0].split("(")[0]: r for r in
            ladder.apply_runtime_options("npu:0")}
    assert "set_compile_mode(False)" in fake_torch_npu.CALLS
    assert torch.npu.config._options["ALLOW_INTERNAL_FORMAT"] is False
    assert rows["torch.npu.config.enable_auto_mixed_precision"]["status"] == "silently ignored"
    with pytest.raises(ladder.RungSkipped, match="only in torch_npu"):
        ladder.apply_runtime_options("cpu")


def test_generation_measure_maps_the_generation_contract(monkeypatch, tiny_model):
    import sys
    import types

    calls = []

    def measure_generation(model, tokenizer, prompts, max_new_tokens, device=None, *, repeats=3, chat=False,
                           static_cache=False):
        calls.append((len(prompts), max_new_tokens, repeats, static_cache))
        graph = {"compiled_graphs": 2, "compile_s": 9.0} if static_cache else {}
        return {"total_ms": 500.0, "tokens_per_s_aggregate": 8.0 * len(prompts), "peak_memory_bytes": 123,
                "batch_size": len(prompts), "ttft_ms": 50.0, "decode_ms_per_token": 45.0,
                "dtype": "float32", "code_path": "stub", "prompt_tokens": 7, "new_tokens": max_new_tokens,
                **graph}

    monkeypatch.setitem(sys.modules, "helpers.generation",
                        types.SimpleNamespace(measure_generation=measure_generation))
    model, tokenizer = tiny_model
    measure = ladder.generation_measure(tokenizer, ["a"], 4, "cpu", bandwidth_gbps=10.0, repeats=1)
    one = measure(model)
    four = measure((model, ["a"] * 4))
    static = measure(ladder.Variant(model, ["a"] * 2, static_cache=True))
    assert calls == [(1, 4, 1, False), (4, 4, 1, False), (2, 4, 1, True)]
    assert one["compiled_graphs"] is None and static["compiled_graphs"] == 2 and static["compile_s"] == 9.0
    assert one["latency_ms"] == 500.0 and four["tokens_per_s"] == 32.0
    assert (one["prompt_tokens"], one["new_tokens"]) == (7, 4)  # chapter 07 compares at these lengths
    assert one["weight_bytes"] == models.weight_bytes(model) > 0
    assert four["roofline_tok_s"] == pytest.approx(4 * one["roofline_tok_s"])


def test_batch_rung_speedup_is_a_throughput_ratio():
    metrics = {"b1": {"latency_ms": 100.0, "tokens_per_s": 10.0, "batch_size": 1},
               "b4": {"latency_ms": 150.0, "tokens_per_s": 26.0, "batch_size": 4}}
    table = ladder.run_ladder([("b1", "", lambda: "b1"), ("b4", "", lambda: "b4")], lambda v: metrics[v])
    assert table.loc[1, "speedup"] == pytest.approx(2.6)


def test_run_script_times_a_script_and_reports_failures(tmp_path):
    from helpers import ladder

    ok = tmp_path / "ok.sh"
    ok.write_text("sleep 0.3; echo generated text in $(pwd)\n")
    out = ladder.run_script(str(ok), parameter="mindspeed_script")
    assert out["returncode"] == 0 and f"generated text in {tmp_path}" in out["output_tail"]
    assert out["wall_s"] >= 0.3  # the script's whole run is timed, not the start of the process
    bad = tmp_path / "bad.sh"
    bad.write_text("echo broken >&2; exit 3\n")
    with pytest.raises(RuntimeError, match="exited with 3"):
        ladder.run_script(str(bad), parameter="mindspeed_script")
    with pytest.raises(ValueError, match="mindspeed_script="):
        ladder.run_script(str(tmp_path / "missing.sh"), parameter="mindspeed_script")


def _ladder_table():
    metrics = {"eager": {"latency_ms": 100.0, "tokens_per_s": 10.0, "batch_size": 1},
               "graph": {"latency_ms": 50.0, "tokens_per_s": 20.0, "batch_size": 1},
               "int8": {"latency_ms": 40.0, "tokens_per_s": 25.0, "batch_size": 1},
               "batch 8": {"latency_ms": 80.0, "tokens_per_s": 100.0, "batch_size": 8}}
    rungs = [(name, "", (lambda n=name: n)) for name in metrics]
    rungs.insert(1, ("broken", "", lambda: 1 / 0))
    return ladder.run_ladder(rungs, lambda v: metrics[v])


def test_headline_figures_never_mix_batch1_latency_and_batch_throughput():
    table = _ladder_table()
    best = ladder.best_batch1_speedup(table)
    assert best["rung"] == "int8" and best["speedup"] == pytest.approx(2.5)  # not the batch rung's 10x
    batch = ladder.batch_throughput_ratio(table)
    assert batch["rung"] == "batch 8" and batch["ratio"] == pytest.approx(10.0) and batch["batch_size"] == 8
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
    table = ladder.run_ladder([(n, "", (lambda n=n: n)) for n in metrics], lambda v: metrics[v])
    assert ladder.graph_count_problems(table) == ["recompiling: 9 graphs built, more than 2 for one shape"]
    assert ladder.graph_count_problems(table[table["rung"] != "recompiling"]) == []
