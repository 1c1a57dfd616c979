"""helpers.compare: synthetic NPU / CUDA / CPU runs written as results.json files, and one real comparison.

The synthetic runs exercise the comparability rules (a ratio only for the same metric, unit, model,
dtype and shape, both chapters finished), unreadable files and other schemas, the guide's table and
the claims section. The real comparison runs chapters 00 and 03 twice here (bfloat16 and float32,
quick profile) and checks the page generically, from whatever key figures those chapters record.
"""
from __future__ import annotations

import csv
import html
import json
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

from helpers import claims, compare
from helpers.results import read_run

REPO = Path(__file__).resolve().parent.parent
LLAMA = "NousResearch/Llama-2-7b-hf"


def figure(value, unit, device, dtype, shape="batch 1, prompt 6 tokens, 64 new tokens", code_path="HF generate"):
    return {"value": value, "unit": unit, "device": device, "dtype": dtype, "shape": shape, "code_path": code_path}


def write_run(root: Path, name: str, device: str, dtype: str, model: str, chapters: dict,
              statuses: dict = None, run_json: bool = True, profile: str = "npu") -> Path:
    """A run folder as the runner writes it: <run>/<chapter>/results.json (+ run.json)."""
    run_dir = root / name
    run_dir.mkdir(parents=True, exist_ok=True)
    entries = []
    for chapter, body in chapters.items():
        status = (statuses or {}).get(chapter, "ok")
        data = {"schema": 1, "chapter": chapter, "status": "running" if status == "failed" else status,
                "parameters": {"device": "auto", "model": model, "dtype": dtype, "profile": profile},
                "environment": {"device": device, "device_properties": {"name": f"{device} board"}},
                "metrics": body.get("metrics", {}), "tables": body.get("tables", {}),
                "key_figures": body.get("key_figures", list(body.get("metrics", {}))), "notes": []}
        (run_dir / chapter).mkdir(parents=True, exist_ok=True)
        (run_dir / chapter / "results.json").write_text(json.dumps(data))
        entries.append({"notebook": chapter, "status": status,
                        **({"error": "RuntimeError: boom in cell 7"} if status == "failed" else {})})
    if run_json:
        (run_dir / "run.json").write_text(json.dumps({"run_id": name, "profile": profile, "notebooks": entries}))
    return run_dir


def standard_chapters(device: str, dtype: str, decode: float, ttft: float, roofline: float,
                      batch8: float = None, ladder: tuple = (), model: str = ""):
    env00 = {"metrics": {"device": {"value": device, "unit": ""},
                         "model": {"value": model or None, "unit": "", "dtype": dtype},
                         "memory_bandwidth_gbps": figure(1000.0 if device != "cpu" else 20.0, "GB/s", device,
                                                         "float32", shape="64 MiB buffer")},
             "key_figures": ["device", "memory_bandwidth_gbps"]}
    ch03 = {"metrics": {"ttft_ms": figure(ttft, "ms", device, dtype),
                        "decode_tok_s_batch1": figure(decode, "tok/s", device, dtype),
                        "decode_roofline_pct": figure(roofline, "%", device, dtype, shape="batch 1, mean context 38")}}
    chapters = {"00_environment_check": env00, "03_end_to_end": ch03}
    if batch8 is not None:
        chapters["04_batching"] = {
            "metrics": {"batch_throughput_ratio_8": figure(batch8 / decode, "x", device, dtype, shape="batch 8 vs 1")},
            "tables": {"batch_sweep": [
                {"point": 1, "status": "ok", "prompt_tokens": 12, "tokens_per_s_aggregate": decode,
                 "peak_memory_bytes": 13.9e9, "memory_kind": "torch.npu.max_memory_allocated"},
                {"point": 8, "status": "ok", "prompt_tokens": 12, "tokens_per_s_aggregate": batch8,
                 "peak_memory_bytes": 15e9}]}}
    if ladder:
        chapters["06_optimization_ladder"] = {
            "metrics": {**{f"ladder_tok_s_{name}": figure(v, "tok/s", device, dtype) for name, v in ladder},
                        "ladder_best_batch1_speedup": figure(ladder[1][1] / ladder[0][1], "x", device, dtype)},
            "key_figures": ["ladder_best_batch1_speedup"]}
    return chapters


@pytest.fixture
def three_runs(tmp_path):
    """An NPU and a CUDA run of Llama-2-7B fp16 (same profile) and a CPU run of a small model."""
    npu = write_run(tmp_path, "npu-run", "npu:0", "float16", LLAMA,
                    standard_chapters("npu:0", "float16", 20.0, 300.0, 55.0, batch8=120.0,
                                      ladder=(("native_eager", 20.0), ("fused", 26.0), ("batch", 110.0))))
    cuda = write_run(tmp_path, "cuda-run", "cuda:0", "float16", LLAMA,
                     standard_chapters("cuda:0", "float16", 40.0, 200.0, 70.0, batch8=260.0,
                                       ladder=(("native_eager", 40.0), ("fused", 44.0))))
    cpu = write_run(tmp_path, "cpu-run", "cpu", "bfloat16", "smollm2-135m",
                    standard_chapters("cpu", "bfloat16", 30.0, 90.0, 35.0), profile="quick")
    return npu, cuda, cpu


def load(*paths):
    return compare.label_runs([compare.Run(read_run(p)) for p in paths])


def row(long, run, key, chapter="03_end_to_end"):
    hit = long[(long["run"] == run) & (long["figure"] == key) & (long["chapter"] == chapter)]
    assert len(hit) == 1, (run, key)
    return hit.iloc[0]


def test_ratio_only_for_same_metric_model_dtype_and_shape(three_runs):
    runs = load(*three_runs)
    long = compare.comparison_table(runs)
    # NPU vs CUDA, same model, dtype and shape: a ratio, computed from the two recorded figures.
    r = row(long, "cuda-run", "decode_tok_s_batch1")
    assert r["ratio_to_reference"] == pytest.approx(40.0 / 20.0) and r["why_no_ratio"] == ""
    assert row(long, "cuda-run", "ttft_ms")["ratio_to_reference"] == pytest.approx(200.0 / 300.0)
    # The CPU run differs in model and dtype: no ratio, and the cell says both reasons.
    r = row(long, "cpu-run", "decode_tok_s_batch1")
    assert r["ratio_to_reference"] is None or r["ratio_to_reference"] != r["ratio_to_reference"]
    assert "model differs" in r["why_no_ratio"] and "dtype differs" in r["why_no_ratio"]
    # A string figure is never divided.
    assert "not a number" in row(long, "cuda-run", "device", "00_environment_check")["why_no_ratio"]
    # The rule is strict even for a figure that hardly depends on the model: different model, no ratio.
    assert "model differs" in row(long, "cpu-run", "memory_bandwidth_gbps", "00_environment_check")["why_no_ratio"]
    # The reference run's own rows are marked as such.
    assert (long[long["run"] == "npu-run"]["why_no_ratio"] == "reference run").all()


def test_each_rule_alone_blocks_the_ratio(tmp_path):
    base = standard_chapters("cpu", "bfloat16", 30.0, 90.0, 35.0)
    a = write_run(tmp_path, "a", "cpu", "bfloat16", "smollm2-135m", base, profile="quick")
    variants = {
        "dtype": ("float32", "smollm2-135m", {}),
        "model": ("bfloat16", "tiny-random", {}),
        "shape": ("bfloat16", "smollm2-135m", {"shape": "batch 1, prompt 6 tokens, 16 new tokens"}),
        "unit": ("bfloat16", "smollm2-135m", {"unit": "ms/token"}),
    }
    for name, (dtype, model, override) in variants.items():
        chapters = standard_chapters("cpu", dtype, 33.0, 90.0, 35.0)
        chapters["03_end_to_end"]["metrics"]["decode_tok_s_batch1"].update(override)
        b = write_run(tmp_path, f"b-{name}", "cpu", dtype, model, chapters, profile="quick")
        runs = load(a, b)
        r = row(compare.comparison_table(runs), f"b-{name}", "decode_tok_s_batch1")
        assert f"{name} differs" in r["why_no_ratio"], (name, r["why_no_ratio"])
    # Two CPU runs that agree in everything: the ratio is there (same device allowed).
    b = write_run(tmp_path, "b-same", "cpu", "bfloat16", "smollm2-135m",
                  standard_chapters("cpu", "bfloat16", 33.0, 90.0, 35.0), profile="quick")
    runs = load(a, b)
    assert row(compare.comparison_table(runs), "b-same", "decode_tok_s_batch1")["ratio_to_reference"] == \
        pytest.approx(1.1)


def test_failed_and_missing_chapters_are_shown_not_compared(three_runs, tmp_path):
    npu, cuda, _ = three_runs
    failed = write_run(tmp_path, "cuda-failed", "cuda:0", "float16", LLAMA,
                       standard_chapters("cuda:0", "float16", 41.0, 210.0, 70.0),
                       statuses={"03_end_to_end": "failed"})
    shutil.rmtree(failed / "00_environment_check")  # and chapter 00 never ran
    runs = load(npu, failed)
    assert runs[1].status["03_end_to_end"] == "failed"
    assert any("03_end_to_end: failed (RuntimeError: boom in cell 7)" in n for n in runs[1].notes)
    long = compare.comparison_table(runs)
    r = row(long, "cuda-failed", "decode_tok_s_batch1")
    assert r["value"] == 41.0 and "chapter failed in cuda-failed" in r["why_no_ratio"]
    r = row(long, "cuda-failed", "memory_bandwidth_gbps", "00_environment_check")
    assert r["value"] is None and "it wrote no results.json" in r["why_no_ratio"]
    r = row(long, "cuda-failed", "batch_throughput_ratio_8", "04_batching")
    assert r["value"] is None and "chapter not run" in r["why_no_ratio"]


def test_other_schemas_and_unreadable_files_are_reported_not_adapted(three_runs, tmp_path):
    npu = three_runs[0]
    odd = write_run(tmp_path, "odd-run", "cpu", "float32", "smollm2-135m",
                    standard_chapters("cpu", "float32", 19.0, 320.0, 20.0), run_json=False)
    # A file without a schema (bare values, no key_figures): not today's schema, so not read at all.
    (odd / "03_end_to_end" / "results.json").write_text(json.dumps({"metrics": {"decode_tok_s_batch1": 19.0}}))
    (odd / "04_batching").mkdir()
    (odd / "04_batching" / "results.json").write_text("{ truncated")
    (odd / "05_int8_quantization").mkdir()
    (odd / "05_int8_quantization" / "results.json").write_text("[1, 2]")
    (odd / "06_optimization_ladder").mkdir()
    (odd / "06_optimization_ladder" / "results.json").write_text(json.dumps({"schema": 2, "metrics": {}}))
    run = load(odd)[0]
    assert run.status == {"00_environment_check": "ok", "03_end_to_end": "unreadable", "04_batching": "unreadable",
                          "05_int8_quantization": "unreadable", "06_optimization_ladder": "unreadable"}
    assert set(run.chapters) == {"00_environment_check"}  # nothing read from the other files
    text = " | ".join(run.notes)
    for expected in ("03_end_to_end: unreadable (results.json schema None", "not valid JSON", "not a JSON object",
                     "schema 2, but this workbook", "run.json missing"):
        assert expected in text, expected
    long = compare.comparison_table(load(npu, odd))
    r = row(long, "odd-run", "decode_tok_s_batch1")
    assert r["value"] is None and "chapter unreadable: results.json schema None" in r["why_no_ratio"]
    assert row(long, "odd-run", "memory_bandwidth_gbps", "00_environment_check")["value"] == 20.0
    out = compare.compare([npu, odd], tmp_path / "out")
    assert "schema 2, but this workbook" in html.unescape(out["html"].read_text())


def test_batch8_decode_comes_from_the_sweep_table_or_says_why_not(three_runs):
    runs = load(*three_runs)
    assert compare.batch_sweep_cell(runs[0], 8).number == 120.0
    assert "chapter not run" in compare.batch_sweep_cell(runs[2], 8).missing
    long = compare.comparison_table(runs)
    assert row(long, "cuda-run", "decode_tok_s_batch8", "04_batching")["ratio_to_reference"] == \
        pytest.approx(260.0 / 120.0)


def test_guide_table_comes_from_the_claims_table(three_runs):
    runs = load(*three_runs)
    table = claims.load_claims()
    rows = compare.guide_benchmark_claims(table)
    assert {(r["unit"], r["hardware"]) for r in rows} >= {(u, h) for u in ("tok/s", "ms", "GB") for h in ("npu", "cuda")}
    for r in rows:
        assert r["value"] == claims.guide_number(r["id"])
    guide = compare.guide_table(runs, table)
    claim_cols = [c for c in guide.columns if c.startswith("guide's claim")]
    assert len(claim_cols) == 2 and all(guide[c].notna().all() for c in claim_cols)
    # A changed claims table changes the page: the numbers are read, not typed in the helper.
    changed = table.copy()
    tok_rows = [r["id"] for r in rows if r["unit"] == "tok/s"]
    changed.loc[changed["id"] == tok_rows[0], "claimed_value"] = "99.5"
    assert "99.5" in compare.guide_table(runs, changed).to_string()
    measured = guide.set_index("figure")
    assert measured.loc["decode tok/s, batch 1", "measured: npu-run"].startswith("20 tok/s")
    assert "did not record" in measured.loc["memory, GB", "measured: cpu-run"]
    assert measured.loc["memory, GB", "measured: npu-run"].startswith("13.9 GB")


def test_plots_draw_what_was_recorded_and_skip_what_was_not(three_runs, tmp_path):
    import matplotlib

    matplotlib.use("Agg")
    runs = load(*three_runs)
    for plot in (compare.plot_decode, compare.plot_ttft, compare.plot_roofline, compare.plot_ladder):
        assert plot(runs) is not None, plot.__name__
    assert [n for n, _ in compare.ladder_rungs(runs[0])] == ["native_eager", "fused", "batch"]
    empty = load(*(write_run(tmp_path, n, "cpu", "float32", "m", {}) for n in ("e1", "e2")))
    for plot in (compare.plot_decode, compare.plot_ttft, compare.plot_roofline, compare.plot_ladder):
        assert plot(empty) is None, plot.__name__


def test_cli_writes_page_and_csv_with_one_column_group_per_run(three_runs, tmp_path):
    reports = tmp_path / "reports"
    rc = compare.main([str(p) for p in three_runs] + ["--id", "t", "--reports-dir", str(reports)])
    assert rc == 0
    page = (reports / "compare-t" / "index.html").read_text()
    page = html.unescape(page)
    for label in ("npu-run", "cuda-run", "cpu-run", "guide's claim about", "910B", "A100", "no ratio: "):
        assert label in page, label
    with open(reports / "compare-t" / "figures.csv", newline="") as fh:
        rows = list(csv.DictReader(fh))
    header = rows[0].keys()
    for run in ("npu-run", "cuda-run", "cpu-run"):
        for col in ("value", "device", "dtype", "model", "profile", "code_path"):
            assert f"{run}: {col}" in header
    decode = next(r for r in rows if r["figure"] == "decode_tok_s_batch1")
    assert float(decode["cuda-run / npu-run"]) == pytest.approx(2.0)
    assert decode["cpu-run / npu-run"] == "" and "model differs" in decode["cpu-run / npu-run: why no ratio"]


@pytest.mark.parametrize("argv, message", [
    ([], "give two or more"),
    (["ONE"], "give two or more"),
    (["ONE", "missing-folder"], "is not a folder"),
    (["ONE", "ONE"], "given more than once"),
    (["ONE", "TWO", "--reference", "5"], "reference=5"),
    (["ONE", "TWO", "--id", "../x"], "--id"),
])
def test_bad_input_names_the_parameter(three_runs, tmp_path, capsys, argv, message):
    names = {"ONE": str(three_runs[0]), "TWO": str(three_runs[1]), "missing-folder": str(tmp_path / "nope")}
    rc = compare.main([names.get(a, a) for a in argv] + ["--reports-dir", str(tmp_path / "r")])
    assert rc == 2
    assert message in capsys.readouterr().err


def test_claims_audit_is_merged_over_all_runs(three_runs, tmp_path):
    out = compare.compare(list(three_runs), tmp_path / "real")
    table = out["claims"]
    assert set(table["decided_by"]) <= {"", "npu-run", "cuda-run", "cpu-run"}
    # The guide's benchmark claims with a measured metric: a 910B claim decided by the NPU run, an
    # A100 claim by the CUDA run (both runs are Llama-2-7B fp16), never by the CPU run.
    measured = [c for c in compare.guide_benchmark_claims() if c["metric"]]
    assert {c["hardware"] for c in measured} == {"npu", "cuda"}
    by_id = table.set_index("id")
    for c in measured:
        expected = {"npu": "npu-run", "cuda": "cuda-run"}[c["hardware"]]
        assert by_id.loc[c["id"], "decided_by"] == expected, c["id"]
        assert by_id.loc[c["id"], "device_class"] == c["hardware"]
    guide_text = out["guide"].to_string()
    assert "decided by npu-run" in guide_text and "decided by cuda-run" in guide_text
    page = html.unescape(out["html"].read_text())
    assert "<th>decided by</th>" in page and page.count('data-verdict-class="') == sum(
        1 for n in claims.verdict_counts(table).values() if n)


def test_a_failing_claims_audit_is_shown_and_the_comparison_kept(three_runs, tmp_path, monkeypatch):
    seen = {}

    def broken(run_dirs, claims=None, specs_path=None):
        seen["run_dirs"] = run_dirs
        raise ValueError("claims.csv row 3: bad rule")

    monkeypatch.setattr(claims, "verdicts", broken)
    out = compare.compare(list(three_runs), tmp_path / "broken")
    assert seen["run_dirs"] == [str(p) for p in three_runs]
    page = html.unescape(out["html"].read_text())
    assert out["claims"] is None and "audit over these runs failed: ValueError: claims.csv row 3: bad rule" in page
    assert "decode_tok_s_batch1" in page.replace("_<wbr>", "_")  # the figures are still there


def test_the_page_speaks_one_language_at_a_time(three_runs, tmp_path):
    with pytest.raises(ValueError, match="lang='fr'.*labels in en, zh"):
        compare.compare(list(three_runs), tmp_path / "fr", lang="fr")


def _page_width(page: Path, chromium: str, tmp: Path) -> int:
    """scrollWidth of the page in a 1280 px wide headless Chromium window."""
    probe = tmp / "probe.html"
    probe.write_text(page.read_text().replace(
        "</body>", "<script>document.title='W'+document.documentElement.scrollWidth</script></body>"))
    profile = tempfile.mkdtemp(dir=tmp)
    proc = subprocess.run([chromium, "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
                           "--disable-background-networking", "--disable-component-update", "--disable-sync",
                           f"--user-data-dir={profile}", "--window-size=1280,900", "--dump-dom", probe.as_uri()],
                          capture_output=True, text=True, timeout=120)
    import re

    found = re.search(r"<title>W(\d+)</title>", proc.stdout)
    assert found, proc.stderr[-2000:]
    return int(found.group(1))


def test_page_fits_1280_px_without_horizontal_scroll(three_runs, tmp_path):
    chromium = shutil.which("chromium") or shutil.which("chromium-browser")
    if not chromium:
        pytest.skip("headless Chromium is not installed")
    # Long code paths and notes must wrap, not widen the page.
    extra = write_run(tmp_path, "a-run-with-a-rather-long-name-" + "x" * 40, "cpu", "float32", "smollm2-135m",
                      standard_chapters("cpu", "float32", 9.0, 400.0, 20.0))
    results = extra / "03_end_to_end" / "results.json"
    data = json.loads(results.read_text())
    data["metrics"]["ttft_ms"]["code_path"] = "HF_generate_" * 30
    results.write_text(json.dumps(data))
    out = compare.compare(list(three_runs) + [extra], tmp_path / "wide")
    assert _page_width(out["html"], chromium, tmp_path) <= 1280


# --- one real comparison of two runs made here ----------------------------------------------------

@pytest.mark.notebooks
def test_real_runs_in_two_dtypes_compare_into_one_page(notebook_runs, tmp_path):
    """The two smoke runs of make test (the same small model in two dtypes, tests/conftest.py) on one
    compare page: their shared chapters' figures are read, and none is put into a ratio (the dtypes differ)."""
    runs = [notebook_runs["runs"][key]["run_dir"] for key in ("zh", "dtype")]
    for key, run in notebook_runs["runs"].items():
        assert run["run"] is not None, run["proc"].stdout[-3000:] + run["proc"].stderr[-3000:]
    rc = compare.main([str(p) for p in runs] + ["--id", "real", "--reports-dir", str(tmp_path)])
    assert rc == 0
    written = compare.compare(runs, tmp_path / "compare-real")
    loaded, long = written["runs"], written["figures"]
    assert [r.dtype for r in loaded] == [notebook_runs["runs"][key]["dtype"] for key in ("zh", "dtype")]
    assert all(r.device_class == "cpu" for r in loaded)
    keys = [k for k in long["figure"].unique() if (long["figure"] == k).any()]
    assert keys, "no key figures read from the two runs"
    checked = 0
    for (chapter, key), group in long.groupby(["chapter", "figure"], sort=False):
        ref, other = (group[group["run"] == r.label].iloc[0] for r in loaded)
        if ref["missing"] or other["missing"]:
            assert "no figure in" in other["why_no_ratio"]
            continue
        same = all(ref[c] == other[c] for c in ("unit", "model", "dtype", "shape"))
        numeric = all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in (ref["value"], other["value"]))
        finished = ref["chapter_status"] in compare.FINISHED and other["chapter_status"] in compare.FINISHED
        if same and numeric and finished and ref["value"] != 0:
            assert other["ratio_to_reference"] == pytest.approx(other["value"] / ref["value"]), key
        else:
            assert other["why_no_ratio"], key
            assert other["ratio_to_reference"] is None or other["ratio_to_reference"] != other["ratio_to_reference"]
        checked += 1
    assert checked
    page = written["html"].read_text()
    for run in loaded:
        assert run.label in page
    assert "<img" in page  # at least one headline plot from the measured figures


def test_labels_are_folder_names_made_unique(tmp_path):
    chapters = standard_chapters("cpu", "float32", 9.0, 400.0, 20.0)
    a = write_run(tmp_path / "laptop", "run", "cpu", "float32", "smollm2-135m", chapters)
    b = write_run(tmp_path / "ci", "run", "cpu", "float32", "smollm2-135m", chapters)
    c = write_run(tmp_path / "x" / "laptop", "run", "cpu", "float32", "smollm2-135m", chapters)
    labels = [r.label for r in load(a, b, c)]
    assert labels == ["laptop/run", "ci/run", "laptop/run (2)"]
    runs = load(a, tmp_path / "ci" / "run")
    assert [r.label for r in runs] == ["laptop/run", "ci/run"]
    (a / "run.json").write_text(json.dumps({"run_id": "renamed-later", "notebooks": []}))
    assert load(a)[0].label == "run"
