"""Chapter 04's study: the guide's padding call, the padding check (in float32 where it matters),
the batch sweep, its ratios to batch 1 and the KV cache beside the weights."""
import pytest
import torch
from test_generation import PROMPTS

from helpers import batching_study, generation, roofline


def test_guide_padding_call_needs_a_pad_token():
    out = batching_study.guide_padding_call()
    assert out["runs"] is False and "ValueError" in out["error"]


def test_batch_prompts_cycle_through_prompts_of_different_lengths():
    assert batching_study.batch_prompts(3) == list(batching_study.BATCH_PROMPTS[:3])
    assert batching_study.batch_prompts(10)[8:] == list(batching_study.BATCH_PROMPTS[:2])
    assert len({len(p) for p in batching_study.batch_prompts(4)}) == 4  # the padding check's batch is padded
    with pytest.raises(ValueError, match="batch_size=0"):
        batching_study.batch_prompts(0)


def test_batched_greedy_equals_unbatched(tiny_model):
    model, tok = tiny_model
    lengths = {len(tok(p)["input_ids"]) for p in PROMPTS}
    assert len(lengths) == 3  # the batch really is padded
    check = batching_study.padding_check(model, tok, PROMPTS, 6)
    assert check["match"], check["rows"]
    assert all(r["first_difference"] is None for r in check["rows"])


def test_padding_check_reports_a_difference(tiny_model, monkeypatch):
    model, tok = tiny_model
    real = generation.greedy_new_tokens

    def broken(model, tok, prompts, n, **kw):
        out = real(model, tok, prompts, n, **kw)
        if len(prompts) > 1:  # corrupt only the batched run
            out[1][2] = (out[1][2] + 1) % 200
        return out

    monkeypatch.setattr(batching_study, "greedy_new_tokens", broken)
    check = batching_study.padding_check(model, tok, PROMPTS, 4)
    assert not check["match"]
    assert [r["first_difference"] for r in check["rows"]] == [None, 2, None]


def _fake_padding_check(matches: dict):
    """padding_check that reports a match per model dtype, as given."""
    def check(model, tok, prompts, n, **kw):
        ok = matches[next(model.parameters()).dtype]
        rows = [{"prompt": p, "first_difference": None if ok or i else 3, "match": ok or bool(i)}
                for i, p in enumerate(prompts)]
        return {"match": ok, "rows": rows, "batch_size": len(prompts), "new_tokens": n}
    return check


def test_padding_check_goes_to_float32_only_when_a_reduced_precision_run_differs(tiny_model, monkeypatch):
    import copy

    model, tok = tiny_model
    half = copy.deepcopy(model).to(torch.bfloat16)
    loads = []

    def load():
        loads.append(1)
        return model

    monkeypatch.setattr(batching_study, "padding_check",
                        _fake_padding_check({torch.bfloat16: False, torch.float32: True}))
    check = batching_study.padding_check_in_float32(half, tok, PROMPTS, 4, load_float32=load)
    assert loads == [1] and check["dtype"] == "bfloat16" and not check["match"]
    assert check["float32"]["match"] and check["padding_right"]
    assert check["differing"] == 1 and check["first_difference"] == 3
    # a float32 run that differs is a padding bug: nothing to reload, padding_right is False
    monkeypatch.setattr(batching_study, "padding_check", _fake_padding_check({torch.float32: False}))
    check = batching_study.padding_check_in_float32(model, tok, PROMPTS, 4, load_float32=load)
    assert loads == [1] and check["float32"] is None and not check["padding_right"]
    # a match needs no second check either
    monkeypatch.setattr(batching_study, "padding_check", _fake_padding_check({torch.bfloat16: True}))
    check = batching_study.padding_check_in_float32(half, tok, PROMPTS, 4, load_float32=load)
    assert loads == [1] and check["padding_right"] and check["first_difference"] is None


def test_batch_sweep_measures_each_size_once_with_bytes_and_bandwidth(tiny_model):
    model, tok = tiny_model
    rows = batching_study.batch_sweep(model, tok, [2, 1, 2], 4, repeats=1)
    assert [r["point"] for r in rows] == [1, 2] and all(r["status"] == "ok" for r in rows)
    for r in rows:
        assert r["batch_size"] == r["point"] and r["code_path"].endswith("dynamic KV cache, eager")
        assert r["bytes_per_step"] == generation.decode_bytes_per_step(model, r["point"],
                                                                       r["prompt_tokens"] + 2)
        if r["decode_resolved"]:
            assert r["achieved_gbps"] == pytest.approx(
                r["bytes_per_step"] / (r["decode_ms_per_token"] / 1e3) / 1e9)
    table = generation.sweep_table(rows)
    assert not [c for c in table.columns if c.endswith("samples_ms")] and len(table) == 2


def _point(batch, decode_ms, ttft_ms, growth, kv, weights=1000 * 2 ** 20, status="ok"):
    return {"point": batch, "status": status, "batch_size": batch, "device": "cpu", "decode_resolved": True,
            "decode_samples_ms": decode_ms, "ttft_samples_ms": ttft_ms, "memory_growth_bytes": growth,
            "kv_cache_bytes": kv, "peak_memory_bytes": weights + growth, "memory_kind": "test",
            "prompt_tokens": 10, "new_tokens": 4, "bytes_per_step": 2e9,
            "achieved_gbps": 2e9 / decode_ms[1] / 1e6,
            "decode_ms_per_token": decode_ms[1]}


def test_batch_ratios_carry_their_spreads_and_name_each_memory_figure():
    mib = 2 ** 20
    rows = [_point(1, [9.0, 10.0, 12.0], [50.0, 50.0, 50.0], 100 * mib, 1 * mib),
            _point(4, [11.0, 12.5, 13.0], [150.0, 160.0, 170.0], 104 * mib, 4 * mib),
            _point(8, [20.0, 25.0, 30.0], [300.0, 320.0, 340.0], 400 * mib, 8 * mib),
            {"point": 16, "status": "oom", "error": "out of memory"}]
    ratios = batching_study.batch_ratios(rows, {4: {"throughput": 3.2, "memory_pct": 15.0, "latency_pct": 20.0}})
    assert [r["batch"] for r in ratios] == [1, 4, 8]
    one = generation.decode_timing(rows[0])
    for r, row in zip(ratios, rows):
        b, t = r["batch"], generation.decode_timing(row)
        assert r["throughput_ratio"] == pytest.approx(b * one.median / t.median)
        assert r["throughput_low"] == pytest.approx(b * one.p10 / t.p90)
        assert r["throughput_high"] == pytest.approx(b * one.p90 / t.p10)
        assert r["latency_growth_pct"] == pytest.approx(100 * (t.median / one.median - 1))
        assert r["latency_ratio_low"] <= r["latency_ratio"] <= r["latency_ratio_high"]
        assert r["latency_growth_low_pct"] == pytest.approx(100 * (r["latency_ratio_low"] - 1))
    four, eight = ratios[1], ratios[2]
    assert four["memory_growth_mib"] == 104 and four["kv_cache_mib"] == 4 and four["kv_added_mib"] == 3
    assert four["memory_growth_pct"] == pytest.approx(100 * (1104 / 1100 - 1))  # peak over batch 1's
    assert four["memory_growth_change"] == "no change beyond the noise"  # +4 %: within the 10 % rule
    assert eight["memory_growth_change"] == "grows"
    assert four["guide_throughput"] == 3.2 and eight["guide_throughput"] is None
    assert ratios[0]["throughput_ratio"] == 1.0 and ratios[0]["memory_growth_pct"] == 0.0
    # a point with a decode sample at or below zero has no bounded spread: left out
    noisy = _point(2, [-30.0, 6.0, 10.0], [60.0] * 3, 100 * mib, 2 * mib)
    assert [r["batch"] for r in batching_study.batch_ratios([rows[0], noisy])] == [1]
    assert batching_study.highest_bandwidth_point([noisy]) is None
    # no batch-1 decode figure: no ratios at all
    assert batching_study.batch_ratios([dict(rows[0], decode_resolved=False), rows[1]]) == []
    assert batching_study.batch_ratios(rows[1:]) == []


def test_kv_cache_table_and_the_highest_bandwidth_point():
    mib = 2 ** 20
    rows = [_point(1, [10.0, 10.0, 10.0], [1.0] * 3, 10 * mib, 2 * mib),
            _point(2, [5.0, 5.0, 5.0], [1.0] * 3, 20 * mib, 4 * mib),
            {"point": 4, "status": "failed", "error": "boom"}]
    kv = batching_study.kv_cache_table(rows, weight_bytes=400 * mib)
    assert [r["batch"] for r in kv] == [1, 2]
    assert kv[1]["kv_cache_MiB"] == 4 and kv[1]["kv_share_of_weights_pct"] == pytest.approx(1.0)
    assert kv[1]["context_tokens"] == 14 and kv[1]["measured_growth_MiB"] == 20
    assert kv[1]["peak_memory_MiB"] == 1020 and kv[0]["bytes_per_step_MB"] == 2000
    assert batching_study.highest_bandwidth_point(rows)["point"] == 2
    assert batching_study.highest_bandwidth_point([dict(rows[0], decode_resolved=False)]) is None


def test_llama2_kv_growth_inverts_the_claimed_growth():
    rows = batching_study.llama2_kv_growth({8: 30.0, 4: 15.0}, contexts=(512,))
    assert [r["batch"] for r in rows] == [4, 8] and rows[0]["dtype"] == "float16"
    cfg, w = roofline.LLAMA2_7B_CONFIG, roofline.llama2_weight_bytes("float16")
    for r in rows:
        at_claim = batching_study.kv_memory_growth_pct(cfg, r["batch"], round(r["context_for_claim"]), w)
        assert at_claim == pytest.approx(r["guide_memory_pct"], abs=0.1)
        assert r["kv_growth_pct_512"] == pytest.approx(batching_study.kv_memory_growth_pct(cfg, r["batch"], 512, w))
    assert rows[0]["kv_per_token_kib"] == 512  # 2 x 32 layers x 32 heads x 128 x 2 bytes
