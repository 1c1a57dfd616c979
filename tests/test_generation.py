"""Generation metrics: TTFT/decode split arithmetic, bytes per step, and sweeps."""
import pytest
import torch

from helpers import backend, bench, generation, int8_study, models, roofline

PROMPTS = ["hello world, this prompt is longer", "hi", "a medium prompt"]


def test_decode_is_the_median_of_every_stamped_step_of_the_timed_generates(tiny_model, monkeypatch):
    """Decode per token comes from the clock stamped after each new token of one generate: the
    warm-up generate's steps are left out, every timed step is a sample, medians and p10-p90 over them."""
    model, tok = tiny_model
    new_tokens, calls = 4, []

    def clock():  # a generate of 4 tokens stamps 5 times: its start, then after each token
        i = len(calls)
        run, pos = divmod(i, new_tokens + 1)
        step = 0.0 if pos == 0 else 0.5 if pos == 1 else 0.01 * (run + 1)  # run 0 is the warm-up
        calls.append((calls[-1] if calls else 0.0) + step)
        return calls[-1]

    monkeypatch.setattr(generation.StepStamps, "clock", staticmethod(clock))
    r = generation.measure_generation(model, tok, ["hi"], new_tokens, repeats=3)
    assert len(calls) == 4 * (new_tokens + 1)  # one warm-up and three timed generates, each stamped
    assert r["decode_samples_ms"] == pytest.approx([20.0] * 3 + [30.0] * 3 + [40.0] * 3)
    assert r["decode_ms_per_token"] == pytest.approx(30.0)
    assert r["decode_p10_ms"] == pytest.approx(20.0) and r["decode_p90_ms"] == pytest.approx(40.0)
    assert r["tokens_per_s_per_user"] == pytest.approx(1000 / 30) and r["decode_steps_per_generate"] == 3
    assert "stamped per token" in r["code_path"]


def test_the_two_generate_difference_is_a_cross_check_with_known_timings(tiny_model, monkeypatch):
    """TTFT = t(1); the cross-check is (t(N) - t(1)) / (N - 1) per pair; aggregate = per-user x batch."""
    model, tok = tiny_model
    prefill = [0.100, 0.110, 0.120]
    full = [0.100 + 7 * 0.020, 0.110 + 7 * 0.030, 0.120 + 7 * 0.040]

    def fake_measure(fn, device, *, name="", **kw):
        for _ in range(1 + len(full)):  # still runs generate (warm-up and timed), so the real path runs
            fn()
        return bench.Timing(name, prefill if name == "generate 1 token" else full, device=str(device))

    monkeypatch.setattr(generation.bench, "measure", fake_measure)
    r = generation.measure_generation(model, tok, PROMPTS, 8, repeats=3)
    assert r["ttft_ms"] == pytest.approx(110.0)
    assert r["ttft_p10_ms"] == pytest.approx(102.0)
    assert r["decode_two_generates_ms"] == pytest.approx(30.0)
    assert r["decode_two_generates_p10_ms"] == pytest.approx(22.0)
    assert r["decode_two_generates_p90_ms"] == pytest.approx(38.0)
    assert len(r["decode_samples_ms"]) == 3 * 7  # the stamped steps of the three timed generates
    assert r["tokens_per_s_per_user"] == pytest.approx(1000 / r["decode_ms_per_token"])
    assert r["tokens_per_s_aggregate"] == pytest.approx(3 * r["tokens_per_s_per_user"])
    assert r["total_ms"] == pytest.approx(full[1] * 1e3)
    assert r["batch_size"] == 3 and r["new_tokens"] == 8


def test_per_token_decode_resolves_where_the_two_generate_difference_does_not(tiny_model, monkeypatch):
    """The quick run's failure: the 1-token generates took as long as the N-token ones (a loaded
    machine), so (t(N) - t(1)) / (N - 1) <= 0. Here the generates really run and stamp their steps,
    while the totals bench.measure reports are those of that run; the per-token figure is still a
    number and the cross-check says it did not resolve."""
    model, tok = tiny_model

    def loaded_measure(fn, device, *, name="", **kw):
        for _ in range(1 + 2):  # the warm-up and two timed generates, really run
            fn()
        return bench.Timing(name, [0.5, 0.5] if name == "generate 1 token" else [0.2, 0.3], device=str(device))

    monkeypatch.setattr(generation.bench, "measure", loaded_measure)
    r = generation.measure_generation(model, tok, ["x"], 4, repeats=2)
    assert not r["decode_two_generates_resolved"]
    assert r["decode_two_generates_ms"] != r["decode_two_generates_ms"]  # NaN, never a negative time
    assert r["decode_resolved"] and r["decode_ms_per_token"] > 0 and r["tokens_per_s_per_user"] > 0
    assert r["decode_p10_ms"] <= r["decode_ms_per_token"] <= r["decode_p90_ms"]
    assert len(r["decode_samples_ms"]) == 2 * 3  # the warm-up generate's steps left out


def test_the_kernel_profile_splits_generates_of_at_most_a_few_tokens(tiny_model):
    # the profiler's events cost the time, not the steps: a long request is split over a short one
    model, tok = tiny_model
    r = generation.measure_generation(model, tok, PROMPTS[:1], 12, repeats=1, kernel_profile=True)
    n = generation.KERNEL_PROFILE_TOKENS
    assert r["new_tokens"] == 12 and f"(generate {n} - generate 1) / {n - 1}" in r["kernel_profile"]
    assert r["matmul_kernels"]  # the split itself can come out negative on a model this small


def test_step_stamps_time_the_steps_between_new_tokens():
    stamps = generation.StepStamps("cpu")
    stamps.stamps = [0.0, 0.5, 0.52, 0.55, 0.59, 0.7]  # start, 4 tokens, one step a generate ran ahead
    assert stamps.decode_intervals(4) == pytest.approx([0.02, 0.03, 0.04])
    done = stamps(torch.zeros(2, 3, dtype=torch.long))
    assert done.dtype == torch.bool and not done.any()  # it never stops a generate


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


def test_decode_bytes_count_packed_int8_weights(tiny_model):
    """A quantized model's step reads its int8 weights and scales (buffers, not parameters)."""
    import copy

    from helpers import quant

    model, _ = tiny_model
    int8 = copy.deepcopy(model)
    quant.quantize_model_int8(int8, impl="dequant")
    table = int8.get_input_embeddings().weight
    expected = (models.weight_bytes(int8) - table.numel() * table.element_size() + 3 * table.shape[1] * 4
                + roofline.kv_cache_bytes(int8.config, 3, 20, "float32"))
    assert generation.decode_bytes_per_step(int8, 3, 20) == expected
    assert expected < generation.decode_bytes_per_step(model, 3, 20)


def test_achieved_bandwidth():
    # 1 GB per step at 20 ms per step = 50 GB/s
    assert generation.achieved_bandwidth_gbps(1e9, 20.0) == pytest.approx(50.0)


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
    check = generation.timing_figures([0.1], [0.02, 0.03], 1, "cpu", two_generates=[-0.01, 0.004, -0.002])
    assert check["decode_resolved"] and not check["decode_two_generates_resolved"]
    assert check["decode_two_generates_ms"] != check["decode_two_generates_ms"]
    assert check["decode_two_generates_samples_ms"] == pytest.approx([-10.0, 4.0, -2.0])


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


def test_interleaved_measurement_pools_rounds(tiny_model):
    import copy

    from helpers import quant

    model, tok = tiny_model
    int8 = copy.deepcopy(model)
    quant.quantize_model_int8(int8, impl="dequant")
    out = int8_study.measure_interleaved({"fp32": model, "int8": int8}, tok, ["hi"], 4, rounds=2, repeats=2)
    assert set(out) == {"fp32", "int8"}
    for res in out.values():
        # two rounds of two repeats, each generate of 4 tokens stamping 3 decode steps
        assert len(res["decode_samples_ms"]) == 12 and res["rounds"] == 2 and res["repeats"] == 4
        assert len(res["decode_two_generates_samples_ms"]) == 4
        timing = generation.decode_timing(res)
        assert res["decode_ms_per_token"] == pytest.approx(timing.median_ms)
        assert res["ttft_ms"] == pytest.approx(generation.ttft_timing(res).median_ms)
        assert "2 interleaved rounds" in res["code_path"]
    with pytest.raises(ValueError, match="rounds"):
        int8_study.measure_interleaved({"fp32": model}, tok, ["hi"], 4, rounds=0)
