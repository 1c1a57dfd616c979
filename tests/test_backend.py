"""Device selection, torch_npu import failure modes, memory helpers and dtype parsing."""
from __future__ import annotations

import importlib.util
from pathlib import Path

import sys
import types

import pytest
import torch

from helpers import backend


def _install_failing_torch_npu(monkeypatch, tmp_path, statement: str) -> None:
    """Put a ``torch_npu`` on sys.path whose import fails the way a broken install does."""
    (tmp_path / "torch_npu.py").write_text(statement + "\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.delitem(sys.modules, "torch_npu", raising=False)
    monkeypatch.setattr(backend, "_NPU_IMPORT", None)


FAILURES = {
    "libhccl": ("ImportError", 'raise ImportError("libhccl.so: cannot open shared object file: '
                               'No such file or directory")'),
    "version mismatch": ("RuntimeError", 'raise RuntimeError("torch_npu 2.1.0.post10 requires '
                                         'torch 2.1.0 but found 2.13.0")'),
    "missing driver lib": ("OSError", 'raise OSError("libascend_hal.so: cannot open shared object")'),
    "missing dependency": ("ModuleNotFoundError", "import a_module_that_is_not_installed_xyz"),
}


@pytest.mark.parametrize("case", sorted(FAILURES))
def test_import_torch_npu_failure_modes_are_caught_and_explained(monkeypatch, tmp_path, case):
    kind, statement = FAILURES[case]
    _install_failing_torch_npu(monkeypatch, tmp_path, statement)
    result = backend.import_torch_npu(refresh=True)
    assert not result.ok
    assert result.error.startswith(kind)
    assert "TORCH_DEVICE_BACKEND_AUTOLOAD=0" in result.hint
    assert "set_env.sh" in result.hint


def test_torch_npu_not_installed_is_not_an_error_with_a_hint(monkeypatch, tmp_path):
    monkeypatch.delitem(sys.modules, "torch_npu", raising=False)
    monkeypatch.setattr(sys, "path", [p for p in sys.path if "torch_npu" not in p])
    monkeypatch.setattr(backend, "_NPU_IMPORT", None)
    result = backend.import_torch_npu(refresh=True)
    assert not result.ok
    assert result.error == "torch_npu is not installed"
    assert result.hint is None


def test_import_result_is_cached_until_refresh(monkeypatch, tmp_path):
    _install_failing_torch_npu(monkeypatch, tmp_path, FAILURES["libhccl"][1])
    first = backend.import_torch_npu(refresh=True)
    assert backend.import_torch_npu() is first
    assert backend.import_torch_npu(refresh=True) is not first


def test_broken_torch_npu_auto_falls_back_and_explicit_npu_raises(monkeypatch, tmp_path):
    _install_failing_torch_npu(monkeypatch, tmp_path, FAILURES["libhccl"][1])
    monkeypatch.setattr(backend, "cuda_available", lambda: False)
    choice = backend.pick_device("auto")
    assert choice.device.type == "cpu"
    assert "libhccl.so" in choice.reason
    with pytest.raises(RuntimeError) as err:
        backend.pick_device("npu")
    message = str(err.value)
    assert "device='npu'" in message and "devices found: cpu" in message
    assert "TORCH_DEVICE_BACKEND_AUTOLOAD=0" in message and "set_env.sh" in message


def test_fake_npu_without_device(fake_torch_npu, monkeypatch):
    monkeypatch.setattr(backend, "cuda_available", lambda: False)
    assert backend.import_torch_npu().ok
    assert backend.available_devices() == ["cpu"]
    assert backend.pick_device("auto").device.type == "cpu"
    with pytest.raises(RuntimeError, match=r"devices found: cpu.*is_available\(\) is False"):
        backend.pick_device("npu:0")


def test_fake_npu_with_device_is_picked_first(fake_torch_npu, monkeypatch):
    fake_torch_npu.npu = fake_torch_npu.make_npu_namespace(available=True)
    monkeypatch.setattr(torch, "npu", fake_torch_npu.npu, raising=False)
    monkeypatch.setattr(backend, "cuda_available", lambda: True)
    assert backend.available_devices() == ["npu", "cuda", "cpu"]
    # torch.device("npu") exists only once the real torch_npu renamed the PrivateUse1 backend.
    monkeypatch.setattr(backend.torch, "device", lambda name: types.SimpleNamespace(type=name.split(":")[0]))
    choice = backend.pick_device("auto")
    assert choice.device.type == "npu" and "npu is available" in choice.reason
    assert backend.pick_device("cpu").device.type == "cpu"


def test_npu_query_failure_counts_as_no_npu(fake_torch_npu, monkeypatch):
    def broken():
        raise RuntimeError("drvErr: device not found")

    fake_torch_npu.npu.is_available = broken
    assert backend.npu_available() is False


@pytest.mark.parametrize("bad", ["gpu", "npu:x", "auto:0", "", "tpu:1"])
def test_bad_device_names_the_parameter_and_choices(bad):
    with pytest.raises(ValueError) as err:
        backend.pick_device(bad)
    assert "device=" in str(err.value) and "auto, npu, cuda, cpu" in str(err.value)


def test_cuda_requested_without_cuda(monkeypatch):
    monkeypatch.setattr(backend, "cuda_available", lambda: False)
    monkeypatch.setattr(backend, "npu_available", lambda: False)
    with pytest.raises(RuntimeError, match=r"no cuda device; devices found: cpu"):
        backend.pick_device("cuda")


# --- synchronisation and memory per backend -------------------------------------------------

class _FakeDevice:
    def __init__(self, kind):
        self.type, self.index = kind, None


def test_synchronize_and_memory_dispatch_to_the_npu_module(fake_torch_npu, monkeypatch):
    monkeypatch.setattr(backend, "as_device", lambda d: _FakeDevice("npu"))
    calls = []
    fake_torch_npu.npu.reset_peak_memory_stats = lambda *a: calls.append("reset")
    fake_torch_npu.npu.empty_cache = lambda: calls.append("empty")
    fake_torch_npu.npu.memory_allocated = lambda *a: 1000
    fake_torch_npu.npu.max_memory_allocated = lambda *a: 12345
    backend.synchronize("npu")
    assert fake_torch_npu.CALLS[-1] == "synchronize"
    with backend.MemoryRegion("npu") as mem:
        assert calls == ["empty", "reset"]  # the peak is reset at the start of the region
    assert mem.peak_bytes == 12345 and mem.start_bytes == 1000 and mem.growth_bytes == 11345
    assert "reset at its start" in mem.kind
    backend.free_memory("npu")
    assert calls[-1] == "empty"


def test_cpu_synchronize_is_a_no_op():
    backend.synchronize("cpu")
    assert backend.device_module("cpu") is None


def test_cpu_memory_region_measures_growth_not_an_earlier_high_water_mark():
    big = torch.ones(256 * 2**20 // 4)  # an earlier, larger allocation sets a high-water mark
    del big
    with backend.MemoryRegion("cpu") as mem:
        block = torch.ones(64 * 2**20 // 4)  # 64 MiB, touched, inside the region
        del block
    assert 48 * 2**20 <= mem.growth_bytes < 200 * 2**20  # the region's own 64 MiB, not the 256 MiB
    with backend.MemoryRegion("cpu") as idle:
        pass
    assert idle.growth_bytes < 16 * 2**20


def test_cpu_memory_region_samples_when_clear_refs_is_forbidden(monkeypatch):
    monkeypatch.setattr(backend, "_reset_cpu_high_water_mark", lambda: False)
    with backend.MemoryRegion("cpu") as mem:
        block = torch.ones(96 * 2**20 // 4)
        import time

        time.sleep(0.05)  # long enough for the 2 ms sampler to see it
        del block
    assert "sampled" in mem.kind and mem.growth_bytes >= 64 * 2**20


# --- out of memory (the sweep helpers build on these two) -----------------------------------

@pytest.mark.parametrize("exc", [
    MemoryError(),
    torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB"),
    RuntimeError("NPU out of memory. Tried to allocate 1.00 GiB (NPU 0; 29.50 GiB total capacity)"),
    RuntimeError("[enforce fail at alloc_cpu.cpp:117] . DefaultCPUAllocator: can't allocate memory"),
    RuntimeError("OOM when allocating tensor"),
])
def test_out_of_memory_is_recognised(exc):
    assert backend.is_out_of_memory(exc)


@pytest.mark.parametrize("exc", [
    RuntimeError("mat1 and mat2 shapes cannot be multiplied"),
    ValueError("zoom factor"),
    KeyError("room"),
])
def test_other_errors_are_not_out_of_memory(exc):
    assert not backend.is_out_of_memory(exc)


def test_out_of_memory_on_torch_without_torch_outofmemoryerror(monkeypatch):
    monkeypatch.delattr(torch, "OutOfMemoryError")
    assert backend.is_out_of_memory(MemoryError())
    assert backend.is_out_of_memory(RuntimeError("NPU out of memory"))
    assert not backend.is_out_of_memory(RuntimeError("shape mismatch"))


def test_real_cpu_allocation_failure_is_out_of_memory_and_memory_is_freed():
    with pytest.raises(RuntimeError) as err:
        torch.empty(2**62, dtype=torch.uint8)
    assert backend.is_out_of_memory(err.value)
    backend.free_memory("cpu")  # must not raise on the CPU


# --- dtypes ----------------------------------------------------------------------------------

@pytest.mark.parametrize("text,dtype", [("fp16", torch.float16), ("bfloat16", torch.bfloat16),
                                        ("float32", torch.float32), (torch.float16, torch.float16)])
def test_parse_dtype(text, dtype):
    assert backend.parse_dtype(text, "cpu") == dtype


def test_parse_dtype_auto_on_cpu_matches_choose_dtype(monkeypatch):
    monkeypatch.delenv(backend.RUN_DIR_ENV, raising=False)
    assert backend.parse_dtype("auto", "cpu") == backend.choose_dtype("cpu").dtype


def test_unknown_dtype_names_the_parameter_and_choices():
    with pytest.raises(ValueError, match=r"dtype='int4' is not valid; choose one of auto, float32"):
        backend.parse_dtype("int4", "cpu")


def test_bf16_where_the_device_lacks_it(fake_torch_npu, monkeypatch):
    fake_torch_npu.npu.is_bf16_supported = lambda: False
    monkeypatch.setattr(backend, "as_device", lambda d: _FakeDevice("npu"))
    with pytest.raises(ValueError, match=r"dtype=bfloat16 is not supported on this npu device"):
        backend.parse_dtype("bf16", "npu")
    assert backend.parse_dtype("fp16", "npu") == torch.float16




# --- the CPU working dtype, chosen by timing -------------------------------------------------

# the one builder of synthetic probe rows lives with the fixtures it also makes
_spec = importlib.util.spec_from_file_location(
    "_make_fixture_runs", Path(__file__).parent / "fixtures" / "make_fixture_runs.py")
_fixture_runs = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(_fixture_runs)
_row = _fixture_runs.probe_row


# float32 50 ms a step; bfloat16 45 ms with a cheap prefill; float16 30 ms with an expensive one
# (a CPU whose float16 GEMVs are fast but whose float16 arithmetic is slow)
F32, BF16, FP16 = _row("float32", 50, 100, 300), _row("bfloat16", 45, 90, 280), _row("float16", 30, 100, 400)


def test_the_request_time_is_the_prefill_line_plus_the_decode_steps():
    t = backend.request_times(F32, prompt_tokens=80, new_tokens=10)
    assert t["request_ms"] == pytest.approx(200 + 10 * 50)  # halfway between 32 and 128 tokens
    assert t["request_p10_ms"] == pytest.approx(195 + 10 * 49.5)
    assert t["request_p90_ms"] == pytest.approx(205 + 10 * 50.5)
    assert F32["request_ms"] == pytest.approx(300 + backend.REQUEST_NEW_TOKENS * 50)
    assert F32["request_prompt_tokens"] == backend.REQUEST_PROMPT_TOKENS


def test_float16_is_picked_when_its_request_is_fastest_beyond_the_spread():
    assert backend.pick_cpu_dtype([F32, BF16, FP16]) == ("float16", "16bit_faster")


def test_bfloat16_is_picked_where_float16s_prefill_dominates_a_long_prompt():
    assert backend.pick_cpu_dtype([F32, BF16, FP16], prompt_tokens=2048) == ("bfloat16", "16bit_faster")
    # within the spread of each other, bf16 keeps float32's range
    close = _row("float16", 44.9, 90, 280)
    assert backend.pick_cpu_dtype([F32, BF16, close]) == ("bfloat16", "16bit_faster")


def test_float32_is_kept_when_no_16bit_dtype_beats_it():
    slower = [F32, _row("bfloat16", 60, 120, 350), _row("float16", 55, 200, 900)]
    assert backend.pick_cpu_dtype(slower) == ("float32", "float32_not_slower")
    overlapping = [_row("float32", 50, 100, 300, spread=3), _row("bfloat16", 49, 100, 300, spread=3),
                   _row("float16", 80, 100, 300)]
    assert backend.pick_cpu_dtype(overlapping) == ("float32", "float32_not_slower")


def test_a_dtype_that_does_not_run_is_never_picked():
    rows = [F32, {"dtype": "bfloat16", "problem": "RuntimeError: not implemented"},
            {**FP16, "problem": "differs from float32 by 3"}]
    assert backend.pick_cpu_dtype(rows) == ("float32", "no_16bit_usable")
    assert "no 16-bit dtype runs" in backend._reason("no_16bit_usable", rows, "float32")
    with pytest.raises(ValueError, match="float32 row"):
        backend.pick_cpu_dtype([BF16])


def test_the_flip_length_is_where_the_request_time_lines_change_the_pick():
    rows = [F32, BF16, FP16]
    flips = backend.flip_lengths(rows)
    # float16 stops beating bfloat16 beyond the spreads where its steeper prefill line has eaten its
    # decode lead: 2020 + 3.125 (P - 32) + 37 = 2970 + 1.979 (P - 32) - 37, P = 796.2
    assert flips["flip_longer_tokens"] == 797 and flips["flip_longer_dtype"] == "bfloat16"
    assert backend.pick_cpu_dtype(rows, 796)[0] == "float16" and backend.pick_cpu_dtype(rows, 797)[0] == "bfloat16"
    assert flips["flip_shorter_tokens"] is None  # float16 holds down to a 1-token prompt
    text = backend._reason("16bit_faster", rows, "float16", flips)
    assert "from 797-token prompts on it would be bfloat16" in text
    # seen from a long request, the pick flips the other way at the same length
    long = backend.flip_lengths(rows, prompt_tokens=2048)
    assert long["flip_shorter_tokens"] == 796 and long["flip_shorter_dtype"] == "float16"
    assert long["flip_longer_tokens"] is None


def test_no_flip_when_one_dtype_wins_at_every_prompt_length():
    rows = [F32, _row("bfloat16", 40, 50, 100), _row("float16", 60, 200, 900)]
    flips = backend.flip_lengths(rows)
    assert set(flips.values()) == {None}
    short = backend.flip_lengths(rows, horizon=200)  # a short horizon is honoured too
    assert short["flip_longer_tokens"] is None


def test_linear_shapes_follow_the_config():
    shapes = backend.linear_shapes(backend.EMBEDDED_WIDTHS)
    assert shapes["q_proj"] == (576, 576) and shapes["k_proj"] == (192, 576)
    assert shapes["down_proj"] == (576, 1536) and shapes["lm_head"] == (49152, 576)
    assert shapes["layers"] == 30
    with pytest.raises(ValueError, match="hidden_size"):
        backend.linear_shapes({"hidden_size": 8})


def test_the_embedded_model_is_built_whole_and_a_7b_on_a_subset_of_its_layers():
    assert backend.probe_layers(backend.EMBEDDED_WIDTHS) == (30, 30)
    llama2_7b = {"hidden_size": 4096, "intermediate_size": 11008, "num_attention_heads": 32,
                 "vocab_size": 32000, "num_hidden_layers": 32, "tie_word_embeddings": False}
    assert backend.probe_layers(llama2_7b) == (1, 32)  # one layer is 0.8 GB in float32
    # 8 GiB less the 1.05 GB embedding + lm_head holds 9 layers of 0.81 GB
    assert backend.probe_layers(llama2_7b, budget=8 * 2**30)[0] == 9
    assert backend.probe_config(llama2_7b, 3).num_hidden_layers == 3


def test_a_subset_probe_scales_the_layers_and_counts_the_head_once():
    probe = backend._ForwardProbe.__new__(backend._ForwardProbe)
    probe.layers, probe.built = 40, 2
    probe.samples = {"decode": [0.012, 0.014]}
    probe.fixed = {"decode": [0.002, 0.002, 0.002]}
    # 2 ms of embedding, norm and lm_head once, the rest (10 or 12 ms for 2 layers) times 20
    assert probe.scaled("decode") == pytest.approx([0.002 + 0.010 * 20, 0.002 + 0.012 * 20])
    probe.built = 40
    assert probe.scaled("decode") == [0.012, 0.014]


def test_measured_choice_times_the_real_forward_and_records_its_figures():
    from helpers import models

    config = models.tiny_llama()[0].config
    choice = backend.measure_cpu_dtype(config, rounds=1, decode_iters=1)
    assert choice.dtype in backend.CPU_CANDIDATE_DTYPES
    assert choice.decision in backend.DTYPE_DECISIONS and choice.source == "measured now"
    assert [r["dtype"] for r in choice.rows] == ["float32", "bfloat16", "float16"]
    for row in choice.rows:
        if not row["problem"]:
            for part in ("decode", "prefill_short", "prefill_long", "request"):
                assert row[f"{part}_p10_ms"] <= row[f"{part}_ms"] <= row[f"{part}_p90_ms"], part
            assert row["timed_layers"] == row["layers"] == config.num_hidden_layers
            assert (row["prefill_short_tokens"], row["prefill_long_tokens"]) == backend.PROBE_PROMPT_TOKENS
            assert row["request_prompt_tokens"] == backend.REQUEST_PROMPT_TOKENS
    assert backend.dtype_name(choice.dtype) in choice.reason
    record = choice.record()
    assert record["request_new_tokens"] == backend.REQUEST_NEW_TOKENS and "flip_longer_tokens" in record
    with pytest.raises(ValueError, match="new_tokens=0"):
        backend.measure_cpu_dtype(config, new_tokens=0)


def test_a_model_too_big_for_the_budget_is_timed_on_a_subset_of_its_layers():
    widths = {"hidden_size": 128, "intermediate_size": 256, "num_attention_heads": 4,
              "vocab_size": 512, "num_hidden_layers": 40, "max_position_embeddings": 256}
    choice = backend.measure_cpu_dtype(widths, budget=2 * 2**20, rounds=1, decode_iters=1)
    row = next(r for r in choice.rows if r["dtype"] == "float32")
    assert row["timed_layers"] == backend.probe_layers(widths, 2 * 2**20)[0] < 40 and row["layers"] == 40


def test_recorded_choice_is_reused_only_from_the_same_cpu_level(tmp_path, monkeypatch):
    from helpers.results import Results

    monkeypatch.delenv(backend.RUN_DIR_ENV, raising=False)
    res = Results("00_environment_check", tmp_path)
    res.record(backend.DTYPE_CHOICE_KEY, "bfloat16", reason="bfloat16: measured", decision="16bit_faster",
               rows=[], cpu_capability=backend.cpu_capability(), threads=torch.get_num_threads(),
               flip_longer_tokens=700, flip_longer_dtype="float32")
    got = backend.recorded_dtype_choice(tmp_path)
    assert got.dtype == torch.bfloat16 and got.source == "recorded by chapter 00 of this run"
    assert got.flip_longer_tokens == 700 and got.flip_longer_dtype == "float32"
    monkeypatch.setenv(backend.RUN_DIR_ENV, str(tmp_path))
    assert backend.parse_dtype("auto", "cpu") == torch.bfloat16  # the runner's run folder, no measuring
    res.record(backend.DTYPE_CHOICE_KEY, "bfloat16", cpu_capability="SOME_OTHER_LEVEL",
               threads=torch.get_num_threads())
    assert backend.recorded_dtype_choice(tmp_path) is None


def test_npu_and_cuda_keep_float16_without_measuring(monkeypatch):
    monkeypatch.setattr(backend, "measure_cpu_dtype", lambda *a, **k: pytest.fail("measured"))
    monkeypatch.setattr(backend, "as_device", lambda d: _FakeDevice("cuda"))
    assert backend.choose_dtype("cuda").dtype == torch.float16


@pytest.mark.parametrize("rows, chosen", [
    ([F32, BF16, _row("float16", 44.9, 90, 280)], "bfloat16"),  # bf16 clear of float32
    ([_row("float32", 50, 100, 300, spread=3), _row("bfloat16", 49, 100, 300, spread=3),
      _row("float16", 80, 100, 300)], "float32"),  # overlapping spreads
    ([F32, _row("bfloat16", 60, 120, 350), _row("float16", 55, 200, 900)], "float32"),  # 16-bit slower
])
def test_the_probe_table_says_what_the_choice_saw(rows, chosen):
    from helpers import decide

    table = backend.dtype_probe_table(rows)
    said = {r.dtype: decide.time_ratio_direction(r.request_ratio_low, r.request_ratio_high)
            for r in table.itertuples() if r.dtype != "float32"}
    assert backend.pick_cpu_dtype(rows)[0] == chosen
    if chosen == "float32":
        assert decide.FASTER not in said.values()
    else:
        assert said[chosen] == decide.FASTER
    base = table[table.dtype == "float32"].iloc[0]
    assert base.request_time_ratio == 1.0 and base.request_ratio_low < 1 < base.request_ratio_high
    assert base.prefill_long_time_ratio == 1.0 and base.decode_time_ratio == 1.0
    if rows[1]["decode_ms"] == 49:  # overlapping spreads: no direction
        assert said["bfloat16"] == decide.SAME


def test_the_probe_table_keeps_a_dtype_that_did_not_run_without_times():
    rows = [F32, {"dtype": "float16", "problem": "differs from float32 by 3"}]
    table = backend.dtype_probe_table(rows)
    row = table[table.dtype == "float16"].iloc[0]
    assert row.problem == "differs from float32 by 3" and pd_isna(row.request_time_ratio)
    assert backend.dtype_probe_table([]).empty


def pd_isna(value):
    import pandas as pd

    return pd.isna(value)


def test_the_environment_table_names_host_ram_on_a_cpu_and_device_memory_elsewhere():
    report = {"python": "3.11.7", "torch": "2.13.0+cpu", "torch_npu": None,
              "torch_npu_error": "torch_npu is not installed", "cann": None, "cuda": None, "device": "cpu",
              "device_properties": {"name": "Some CPU", "count": 1, "total_memory_bytes": 24 * 2**30},
              "cpu_model": "Some CPU", "torch_threads": 2, "workbook_commit": "abc1234", "transformers": "5.0"}
    table = backend.environment_table(report).set_index("fact")["value"]
    assert table["host RAM (GiB)"] == "24.0" and "device memory (GiB)" not in table
    assert table["torch_npu"] == "not loaded (torch_npu is not installed)" and table["CANN"] == "not found"
    npu = backend.environment_table({**report, "device": "npu:0", "torch_npu": "2.1.0.post10"})
    npu = npu.set_index("fact")["value"]
    assert npu["device memory (GiB)"] == "24.0" and npu["torch_npu"] == "2.1.0.post10"
