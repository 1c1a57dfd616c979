"""Variants of the chapters' recorded quick runs (``tests/fixtures/runs/cpu-quick``) for the page
renders of ``tests/test_prose.py``: each changes what a branch of a chapter's template depends on
(another dtype or device, a decision that goes the other way, a figure that is missing), so every
message of a template is rendered at least once, in every language. They are test data, not
measurements: every number in them is either the quick run's or stated here.

``VARIANTS[(chapter, name)]`` builds the variant's ``results.json`` (a fresh copy per call).
"""
from __future__ import annotations

import copy
import importlib.util
import json
from pathlib import Path

RUNS = Path(__file__).parent / "fixtures" / "runs"


def quick(chapter: str) -> dict:
    """The chapter's recorded quick run (a fresh copy)."""
    return json.loads((RUNS / "cpu-quick" / chapter / "results.json").read_text(encoding="utf-8"))


# --- 00_environment_check: the dtype choice's every branch, an NPU -----------------------------------

# the one builder of synthetic probe rows lives with the fixtures it also makes
_spec = importlib.util.spec_from_file_location("_make_fixture_runs", RUNS.parent / "make_fixture_runs.py")
_fixture_runs = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(_fixture_runs)
probe_row = _fixture_runs.probe_row


def _with_rows(rows) -> dict:
    """Chapter 00's run with ``choose_dtype``'s decision on ``rows``, recorded the way the chapter does."""
    from helpers import dtype_choice, environment_study

    r = quick("00_environment_check")
    chosen, decision = dtype_choice.pick_cpu_dtype(rows)
    flips = dtype_choice.flip_lengths(rows) if decision != "no_16bit_usable" else {}
    c = r["metrics"]["dtype_choice"]
    c.update(value=chosen, decision=decision, rows=rows, reason=dtype_choice._reason(decision, rows, chosen, flips),
             request_prompt_tokens=dtype_choice.REQUEST_PROMPT_TOKENS, request_new_tokens=dtype_choice.REQUEST_NEW_TOKENS,
             flip_horizon_tokens=dtype_choice.FLIP_HORIZON_TOKENS, pick_margin_pct=dtype_choice.PICK_MARGIN_PCT)
    c.update({k: flips.get(k) for k in ("flip_longer_tokens", "flip_longer_dtype", "flip_shorter_tokens",
                                        "flip_shorter_dtype")})
    table = environment_study.dtype_probe_table(rows)
    r["tables"]["dtype_probe"] = json.loads(table.to_json(orient="records"))
    r["device_choice"]["dtype"] = chosen
    for key in ("model", "smoke_generation", "model_load_s", "decode_ceiling_tok_s"):
        r["metrics"][key]["dtype"] = chosen
    return r


def counted(results, n=5):
    """Chapter 00's probe rows with a recorded sample count (the fixture was made before rows recorded one)."""
    results = copy.deepcopy(results)
    for row in results["tables"]["dtype_probe"]:
        row["n_samples"] = n
    return results


def float32_tie():
    return _with_rows([probe_row("float32", 50, 100, 300, spread=3), probe_row("bfloat16", 49, 100, 300, spread=3),
                       probe_row("float16", 80, 100, 300)])


def float32_16bit_slower():
    return _with_rows([probe_row("float32", 50, 100, 300), probe_row("bfloat16", 60, 120, 350),
                       probe_row("float16", 55, 200, 900)])


def float16_until_a_longer_prompt():
    """float16's fast decode wins the standard request; its steep prefill loses from a longer prompt."""
    return _with_rows([probe_row("float32", 50, 100, 300), probe_row("bfloat16", 35, 60, 180),
                       probe_row("float16", 20, 100, 400)])


def no_16bit():
    return _with_rows([probe_row("float32", 50, 100, 300),
                       {"dtype": "bfloat16", "problem": "RuntimeError: not implemented"},
                       {"dtype": "float16", "problem": "differs from the reference"}])


def dtype_parameter():
    r = float32_16bit_slower()
    r["metrics"].pop("dtype_choice")
    r["tables"].pop("dtype_probe")
    r["parameters"]["dtype"] = "float32"
    return r


def npu_00(noisy=True):
    r = quick("00_environment_check")
    for entry in r["metrics"].values():
        if "dtype" in entry:
            entry["dtype"] = "float16"
        if "device" in entry:
            entry["device"] = "npu:0"
    r["metrics"]["dtype_choice"].update(value="float16", rows=[], decision="",
                                        reason="float16: the guides' inference dtype and native on npu")
    r["tables"]["dtype_probe"] = []
    r["device_choice"]["dtype"] = "float16"
    r["environment"].update(device="npu:0", npu_smi_info="+----- npu-smi 23.0.0 -----+", torch_npu="2.1.0.post10")
    r["metrics"]["torch_npu_line"].update(value="torch_npu 2.1.0.post10 (torch 2.1.0, CANN 8.0.0 in the table)",
                                          lacks=["torch_npu.npu_swiglu", "torchair mode"])
    r["metrics"]["torch_npu_pairing"].update(value="torch and torch_npu versions pair (2.1.0)", ok=True,
                                             advice="")
    r["metrics"]["memory_bandwidth_gbps"]["noisy"] = noisy
    return r


def npu_00_line_complete():
    r = npu_00(noisy=False)
    r["metrics"]["torch_npu_line"]["lacks"] = []
    r["metrics"]["torch_npu_pairing"]["advice"] = "upgrade CANN"
    return r


# --- 02_ffn_fusion: a ratio inside its noise, a clear one, no graph mode, a float32 run -----------------

def _merged(ratio, low, high):
    r = quick("02_ffn_fusion")
    r["metrics"]["ffn_merged_speedup_decode"].update(value=ratio, low=low, high=high)
    return r


def ffn_precision(diff):
    r = quick("02_ffn_fusion")
    r["metrics"]["ffn_fused_max_abs_diff"]["value"] = diff
    return r


def ffn_as_float32():
    """The same run as if its working dtype were float32 (a CPU without bf16)."""
    r = quick("02_ffn_fusion")
    for entry in r["metrics"].values():
        if entry.get("dtype") == "bfloat16":
            entry["dtype"] = "float32"
    r["device_choice"]["dtype"] = "float32"
    return r


def ffn_without_graph_mode():
    r = quick("02_ffn_fusion")
    r["parameters"]["compile_ops"] = False
    del r["metrics"]["residual_norm_graph_speedup"]
    r["tables"]["residual_norm_graph"] = []
    r["tables"]["ffn_variants"] = [v for v in r["tables"]["ffn_variants"] if v["variant"] in ("unfused", "merged")]
    return r


# --- 04_batching: a float32 run, an NPU at batch 8, a failed batch 1, broken padding ------------------

def _set_dtype(results: dict, dtype: str, device: str) -> None:
    for entry in results["metrics"].values():
        if "dtype" in entry:
            entry["dtype"] = dtype
        if "device" in entry:
            entry["device"] = device
    for row in results["tables"]["batch_sweep"]:
        row.update(dtype=dtype, device=device)
    results["device_choice"]["dtype"] = dtype


def batching_float32():
    r = quick("04_batching")
    _set_dtype(r, "float32", "cpu")
    r["metrics"].pop("batched_outputs_match_float32", None)
    r["metrics"]["batched_outputs_match"].update(value=True, first_difference=None, differing=0)
    return r


def batching_npu_batch8():
    """fp16 on an NPU, batch 8 measured, padding differs in fp16 but not in float32, the memory
    growth the same at every batch size, decode at the bandwidth."""
    r = quick("04_batching")
    _set_dtype(r, "float16", "npu:0")
    m, t = r["metrics"], r["tables"]
    m["batched_outputs_match"].update(value=False, first_difference=3, differing=1)
    m["batched_outputs_match_float32"] = {"value": True, "unit": "", "dtype": "float32", "device": "npu:0",
                                          "shape": m["batched_outputs_match"]["shape"], "code_path": "test"}
    last = copy.deepcopy(t["batch_ratios"][-1])
    last.update(batch=8, guide_throughput=5.8, guide_memory_pct=30.0, guide_latency_pct=45.0,
                memory_growth_change="no change beyond the noise")
    t["batch_ratios"].append(last)
    for row in t["batch_ratios"]:
        row["memory_growth_mib"] = 100.0
    t["batch_sweep"].append(dict(t["batch_sweep"][-1], point=8, batch_size=8))
    m["batch_decode_gbps_max"]["value"] = 0.9 * m["reference_bandwidth_gbps"]["value"]
    return r


def batching_batch1_failed():
    r = batching_float32()
    r["tables"]["batch_ratios"] = []
    r["tables"]["batch_sweep"][0].update(status="oom", error="OutOfMemoryError: out of memory")
    r["metrics"].pop("batch_decode_gbps_max", None)
    return r


def batching_padding_broken():
    r = quick("04_batching")
    m = r["metrics"]
    m["batched_outputs_match"].update(value=False, first_difference=0, differing=2)
    m["batched_outputs_match_float32"] = dict(m["batched_outputs_match"], dtype="float32", value=False)
    return r


# --- 06_optimization_ladder: a tied and a gainless best rung, no llama.cpp, a graph rung, ... ---------

def _ladder(change):
    def make():
        r = quick("06_optimization_ladder")
        change(r)
        return r
    return make


def _tied(r):
    r["metrics"]["ladder_best_batch1_speedup"].update(decision="best, tied", tied=["+ INT8"])


def _no_gain(r):
    r["metrics"]["ladder_best_batch1_speedup"].update(decision="no gain beyond the noise", tied=["+ INT8"])


def _no_llamacpp(r):
    for key in ("llamacpp_ttft_ms", "ladder_best_batch1_vs_llamacpp"):
        r["metrics"].pop(key, None)
    r["metrics"]["llamacpp_decode_tok_s"] = {"value": None, "unit": "tok/s", "status": "unavailable",
                                             "reason": "llama-cpp-python is not installed"}


def ladder_graph_rung(r):
    row = next(x for x in r["tables"]["ladder"] if x["rung"] == "+ graph mode")
    row.update(status="ok", compiled_graphs=2, compile_s=41.5, latency_ms=900.0, error="")
    r["parameters"]["graph_mode"] = True


def _sixteen_bit(r):
    m = r["metrics"]
    m["float32_vs_native_rung"].update(value=1.6, low=1.5, high=1.7, dtype="bfloat16")
    m["float32_vs_best_rung"] = {**m["float32_vs_native_rung"], "value": 3.1, "rung": "+ INT4 g32"}


def _int8_in_the_noise(r):
    r["metrics"]["int8_rung_step"].update(value=1.01, low=0.95, high=1.07, kernel="int8pack", kernel_ms=8.6,
                                          dense="dense bfloat16", dense_ms=9.0, saving_ms=0.4)


def _blocked(r):
    r["metrics"]["ladder_best_batch1_vs_llamacpp"].update(
        value=0.4, low=0.38, high=0.42, decision="not met", blocker="matmul kernels", step_ms=50.0,
        target_ms=40.0, matmul_ms=42.0,
        attention_ms=2.0, other_ms=3.0, framework_ms=3.0)


def _nothing_quantized(r):
    r["tables"]["weight_formats"] = []
    r["metrics"].pop("int4_top1_agreement", None)
    r["metrics"]["mindspeed_script_wall_s"] = {"value": 312.0, "unit": "s", "returncode": 0}


KEPT_DENSE = "lm_head (N=128256 > 65535, the limit of npu_weight_quant_batchmatmul)"


def _kept_dense(r):
    r["tables"]["weight_formats"][0]["kept_dense"] = KEPT_DENSE


# --- 07_serving: the recorded quick run relabelled as another device class and dtype ---------------

def serving_relabelled(device: str, dtype: str):
    def make():
        r = quick("07_serving")
        r["device_choice"].update(device=device, dtype=dtype)
        for entry in r["metrics"].values():
            entry.update(device=device, dtype=dtype)
        for name in ("comparison", "our_path", "matched", "sweep"):
            for row in r["tables"].get(name, []):
                row.update({k: dtype for k in ("dtype",) if k in row})
        return r
    return make


VARIANTS = {
    ("00_environment_check", "float32 kept, spreads overlap"): float32_tie,
    ("00_environment_check", "float32 kept, 16-bit slower"): float32_16bit_slower,
    ("00_environment_check", "no 16-bit dtype runs"): no_16bit,
    ("00_environment_check", "float16 until a longer prompt"): float16_until_a_longer_prompt,
    ("00_environment_check", "dtype set by the parameter"): dtype_parameter,
    ("00_environment_check", "counted bf16 cpu"): lambda: counted(quick("00_environment_check")),
    ("00_environment_check", "counted float32 kept, spreads overlap"): lambda: counted(float32_tie()),
    ("00_environment_check", "counted float32 kept, 16-bit slower"): lambda: counted(float32_16bit_slower()),
    ("00_environment_check", "npu float16"): npu_00,
    ("00_environment_check", "npu line complete"): npu_00_line_complete,
    ("02_ffn_fusion", "merged inside its noise"): lambda: _merged(1.05, 0.91, 1.23),
    ("02_ffn_fusion", "merged beyond its noise"): lambda: _merged(1.4, 1.2, 1.6),
    ("02_ffn_fusion", "precision bound missed"): lambda: ffn_precision(5e-3),
    ("02_ffn_fusion", "precision bound met"): lambda: ffn_precision(5e-4),
    ("02_ffn_fusion", "float32"): ffn_as_float32,
    ("02_ffn_fusion", "no graph mode"): ffn_without_graph_mode,
    ("04_batching", "float32-cpu"): batching_float32,
    ("04_batching", "npu-batch8"): batching_npu_batch8,
    ("04_batching", "batch1-failed"): batching_batch1_failed,
    ("04_batching", "padding-broken"): batching_padding_broken,
    ("06_optimization_ladder", "kept dense"): _ladder(_kept_dense),
    ("06_optimization_ladder", "tied"): _ladder(_tied),
    ("06_optimization_ladder", "no gain"): _ladder(_no_gain),
    ("06_optimization_ladder", "no llama.cpp"): _ladder(_no_llamacpp),
    ("06_optimization_ladder", "graph"): _ladder(ladder_graph_rung),
    ("06_optimization_ladder", "16-bit"): _ladder(_sixteen_bit),
    ("06_optimization_ladder", "int8 in the noise"): _ladder(_int8_in_the_noise),
    ("06_optimization_ladder", "blocked"): _ladder(_blocked),
    ("06_optimization_ladder", "nothing quantized"): _ladder(_nothing_quantized),
    ("07_serving", "relabelled npu:0 float16"): serving_relabelled("npu:0", "float16"),
    ("07_serving", "relabelled cuda:0 float32"): serving_relabelled("cuda:0", "float32"),
}
