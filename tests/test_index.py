"""The runner's index page: readable key figures (label, unit, direction, rounding) and verdict counts."""
from __future__ import annotations

import json
import os
import re
from pathlib import Path

import pytest

from helpers import claims, prose, report, run
from helpers.results import REPORT_CHAPTER, Results, write_json_atomic

REPO = Path(__file__).resolve().parent.parent
# The figures other chapters promise to record as key figures (shared interface of the chapters).
PROMISED_KEYS = ("ladder_best_batch1_speedup", "ladder_batch_throughput_ratio", "graph_compiled_graphs",
                 "graph_compile_s", "ladder_tok_s_native_eager", "batch_throughput_ratio_8",
                 "int8_decode_speedup_batch1", "claims_total", "claims_contradicted")


def recorded_key_figures() -> set[str]:
    """Keys the notebooks record with key_figure set (f-string keys with their placeholder)."""
    keys = set()
    for path in sorted((REPO / "notebooks").glob("*.ipynb")) + sorted((REPO / "solutions").glob("*.ipynb")):
        for cell in json.loads(path.read_text())["cells"]:
            source = "".join(cell["source"])
            for match in re.finditer(r'record\(\s*f?"([A-Za-z0-9_{}\[\]"]+)"(.{0,400}?)\)', source, re.S):
                if "key_figure" in match.group(2):
                    keys.add(re.sub(r"\{[^}]*\}", "8", match.group(1)))
    return keys


def test_every_key_figure_of_the_notebooks_has_a_label_and_direction():
    keys = recorded_key_figures() | set(PROMISED_KEYS)
    assert len(keys) > 10  # the scan found the notebooks' figures
    unlabelled = [k for k in keys if report.key_figure_label(k)[0] == k.replace("_", " ")]
    assert not unlabelled, f"add these keys to report.KEY_FIGURE_LABELS: {unlabelled}"
    for key in keys:
        assert report.key_figure_label(key)[1] in ("higher", "lower", "")


def test_unknown_keys_fall_back_to_their_name():
    assert report.key_figure_label("made_up_metric") == ("made up metric", "")


def test_prefix_keys_name_their_batch_or_rung():
    assert report.key_figure_label("int8_decode_speedup_batch8") == ("INT8 decode speedup over dense, batch 8",
                                                                       "higher")
    assert report.key_figure_label("ladder_tok_s_fused_ops")[0] == "ladder rung fused ops decode speed"


@pytest.mark.parametrize("value, text", [
    (0.97474, "0.975"), (1.6512, "1.65"), (1.0, "1.00"), (0.5, "0.500"), (51.27, "51.3"), (768.4, "768"), (12345.6, "12,346"),
    (9.765625e-4, "0.000977"), (0.0, "0"), (True, "yes"), (False, "no"), (None, "–"), (7, "7"),
    (float("nan"), "–"), ("cpu", "cpu")])
def test_rounding(value, text):
    """The index shows a key figure as the chapters' sentences do (``prose.format_number``)."""
    assert prose.format_number(value) == text


def test_a_key_figure_reads_as_label_value_unit_and_direction():
    d = report.describe_key_figure("ffn_merged_speedup_decode", {"value": 0.97474, "unit": "x", "device": "cpu",
                                                                 "dtype": "float32", "shape": "batch 1"})
    assert d == {"key": "ffn_merged_speedup_decode", "label": "merged gate/up FFN speedup at decode shape",
                 "value": "0.975×", "direction": "higher is better", "context": "cpu, float32, batch 1",
                 "spread": ""}
    assert report.describe_key_figure("ttft_ms", {"value": 69.23, "unit": "ms"})["value"] == "69.2 ms"
    assert report.describe_key_figure("ttft_ms", {"value": 69.23, "unit": "ms"})["direction"] == "lower is better"


def _small_run(run_dir: Path, with_report: bool, counts=()) -> dict:
    res = Results("02_ffn_fusion", run_dir, environment={"device": "cpu"})
    res.record("ffn_merged_speedup_decode", 0.97474, "x", key_figure=True, device="cpu", dtype="float32")
    res.finish()
    entries = [{"notebook": "02_ffn_fusion", "status": "ok", "duration_s": 1.0}]
    if with_report:
        res = Results(REPORT_CHAPTER, run_dir)
        res.table("verdict_counts", [{"verdict_class": c, "claims": n} for c, n in counts])
        res.finish()
        entries.append({"notebook": REPORT_CHAPTER, "status": "ok", "duration_s": 1.0})
    data = {"run_id": run_dir.name, "profile": "quick", "started": "now", "status": "ok",
            "environment": {"device": "cpu"}, "notebooks": entries}
    write_json_atomic(run_dir / "run.json", data)
    return data


def test_index_prints_labels_and_the_report_chapters_own_verdict_counts(tmp_path, monkeypatch):
    """The report chapter may audit other runs' folders too: the index shows its table, never a recount."""
    def boom(*a, **k):
        raise AssertionError("the report chapter recorded its counts; the index must not audit again")
    monkeypatch.setattr(claims, "verdicts", boom)
    data = _small_run(tmp_path, True, [("reproduced", 2), ("measured on other hardware", 9)])
    page = run.write_index(tmp_path, data).read_text()
    assert "merged gate/up FFN speedup at decode shape: <b>0.975×</b>" in page
    assert "higher is better" in page
    assert "0.9747" not in page
    assert ('<td class="verdict v-measured-on-other-hardware" data-verdict-class="measured on other hardware"'
            in page and "<td>9</td>" in page)
    assert '<td class="verdict v-reproduced" data-verdict-class="reproduced"' in page and "<td>2</td>" in page
    assert "(11 claims)" in page


def test_one_claim_is_one_claim_in_both_languages(tmp_path):
    data = _small_run(tmp_path, True, [("reproduced", 1)])
    page = run.write_index(tmp_path, data).read_text()
    assert "(1 claim)" in page and "1 claims" not in page
    entry = {"value": 1, "unit": "claims"}
    assert report.describe_key_figure("claims_reproduced", entry)["value"] == "1 claim"
    assert report.describe_key_figure("claims_reproduced", {"value": 3, "unit": "claims"})["value"] == "3 claims"
    assert report.describe_key_figure("decode_step_launches", {"value": 1, "unit": "ops"})["value"] == "1 op"
    assert report.describe_key_figure("claims_reproduced", entry, lang="zh")["value"] == "1 条"
    data["lang"] = "zh"
    assert "（共 1 条）" in run.write_index(tmp_path, data).read_text()


def test_a_verdict_class_is_one_css_class_whatever_its_words():
    """``class="measured on other hardware"`` would be four classes, and ``.contradicted`` would match
    "contradicted by sources": every badge carries the class's slug as one class."""
    from helpers import pages

    html = pages.environment("en").from_string(
        '{% import "macros.html.j2" as m with context %}{{ m.badge(c, c, {}) }}').render(
        c="contradicted by sources", C={}, L={})
    classes = re.search(r'class="([^"]*)"', html).group(1).split()
    assert classes == ["badge", "v-contradicted-by-sources"]
    assert 'data-verdict-class="contradicted by sources"' in html


def test_the_device_figure_does_not_repeat_its_device():
    d = report.describe_key_figure("device", {"value": "cpu", "unit": "", "device": "cpu", "dtype": "bfloat16"})
    assert d["value"] == "cpu" and d["context"] == "bfloat16"  # was "cpu" beside "cpu, bfloat16": "cpu cpu"


def test_a_ratio_from_too_few_samples_says_so_on_the_index():
    entry = {"value": 1.6, "unit": "x", "low": 1.5, "high": 1.7}
    few = report.describe_key_figure("graph_mode_decode_speedup", entry, samples=2)
    assert few["spread"] == "(p10–p90 1.50–1.70: too few samples to say a direction: 2 of 5)"
    assert report.describe_key_figure("graph_mode_decode_speedup", entry, samples=5)["spread"] == "(p10–p90 1.50–1.70)"
    assert "count not recorded" in report.describe_key_figure("graph_mode_decode_speedup", entry)["spread"]


def test_the_index_warns_beside_the_figures_of_a_chapter_measured_under_load(tmp_path):
    data = _small_run(tmp_path, with_report=False)
    path = tmp_path / "02_ffn_fusion" / "results.json"
    recorded = json.loads(path.read_text())
    busy = [{"pid": 4242, "name": "stress-ng", "cpu_pct": 97.0}]
    recorded["load"] = {"start": {"load_1m": 4.8, "cores": 2, "load_per_core": 2.4, "threshold_per_core": 1.0,
                                  "under_load": True, "busy": busy},
                        "end": {"load_1m": 0.4, "cores": 2, "load_per_core": 0.2, "threshold_per_core": 1.0,
                                "under_load": False, "busy": []}}
    write_json_atomic(path, recorded)
    page = run.write_index(tmp_path, data).read_text()
    assert "CPU load average 4.8 on 2 cores (2.40 per core, above 1) at the start" in page
    assert "stress-ng (4242, 97 %)" in page and "at the end" not in page
    assert "measured under load (load average per core above 1): 02_ffn_fusion" in page
    data["lang"] = "zh"
    assert "CPU 平均负载 4.8" in run.write_index(tmp_path, data).read_text()
    # two chapters under load: listed with the page's own separator
    two = {**data, "notebooks": [*data["notebooks"], {"notebook": "03_end_to_end", "status": "ok", "duration_s": 1.0}]}
    Results("03_end_to_end", tmp_path, environment={"device": "cpu"}).finish()
    other = tmp_path / "03_end_to_end" / "results.json"
    write_json_atomic(other, {**json.loads(other.read_text()), "load": recorded["load"]})
    assert "02_ffn_fusion、03_end_to_end" in run.write_index(tmp_path, two).read_text()
    assert "02_ffn_fusion, 03_end_to_end" in run.write_index(tmp_path, {**two, "lang": "en"}).read_text()
    write_json_atomic(other, {k: v for k, v in json.loads(other.read_text()).items() if k != "load"})
    recorded["load"]["start"]["under_load"] = False
    write_json_atomic(path, recorded)
    assert "under load" not in run.write_index(tmp_path, {**data, "lang": "en"}).read_text()


def test_index_without_a_finished_report_chapter_has_no_verdict_section(tmp_path):
    page = run.write_index(tmp_path, _small_run(tmp_path, with_report=False)).read_text()
    assert "data-verdict-class" not in page
    data = _small_run(tmp_path, True, [("reproduced", 2)])
    data["notebooks"][-1].update(status="failed", error="RuntimeError: the audit broke")
    page = run.write_index(tmp_path, data).read_text()
    assert "data-verdict-class" not in page and "RuntimeError: the audit broke" in page
    assert "merged gate/up FFN speedup" in page


def test_index_lists_every_chapter_of_the_folder_in_one_status_vocabulary(tmp_path):
    data = _small_run(tmp_path, with_report=False)
    Results("03_end_to_end", tmp_path).record("ttft_ms", 70.0, "ms", key_figure=True)  # never finished
    (tmp_path / "04_batching").mkdir()
    (tmp_path / "04_batching" / "results.json").write_text(json.dumps({"schema": 2, "metrics": {}}))
    page = run.write_index(tmp_path, data).read_text()
    assert "<tr class='ok'><td>02_ffn_fusion</td>" in page
    assert "<tr class='unfinished'><td>03_end_to_end</td>" in page and "time to first token" in page
    assert "results.json still says running" in page
    assert "<tr class='unreadable'><td>04_batching</td>" in page and "schema 2, but this workbook" in page
    with pytest.raises(ValueError, match="lang='fr'"):
        report.describe_key_figure("ttft_ms", {"value": 1.0}, lang="fr")


def test_report_pages_are_readable_by_others_under_the_usual_umask(tmp_path):
    import pandas as pd

    audit = pd.DataFrame([{"id": "C1", "seed": "s", "section": "x", "text_zh": "测试", "gloss_en": "g",
                           "claimed_value": "1", "unit": "", "hardware": "", "model": "", "rule": "ratio",
                           "args": "", "verdict": "reproduced", "verdict_class": "reproduced", "detail": "d",
                           "evidence": "computed", "elsewhere": "", "elsewhere_run": "", "decided_by": "",
                           "device_class": ""}])
    old = os.umask(0o022)
    try:
        data = _small_run(tmp_path, with_report=False)
        index = run.write_index(tmp_path, data)
        page = report.write_claims_report(tmp_path / REPORT_CHAPTER / "claims_report.html", "r", audit)
    finally:
        os.umask(old)
    for path in (index, page, tmp_path / "run.json", tmp_path / "02_ffn_fusion" / "results.json"):
        assert path.stat().st_mode & 0o777 == 0o644, path


def test_a_ratio_inside_its_noise_says_so_on_the_index():
    inside = report.describe_key_figure("ffn_merged_speedup_decode",
                                        {"value": 1.05, "unit": "x", "low": 0.91, "high": 1.23}, samples=5)
    assert inside["spread"] == "(p10–p90 0.910–1.23: no difference beyond the noise)"
    apart = report.describe_key_figure("graph_mode_decode_speedup",
                                       {"value": 1.6, "unit": "x", "low": 1.5, "high": 1.7}, samples=5)
    assert apart["spread"] == "(p10–p90 1.50–1.70)"
    assert report.describe_key_figure("ttft_ms", {"value": 80.0, "unit": "ms"})["spread"] == ""
