"""Chapter 04's template, rendered from a real quick run and from variants of it for other devices.

The fixture is the ``results.json`` of a quick-profile run of ``04_batching`` on a CPU (per-sample
lists stripped). The variants change what a branch of the template depends on (a float32 run, an
NPU run with batch 8 and a memory growth that does not move, a run whose batch 1 failed, broken
padding), so every sentence is rendered at least once. In audit mode each figure is marked with
its source; the checks below hold for every block of every variant.
"""
from __future__ import annotations

import copy
import json
import re
from pathlib import Path

import nbformat
import pytest

from helpers import prose

REPO = Path(__file__).resolve().parent.parent
CHAPTER = "04_batching"
FIXTURE = REPO / "tests" / "fixtures" / "runs" / "cpu-quick" / CHAPTER / "results.json"
TEMPLATE = REPO / "helpers" / "templates" / f"{CHAPTER}.en.md.j2"
MARK = re.compile(f"{prose.AUDIT_OPEN}([^=]+)=([^{prose.AUDIT_CLOSE}]*){prose.AUDIT_CLOSE}")
DTYPE_WORDS = re.compile(r"\b(fp16|bf16|fp32|float16|bfloat16|float32|half precision)\b|16-bit", re.I)
DIRECTION_WORDS = re.compile(
    r"\b(faster|slower|quicker|best|worst|grows|grew|shrinks|shrank|nearly free|memory-bound|"
    r"compute-bound|bandwidth-bound|same effect|beyond the noise|within the noise|improves?|"
    r"speeds? up|slows? down|better|worse|larger|smaller|higher|lower|increases|decreases)\b", re.I)


def _fixture() -> dict:
    return json.loads(FIXTURE.read_text(encoding="utf-8"))


def _set_dtype(results: dict, dtype: str, device: str) -> None:
    for entry in results["metrics"].values():
        if "dtype" in entry:
            entry["dtype"] = dtype
        if "device" in entry:
            entry["device"] = device
    for row in results["tables"]["batch_sweep"]:
        row.update(dtype=dtype, device=device)


def _float32_cpu() -> dict:
    r = _fixture()
    _set_dtype(r, "float32", "cpu")
    r["metrics"].pop("batched_outputs_match_float32", None)
    r["metrics"]["batched_outputs_match"].update(value=True, first_difference=None, differing=0)
    return r


def _npu_batch8_flat_memory() -> dict:
    """fp16 on an NPU, batch 8 measured, padding differs in fp16 but not in float32, the memory
    growth the same at every batch size, decode at the bandwidth."""
    r = _fixture()
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
    sweep8 = dict(t["batch_sweep"][-1], point=8, batch_size=8)
    t["batch_sweep"].append(sweep8)
    m["batch_decode_gbps_max"]["value"] = 0.9 * m["reference_bandwidth_gbps"]["value"]
    return r


def _batch1_failed() -> dict:
    r = _float32_cpu()
    r["tables"]["batch_ratios"] = []
    r["tables"]["batch_sweep"][0].update(status="oom", error="OutOfMemoryError: out of memory")
    r["metrics"].pop("batch_decode_gbps_max", None)
    return r


def _padding_broken() -> dict:
    r = _fixture()
    m = r["metrics"]
    m["batched_outputs_match"].update(value=False, first_difference=0, differing=2)
    m["batched_outputs_match_float32"] = dict(m["batched_outputs_match"], dtype="float32", value=False)
    return r


VARIANTS = {"cpu-quick": _fixture, "float32-cpu": _float32_cpu, "npu-batch8": _npu_batch8_flat_memory,
            "batch1-failed": _batch1_failed, "padding-broken": _padding_broken}


def _resolve(results: dict, source: str):
    """The recorded value a mark names: ``04_batching.key.field`` or ``04_batching.table[i].col``."""
    path = source.split(".", 1)[1]
    head, _, rest = path.partition(".")
    found = re.fullmatch(r"(\w+)\[(\d+)\]", head)
    node = results["tables"][found.group(1)][int(found.group(2))] if found else results["metrics"][head]
    for part in rest.split(".") if rest else []:
        node = node[part]
    return node["value"] if isinstance(node, dict) and "value" in node else node


@pytest.fixture(scope="module")
def source() -> str:
    return TEMPLATE.read_text(encoding="utf-8")


def test_the_fixture_is_a_real_quick_run_without_samples():
    r = _fixture()
    assert r["chapter"] == CHAPTER and r["status"] == "ok" and r["parameters"]["profile"] == "quick"
    assert not [k for row in r["tables"]["batch_sweep"] for k in row if k.endswith("samples_ms")]
    assert set(prose.blocks(CHAPTER)) == {"padding", "ratios", "memory", "llama2_kv", "summary", "exercises"}


def test_the_template_spells_no_direction_or_dtype_word(source):
    # the prose of the template: its comment (which names the rules) and its tags, where a decision is
    # compared with its key ({% if change == "grows" %}), left out
    text = re.sub(r"\{#.*?#\}|\{%.*?%\}|\{\{.*?\}\}", "", source, flags=re.S)
    assert not DTYPE_WORDS.findall(text)
    assert not DIRECTION_WORDS.findall(text)


@pytest.mark.parametrize("variant", VARIANTS)
@pytest.mark.parametrize("block", ["padding", "ratios", "memory", "llama2_kv", "summary", "exercises"])
def test_every_block_states_only_recorded_numbers_and_decided_directions(variant, block, source):
    results = VARIANTS[variant]()
    text = prose.render(CHAPTER, block, results, audit=True)
    assert text, f"{block} rendered nothing for {variant}"
    for where, shown in MARK.findall(text):
        if where.startswith(f"{CHAPTER}.") and "*" not in where:
            value = _resolve(results, where)
            assert shown.startswith(prose.format_number(value)), (where, shown, value)
    outside = MARK.sub("", text)
    for phrase in sorted(prose.words().values(), key=len, reverse=True):
        outside = outside.replace(phrase, "")  # the phrase of a decision, shown with | say
    stray = [n for n in re.findall(r"\d+(?:\.\d+)?", outside) if n not in source]
    assert not stray, f"{variant}/{block}: numbers not from a recorded figure: {stray}\n{text}"
    assert not DTYPE_WORDS.findall(outside), f"{variant}/{block}: a dtype word not from the run"
    assert not DIRECTION_WORDS.findall(outside), f"{variant}/{block}: a direction word not from a decision"


def test_the_branches_say_what_their_data_shows():
    plain = {name: {b: " ".join(prose.render(CHAPTER, b, make()).split()) for b in prose.blocks(CHAPTER)}
             for name, make in VARIANTS.items()}
    assert "equal the ones each prompt gives alone" in plain["float32-cpu"]["padding"]
    run_blocks = " ".join(v for k, v in plain["float32-cpu"].items() if k != "llama2_kv")
    assert "float32" in run_blocks and "float16" not in run_blocks  # nor bfloat16
    assert "in float16)" in plain["float32-cpu"]["llama2_kv"]  # Llama-2-7B's dtype, named as such
    npu = plain["npu-batch8"]
    assert "In float32 they match" in npu["padding"] and "in float16 that moves a logit" in npu["padding"]
    assert "does not show the batch on this device" in npu["memory"]
    assert "at the bandwidth" in npu["memory"] and "**Batch 8:**" in npu["summary"]
    assert "The guide's claim for Llama-2-7B on a 910B is 5.80x" in npu["ratios"]
    assert "no usable decode figure" in plain["batch1-failed"]["ratios"]
    assert "**Batch 1** did not complete: oom" in plain["batch1-failed"]["summary"]
    assert "they differ too, so the padding is broken" in plain["padding-broken"]["padding"]
