"""The report chapter renders from a partial run: hand-made results, one failed and one missing chapter."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from helpers import claims, report, round_robin
from helpers.results import (REPORT_CHAPTER, STATUSES, Results, load_results, read_run, workbook_chapters,
                             write_json_atomic)

REPO = Path(__file__).resolve().parent.parent


def _record(res, key, value, unit=""):
    res.record(key, value, unit, key_figure=True, device="cpu", dtype="float32", shape="test fixture",
               code_path="hand-made test fixture")


def make_partial_run(run_dir: Path) -> Path:
    """00, 03, 04 and 06 ok; 05 stopped half-way; 02 failed before writing; 01 never ran."""
    res = Results("00_environment_check", run_dir, environment={"device": "cpu"})
    _record(res, "memory_bandwidth_gbps", 30.0, "GB/s")
    _record(res, "decode_ceiling_tok_s", 55.0, "tok/s")
    res.table("api_check", [{"guide_name": "torch_npu.npu.rms_norm", "real_api": "torch_npu.npu_rms_norm",
                             "documented": "does not exist", "exists_here": None}])
    res.finish()
    res = Results("03_end_to_end", run_dir, environment={"device": "cpu"})
    _record(res, "decode_tok_s_batch1", 18.0, "tok/s")
    _record(res, "ttft_ms", 120.0, "ms")
    res.finish()
    res = Results("04_batching", run_dir, environment={"device": "cpu"})
    for key, value in (("batch_throughput_ratio_4", 3.0), ("batch_throughput_ratio_8", 4.1),
                       ("batch_latency_growth_pct_4", 33.0), ("batch_memory_growth_pct_4", 4.0)):
        _record(res, key, value)
    res.finish()
    res = Results("05_int8_quantization", run_dir, environment={"device": "cpu"})
    _record(res, "int8_decode_speedup_batch1", 1.6)  # then "crashed": status stays "running"
    table = round_robin.run_ladder(
        [("native eager", "", lambda: 100.0), ("fused", "", lambda: 1 / 0), ("int8", "", lambda: 60.0)],
        lambda v: {"latency_ms": v, "tokens_per_s": 1e3 / v, "peak_memory_bytes": 1000 * v})
    res = Results("06_optimization_ladder", run_dir, environment={"device": "cpu"})
    res.table("ladder", table.drop(columns=["traceback"], errors="ignore"))
    res.finish()
    write_json_atomic(run_dir / "run.json", {"run_id": run_dir.name, "notebooks": [
        {"notebook": "02_ffn_fusion", "status": "failed", "error": "RuntimeError: fixture failure"}]})
    return run_dir


def test_status_plots_and_claims_page_from_a_partial_run(tmp_path):
    run_dir = make_partial_run(tmp_path / "partial")
    folder = read_run(run_dir, expected=workbook_chapters())
    status = folder.status_table().set_index("chapter")
    assert status.loc["02_ffn_fusion", "status"] == "failed"
    assert status.loc["02_ffn_fusion", "reason"] == "RuntimeError: fixture failure"
    assert status.loc["01_operator_verification", "status"] == "not run"
    assert status.loc["05_int8_quantization", "status"] == "unfinished"
    assert status.loc["06_optimization_ladder", "status"] == "ok"
    assert REPORT_CHAPTER not in status.index and set(status["status"]) <= set(STATUSES)
    results = folder.results()
    table = claims.load_claims()
    assert report.guide_value(table, "04_batching.batch_throughput_ratio_4") == pytest.approx(3.2)
    figs = [report.plot_roofline(results), report.plot_batching(results, table),
            report.plot_int8(results, table), report.plot_ladder(results)]
    assert all(f is not None for f in figs)
    assert report.plot_roofline({}) is None and report.plot_ladder({}) is None
    assert report.plot_batching({}, table) is None and report.plot_int8({}, table) is None
    audit = claims.verdicts(run_dir, table)
    figures = report.key_figures(results)
    figures.loc[0, "shape"] = "x <y>"
    page = report.write_claims_report(tmp_path / "r.html", "partial", audit, status=folder.status_table(),
                                      figures=figures, plots=figs).read_text()
    assert "Claims audit: run partial" in page and "x &lt;y&gt;" in page and "decode_tok_s_batch1" in page
    assert page.count("data:image/png;base64,") == len(figs)
    assert "fixture failure" in page and "<td>unfinished</td>" in page


@pytest.mark.notebooks  # executes chapter 08 through the runner (a kernel, about 10 s alone)
def test_report_notebook_renders_through_the_runner(tmp_path):
    reports = tmp_path / "reports"
    make_partial_run(reports / "partial")
    env = {**os.environ, "WORKBOOK_REPORTS": str(reports)}
    proc = subprocess.run([sys.executable, "-m", "helpers.run", "--profile", "quick", "--only", REPORT_CHAPTER,
                           "--reports-dir", str(reports), "--run-id", "partial", "--no-html"],
                          cwd=REPO, env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    run_dir = reports / "partial"
    data = load_results(run_dir, REPORT_CHAPTER)
    assert data["status"] == "ok"
    assert data["metrics"]["claims_total"]["value"] == len(claims.load_claims())
    rows = {row["id"]: row for row in data["tables"]["claims"]}
    # batch 4 throughput 3.0 on a CPU vs the guide's 3.2 on a 910B: the technique's effect, not a verdict
    assert rows["C42"]["verdict"] == "needs an NPU to check"
    assert rows["C42"]["verdict_class"] == "measured on other hardware"
    assert rows["C42"]["elsewhere"].startswith("same effect on cpu")
    counts = {row["verdict_class"]: row["claims"] for row in data["tables"]["verdict_counts"]}
    tally = {cls: sum(r["verdict_class"] == cls for r in rows.values()) for cls in claims.VERDICT_CLASSES}
    assert counts == tally and sum(counts.values()) == len(rows)
    assert [a["label"] for a in data["artifacts"]] == ["claims audit (HTML, no code)"]
    assert (run_dir / data["artifacts"][0]["path"]).exists()
    assert "claims audit" in (run_dir / "index.html").read_text()
    notebook = json.loads((run_dir / f"{REPORT_CHAPTER}.ipynb").read_text())
    outputs = [o for c in notebook["cells"] if c["cell_type"] == "code" for o in c.get("outputs", [])]
    assert not [o for o in outputs if o["output_type"] == "error"]
    assert not [o for o in outputs if o.get("name") == "stderr"], "noisy stderr output"
    images = [o for o in outputs if "image/png" in o.get("data", {})]
    assert len(images) >= 5  # verdicts, roofline, batching, int8, ladder


def test_the_batch1_protocol_table_has_a_row_per_chapter_that_measures_it():
    """Chapters 03, 04, 05 and 06 each time the same batch-1 eager decode: one row each, from their records."""
    fixture = Path(__file__).parent / "fixtures" / "runs" / "cpu-quick"
    results = {p.parent.name: json.loads(p.read_text(encoding="utf-8")) for p in fixture.glob("*/results.json")}
    table = report.batch1_protocol_table(results)
    expected = {"03_end_to_end", "04_batching", "05_int8_quantization", "06_optimization_ladder"} & set(results)
    assert set(table["chapter"]) == expected and len(table) == len(expected)
    dense = results["05_int8_quantization"]["tables"]["variants"][0]
    row = table[table["chapter"] == "05_int8_quantization"].iloc[0]
    assert row["tok/s"] == dense["decode_tok_s_b1"] and row["dtype"] == dense["dtype"]
    assert report.batch1_protocol_table({}).empty
