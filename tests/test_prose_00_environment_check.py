"""Chapter 00's template, rendered from a real quick run and from variants of it for other outcomes.

The fixture is the ``results.json`` of a quick-profile run of ``00_environment_check`` on a CPU
whose ``dtype=auto`` chose bfloat16; its ``dtype=auto`` record is in the probe's current format with
synthetic rows (``make_fixture_runs.py --synthetic-dtype-choice``, its ``note`` says so). The
variants change what a branch of the template depends on: float32 kept because the spreads
overlap, float32 kept because the 16-bit dtypes are slower, no 16-bit dtype that runs, float16
picked with a flip to bfloat16 at a longer prompt, a dtype set by the parameter, an NPU (float16
without timing, a torch_npu line that lacks ops) and a noisy bandwidth. In audit mode every figure
is marked with its source; the checks hold for every block of every variant, in both languages.
"""
from __future__ import annotations

import importlib.util

import json
import re
from pathlib import Path

import pytest

from helpers import decide, dtype_choice, environment_study, prose

REPO = Path(__file__).resolve().parent.parent
CHAPTER = "00_environment_check"
FIXTURE = REPO / "tests" / "fixtures" / "runs" / "cpu-quick" / CHAPTER / "results.json"
MARK = re.compile(f"{prose.AUDIT_OPEN}([^=]+)=([^{prose.AUDIT_CLOSE}]*){prose.AUDIT_CLOSE}")
DTYPE_WORDS = re.compile(r"\b(fp16|bf16|fp32|float16|bfloat16|float32|half precision)\b|16-bit", re.I)
LANGS = [lang for lang in prose.LANGUAGES if (prose.TEMPLATES / prose.template_name(CHAPTER, lang)).exists()]


def _fixture() -> dict:
    return json.loads(FIXTURE.read_text(encoding="utf-8"))


# the one builder of synthetic probe rows lives with the fixtures it also makes
_spec = importlib.util.spec_from_file_location(
    "_make_fixture_runs", Path(__file__).parent / "fixtures" / "make_fixture_runs.py")
_fixture_runs = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(_fixture_runs)
_row = _fixture_runs.probe_row


def _with_rows(rows) -> dict:
    """The fixture with ``choose_dtype``'s decision on ``rows``, recorded the way the chapter does."""
    r = _fixture()
    chosen, decision = dtype_choice.pick_cpu_dtype(rows)
    flips = dtype_choice.flip_lengths(rows) if decision != "no_16bit_usable" else {}
    c = r["metrics"]["dtype_choice"]
    c.update(value=chosen, decision=decision, rows=rows, reason=dtype_choice._reason(decision, rows, chosen, flips),
             request_prompt_tokens=dtype_choice.REQUEST_PROMPT_TOKENS, request_new_tokens=dtype_choice.REQUEST_NEW_TOKENS,
             flip_horizon_tokens=dtype_choice.FLIP_HORIZON_TOKENS)
    c.update({k: flips.get(k) for k in ("flip_longer_tokens", "flip_longer_dtype", "flip_shorter_tokens",
                                        "flip_shorter_dtype")})
    table = environment_study.dtype_probe_table(rows)
    r["tables"]["dtype_probe"] = json.loads(table.to_json(orient="records"))
    r["device_choice"]["dtype"] = chosen
    for key in ("model", "smoke_generation", "model_load_s", "decode_ceiling_tok_s"):
        r["metrics"][key]["dtype"] = chosen
    return r


def _float32_tie():
    return _with_rows([_row("float32", 50, 100, 300, spread=3), _row("bfloat16", 49, 100, 300, spread=3),
                       _row("float16", 80, 100, 300)])


def _float32_16bit_slower():
    return _with_rows([_row("float32", 50, 100, 300), _row("bfloat16", 60, 120, 350),
                       _row("float16", 55, 200, 900)])


def _float16_until_a_longer_prompt():
    """float16's fast decode wins the standard request; its steep prefill loses from a longer prompt."""
    return _with_rows([_row("float32", 50, 100, 300), _row("bfloat16", 45, 90, 280),
                       _row("float16", 30, 100, 400)])


def _no_16bit():
    return _with_rows([_row("float32", 50, 100, 300),
                       {"dtype": "bfloat16", "problem": "RuntimeError: not implemented"},
                       {"dtype": "float16", "problem": "differs from the reference"}])


def _dtype_parameter():
    r = _float32_16bit_slower()
    r["metrics"].pop("dtype_choice")
    r["tables"].pop("dtype_probe")
    r["parameters"]["dtype"] = "float32"
    return r


def _npu():
    r = _fixture()
    for entry in r["metrics"].values():
        if "dtype" in entry:
            entry["dtype"] = "float16"
        if "device" in entry:
            entry["device"] = "npu:0"
    r["metrics"]["dtype_choice"].update(value="float16", rows=[], decision="",
                                        reason="float16: the guides' inference dtype and native on npu")
    r["tables"]["dtype_probe"] = []
    r["device_choice"]["dtype"] = "float16"
    r["environment"].update(device="npu:0", npu_smi_info="+----- npu-smi 23.0.0 -----+")
    r["metrics"]["torch_npu_line"].update(value="torch_npu 2.1.0.post10 (torch 2.1.0, CANN 8.0.0 in the table)",
                                          lacks=["torch_npu.npu_swiglu", "torchair mode"])
    r["metrics"]["torch_npu_pairing"].update(value="torch and torch_npu versions pair (2.1.0)", ok=True,
                                             advice="")
    r["metrics"]["memory_bandwidth_gbps"]["noisy"] = True
    return r


VARIANTS = {"bf16 cpu (fixture)": _fixture, "float32 kept, spreads overlap": _float32_tie,
            "float32 kept, 16-bit slower": _float32_16bit_slower, "no 16-bit dtype runs": _no_16bit,
            "float16 until a longer prompt": _float16_until_a_longer_prompt,
            "dtype set by the parameter": _dtype_parameter, "npu float16": _npu}


def _render(results: dict, lang: str, audit: bool = True) -> dict:
    return {b: prose.render(CHAPTER, b, results, lang=lang, audit=audit) for b in prose.blocks(CHAPTER, lang)}


def test_the_fixture_is_a_real_quick_run_with_the_records_later_chapters_read():
    r = _fixture()
    assert r["chapter"] == CHAPTER and r["status"] == "ok" and r["parameters"]["profile"] == "quick"
    choice = r["metrics"]["dtype_choice"]
    for field in ("reason", "decision", "rows", "shapes_source", "cpu_capability", "threads",
                  "request_prompt_tokens", "request_new_tokens", "flip_longer_tokens", "flip_horizon_tokens"):
        assert field in choice, field
    for row in choice["rows"]:
        assert {"decode_ms", "prefill_short_ms", "prefill_long_ms", "request_ms", "timed_layers"} <= set(row)
    assert {"value", "p10", "p90", "noisy"} <= set(r["metrics"]["memory_bandwidth_gbps"])
    assert "_samples_ms" not in FIXTURE.read_text(encoding="utf-8")


@pytest.mark.parametrize("lang", LANGS)
@pytest.mark.parametrize("variant", VARIANTS)
def test_every_block_states_only_recorded_numbers_and_the_runs_dtypes(variant, lang):
    results = VARIANTS[variant]()
    text = "\n".join(_render(results, lang).values())
    outside = MARK.sub("", text)
    source = (prose.TEMPLATES / prose.template_name(CHAPTER, lang)).read_text(encoding="utf-8")
    literal = re.sub(r"\{#.*?#\}|\{\{.*?\}\}|\{%.*?%\}", " ", source, flags=re.S)
    fixed = set(re.findall(r"\d+(?:\.\d+)?", literal))  # the exercises' own numbers, "batch-1"
    stray = [n for n in re.findall(r"\d+(?:\.\d+)?", outside) if n not in fixed]
    assert not stray, f"{variant}: numbers that are no recorded figure: {stray}"
    run_dtypes = {str(results["device_choice"]["dtype"])}
    for word in DTYPE_WORDS.findall(outside):
        assert not word or word in run_dtypes, f"{variant}: says {word!r} outside the records"


def _counted(results, n=5):
    """The probe rows with a recorded sample count (the fixtures were made before rows recorded one)."""
    import copy

    results = copy.deepcopy(results)
    for row in results["tables"]["dtype_probe"]:
        row["n_samples"] = n
    return results


@pytest.mark.parametrize("lang", LANGS)
def test_the_dtype_sentence_follows_the_decision_both_ways(lang):
    say = prose.words(lang)
    bf16 = prose.render(CHAPTER, "dtype", _counted(_fixture()), lang=lang)
    assert "**bfloat16**" in bf16 and say[decide.FASTER] in bf16
    # without a recorded count (the fixture as it was recorded) no direction is said
    uncounted = prose.render(CHAPTER, "dtype", _fixture(), lang=lang)
    assert say[decide.FASTER] not in uncounted
    assert say["too few samples, not recorded"].format(need=decide.MIN_SAMPLES) in uncounted
    tie = prose.render(CHAPTER, "dtype", _counted(_float32_tie()), lang=lang)
    assert "**float32**" in tie and say[decide.SAME] in tie and say[decide.FASTER] not in tie
    slower = prose.render(CHAPTER, "dtype", _counted(_float32_16bit_slower()), lang=lang)
    assert "**float32**" in slower and say[decide.SLOWER] in slower and say[decide.FASTER] not in slower
    none = prose.render(CHAPTER, "dtype", _no_16bit(), lang=lang)
    assert "RuntimeError: not implemented" in none and say[decide.SAME] not in none
    assert "`float32`" in prose.render(CHAPTER, "dtype", _dtype_parameter(), lang=lang)
    flip = prose.render(CHAPTER, "dtype", _float16_until_a_longer_prompt(), lang=lang)
    assert "**float16**" in flip and "797" in flip and "**bfloat16**" in flip
    assert "797" not in slower and f"{dtype_choice.FLIP_HORIZON_TOKENS:,}" in slower
    assert "**float16**" in prose.render(CHAPTER, "dtype", _npu(), lang=lang)


@pytest.mark.parametrize("lang", LANGS)
def test_the_npu_branches_render_what_was_recorded(lang):
    blocks = _render(_npu(), lang, audit=False)
    assert "npu-smi 23.0.0" in blocks["npu_smi"]
    assert "`torch_npu.npu_swiglu`" in blocks["npu_line"] and "`torchair mode`" in blocks["npu_line"]
    cpu = _render(_fixture(), lang, audit=False)
    assert "npu-smi 23.0.0" not in cpu["npu_smi"] and "`cpu`" in cpu["npu_smi"]
    assert blocks["bandwidth"] != _render({**_npu(), "metrics": {**_npu()["metrics"], "memory_bandwidth_gbps": {
        **_npu()["metrics"]["memory_bandwidth_gbps"], "noisy": False}}}, lang, audit=False)["bandwidth"]

