"""llama.cpp beside the ladder (chapter 06): availability from the setup's record, the protocol's
arithmetic, and a child that crashes or is missing giving a reason instead of a figure."""
import json
import os
import sys

import pytest

from helpers import llamacpp, model_files


def test_summary_follows_the_workbooks_decode_definition():
    steps = [[0.010] * 15, [0.011] * 15, [0.012] * 15]
    raw = {"first_s": [0.030, 0.032, 0.031], "full_s": [0.030 + 15 * 0.010, 0.032 + 15 * 0.011, 0.031 + 15 * 0.012],
           "step_s": steps, "tokens": list(range(16)), "system_info": "AVX2 = 1"}
    out = llamacpp.summarize(raw, 16)
    # every step is a sample, as in generation.timing_figures: 45 samples, median 11 ms
    assert len(out["decode_samples_ms"]) == 45 and out["decode_ms_per_token"] == pytest.approx(11.0)
    assert out["decode_p10_ms"] == pytest.approx(10.0) and out["decode_p90_ms"] == pytest.approx(12.0)
    assert out["tokens_per_s"] == pytest.approx(1e3 / 11.0) and out["ttft_ms"] == pytest.approx(31.0)
    assert out["decode_two_generates_ms"] == pytest.approx(11.0)  # the cross-check the rungs carry too
    with pytest.raises(ValueError, match="as many"):
        llamacpp.summarize({"first_s": [1.0], "full_s": [], "step_s": []}, 16)
    with pytest.raises(ValueError, match="15 decode steps"):
        llamacpp.summarize({**raw, "step_s": [[0.01] * 14] * 3}, 16)


def test_availability_names_what_setup_recorded(tmp_path, monkeypatch):
    monkeypatch.setattr(llamacpp, "installed_version", lambda: None)
    monkeypatch.setattr(llamacpp, "status_path", lambda: tmp_path / "status.json")
    assert "not installed" in llamacpp.availability()["reason"]
    (tmp_path / "status.json").write_text(json.dumps({"status": "skipped", "reason": "no C++ compiler"}))
    found = llamacpp.availability()
    assert not found["available"] and "no C++ compiler" in found["reason"]
    out = llamacpp.measure("x.gguf", [1, 2, 3], 8)
    assert out["status"] == "unavailable" and "no C++ compiler" in out["reason"]
    monkeypatch.setattr(llamacpp, "installed_version", lambda: "0.3.36")
    assert llamacpp.availability()["available"]


def test_bad_arguments_name_the_parameter():
    with pytest.raises(ValueError, match="new_tokens"):
        llamacpp.measure("x.gguf", [1], 1)
    with pytest.raises(ValueError, match="repeats"):
        llamacpp.measure("x.gguf", [1], 4, repeats=0)
    with pytest.raises(ValueError, match="prompt_ids"):
        llamacpp.measure("x.gguf", [], 4)


def _raw(n=8):
    return {"first_s": [0.01, 0.01], "full_s": [0.01 + (n - 1) * 0.005] * 2, "step_s": [[0.005] * (n - 1)] * 2,
            "tokens": list(range(n))}


@pytest.mark.parametrize("code", [-4, -7, -11, 132, 139])
def test_a_child_that_dies_of_a_signal_with_extra_buffers_is_retried_without_them(monkeypatch, code):
    monkeypatch.setattr(llamacpp, "installed_version", lambda: "0.3.36")
    calls = []

    def child(request, timeout):
        calls.append(request["extra_buffers"])
        if request["extra_buffers"]:
            return None, (code, f"llama.cpp died of signal {code}")
        return _raw(), None

    monkeypatch.setattr(llamacpp, "_run_child", child)
    out = llamacpp.measure("m.Q4_1.gguf", [1, 2], 8, threads=2)
    assert calls == [True, False] and out["status"] == "ok" and not out["extra_buffers"]
    assert f"signal {code}" in out["note"] and "use_extra_bufts=False" in out["code_path"]
    assert out["quantization"] == "Q4_1" and out["decode_ms_per_token"] == pytest.approx(5.0)


def test_a_clean_run_keeps_extra_buffers_and_other_failures_are_reasons(monkeypatch):
    monkeypatch.setattr(llamacpp, "installed_version", lambda: "0.3.36")
    monkeypatch.setattr(llamacpp, "_run_child", lambda request, timeout: (_raw(), None))
    out = llamacpp.measure("m.Q4_1.gguf", [1, 2], 8, threads=2)
    assert out["extra_buffers"] and not out["note"] and "use_extra_bufts" not in out["code_path"]
    calls = []

    def exits(request, timeout):  # an exit code, not a signal: nothing to retry
        calls.append(request["extra_buffers"])
        return None, (1, "llama.cpp exit code 1: no such file")

    monkeypatch.setattr(llamacpp, "_run_child", exits)
    assert llamacpp.measure("m.Q4_1.gguf", [1, 2], 8, threads=2) == {"status": "failed",
                                                                      "reason": "llama.cpp exit code 1: no such file"}
    assert calls == [True]
    monkeypatch.setattr(llamacpp, "_run_child", lambda request, timeout: (None, (-4, "died again")))
    out = llamacpp.measure("m.Q4_1.gguf", [1, 2], 8, threads=2)  # dies both ways: both are said
    assert out["status"] == "failed" and out["reason"].startswith("died again (and before that, with llama.cpp's")


@pytest.mark.parametrize("sig,name", [("SIGILL", "illegal instruction"), ("SIGSEGV", "segmentation fault"),
                                      ("SIGBUS", "bus error")])
@pytest.mark.parametrize("extra", [True, False])
def test_a_real_child_killed_by_each_signal_is_named_truthfully(tmp_path, monkeypatch, sig, name, extra):
    script = tmp_path / "child.py"
    script.write_text(f"import os, signal\nos.kill(os.getpid(), signal.{sig})\n")
    monkeypatch.setattr(llamacpp, "__file__", str(script))
    out, failure = llamacpp._run_child({"threads": 1, "extra_buffers": extra}, timeout=60)
    assert out is None and llamacpp.died_of_signal(failure[0]) and name in failure[1]
    assert ("with its extra buffer types" in failure[1]) == extra
    # only an illegal instruction without the extra buffers blames the build, and says how to rebuild
    assert ("pip cache remove llama_cpp_python" in failure[1]) == (sig == "SIGILL" and not extra)


def test_llamacpp_runs_the_embedded_gguf_with_fixed_new_tokens():
    from helpers import models

    if llamacpp.installed_version() is None:
        setup = llamacpp.read_setup_status()
        # In CI a build that setup attempted and lost is a failure, not a skip (chapter 06 would
        # silently lose its reference); a build switched off (WORKBOOK_LLAMACPP=0, the legacy set) skips.
        if os.environ.get("CI") and setup.get("status") == "failed":
            pytest.fail(f"setup could not build llama-cpp-python: {setup.get('reason')}")
        pytest.skip(f"llama-cpp-python is not installed here ({setup.get('status', 'setup never ran')})")

    out = llamacpp.measure(model_files.locate_embedded_gguf(), [28120, 260, 5896, 282], 6, threads=1, repeats=1)
    assert out["status"] == "ok", out
    assert len(out["tokens"]) == 6 and out["decode_ms_per_token"] > 0 and out["ttft_ms"] > 0
    assert "CPU" in out["system_info"]


def _need_llamacpp():
    if llamacpp.installed_version() is None:
        pytest.skip(f"llama-cpp-python is not installed here ({llamacpp.read_setup_status().get('status')})")


@pytest.mark.parametrize("extra", [True, False])
def test_both_sides_time_the_decode_of_a_real_tiny_gguf_the_same_way(extra):
    """llama.cpp (with and without its extra buffer types) and a rung's ``measure_generation`` give the
    same figures from the same kind of samples: one per decode step, repeats x (N - 1) of them, and the
    two-generates difference beside them; llama.cpp's bytes per step are those of the file it ran."""
    import torch

    from conftest import small_model_path
    from helpers import generation, ladder, model_files

    _need_llamacpp()
    gguf = small_model_path()
    new, repeats = 5, 2
    out = llamacpp.measure(gguf, [28120, 260, 5896, 282], new, threads=1, repeats=repeats, extra_buffers=extra)
    if out["status"] != "ok" and extra and "died of" in out.get("reason", ""):
        # an AMX VM: the default measure() retries without them (the test above); say what this CPU did
        pytest.skip(f"this CPU cannot run llama.cpp's extra buffer types: {out['reason']}")
    assert out["status"] == "ok", out
    assert out["extra_buffers"] is extra and ("use_extra_bufts=False" in out["code_path"]) is not extra
    assert len(out["decode_samples_ms"]) == repeats * (new - 1) and len(out["ttft_samples_ms"]) == repeats
    assert out["decode_samples_ms"] and min(out["decode_samples_ms"]) > 0 and out["decode_p10_ms"] <= out["decode_p90_ms"]

    model, tokenizer = model_files.tiny_llama(seed=0)
    rung = generation.measure_generation(model, tokenizer, ["a b c d"], new, torch.device("cpu"), repeats=repeats)
    shared = {k for k in rung if k.startswith(("ttft", "decode"))} - {"decode_steps_per_generate"}
    assert shared <= set(out), sorted(shared - set(out))  # every decode / TTFT figure a rung has
    assert len(rung["decode_samples_ms"]) == len(out["decode_samples_ms"])

    # the ladder's reference reads the bytes of the GGUF that was timed, here not the embedded one
    refs = ladder.References(None, llamacpp_on=True, device="cpu", model=str(gguf), prompt_ids=[1, 2, 3, 4],
                             new_tokens=new, repeats=repeats, bandwidth_gbps=10.0)
    refs.llama_runs = [out]
    row = refs.llama()
    assert row["bytes_per_step"] == llamacpp.bytes_per_step(gguf, 4 + new // 2)["bytes_per_step"]
    assert row["bytes_per_step"] != llamacpp.bytes_per_step(model_files.locate_embedded_gguf(), 4 + new // 2)["bytes_per_step"]
