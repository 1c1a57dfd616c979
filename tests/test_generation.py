"""Generation metrics: TTFT/decode split arithmetic, bytes per step, padding, and sweeps."""
import pytest
import torch

from helpers import backend, bench, generation, models, roofline

PROMPTS = ["hello world, this prompt is longer", "hi", "a medium prompt"]


def test_split_arithmetic_with_known_timings(tiny_model, monkeypatch):
    """TTFT = t(1); decode = (t(N) - t(1)) / (N - 1); aggregate = per-user x batch."""
    model, tok = tiny_model
    prefill = [0.100, 0.110, 0.120]
    full = [0.100 + 7 * 0.020, 0.110 + 7 * 0.030, 0.120 + 7 * 0.040]

    def fake_measure(fn, device, *, name="", **kw):
        fn()  # still runs generate once, so the real code path is exercised
        return bench.Timing(name, prefill if name == "generate 1 token" else full, device=str(device))

    monkeypatch.setattr(generation.bench, "measure", fake_measure)
    r = generation.measure_generation(model, tok, PROMPTS, 8, repeats=3)
    assert r["ttft_ms"] == pytest.approx(110.0)
    assert r["ttft_p10_ms"] == pytest.approx(102.0)
    assert r["decode_ms_per_token"] == pytest.approx(30.0)
    assert r["decode_p10_ms"] == pytest.approx(22.0)
    assert r["decode_p90_ms"] == pytest.approx(38.0)
    assert r["tokens_per_s_per_user"] == pytest.approx(1000 / 30)
    assert r["tokens_per_s_aggregate"] == pytest.approx(3 * 1000 / 30)
    assert r["total_ms"] == pytest.approx(full[1] * 1e3)
    assert r["batch_size"] == 3 and r["new_tokens"] == 8


def test_real_measurement_on_tiny_model(tiny_model):
    model, tok = tiny_model
    r = generation.measure_generation(model, tok, PROMPTS[:2], 4, repeats=2)
    expected_keys = {"batch_size", "prompt_tokens", "new_tokens", "ttft_ms", "ttft_p10_ms",
                     "ttft_p90_ms", "decode_ms_per_token", "decode_p10_ms", "decode_p90_ms",
                     "tokens_per_s_per_user", "tokens_per_s_aggregate", "total_ms",
                     "peak_memory_bytes", "memory_kind", "dtype", "device", "code_path"}
    assert expected_keys <= set(r)
    longest = len(tok(PROMPTS[0])["input_ids"])
    assert r["batch_size"] == 2 and r["prompt_tokens"] == longest and r["new_tokens"] == 4
    assert r["ttft_p10_ms"] <= r["ttft_ms"] <= r["ttft_p90_ms"]
    assert r["dtype"] == "float32" and r["device"] == "cpu"
    # The request's memory, not the process high-water mark: weights plus what the generates added.
    weights = models.weight_bytes(model)
    assert r["peak_memory_bytes"] == weights + r["memory_growth_bytes"]
    assert r["peak_memory_bytes"] < backend._cpu_rss_bytes() / 4  # the process holds torch, Python, ...
    assert r["kv_cache_bytes"] == roofline.kv_cache_bytes(model.config, 2, longest + 4, "float32")
    assert "weight bytes + growth" in r["memory_kind"]


@pytest.mark.parametrize("kwargs,name", [({"max_new_tokens": 1}, "max_new_tokens"),
                                         ({"max_new_tokens": 4, "repeats": 0}, "repeats")])
def test_bad_arguments_fail_before_work(tiny_model, kwargs, name):
    model, tok = tiny_model
    with pytest.raises(ValueError, match=name):
        generation.measure_generation(model, tok, ["x"], **kwargs)


def _tiny_sizes(batch, ctx, tied):
    # hidden 64, 2 layers, 4 heads (head_dim 16), 2 kv heads, intermediate 160, vocab 258, fp32
    vocab, h, inter, layers = 258, 64, 160, 2
    layer = h * h * 2 + h * 32 * 2 + 3 * h * inter + 2 * h
    lm_head = vocab * h
    embed_read = 0 if tied else batch * h
    weights = (layers * layer + h + lm_head + embed_read) * 4
    kv = 2 * layers * 2 * 16 * ctx * batch * 4
    return weights + kv


def test_decode_bytes_untied_counts_one_embedding_row_per_sequence(tiny_model):
    model, _ = tiny_model
    assert model.config.vocab_size == 258
    for batch, ctx in [(1, 0), (1, 10), (4, 100)]:
        assert generation.decode_bytes_per_step(model, batch, ctx) == _tiny_sizes(batch, ctx, False)


def test_decode_bytes_tied_counts_the_matrix_once():
    from transformers import LlamaConfig, LlamaForCausalLM

    cfg = LlamaConfig(vocab_size=258, hidden_size=64, intermediate_size=160, num_hidden_layers=2,
                      num_attention_heads=4, num_key_value_heads=2, tie_word_embeddings=True)
    model = LlamaForCausalLM(cfg)
    assert model.lm_head.weight.data_ptr() == model.model.embed_tokens.weight.data_ptr()
    assert generation.decode_bytes_per_step(model, 2, 50) == _tiny_sizes(2, 50, True)
    with pytest.raises(ValueError, match="batch_size"):
        generation.decode_bytes_per_step(model, 0, 50)


def test_achieved_bandwidth():
    # 1 GB per step at 20 ms per step = 50 GB/s
    assert generation.achieved_bandwidth_gbps(1e9, 20.0) == pytest.approx(50.0)


def test_batched_greedy_equals_unbatched(tiny_model):
    model, tok = tiny_model
    lengths = {len(tok(p)["input_ids"]) for p in PROMPTS}
    assert len(lengths) == 3  # the batch really is padded
    check = generation.padding_check(model, tok, PROMPTS, 6)
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

    monkeypatch.setattr(generation, "greedy_new_tokens", broken)
    check = generation.padding_check(model, tok, PROMPTS, 4)
    assert not check["match"]
    assert [r["first_difference"] for r in check["rows"]] == [None, 2, None]


def test_sweep_goes_on_after_oom_and_failure(monkeypatch):
    freed = []
    monkeypatch.setattr(generation.backend, "free_memory", lambda device: freed.append(device))

    def fn(batch):
        if batch == 2:
            raise torch.OutOfMemoryError("out of memory allocating 1 GiB")
        if batch == 4:
            raise RuntimeError("shape mismatch")
        return {"tokens_per_s": 10.0 * batch}

    rows = generation.run_sweep([1, 2, 4, 8], fn, "cpu")
    assert [r["status"] for r in rows] == ["ok", "oom", "failed", "ok"]
    assert rows[3]["tokens_per_s"] == 80.0 and rows[0]["point"] == 1
    assert "OutOfMemoryError" in rows[1]["error"] and "shape mismatch" in rows[2]["error"]
    assert len(freed) >= 1 and "tokens_per_s" not in rows[1]


def test_prompt_of_length(tiny_model):
    _, tok = tiny_model
    text, count = generation.prompt_of_length(tok, 40)
    assert count == len(tok(text)["input_ids"]) and abs(count - 40) <= 2
    with pytest.raises(ValueError, match="n_tokens"):
        generation.prompt_of_length(tok, 0)


def test_noise_larger_than_decode_gives_no_figure(tiny_model, monkeypatch):
    model, tok = tiny_model

    def fake_measure(fn, device, *, name="", **kw):
        return bench.Timing(name, [0.5, 0.5] if name == "generate 1 token" else [0.2, 0.3],
                            device=str(device))

    monkeypatch.setattr(generation.bench, "measure", fake_measure)
    r = generation.measure_generation(model, tok, ["x"], 4, repeats=2)
    assert not r["decode_resolved"] and r["decode_noisy"]
    assert r["decode_ms_per_token"] != r["decode_ms_per_token"]  # NaN, never a negative speed


def test_timing_figures_are_the_one_definition_of_decode():
    """measure_generation and measure_interleaved's pooling record the figures of timing_figures."""
    r = generation.timing_figures([0.1, 0.2, 0.3], [0.02, 0.03, 0.04], 4, "cpu")
    assert r["ttft_ms"] == pytest.approx(200.0) and r["decode_ms_per_token"] == pytest.approx(30.0)
    assert r["decode_p10_ms"] == pytest.approx(22.0) and r["decode_p90_ms"] == pytest.approx(38.0)
    assert r["tokens_per_s_aggregate"] == pytest.approx(4 * 1000 / 30) and r["decode_resolved"]
    assert r["decode_samples_ms"] == pytest.approx([20.0, 30.0, 40.0])
    noisy = generation.timing_figures([0.1, 0.1], [-0.01, 0.005, -0.002], 1, "cpu")
    assert not noisy["decode_resolved"] and noisy["decode_noisy"]
    for key in ("decode_ms_per_token", "decode_p10_ms", "decode_p90_ms", "tokens_per_s_per_user"):
        assert noisy[key] != noisy[key]  # NaN: no figure, never a negative speed


def test_compile_model_dispatches_by_device(tiny_model, monkeypatch):
    """inductor on CPU, torchair's NPU backend on NPU, always dynamic=False; nothing is compiled."""
    import sys
    import types

    from helpers import static_decode

    model, _ = tiny_model
    calls = []
    monkeypatch.setattr(torch, "compile", lambda fn, **kw: calls.append(kw) or fn)

    class Config:
        mode = None

    fake_torchair = types.SimpleNamespace(CompilerConfig=Config, get_npu_backend=lambda **kw: "npu-backend")
    monkeypatch.setitem(sys.modules, "torchair", fake_torchair)
    try:
        assert static_decode.compile_model(model, "cpu").backend == "inductor"
        assert calls[-1]["backend"] == "inductor" and calls[-1]["dynamic"] is False
        assert static_decode.compile_model(model, "npu", npu_mode="reduce-overhead").backend == "torchair"
        assert calls[-1]["backend"] == "npu-backend" and calls[-1]["dynamic"] is False
        assert "mode" not in calls[-1]  # torchair's mode goes to its CompilerConfig, not torch.compile
    finally:
        static_decode.restore_eager(model)


def test_cpu_contention_warning(monkeypatch):
    monkeypatch.setattr(backend.os, "getloadavg", lambda: (8.0, 8.0, 8.0))
    monkeypatch.setattr(backend.os, "cpu_count", lambda: 2)
    assert "load average 8.0 on 2 cores" in backend.cpu_contention("cpu")
    monkeypatch.setattr(backend.os, "getloadavg", lambda: (1.0, 1.0, 1.0))
    assert backend.cpu_contention("cpu") is None


def test_eager_matmul_times_cover_every_linear_kind_at_its_shape(tiny_model):
    model, _ = tiny_model
    times = generation.eager_matmul_times(model, 1, min_iters=2, min_seconds=0.0)
    kinds = set(times["matmul"])
    assert {"q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj", "lm_head"} == kinds
    q = times.set_index("matmul").loc["q_proj"]
    assert q["layers"] == 2 and q["weight_bytes"] == 2 * 64 * 64 * 4 and q["shape"] == "(1, 64) x (64, 64)"
    assert (times["gbps"] > 0).all() and (times["ms_per_step"] > 0).all()
    with pytest.raises(ValueError, match="batch_size"):
        generation.eager_matmul_times(model, 0)


def _path(step, matmul):
    return {"decode_ms_per_token": step, "weight_matmul_ms": matmul, "attention_ms": 0.5,
            "matmul_kernels": "aten::mm"}


def test_decode_gap_uses_each_paths_own_kernels():
    # a compiled path whose kernels beat the eager ones: no part of any path goes below zero
    gap = generation.decode_gap({"eager": _path(30.0, 12.0), "graph": _path(9.0, 6.0)},
                                bytes_per_step=100e6, weight_bytes=90e6, bandwidth_gbps=20.0)
    rows = gap.set_index("path")
    assert (gap["rest_ms"] >= 0).all() and (gap["matmul_ms"] >= 0).all()
    assert rows.loc["graph", "rest_ms"] == pytest.approx(3.0)
    assert rows.loc["eager", "matmul_share_pct"] == pytest.approx(40.0)
    assert rows.loc["graph", "matmul_gbps"] == pytest.approx(90e6 / 6e-3 / 1e9)
    assert list(gap["roofline_ms"]) == pytest.approx([100e6 / 20e9 * 1e3] * 2)
    assert not gap["note"].any()
    odd = generation.decode_gap({"x": _path(5.0, 6.0)}, 100e6, 90e6, 20.0)
    assert odd["note"].iloc[0]  # a profiled kernel time above the step is flagged, not hidden
    with pytest.raises(ValueError, match="bandwidth_gbps"):
        generation.decode_gap({"eager": _path(1.0, 0.5)}, 1.0, 1.0, 0.0)


def test_decode_step_launches_counts_one_step(tiny_model):
    model, tok = tiny_model
    counts = generation.decode_step_launches(model, tok, "count the launches")
    assert counts["ops"] > 10 and counts["by_op"].get("aten::linear", 0) + counts["by_op"].get("aten::mm", 0) >= 15


def test_interleaved_measurement_pools_rounds(tiny_model):
    import copy

    from helpers import quant

    model, tok = tiny_model
    int8 = copy.deepcopy(model)
    quant.quantize_model_int8(int8, impl="dequant")
    out = generation.measure_interleaved({"fp32": model, "int8": int8}, tok, ["hi"], 4, rounds=2, repeats=2)
    assert set(out) == {"fp32", "int8"}
    for res in out.values():
        assert len(res["decode_samples_ms"]) == 4 and res["rounds"] == 2  # two rounds of two repeats
        timing = generation.decode_timing(res)
        assert res["decode_ms_per_token"] == pytest.approx(timing.median_ms)
        assert res["ttft_ms"] == pytest.approx(generation.ttft_timing(res).median_ms)
        assert "2 interleaved rounds" in res["code_path"]
    with pytest.raises(ValueError, match="rounds"):
        generation.measure_interleaved({"fp32": model}, tok, ["hi"], 4, rounds=0)


# --- chapter 04: batch prompts, the padding check in float32, the sweep and its ratios -----------

def test_batch_prompts_cycle_through_prompts_of_different_lengths():
    assert generation.batch_prompts(3) == list(generation.BATCH_PROMPTS[:3])
    assert generation.batch_prompts(10)[8:] == list(generation.BATCH_PROMPTS[:2])
    assert len({len(p) for p in generation.batch_prompts(4)}) == 4  # the padding check's batch is padded
    with pytest.raises(ValueError, match="batch_size=0"):
        generation.batch_prompts(0)


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

    monkeypatch.setattr(generation, "padding_check",
                        _fake_padding_check({torch.bfloat16: False, torch.float32: True}))
    check = generation.padding_check_in_float32(half, tok, PROMPTS, 4, load_float32=load)
    assert loads == [1] and check["dtype"] == "bfloat16" and not check["match"]
    assert check["float32"]["match"] and check["padding_right"]
    assert check["differing"] == 1 and check["first_difference"] == 3
    # a float32 run that differs is a padding bug: nothing to reload, padding_right is False
    monkeypatch.setattr(generation, "padding_check", _fake_padding_check({torch.float32: False}))
    check = generation.padding_check_in_float32(model, tok, PROMPTS, 4, load_float32=load)
    assert loads == [1] and check["float32"] is None and not check["padding_right"]
    # a match needs no second check either
    monkeypatch.setattr(generation, "padding_check", _fake_padding_check({torch.bfloat16: True}))
    check = generation.padding_check_in_float32(half, tok, PROMPTS, 4, load_float32=load)
    assert loads == [1] and check["padding_right"] and check["first_difference"] is None


def test_batch_sweep_measures_each_size_once_with_bytes_and_bandwidth(tiny_model):
    model, tok = tiny_model
    rows = generation.batch_sweep(model, tok, [2, 1, 2], 4, repeats=1)
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
    ratios = generation.batch_ratios(rows, {4: {"throughput": 3.2, "memory_pct": 15.0, "latency_pct": 20.0}})
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
    assert [r["batch"] for r in generation.batch_ratios([rows[0], noisy])] == [1]
    assert generation.highest_bandwidth_point([noisy]) is None
    # no batch-1 decode figure: no ratios at all
    assert generation.batch_ratios([dict(rows[0], decode_resolved=False), rows[1]]) == []
    assert generation.batch_ratios(rows[1:]) == []


def test_kv_cache_table_and_the_highest_bandwidth_point():
    mib = 2 ** 20
    rows = [_point(1, [10.0, 10.0, 10.0], [1.0] * 3, 10 * mib, 2 * mib),
            _point(2, [5.0, 5.0, 5.0], [1.0] * 3, 20 * mib, 4 * mib),
            {"point": 4, "status": "failed", "error": "boom"}]
    kv = generation.kv_cache_table(rows, weight_bytes=400 * mib)
    assert [r["batch"] for r in kv] == [1, 2]
    assert kv[1]["kv_cache_MiB"] == 4 and kv[1]["kv_share_of_weights_pct"] == pytest.approx(1.0)
    assert kv[1]["context_tokens"] == 14 and kv[1]["measured_growth_MiB"] == 20
    assert kv[1]["peak_memory_MiB"] == 1020 and kv[0]["bytes_per_step_MB"] == 2000
    assert generation.highest_bandwidth_point(rows)["point"] == 2
    assert generation.highest_bandwidth_point([dict(rows[0], decode_resolved=False)]) is None


def test_llama2_kv_growth_inverts_the_claimed_growth():
    rows = generation.llama2_kv_growth({8: 30.0, 4: 15.0}, contexts=(512,))
    assert [r["batch"] for r in rows] == [4, 8] and rows[0]["dtype"] == "float16"
    cfg, w = roofline.LLAMA2_7B_CONFIG, roofline.llama2_weight_bytes("float16")
    for r in rows:
        at_claim = roofline.kv_memory_growth_pct(cfg, r["batch"], round(r["context_for_claim"]), w)
        assert at_claim == pytest.approx(r["guide_memory_pct"], abs=0.1)
        assert r["kv_growth_pct_512"] == pytest.approx(roofline.kv_memory_growth_pct(cfg, r["batch"], 512, w))
    assert rows[0]["kv_per_token_kib"] == 512  # 2 x 32 layers x 32 heads x 128 x 2 bytes


def test_logits_of_last_position_compare_the_slice_with_plain_rows(tiny_model):
    model, _ = tiny_model
    out = generation.logits_of_last_position(model, 8, min_iters=2, min_seconds=0.0)
    assert set(out) == {"slice", "2-D rows"}
    assert out["slice"]["stride"][0] == 8 * model.config.hidden_size  # the prompt's stride is kept
    assert out["2-D rows"]["stride"] == [8 * model.config.hidden_size, 1] or out["2-D rows"]["stride"][1] == 1
    assert all(r["median_ms"] > 0 and r["ops"] for r in out.values())
