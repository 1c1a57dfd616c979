"""Chapter 06's template, rendered from the chapter's real quick run (``tests/fixtures/runs``) and
from variants of it (a tied best rung, no gain, llama.cpp missing, a graph rung, a 16-bit working
dtype, an INT8 rung inside the noise): every number a recorded figure, the headline the table's ratio."""
from __future__ import annotations

import copy
import json
import re
from pathlib import Path

import pytest

from helpers import prose

CHAPTER = "06_optimization_ladder"
FIXTURE = Path(__file__).parent / "fixtures" / "runs" / "cpu-quick" / CHAPTER / "results.json"
MARK = re.compile(f"{prose.AUDIT_OPEN}([^=]*)=([^{prose.AUDIT_CLOSE}]*){prose.AUDIT_CLOSE}")


def _results():
    return json.loads(FIXTURE.read_text(encoding="utf-8"))


def _tied(r):
    r["metrics"]["ladder_best_batch1_speedup"].update(decision="best, tied", tied=["+ INT8"])


def _no_gain(r):
    r["metrics"]["ladder_best_batch1_speedup"].update(decision="no gain beyond the noise", tied=["+ INT8"])


def _no_llamacpp(r):
    for key in ("llamacpp_ttft_ms", "ladder_best_batch1_vs_llamacpp"):
        r["metrics"].pop(key, None)
    r["metrics"]["llamacpp_decode_tok_s"] = {"value": None, "unit": "tok/s", "status": "unavailable",
                                             "reason": "llama-cpp-python is not installed"}


def _graph(r):
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
        value=0.4, low=0.38, high=0.42, blocker="matmul kernels", step_ms=50.0, target_ms=40.0, matmul_ms=42.0,
        attention_ms=2.0, other_ms=3.0, framework_ms=3.0)


def _nothing_quantized(r):
    r["tables"]["weight_formats"] = []
    r["metrics"].pop("int4_top1_agreement", None)
    r["metrics"]["mindspeed_script_wall_s"] = {"value": 312.0, "unit": "s", "returncode": 0}


def _kept_dense(r):
    r["tables"]["weight_formats"][0]["kept_dense"] = \
        "lm_head (N=128256 > 65535, the limit of npu_weight_quant_batchmatmul)"


VARIANTS = {"as run": lambda r: None, "kept dense": _kept_dense, "tied": _tied, "no gain": _no_gain, "no llama.cpp": _no_llamacpp,
            "graph": _graph, "16-bit": _sixteen_bit, "int8 in the noise": _int8_in_the_noise,
            "blocked": _blocked, "nothing quantized": _nothing_quantized}


@pytest.mark.parametrize("lang", prose.LANGUAGES)
@pytest.mark.parametrize("variant", VARIANTS)
def test_every_block_renders_from_each_variant_with_only_recorded_numbers(variant, lang):
    results = _results()
    VARIANTS[variant](results)
    words = prose.words(lang)
    for block in prose.blocks(CHAPTER, lang):
        text = prose.render(CHAPTER, block, results, lang=lang, audit=True)
        assert text.strip(), (variant, block)
        outside = MARK.sub("", text)
        assert not re.search(r"(?<![\w.-])\d+\.\d+", outside), (variant, block, outside)
        if block == "ladder":
            decision = results["metrics"]["ladder_best_batch1_speedup"]["decision"]
            assert words[decision] in outside, (variant, lang, decision)
        if block == "formats" and variant == "kept dense":
            assert "lm_head (N=128256 > 65535, the limit of npu_weight_quant_batchmatmul)" in text
        if block == "references" and variant == "no llama.cpp":
            assert "llama-cpp-python is not installed" in text


def test_the_headline_is_the_table_s_own_ratio():
    results = _results()
    best = results["metrics"]["ladder_best_batch1_speedup"]
    row = next(r for r in results["tables"]["ladder"] if r["rung"] == best["rung"])
    assert best["value"] == pytest.approx(row["speedup"])
    assert (best["low"], best["high"]) == pytest.approx((row["speedup_low"], row["speedup_high"]))
    text = prose.render(CHAPTER, "ladder", results, audit=True)
    assert "06_optimization_ladder.ladder_best_batch1_speedup.value=" in text
    assert f"={prose.format_number(row['speedup'])}x" in text  # the number shown is the table's


def test_the_exercises_name_graph_mode_as_this_run_had_it():
    off = prose.render(CHAPTER, "exercises", _results())
    assert "graph mode did not run here" in off and "was off" in off
    results = _results()
    _graph(results)
    on = prose.render(CHAPTER, "exercises", results)
    assert "the graph rung built its graphs in 41.5 s" in " ".join(on.split()) and "did not run" not in on
