"""The claims table parses, every rule runs, and verdicts follow hand-made result folders."""
from __future__ import annotations

import pandas as pd
import pytest

from helpers import claims
from helpers.results import Results


@pytest.fixture(scope="module")
def table():
    return claims.load_claims()


LLAMA = "meta-llama/Llama-2-7b-hf"


def _chapter(run_dir, chapter, metrics=None, tables=None, status="ok", model="smollm2-135m", device=""):
    """A synthetic chapter results.json; ``device`` defaults to the first metric's device."""
    first = next(iter((metrics or {}).values()), (None, "cpu"))[1]
    res = Results(chapter, run_dir, parameters={"model": model}, environment={"device": device or first})
    for key, (value, device) in (metrics or {}).items():
        res.record(key, value, "", device=device, dtype="float32", shape="test fixture")
    for name, rows in (tables or {}).items():
        res.table(name, rows)
    if status != "running":
        res.finish(status, "" if status == "ok" else "skipped in this fixture")
    return res


def _verdict(table, run_dir, claim_id, specs_path=None):
    out = claims.verdicts(run_dir, table[table["id"] == claim_id], specs_path=specs_path)
    return out.iloc[0]


def test_every_claim_parses_and_has_a_rule(table):
    assert 60 <= len(table) <= 110
    assert table["id"].is_unique
    assert set(table["rule"]) <= set(claims.RULES)
    assert set(table["kind"]) == set(claims.KINDS)
    assert set(table["seed"]) == {"000_4306e0a898c10b2f.txt", "002_c082ff817235df57.txt"}
    for row in table.to_dict(orient="records"):
        args = claims.parse_args(row["args"])
        if row["rule"] in ("ratio", "at_least", "threshold", "weight_memory", "consistency"):
            claims.number(row["claimed_value"])
        if row["rule"] == "bound":
            low, high = claims.claimed_range(row["claimed_value"])
            assert 0 < low <= high and row["unit"] in ("ms", "tok/s")
        if "metric" in args:
            chapter, _, key = args["metric"].partition(".")
            assert chapter[:2].isdigit() and key, row["id"]


def test_empty_run_gives_every_claim_a_verdict_without_rule_errors(table, tmp_path):
    out = claims.verdicts(tmp_path, table)
    assert set(out["verdict"]) <= set(claims.VERDICTS)
    assert not out["detail"].str.contains("rule .* failed", regex=True).any()
    counts = claims.verdict_counts(out)
    assert sum(counts.values()) == len(table)
    # Decided without any measurement: bounds, the guide's own numbers, documentation, computation.
    assert counts["physically impossible"] >= 1
    assert counts["guide inconsistent"] >= 2
    assert counts["contradicted by sources"] >= 5
    assert list(counts) == list(claims.VERDICT_CLASSES)
    measured_rules = out[out["rule"].isin(["ratio", "at_least", "threshold"])]
    assert (measured_rules["verdict"] == "not measured in this run").all()


def _claim_for(table, metric):
    rows = table[table["args"].str.contains(f"metric={metric}", regex=False) & (table["rule"] == "ratio")]
    assert len(rows) == 1
    return rows.iloc[0]["id"]


def test_ratio_reproduced_and_contradicted(table, tmp_path):
    cid = _claim_for(table, "04_batching.batch_throughput_ratio_4")  # the guide: 3.2x
    good, bad = tmp_path / "good", tmp_path / "bad"
    _chapter(good, "04_batching", {"batch_throughput_ratio_4": (3.0, "npu:0")}, model=LLAMA)
    _chapter(bad, "04_batching", {"batch_throughput_ratio_4": (1.3, "npu:0")}, model=LLAMA)
    v = _verdict(table, good, cid)
    assert v["verdict"] == "reproduced" and v["evidence"] == "measured"
    assert v["ratio"] == pytest.approx(3.0 / 3.2)
    assert "npu" in v["measured_on"] and v["device_class"] == "npu" and v["decided_by"] == "good"
    assert LLAMA in v["detail"]
    assert _verdict(table, bad, cid)["verdict"] == "contradicted"


def test_absolute_tolerance_for_percentages(table, tmp_path):
    cid = _claim_for(table, "04_batching.batch_memory_growth_pct_4")  # the guide: +15 %
    _chapter(tmp_path, "04_batching", {"batch_memory_growth_pct_4": (2.0, "npu:0")}, model=LLAMA)
    v = _verdict(table, tmp_path, cid)
    assert v["verdict"] == "contradicted" and "tolerance 10" in v["detail"]


def test_impossible_claim_names_its_bound(table, tmp_path):
    row = table[table["claimed_value"] == "2500-3500"].iloc[0]
    v = _verdict(table, tmp_path, row["id"])
    assert v["verdict"] == "physically impossible"
    assert "TB/s" in v["detail"] and "1600" in v["detail"]


def _specs(path, rows):
    base = {"device": "Ascend 910B", "variant": "910B1 fictional", "memory_gb": 64, "bandwidth_gbps": 1500,
            "fp16_dense_tflops": "", "status": "unofficial", "source": "test fixture", "note": ""}
    pd.DataFrame([{**base, **r} for r in rows]).to_csv(path, index=False)
    return path


def test_bound_depends_on_the_specs_table(table, tmp_path):
    specs = _specs(tmp_path / "device_specs.csv", [{"bandwidth_gbps": 100000}])
    row = table[table["claimed_value"] == "2500-3500"].iloc[0]
    v = _verdict(table, tmp_path, row["id"], specs_path=specs)
    assert v["verdict"] == "needs an NPU to check"
    ev = claims.gather_evidence(tmp_path, specs)
    assert ev.specs[0]["fp16_dense_tflops"] is None and ev.specs_source == "device_specs.csv"
    assert ev.spec("910B1", "fp16_dense_tflops") == (None, "")  # an empty cell is no figure, never 0
    with pytest.raises(ValueError, match="specs column 'hbm_bandwidth_gbps'"):
        ev.spec("910B1", "hbm_bandwidth_gbps")
    with pytest.raises(ValueError, match="missing.csv"):  # no numbers from anywhere but the table
        claims.gather_evidence(tmp_path, tmp_path / "missing.csv")


def test_a_spec_is_the_chips_own_row_not_the_aggregate(table, tmp_path):
    specs = _specs(tmp_path / "device_specs.csv", [
        {"variant": "910B1 / 910B2", "fp16_dense_tflops": 300},
        {"variant": "all 8 chips (8 x 910B)", "memory_gb": 512, "bandwidth_gbps": 12000}])
    ev = claims.gather_evidence(tmp_path, specs)
    value, text = ev.spec("910B1", "bandwidth_gbps")
    assert value == 1500 and "device_specs.csv" in text  # not the 8-chip aggregate row
    assert ev.spec("910B1", "fp16_dense_tflops")[0] == 300
    assert ev.spec("A100", "bandwidth_gbps") == (None, "")  # absent from this table: no figure
    row = table[table["claimed_value"] == "2500-3500"].iloc[0]
    v = _verdict(table, tmp_path, row["id"], specs_path=specs)
    assert v["verdict"] == "physically impossible" and "8 x 1500" in v["detail"]


def test_npu_measurement_decides_a_bound_claim(table, tmp_path):
    row = table[(table["rule"] == "bound") & (table["claimed_value"] == "16.5")].iloc[0]
    npu, cpu = tmp_path / "npu", tmp_path / "cpu"
    _chapter(npu, "03_end_to_end", {"decode_tok_s_batch1": (16.1, "npu:0")}, model=LLAMA)
    _chapter(cpu, "03_end_to_end", {"decode_tok_s_batch1": (18.0, "cpu")})
    assert _verdict(table, npu, row["id"])["verdict"] == "reproduced"
    assert _verdict(table, cpu, row["id"])["verdict"] == "needs an NPU to check"


def test_api_verdicts_use_chapter_00_table(table, tmp_path):
    cid = table[table["args"] == "name=torch_npu.npu.rms_norm"].iloc[0]["id"]
    v = _verdict(table, tmp_path, cid)
    assert v["verdict"] == "API does not exist" and "npu_rms_norm" in v["detail"]
    assert v["evidence"] == "documentation"
    rows = [{"guide_name": "torch_npu.npu.rms_norm", "real_api": "torch_npu.npu_rms_norm",
             "documented": "does not exist", "exists_here": True}]
    _chapter(tmp_path, "00_environment_check", tables={"api_check": rows})
    v = _verdict(table, tmp_path, cid)
    assert v["verdict"] == "API exists" and v["evidence"] == "measured"


def test_failed_or_skipped_chapters_are_named(table, tmp_path):
    cid = _claim_for(table, "05_int8_quantization.int8_decode_speedup_batch1")
    _chapter(tmp_path, "05_int8_quantization", status="running")
    assert "unfinished (results.json still says running" in _verdict(table, tmp_path, cid)["detail"]
    _chapter(tmp_path, "05_int8_quantization", status="skipped")
    v = _verdict(table, tmp_path, cid)
    assert v["verdict"] == "not measured in this run" and "skipped in this fixture" in v["detail"]


def test_a_figure_a_chapter_could_not_record_is_not_measured_with_the_chapters_reason(table, tmp_path):
    cid = _claim_for(table, "07_serving.users_served_ratio")
    res = _chapter(tmp_path, "07_serving", {"other": (1.0, "cpu")})
    v = _verdict(table, tmp_path, cid)
    assert v["verdict"] == "not measured in this run" and v["detail"].startswith("07_serving (ok) did not record")
    res.not_recorded("users_served_ratio", "both sweeps met the targets at their largest level")
    v = _verdict(table, tmp_path, cid)
    assert v["verdict"] == "not measured in this run"
    assert "did not record users_served_ratio: both sweeps met the targets at their largest level" in v["detail"]


def test_guide_internal_inconsistencies(table, tmp_path):
    out = claims.verdicts(tmp_path, table[table["rule"] == "consistency"]).set_index("id")
    assert out.loc["C38", "verdict"] == "internally inconsistent"   # 16.2 vs 16.5 and 16.6
    assert out.loc["C41", "verdict"] == "internally inconsistent"   # 38.5 vs 29.3
    assert out.loc["C54", "verdict"] == "internally consistent"     # 100 tokens at 16.6 tok/s
    assert out.loc["C74", "verdict"] == "internally inconsistent"   # three INT8 speedups
    assert out.loc["C64", "verdict"] == "internally inconsistent"   # the two seeds' first-token latencies
    assert "other guide" in out.loc["C64", "detail"]


def test_numbers_and_bad_rows():
    assert claims.number("29.3/16.5") == pytest.approx(29.3 / 16.5)
    assert claims.number(">1000") == 1000
    assert claims.claimed_range("0.05-0.1") == (0.05, 0.1)
    assert claims.claimed_range("6012/2100") == (6012 / 2100, 6012 / 2100)
    with pytest.raises(ValueError):
        claims.number("__import__('os')")
    with pytest.raises(ValueError, match="not key=value"):
        claims.parse_args("metric")


def test_load_claims_rejects_unknown_rules(tmp_path, table):
    bad = table.head(2).copy()
    bad.loc[bad.index[0], "rule"] = "guess"
    path = tmp_path / "claims.csv"
    bad.to_csv(path, index=False)
    with pytest.raises(ValueError, match="rule='guess'"):
        claims.load_claims(path)


def test_npu_figure_at_another_shape_does_not_decide(table, tmp_path):
    row = table[table["args"].str.contains("rmsnorm_guide_shape_ms")].iloc[0]
    res = Results("01_operator_verification", tmp_path)
    res.record("rmsnorm_guide_shape_ms", 0.07, "ms", device="npu:0", context="the profile's shape, not the guide's")
    assert _verdict(table, tmp_path, row["id"])["verdict"] == "needs an NPU to check"
    res.record("rmsnorm_guide_shape_ms", 0.07, "ms", device="npu:0", context="the guide's shape")
    assert _verdict(table, tmp_path, row["id"])["verdict"] == "reproduced"


def test_guide_number_reads_the_quoted_figure():
    assert claims.guide_number("C42") == pytest.approx(3.2)
    assert claims.guide_number("C51") == pytest.approx(29.3 / 16.5)
    with pytest.raises(KeyError, match="C999"):
        claims.guide_number("C999")


# --- several runs, device classes, and verdicts that never reach past the data -------------------

def _fill_every_metric(table, run_dir, device, model):
    """Every metric the claims table names, recorded on ``device`` with a value near the claim."""
    by_chapter = {}
    for row in table.to_dict(orient="records"):
        metric = claims.parse_args(row["args"]).get("metric")
        if metric:
            chapter, _, key = metric.partition(".")
            try:
                value = claims.claimed_range(row["claimed_value"])[0]
            except ValueError:
                value = 1.0
            by_chapter.setdefault(chapter, {})[key] = (value, device)
    for chapter, metrics in by_chapter.items():
        _chapter(run_dir, chapter, metrics, model=model, device=device)


@pytest.mark.parametrize("device,model", [("cpu", "smollm2-135m"), ("cpu", LLAMA), ("npu:0", "smollm2-135m"),
                                          ("cuda:0", "smollm2-135m")])
def test_no_measurement_off_the_claimed_hardware_reproduces_or_contradicts(table, tmp_path, device, model):
    _fill_every_metric(table, tmp_path, device, model)
    out = claims.verdicts(tmp_path, table)
    cls = device_class = device.split(":")[0]
    wrong_model = (out["model"] != "") & (model != LLAMA)
    undecidable = out[(out["hardware"] != "") & ((out["hardware"] != device_class) | wrong_model)]
    measured = undecidable[undecidable["evidence"] == "measured"]
    assert len(measured) >= 8  # the fixture did reach the rules
    assert not measured["verdict"].isin(["reproduced", "contradicted"]).any(), \
        measured[["id", "verdict", "detail"]].to_string()
    # a claim checked against a figure of another technique (unlike=) shows no effect of its own
    unlike = measured["args"].str.contains("unlike=")
    assert unlike.sum() == 2 and (measured[unlike]["verdict_class"] == "needs the claimed hardware").all()
    assert measured[unlike]["elsewhere"].str.startswith(claims.UNLIKE).all()
    measured = measured[~unlike]
    assert (measured["verdict_class"] == "measured on other hardware").all()
    assert measured["elsewhere"].str.contains(cls).all()
    # the measurement elsewhere did not decide the claim: no deciding run, but the run that showed it
    assert (measured["decided_by"] == "").all() and (measured["device_class"] == "").all()
    assert (measured["elsewhere_run"] == tmp_path.name).all()


def test_same_values_on_the_claimed_hardware_do_decide(table, tmp_path):
    _fill_every_metric(table, tmp_path, "npu:0", LLAMA)
    out = claims.verdicts(tmp_path, table)
    npu = out[(out["hardware"] == "npu") & (out["evidence"] == "measured")]
    unlike = npu["args"].str.contains("unlike=")
    assert len(npu) >= 8 and npu[~unlike]["verdict"].isin(["reproduced", "contradicted"]).all()
    # on the claimed hardware too, a figure of another technique neither reproduces nor contradicts
    assert (npu[unlike]["verdict"] == claims.NOT_MEASURED).all() and npu[unlike]["detail"].str.contains("unlike").all()


def test_a_claim_measured_only_on_unlike_evidence_says_so_not_opposite_effect(table, tmp_path):
    """C82: MindSpeed's 1.84x against vLLM-on-CPU's 0.712x over our path; C58: the guide's
    "+MindSpeed+INT8" rung against whichever rung of ours is best. Neither is the claim's technique."""
    _chapter(tmp_path, "07_serving", {"engine_batch1_decode_ratio": (0.712, "cpu")})
    _chapter(tmp_path, "06_optimization_ladder", {"ladder_best_batch1_speedup": (1.16, "cpu")})
    out = claims.verdicts(tmp_path, table[table["id"].isin(["C82", "C58"])]).set_index("id")
    for cid in ("C82", "C58"):
        assert out.loc[cid, "verdict"] == "needs an NPU to check"
        assert out.loc[cid, "verdict_class"] == "needs the claimed hardware"
        assert out.loc[cid, "elsewhere"].startswith("unlike evidence (")
        assert "opposite effect" not in out.loc[cid, "elsewhere"]
    assert "0.712x" in out.loc["C82", "elsewhere"] and "MindSpeed" in out.loc["C82", "elsewhere"]


def test_several_runs_each_claim_decided_by_the_matching_device(table, tmp_path):
    npu, cuda, cpu = tmp_path / "run-npu", tmp_path / "run-cuda", tmp_path / "run-cpu"
    for run, dev in ((npu, "npu:0"), (cuda, "cuda:0"), (cpu, "cpu")):
        _chapter(run, "00_environment_check", {"device": (dev, dev)}, model=LLAMA, device=dev)
    _chapter(npu, "04_batching", {"batch_throughput_ratio_4": (3.1, "npu:0")}, model=LLAMA)
    _chapter(cpu, "04_batching", {"batch_throughput_ratio_4": (0.9, "cpu")}, model="smollm2-135m")
    _chapter(cuda, "03_end_to_end", {"decode_tok_s_batch1": (40.0, "cuda:0")}, model=LLAMA)
    _chapter(cpu, "03_end_to_end", {"decode_tok_s_batch1": (41.0, "cpu")}, model=LLAMA)
    batch4 = _claim_for(table, "04_batching.batch_throughput_ratio_4")
    a100 = table[(table["hardware"] == "cuda") & (table["claimed_value"] == "42.8")].iloc[0]["id"]
    subset = table[table["id"].isin([batch4, a100])]
    for order in ([cpu, cuda, npu], [npu, cpu, cuda]):
        out = claims.verdicts(order, subset).set_index("id")
        assert out.loc[batch4, "verdict"] == "reproduced" and out.loc[batch4, "decided_by"] == "run-npu"
        assert out.loc[batch4, "device_class"] == "npu"
        assert out.loc[a100, "verdict"] == "reproduced" and out.loc[a100, "decided_by"] == "run-cuda"
    only_cpu = claims.verdicts([cpu], subset).set_index("id")
    assert only_cpu.loc[batch4, "verdict"] == "needs an NPU to check"
    assert only_cpu.loc[batch4, "elsewhere"].startswith("opposite effect on cpu (smollm2-135m): 0.9x")
    assert only_cpu.loc[a100, "verdict"] == "needs a CUDA GPU to check" and only_cpu.loc[a100, "decided_by"] == ""
    with pytest.raises(ValueError, match="run_dirs"):
        claims.verdicts([], subset)


def test_verdict_classes_cover_every_verdict():
    for verdict in claims.VERDICTS:
        assert claims.verdict_class(verdict) in claims.VERDICT_CLASSES
    assert claims.verdict_class("needs an NPU to check", "same effect on cpu") == "measured on other hardware"
    with pytest.raises(ValueError, match="unknown verdict"):
        claims.verdict_class("probably fine")
    assert claims.device_class("npu:3") == "npu" and claims.device_class("") == ""
    assert claims.device_class("unknown (no torch)") == "" and claims.device_class("xla:0") == ""
    assert claims.comparable_model("llama2-7b", "NousResearch/Llama-2-7b-hf")
    assert not claims.comparable_model("llama2-7b", "smollm2-135m")


# --- every rule kind can go both ways ------------------------------------------------------------

def _claim(rule, claimed, args, unit="", hardware="", model="", cid="T1"):
    return pd.DataFrame([{"id": cid, "seed": "fixture", "section": "fixture", "text_zh": "测试",
                          "gloss_en": "fixture", "kind": "fact", "claimed_value": claimed, "unit": unit,
                          "hardware": hardware, "model": model, "rule": rule, "args": args}])


def _npu(run_dir, chapter, metrics=None, tables=None, **fields):
    res = _chapter(run_dir, chapter, {k: (v, "npu:0") for k, v in (metrics or {}).items()}, tables,
                   model=LLAMA, device="npu:0")
    for key, value in fields.items():  # extra fields beside the first metric
        first = next(iter(res.data["metrics"]))
        res.data["metrics"][first][key] = value
    res.save()


LADDER = [{"rung": "native eager", "status": "ok", "tokens_per_s": 10.0, "peak_memory_bytes": 13.9e9},
          {"rung": "+ fused operators", "status": "ok", "tokens_per_s": 12.0, "peak_memory_bytes": 13.9e9},
          {"rung": "+ graph mode", "status": "ok", "tokens_per_s": 13.0, "peak_memory_bytes": 13.9e9},
          {"rung": "+ runtime options", "status": "ok", "tokens_per_s": 17.4, "peak_memory_bytes": 13.9e9},
          {"rung": "+ INT8", "status": "ok", "tokens_per_s": 25.0, "peak_memory_bytes": 7.6e9}]


def _ladder(run_dir, **change):
    rows = [dict(r, **change.get(r["rung"], {})) for r in LADDER]
    _npu(run_dir, "06_optimization_ladder", {"ladder_tok_s_INT8": rows[-1]["tokens_per_s"]}, {"ladder": rows})


def _rn_table(prefill, decode):
    return {"residual_norm_graph": [
        {"case": "prefill", "mode": "eager", "median_ms": 1.0}, {"case": "prefill", "mode": "graph (x)", "median_ms": 1 / prefill},
        {"case": "decode", "mode": "eager", "median_ms": 1.0}, {"case": "decode", "mode": "graph (x)", "median_ms": 1 / decode}]}


def _api_table(run_dir, name, live, documented):
    _chapter(run_dir, "00_environment_check", tables={"api_check": [
        {"guide_name": name, "real_api": "x", "documented": documented, "exists_here": live}]}, device="npu:0")


NOT_INF = "why=training only"
BOTH_WAYS = [
    # (rule, claimed, unit, hardware, model, args, setup(run_dir) or None, expected verdict)
    ("api", "n", "", "", "", "name=torch_npu.npu.rms_norm", None, "API does not exist"),
    ("api", "n", "", "", "", "name=torch_npu.npu.rms_norm",
     lambda d: _api_table(d, "torch_npu.npu.rms_norm", True, "does not exist"), "API exists"),
    ("api", "n", "", "", "", "name=torch.npu.config.allow_internal_format",
     lambda d: _api_table(d, "torch.npu.config.allow_internal_format", False, "exists (set-only)"), "API exists"),
    ("api", "n", "", "", "", "name=torch.npu.config.allow_internal_format",
     lambda d: _api_table(d, "torch.npu.config.allow_internal_format", False, "exists"), "API does not exist"),
    ("fact", "14336", "", "", "", "metric=02_ffn_fusion.size",
     lambda d: _chapter(d, "02_ffn_fusion", {"size": (14336, "cpu")}, device="cpu"), "reproduced"),
    ("fact", "14336", "", "", "", "metric=02_ffn_fusion.size",
     lambda d: _chapter(d, "02_ffn_fusion", {"size": (11008, "cpu")}, device="cpu"), "contradicted"),
    ("fact", "runs", "", "", "", "metric=04_batching.runs;want=true",
     lambda d: _chapter(d, "04_batching", {"runs": (False, "cpu")}, device="cpu"), "contradicted"),
    ("fact", "runs", "", "", "", "metric=04_batching.runs;want=true",
     lambda d: _chapter(d, "04_batching", {"runs": (True, "cpu")}, device="cpu"), "reproduced"),
    ("fact", "runs", "", "", "", "metric=04_batching.runs;want=true", None, "not measured in this run"),
    ("ratio", "3.2", "x", "npu", "llama2-7b", "metric=04_batching.r;tolerance=0.25",
     lambda d: _npu(d, "04_batching", {"r": 3.0}), "reproduced"),
    ("ratio", "3.2", "x", "npu", "llama2-7b", "metric=04_batching.r;tolerance=0.25",
     lambda d: _npu(d, "04_batching", {"r": 1.5}), "contradicted"),
    ("threshold", "3", "x", "npu", "", "metric=01_operator_verification.s;op=>=;tolerance=0.25",
     lambda d: _npu(d, "01_operator_verification", {"s": 2.5}), "reproduced"),
    ("threshold", "3", "x", "npu", "", "metric=01_operator_verification.s;op=>=;tolerance=0.25",
     lambda d: _npu(d, "01_operator_verification", {"s": 2.0}), "contradicted"),
    ("threshold", "1e-3", "", "npu", "", "metric=02_ffn_fusion.d;op=<",
     lambda d: _npu(d, "02_ffn_fusion", {"d": 5e-4}), "reproduced"),
    ("threshold", "1e-3", "", "npu", "", "metric=02_ffn_fusion.d;op=<",
     lambda d: _npu(d, "02_ffn_fusion", {"d": 5e-3}), "contradicted"),
    ("threshold", "1e-2", "", "npu", "", "metric=02_ffn_fusion.d;op=>;requires=weight_contiguous_at_op:false",
     lambda d: _npu(d, "02_ffn_fusion", {"d": 0.05}, weight_contiguous_at_op=False), "reproduced"),
    ("threshold", "1e-2", "", "npu", "", "metric=02_ffn_fusion.d;op=>;requires=weight_contiguous_at_op:false",
     lambda d: _npu(d, "02_ffn_fusion", {"d": 1e-4}, weight_contiguous_at_op=False), "contradicted"),
    ("threshold", "1e-2", "", "npu", "", "metric=02_ffn_fusion.d;op=>;requires=weight_contiguous_at_op:false",
     lambda d: _npu(d, "02_ffn_fusion", {"d": 0.05}, weight_contiguous_at_op=True), "not measured in this run"),
    ("speedup_every_shape", "1", "x", "npu", "", "table=02_ffn_fusion.residual_norm_graph;slow=eager;fast=graph",
     lambda d: _npu(d, "02_ffn_fusion", {"x": 1}, _rn_table(1.5, 1.2)), "reproduced"),
    ("speedup_every_shape", "1", "x", "npu", "", "table=02_ffn_fusion.residual_norm_graph;slow=eager;fast=graph",
     lambda d: _npu(d, "02_ffn_fusion", {"x": 1}, _rn_table(1.5, 0.7)), "contradicted"),
    ("bound", "16.5", "tok/s", "npu", "llama2-7b", "device=910B1;metric=03_end_to_end.t",
     lambda d: _npu(d, "03_end_to_end", {"t": 16.0}), "reproduced"),
    ("bound", "16.5", "tok/s", "npu", "llama2-7b", "device=910B1;metric=03_end_to_end.t",
     lambda d: _npu(d, "03_end_to_end", {"t": 5.0}), "contradicted"),
    ("bound", "2500", "tok/s", "npu", "llama2-7b", "device=910B1;metric=03_end_to_end.t", None, "physically impossible"),
    ("weight_memory", "13.6", "GB", "npu", "llama2-7b", "peak=06_optimization_ladder.ladder[0].peak_memory_bytes",
     lambda d: _ladder(d), "reproduced"),
    ("weight_memory", "13.6", "GB", "npu", "llama2-7b", "peak=06_optimization_ladder.ladder[0].peak_memory_bytes",
     lambda d: _ladder(d, **{"native eager": {"peak_memory_bytes": 20e9}}), "contradicted"),
    ("weight_memory", "7.8", "GB", "npu", "llama2-7b", "weights=int8;peak=06_optimization_ladder.ladder[INT8].peak_memory_bytes",
     lambda d: _ladder(d), "reproduced"),
    ("weight_memory", "5", "GB", "npu", "llama2-7b", "weights=float16", None, "physically impossible"),
    ("fits", "x", "", "npu", "", "model=llama2-13b;device=910B1", None, "disagrees with sources"),
    ("fits", "x", "", "npu", "", "model=llama2-70b;device=910B1", None, "agrees with sources"),
    ("spec", "64", "GB", "npu", "", "device=910B1;column=memory_gb", None, "agrees with sources"),
    ("spec", "32", "GB", "npu", "", "device=910B1;column=memory_gb", None, "disagrees with sources"),
    ("spec", "600", "TOPS", "npu", "", "device=910B1;derive_from=fp16_dense_tflops;factor=2;factor_source=s", None,
     "agrees with sources"),
    ("spec", "256", "TOPS", "npu", "", "device=910B1;derive_from=fp16_dense_tflops;factor=2;factor_source=s", None,
     "disagrees with sources"),
    ("spec", "1000", "TOPS", "npu", "", "device=910B1;derive_from=fp16_dense_tflops;factor=2;factor_source=s", None,
     "physically impossible"),
    ("pairing", "x", "", "", "", "torch_npu=2.1;cann=8.0", None, "agrees with sources"),
    ("pairing", "x", "", "", "", "torch_npu=2.3;cann=8.0", None, "disagrees with sources"),
    ("consistency", "0.4", "x", "", "", "expr=16.5/42.8;tolerance=0.05", None, "internally consistent"),
    ("consistency", "0.5", "x", "", "", "expr=16.5/42.8;tolerance=0.05", None, "internally inconsistent"),
    ("consistency", "6012", "ms", "", "", "rate=16.6;tokens=100", None, "internally consistent"),
    ("consistency", "6012", "ms", "", "", "rate=16.6;tokens=200", None, "internally inconsistent"),
    ("npu_ratio", "1.34", "x", "npu", "llama2-7b", "rung=runtime", lambda d: _ladder(d), "reproduced"),
    ("npu_ratio", "1.34", "x", "npu", "llama2-7b", "rung=runtime",
     lambda d: _ladder(d, **{"+ runtime options": {"tokens_per_s": 13.1}}), "contradicted"),
    ("torch_autoload", "x", "", "", "", "image_torch=2.1.0", None, "agrees with sources"),
    ("torch_autoload", "x", "", "", "", "image_torch=2.6.0", None, "disagrees with sources"),
    ("consistency", "1e-3", "", "", "", "k=4096", None, "internally inconsistent"),
    ("consistency", "1e-3", "", "", "", "k=1", None, "internally consistent"),
]
# Rules whose verdict is data in the table (a documented source, a stated reason), not a check.
FIXED = {"documented"}


@pytest.mark.parametrize("case", BOTH_WAYS, ids=[f"{c[0]}-{i}" for i, c in enumerate(BOTH_WAYS)])
def test_rule_verdict(case, tmp_path):
    rule, claimed, unit, hardware, model, args, setup, expected = case
    if setup is not None:
        setup(tmp_path)
    v = claims.verdicts(tmp_path, _claim(rule, claimed, args, unit, hardware, model)).iloc[0]
    assert v["verdict"] == expected, v["detail"]
    if v["verdict"] in ("reproduced", "contradicted") and hardware:
        assert v["decided_by"] == tmp_path.name and v["device_class"] == hardware


def test_every_checking_rule_has_cases_both_ways():
    verdicts_by_rule = {}
    for rule, *_, expected in BOTH_WAYS:
        verdicts_by_rule.setdefault(rule, set()).add(expected)
    missing = set(claims.RULES) - FIXED - set(verdicts_by_rule)
    assert not missing, f"rules without both-way cases: {missing}"
    assert all(len(v) >= 2 for v in verdicts_by_rule.values()), verdicts_by_rule


def test_no_rule_runs_an_experiment(tmp_path):
    """Rules judge what chapters recorded: auditing a run imports no torch and starts no process."""
    import subprocess
    import sys

    # Imported as the runner imports helpers (its process skips the torch import), so any torch
    # in sys.modules afterwards was imported by the audit itself.
    code = ("import subprocess, sys\n"
            "sys.orig_argv = [sys.executable, '-m', 'helpers.run']\n"
            "def no_process(*a, **k): raise AssertionError('a claims rule started a process')\n"
            "subprocess.run = subprocess.Popen = no_process\n"
            "from helpers import claims\n"
            f"table = claims.verdicts({str(tmp_path)!r})\n"
            "assert len(table) > 50 and not table['detail'].str.contains('rule .* failed').any()\n"
            "assert 'torch' not in sys.modules, 'a claims rule imported torch'\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert out.returncode == 0, out.stderr


def test_fixed_verdict_rules_state_their_source(table):
    fixed = table[table["rule"].isin(FIXED)]
    for row in fixed.to_dict(orient="records"):
        args = claims.parse_args(row["args"])
        assert len(args.get("source") or args.get("note") or args.get("why") or "") > 40, row["id"]


def test_speedup_at_every_shape_on_a_cpu_is_mixed(tmp_path):
    _chapter(tmp_path, "02_ffn_fusion", {"x": (1, "cpu")}, _rn_table(1.5, 0.7), device="cpu")
    row = _claim("speedup_every_shape", "1", "table=02_ffn_fusion.residual_norm_graph;slow=eager;fast=graph", "x",
                 "npu")
    v = claims.verdicts(tmp_path, row).iloc[0]
    assert v["verdict"] == "needs an NPU to check" and v["elsewhere"].startswith("mixed effect on cpu")


# --- the claims report page ------------------------------------------------------------------------

def test_claims_page_groups_rows_and_badges_every_verdict(table, tmp_path):
    import re

    from helpers import report

    from helpers import pages

    audit = claims.verdicts(tmp_path, table)
    page = report.write_claims_report(tmp_path / "claims_report.html", "t", audit).read_text()
    badges = re.findall(r'data-verdict-class="([^"]+)"', page)
    # one badge per class in the legend, then one per claim
    assert len(badges) == len(claims.VERDICT_CLASSES) + len(audit)
    assert set(badges) <= set(claims.VERDICT_CLASSES)
    for seed in set(audit["seed"]):
        assert claims.GUIDES[seed].split(" ")[0] in page
    for section in set(audit["section"]):
        assert f"<h3>{section}" in page.replace("&amp;", "&") or section in page
    row = audit.iloc[0]
    assert row["text_zh"].split()[0] in page and row["gloss_en"][:30] in page
    assert pages.stylesheet() in page  # inlined: the page is one file


def test_int8_plot_is_not_a_one_point_axis(table, tmp_path):
    import matplotlib.pyplot as plt

    from helpers import report
    from helpers.results import read_run

    _chapter(tmp_path, "05_int8_quantization", {"int8_decode_speedup_batch1": (1.65, "cpu"),
                                                "int8_ppl_delta_pct": (0.36, "cpu")})
    fig = report.plot_int8(read_run(tmp_path).results(), table)
    speed_ax, ppl_ax = fig.axes
    assert speed_ax.get_xlim()[0] == 0 and speed_ax.get_xlim()[1] > 2.38  # the guide's largest speedup fits
    low, high = ppl_ax.get_xlim()
    assert low < 0 < 0.36 < high and high - low >= 0.5
    assert len(speed_ax.patches) == 4  # three guide figures and the measurement
    plt.close(fig)
