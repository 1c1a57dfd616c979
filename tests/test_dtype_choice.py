"""dtype=auto: the probe of the model's forward per dtype, the pick by one request's time, where the
pick would flip, and chapter 00's record that the later chapters reuse."""
from __future__ import annotations

import importlib.util
from pathlib import Path

import pandas as pd
import pytest
import torch

from helpers import backend, decide, dtype_choice, environment_study, model_files
from helpers.results import Results


class _FakeDevice:
    def __init__(self, kind):
        self.type, self.index = kind, None


def test_parse_dtype_auto_on_cpu_matches_choose_dtype(monkeypatch):
    # at the tiny model's widths the probe takes a second, not the embedded model's half minute
    monkeypatch.delenv(dtype_choice.RUN_DIR_ENV, raising=False)
    assert dtype_choice.parse_dtype("auto", "cpu", model="tiny-random") == \
        dtype_choice.choose_dtype("cpu", "tiny-random").dtype


# --- the CPU working dtype, chosen by timing -------------------------------------------------

# the one builder of synthetic probe rows lives with the fixtures it also makes
_spec = importlib.util.spec_from_file_location(
    "_make_fixture_runs", Path(__file__).parent / "fixtures" / "make_fixture_runs.py")
_fixture_runs = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(_fixture_runs)
_row = _fixture_runs.probe_row


# float32 50 ms a step; bfloat16 35 ms with a cheap prefill; float16 20 ms with an expensive one
# (a CPU whose float16 GEMVs are fast but whose float16 arithmetic is slow). Requests of 128 + 64
# tokens: 3,500, 2,420 and 1,680 ms, each challenger more than the pick's 20 % margin below.
F32, BF16, FP16 = _row("float32", 50, 100, 300), _row("bfloat16", 35, 60, 180), _row("float16", 20, 100, 400)


def test_the_request_time_is_the_prefill_line_plus_the_decode_steps():
    t = dtype_choice.request_times(F32, prompt_tokens=80, new_tokens=10)
    assert t["request_ms"] == pytest.approx(200 + 10 * 50)  # halfway between 32 and 128 tokens
    assert t["request_p10_ms"] == pytest.approx(195 + 10 * 49.5)
    assert t["request_p90_ms"] == pytest.approx(205 + 10 * 50.5)
    assert F32["request_ms"] == pytest.approx(300 + dtype_choice.REQUEST_NEW_TOKENS * 50)
    assert F32["request_prompt_tokens"] == dtype_choice.REQUEST_PROMPT_TOKENS


def test_float16_is_picked_when_its_request_is_fastest_beyond_the_spread():
    assert dtype_choice.pick_cpu_dtype([F32, BF16, FP16]) == ("float16", "16bit_faster")


def test_bfloat16_is_picked_where_float16s_prefill_dominates_a_long_prompt():
    assert dtype_choice.pick_cpu_dtype([F32, BF16, FP16], prompt_tokens=2048) == ("bfloat16", "16bit_faster")
    # within the spread of each other, bf16 keeps float32's range
    close = _row("float16", 34.9, 60, 180)
    assert dtype_choice.pick_cpu_dtype([F32, BF16, close]) == ("bfloat16", "16bit_faster")


def test_a_challenger_must_clear_the_margin_as_well_as_the_spread():
    # bfloat16 10 % below float32 with the spreads apart: faster, but not by the margin, so float32 stays;
    # float16 15 % below bfloat16 (as on an AVX-512 BF16 CPU without AMX, where the two trade places
    # from run to run): bfloat16 stays
    near = _row("bfloat16", 45, 90, 280)
    assert dtype_choice.faster_beyond_spread(near, F32) and not dtype_choice.clears_margin(near, F32)
    assert dtype_choice.pick_cpu_dtype([F32, near]) == ("float32", "float32_not_slower")
    assert "in 20 % less time" in dtype_choice._reason("float32_not_slower", [F32, near], "float32")
    fp16 = _row("float16", 29.5, 60, 180)  # 0.85 of bfloat16's request
    assert dtype_choice.faster_beyond_spread(fp16, BF16)
    assert dtype_choice.pick_cpu_dtype([F32, BF16, fp16]) == ("bfloat16", "16bit_faster")
    assert dtype_choice.clears_margin(FP16, BF16, 30) and not dtype_choice.clears_margin(FP16, BF16, 31)


def test_a_bfloat16_that_does_not_clear_float32_does_not_hide_a_float16_that_does():
    # bfloat16 10 % below float32, float16 40 % below float32 and 15 % below bfloat16
    near = _row("bfloat16", 45, 90, 280)
    fp16 = _row("float16", 38, 90, 280)
    assert not dtype_choice.clears_margin(fp16, near) and dtype_choice.clears_margin(fp16, F32)
    assert dtype_choice.pick_cpu_dtype([F32, near, fp16]) == ("float16", "16bit_faster")


def test_float32_is_kept_when_no_16bit_dtype_beats_it():
    slower = [F32, _row("bfloat16", 60, 120, 350), _row("float16", 55, 200, 900)]
    assert dtype_choice.pick_cpu_dtype(slower) == ("float32", "float32_not_slower")
    overlapping = [_row("float32", 50, 100, 300, spread=3), _row("bfloat16", 49, 100, 300, spread=3),
                   _row("float16", 80, 100, 300)]
    assert dtype_choice.pick_cpu_dtype(overlapping) == ("float32", "float32_not_slower")


def test_a_dtype_that_does_not_run_is_never_picked():
    rows = [F32, {"dtype": "bfloat16", "problem": "RuntimeError: not implemented"},
            {**FP16, "problem": "differs from float32 by 3"}]
    assert dtype_choice.pick_cpu_dtype(rows) == ("float32", "no_16bit_usable")
    assert "no 16-bit dtype runs" in dtype_choice._reason("no_16bit_usable", rows, "float32")
    with pytest.raises(ValueError, match="float32 row"):
        dtype_choice.pick_cpu_dtype([BF16])


def test_the_flip_length_is_where_the_request_time_lines_change_the_pick():
    rows = [F32, BF16, FP16]
    flips = dtype_choice.flip_lengths(rows)
    # float16 stops clearing the margin against bfloat16 where its steeper prefill line has eaten its
    # decode lead: 1280 + 3.125 P = 0.8 (2260 + 1.25 P), P = 248.5 (its spread stays apart up to 483)
    assert flips["flip_longer_tokens"] == 249 and flips["flip_longer_dtype"] == "bfloat16"
    assert dtype_choice.pick_cpu_dtype(rows, 248)[0] == "float16" and dtype_choice.pick_cpu_dtype(rows, 249)[0] == "bfloat16"
    assert flips["flip_shorter_tokens"] is None  # float16 holds down to a 1-token prompt
    text = dtype_choice._reason("16bit_faster", rows, "float16", flips)
    assert "from 249-token prompts on it would be bfloat16" in text and "at least 20 % less" in text
    # seen from a long request, the pick flips the other way at the same length
    long = dtype_choice.flip_lengths(rows, prompt_tokens=2048)
    assert long["flip_shorter_tokens"] == 248 and long["flip_shorter_dtype"] == "float16"
    assert long["flip_longer_tokens"] is None


def test_no_flip_when_one_dtype_wins_at_every_prompt_length():
    rows = [F32, _row("bfloat16", 38, 50, 100), _row("float16", 60, 200, 900)]
    flips = dtype_choice.flip_lengths(rows)
    assert set(flips.values()) == {None}
    short = dtype_choice.flip_lengths(rows, horizon=200)  # a short horizon is honoured too
    assert short["flip_longer_tokens"] is None


def test_linear_shapes_follow_the_config():
    shapes = dtype_choice.linear_shapes(dtype_choice.EMBEDDED_WIDTHS)
    assert shapes["q_proj"] == (576, 576) and shapes["k_proj"] == (192, 576)
    assert shapes["down_proj"] == (576, 1536) and shapes["lm_head"] == (49152, 576)
    assert shapes["layers"] == 30
    with pytest.raises(ValueError, match="hidden_size"):
        dtype_choice.linear_shapes({"hidden_size": 8})


def test_the_embedded_model_is_built_whole_and_a_7b_on_a_subset_of_its_layers():
    assert dtype_choice.probe_layers(dtype_choice.EMBEDDED_WIDTHS) == (30, 30)
    llama2_7b = {"hidden_size": 4096, "intermediate_size": 11008, "num_attention_heads": 32,
                 "vocab_size": 32000, "num_hidden_layers": 32, "tie_word_embeddings": False}
    assert dtype_choice.probe_layers(llama2_7b) == (1, 32)  # one layer is 0.8 GB in float32
    # 8 GiB less the 1.05 GB embedding + lm_head holds 9 layers of 0.81 GB
    assert dtype_choice.probe_layers(llama2_7b, budget=8 * 2**30)[0] == 9
    assert dtype_choice.probe_config(llama2_7b, 3).num_hidden_layers == 3


def test_a_subset_probe_scales_the_layers_and_counts_the_head_once():
    probe = dtype_choice._ForwardProbe.__new__(dtype_choice._ForwardProbe)
    probe.layers, probe.built = 40, 2
    probe.samples = {"decode": [0.012, 0.014]}
    probe.fixed = {"decode": [0.002, 0.002, 0.002]}
    # 2 ms of embedding, norm and lm_head once, the rest (10 or 12 ms for 2 layers) times 20
    assert probe.scaled("decode") == pytest.approx([0.002 + 0.010 * 20, 0.002 + 0.012 * 20])
    probe.built = 40
    assert probe.scaled("decode") == [0.012, 0.014]


def test_measured_choice_times_the_real_forward_and_records_its_figures():
    config = model_files.tiny_llama()[0].config
    choice = dtype_choice.measure_cpu_dtype(config, rounds=1, decode_iters=1)
    assert choice.dtype in dtype_choice.CPU_CANDIDATE_DTYPES
    assert choice.decision in dtype_choice.DTYPE_DECISIONS and choice.source == "measured now"
    assert [r["dtype"] for r in choice.rows] == ["float32", "bfloat16", "float16"]
    for row in choice.rows:
        if not row["problem"]:
            for part in ("decode", "prefill_short", "prefill_long", "request"):
                assert row[f"{part}_p10_ms"] <= row[f"{part}_ms"] <= row[f"{part}_p90_ms"], part
            assert row["timed_layers"] == row["layers"] == config.num_hidden_layers
            assert (row["prefill_short_tokens"], row["prefill_long_tokens"]) == dtype_choice.PROBE_PROMPT_TOKENS
            assert row["request_prompt_tokens"] == dtype_choice.REQUEST_PROMPT_TOKENS
    assert backend.dtype_name(choice.dtype) in choice.reason
    record = choice.record()
    assert record["request_new_tokens"] == dtype_choice.REQUEST_NEW_TOKENS and "flip_longer_tokens" in record
    with pytest.raises(ValueError, match="new_tokens=0"):
        dtype_choice.measure_cpu_dtype(config, new_tokens=0)


def test_a_model_too_big_for_the_budget_is_timed_on_a_subset_of_its_layers():
    widths = {"hidden_size": 128, "intermediate_size": 256, "num_attention_heads": 4,
              "vocab_size": 512, "num_hidden_layers": 40, "max_position_embeddings": 256}
    choice = dtype_choice.measure_cpu_dtype(widths, budget=2 * 2**20, rounds=1, decode_iters=1)
    row = next(r for r in choice.rows if r["dtype"] == "float32")
    assert row["timed_layers"] == dtype_choice.probe_layers(widths, 2 * 2**20)[0] < 40 and row["layers"] == 40


def test_recorded_choice_is_reused_only_from_the_same_cpu_level(tmp_path, monkeypatch):
    monkeypatch.delenv(dtype_choice.RUN_DIR_ENV, raising=False)
    res = Results("00_environment_check", tmp_path)
    res.record(dtype_choice.DTYPE_CHOICE_KEY, "bfloat16", reason="bfloat16: measured", decision="16bit_faster",
               rows=[], cpu_capability=backend.cpu_capability(), threads=torch.get_num_threads(),
               flip_longer_tokens=700, flip_longer_dtype="float32")
    got = dtype_choice.recorded_dtype_choice(tmp_path)
    assert got.dtype == torch.bfloat16 and got.source == "recorded by chapter 00 of this run"
    assert got.flip_longer_tokens == 700 and got.flip_longer_dtype == "float32"
    monkeypatch.setenv(dtype_choice.RUN_DIR_ENV, str(tmp_path))
    assert dtype_choice.parse_dtype("auto", "cpu") == torch.bfloat16  # the runner's run folder, no measuring
    res.record(dtype_choice.DTYPE_CHOICE_KEY, "bfloat16", cpu_capability="SOME_OTHER_LEVEL",
               threads=torch.get_num_threads())
    assert dtype_choice.recorded_dtype_choice(tmp_path) is None


def test_npu_and_cuda_keep_float16_without_measuring(monkeypatch):
    monkeypatch.setattr(dtype_choice, "measure_cpu_dtype", lambda *a, **k: pytest.fail("measured"))
    monkeypatch.setattr(dtype_choice, "as_device", lambda d: _FakeDevice("cuda"))
    assert dtype_choice.choose_dtype("cuda").dtype == torch.float16


@pytest.mark.parametrize("rows, chosen", [
    ([F32, BF16, _row("float16", 44.9, 90, 280)], "bfloat16"),  # bf16 clear of float32
    ([F32, _row("bfloat16", 45, 90, 280)], "float32"),  # bf16 faster beyond the spread, within the margin
    ([_row("float32", 50, 100, 300, spread=3), _row("bfloat16", 49, 100, 300, spread=3),
      _row("float16", 80, 100, 300)], "float32"),  # overlapping spreads
    ([F32, _row("bfloat16", 60, 120, 350), _row("float16", 55, 200, 900)], "float32"),  # 16-bit slower
])
def test_the_probe_table_says_what_the_choice_saw(rows, chosen):
    table = environment_study.dtype_probe_table(rows)
    # the count the page's decision gets too: the fewer samples of the two rows compared
    said = {r.dtype: decide.time_ratio_direction(r.request_ratio_low, r.request_ratio_high, samples=r.n_samples)
            for r in table.itertuples() if r.dtype != "float32"}
    assert dtype_choice.pick_cpu_dtype(rows)[0] == chosen
    if chosen == "float32":  # a dtype the page calls faster is not faster by the pick's margin
        assert all(r.request_time_ratio > 1 - dtype_choice.PICK_MARGIN_PCT / 100
                   for r in table.itertuples() if said.get(r.dtype) == decide.FASTER)
    else:
        assert said[chosen] == decide.FASTER
    base = table[table.dtype == "float32"].iloc[0]
    assert base.request_time_ratio == 1.0 and base.request_ratio_low < 1 < base.request_ratio_high
    assert base.prefill_long_time_ratio == 1.0 and base.decode_time_ratio == 1.0
    if rows[1]["decode_ms"] == 49:  # overlapping spreads: no direction
        assert said["bfloat16"] == decide.SAME
    # a ratio counts the fewer samples of its two sides: one row timed 4 times says no direction
    few = environment_study.dtype_probe_table([{**rows[0], "n_samples": 4}] + rows[1:])
    assert set(few.n_samples[few.dtype != "float32"]) == {4}
    assert all(decide.is_too_few(decide.time_ratio_direction(r.request_ratio_low, r.request_ratio_high,
                                                             samples=r.n_samples))
               for r in few.itertuples() if r.dtype != "float32")


def test_the_probe_table_keeps_a_dtype_that_did_not_run_without_times():
    rows = [F32, {"dtype": "float16", "problem": "differs from float32 by 3"}]
    table = environment_study.dtype_probe_table(rows)
    row = table[table.dtype == "float16"].iloc[0]
    assert row.problem == "differs from float32 by 3" and pd_isna(row.request_time_ratio)
    assert environment_study.dtype_probe_table([]).empty


def pd_isna(value):
    return pd.isna(value)
