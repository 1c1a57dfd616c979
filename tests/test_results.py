"""results.json: atomic writes, context kept with every figure, the run-folder reader, clear errors."""
from __future__ import annotations

import json
import math
import os
import signal
import subprocess
import sys
import textwrap

import pandas as pd
import pytest
import torch

from helpers import results
from helpers.bench import Timing
from helpers.results import Results, load_results, metric, read_run, write_json_atomic


def test_record_keeps_value_unit_and_context(tmp_path):
    r = Results("03_end_to_end", tmp_path, parameters={"device": "auto"}, environment={"torch": "x"})
    r.record("decode_tok_s_batch1", 18.5, "tok/s", device="cpu", dtype=torch.bfloat16,
             shape=torch.Size([1, 30]), code_path="HF generate", key_figure=True)
    data = json.loads((tmp_path / "03_end_to_end" / "results.json").read_text())
    entry = data["metrics"]["decode_tok_s_batch1"]
    assert entry == {"value": 18.5, "unit": "tok/s", "device": "cpu", "dtype": "bfloat16",
                     "shape": [1, 30], "code_path": "HF generate"}
    assert data["key_figures"] == ["decode_tok_s_batch1"]
    assert data["parameters"] == {"device": "auto"} and data["status"] == "running"


def test_an_answers_notebook_reads_its_chapter_or_says_how_to_write_it(tmp_path, monkeypatch):
    with pytest.raises(FileNotFoundError, match=r"run_dir=.* has no 04_batching/results.json.*--only 04"):
        results.chapter_results(str(tmp_path), "04_batching")
    Results("04_batching", tmp_path).record("a", 1)
    folder, found = results.chapter_results(str(tmp_path), "04_batching")
    assert folder == tmp_path and metric(found, "a") == 1
    monkeypatch.setenv("WORKBOOK_RUN_DIR", str(tmp_path))  # an empty run_dir is the interactive folder
    assert results.chapter_results("", "04_batching")[0] == tmp_path


def test_every_call_is_saved_immediately_and_finish_sets_status(tmp_path):
    r = Results("x", tmp_path)
    r.record("a", 1)
    assert metric(load_results(tmp_path, "x"), "a") == 1
    r.table("t", pd.DataFrame({"rung": ["eager"], "latency_ms": [1.5]}))
    r.note("n")
    r.finish()
    data = load_results(tmp_path, "x")
    assert data["tables"]["t"] == [{"rung": "eager", "latency_ms": 1.5}]
    assert data["status"] == "ok" and "finished" in data and data["notes"] == ["n"]
    r.finish("skipped", "needs an NPU")
    assert load_results(tmp_path, "x")["status_reason"] == "needs an NPU"
    with pytest.raises(ValueError, match="status='failed'"):
        r.finish("failed")


def test_non_json_values_are_converted(tmp_path):
    r = Results("x", tmp_path)
    r.record("nan", float("nan"))
    r.record("timing", Timing("t", [0.001, 0.002]))
    r.record("tensor", torch.tensor([1.0, 2.0]))
    r.record("device", torch.device("cpu"))
    data = load_results(tmp_path, "x")
    assert data["metrics"]["nan"]["value"] is None
    assert data["metrics"]["timing"]["value"]["median_ms"] == pytest.approx(1.5)
    assert data["metrics"]["tensor"]["value"] == [1.0, 2.0]
    assert data["metrics"]["device"]["value"] == "cpu"


def test_readers_tolerate_missing_and_broken_files(tmp_path):
    assert load_results(tmp_path, "nope") is None
    (tmp_path / "broken").mkdir()
    (tmp_path / "broken" / "results.json").write_text("{ half a fi")
    assert load_results(tmp_path, "broken") is None
    Results("ok", tmp_path).record("k", 2)
    assert metric(load_results(tmp_path, "ok"), "k") == 2
    assert set(read_run(tmp_path).results()) == {"ok"}
    assert metric(None, "k", "d") == "d" and metric(load_results(tmp_path, "ok"), "zz", 0) == 0


def _write(path, data):
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(data if isinstance(data, str) else json.dumps(data))


def test_only_schema_1_is_read_and_anything_else_says_why(tmp_path):
    good = Results("good", tmp_path).data
    cases = {"no_schema": {**good, "schema": None}, "schema_2": {**good, "schema": 2},
             "no_metrics": {k: v for k, v in good.items() if k != "metrics"}, "a_list": [1, 2], "half": "{ half"}
    for name, data in cases.items():
        _write(tmp_path / name / "results.json", data)
    reasons = {name: results.read_results_file(tmp_path / name / "results.json") for name in cases}
    assert all(data is None for data, _ in reasons.values())
    assert reasons["no_schema"][1] == "schema None, but this workbook writes and reads schema 1"
    assert reasons["schema_2"][1].startswith("schema 2, ")
    assert reasons["no_metrics"][1] == "schema 1 without a valid metrics"
    assert reasons["a_list"][1] == "not a JSON object" and reasons["half"][1].startswith("not valid JSON")
    assert results.read_results_file(tmp_path / "good" / "results.json") == (good, "")
    folder = read_run(tmp_path)
    assert {n: c.status for n, c in folder.chapters.items()} == {**{n: "unreadable" for n in cases}, "good": "unfinished"}
    assert "no_schema: unreadable (results.json schema None" in " | ".join(folder.notes)


@pytest.mark.parametrize("file_status, entry, expected", [
    ("ok", {}, ("ok", "")),
    ("skipped", {}, ("skipped", "needs an NPU")),
    ("running", {}, ("unfinished", "results.json still says running")),
    (None, {}, ("not run", "")),
    ("running", {"status": "failed", "error": "ValueError: boom"}, ("failed", "ValueError: boom")),
    (None, {"status": "failed", "error": "kernel died"}, ("failed", "kernel died")),
    ("running", {"status": "ok"}, ("ok", "")),  # the runner saw the notebook finish
    (None, {"status": "ok"}, ("ok", "it wrote no results.json")),
    (None, {"status": "running"}, ("unfinished", "the runner started it")),
    ("done", {}, ("unreadable", "results.json status 'done'")),
])
def test_one_status_from_results_json_and_the_runners_entry(file_status, entry, expected):
    data = None if file_status is None else {"status": file_status,
                                             **({"status_reason": "needs an NPU"} if file_status == "skipped" else {})}
    status, reason = results.chapter_status(data, "" if data else "missing", entry)
    assert status == expected[0] and reason.startswith(expected[1]), (status, reason)
    assert status in results.STATUSES


def test_a_run_folder_merges_run_json_lists_expected_chapters_and_names_the_device(tmp_path):
    with pytest.raises(FileNotFoundError, match="is not a folder"):
        read_run(tmp_path / "nope")
    r = Results("00_environment_check", tmp_path, environment={"device": "cpu"})
    r.record("device", "npu:0")
    r.finish()
    Results("03_end_to_end", tmp_path, environment={"device": "npu:0"})
    folder = read_run(tmp_path, expected=["01_operator_verification"])
    assert folder.notes[0].startswith("run.json missing") and folder.device == "npu:0"
    assert [(c.name, c.status) for c in folder.chapters.values()] == [
        ("00_environment_check", "ok"), ("01_operator_verification", "not run"), ("03_end_to_end", "unfinished")]
    write_json_atomic(tmp_path / "run.json", {"run_id": "r", "notebooks": [
        {"notebook": "03_end_to_end", "status": "failed", "error": "a\nRuntimeError: out of memory"},
        {"notebook": "02_ffn_fusion", "status": "failed", "error": "died before writing"}]})
    folder = read_run(tmp_path)
    assert folder.chapters["03_end_to_end"].status == "failed" and folder.chapters["02_ffn_fusion"].status == "failed"
    assert folder.chapters["03_end_to_end"].entry["error"].endswith("out of memory")
    assert set(folder.results()) == {"00_environment_check", "03_end_to_end"}  # a failed chapter's figures stay
    table = folder.status_table()
    assert list(table["chapter"]) == ["00_environment_check", "02_ffn_fusion", "03_end_to_end"]
    r = Results(results.REPORT_CHAPTER, tmp_path)
    assert results.REPORT_CHAPTER not in read_run(tmp_path).results()  # never one of its own inputs
    assert results.REPORT_CHAPTER in read_run(tmp_path).chapters


@pytest.mark.parametrize("device, cls", [("npu:0", "npu"), ("cuda:1", "cuda"), ("CPU", "cpu"), ("", ""),
                                         ("?", ""), ("unknown (no torch)", ""), ("mps", "")])
def test_device_class_names_one_of_three_classes(device, cls):
    assert results.device_class(device) == cls


def test_interrupt_mid_write_leaves_the_old_file_intact(tmp_path, monkeypatch):
    path = tmp_path / "results.json"
    write_json_atomic(path, {"metrics": {"a": 1}})
    original = path.read_bytes()

    real_dump = json.dump

    def dump_then_interrupt(obj, fh, **kwargs):
        fh.write('{"metrics": {"a": 1, "b": ')  # half of the new content reaches the temp file
        fh.flush()
        raise KeyboardInterrupt

    monkeypatch.setattr(results.json, "dump", dump_then_interrupt)
    with pytest.raises(KeyboardInterrupt):
        write_json_atomic(path, {"metrics": {"a": 1, "b": 2}})
    monkeypatch.setattr(results.json, "dump", real_dump)
    assert path.read_bytes() == original
    assert [p.name for p in tmp_path.iterdir()] == ["results.json"]  # no temp file left behind


def test_killed_writer_process_leaves_the_old_file_intact(tmp_path):
    """SIGKILL in the middle of a large write: the reader still sees the previous complete file."""
    path = tmp_path / "results.json"
    write_json_atomic(path, {"generation": 0})
    code = textwrap.dedent(f"""
        import json, os, sys
        from helpers import results
        real = json.dump
        def slow(obj, fh, **kw):
            fh.write('{{"generation": 1, "pad": "')
            fh.flush()
            os.kill(os.getpid(), 9)
        results.json.dump = slow
        results.write_json_atomic({str(path)!r}, {{"generation": 1}})
    """)
    proc = subprocess.run([sys.executable, "-c", code], cwd=os.path.dirname(results.__file__) + "/..",
                          capture_output=True, timeout=120)
    assert proc.returncode == -signal.SIGKILL
    assert json.loads(path.read_text()) == {"generation": 0}


def test_nan_is_never_written_as_invalid_json(tmp_path):
    path = tmp_path / "r.json"
    write_json_atomic(path, {"v": [math.inf, -math.inf, 1.0]})
    assert json.loads(path.read_text()) == {"v": [None, None, 1.0]}


def test_unwritable_results_folder_names_the_folder_and_the_option(tmp_path):
    blocker = tmp_path / "a_file"
    blocker.write_text("")
    target = blocker / "run" / "results.json"  # a folder below a regular file cannot exist
    with pytest.raises(PermissionError) as err:
        write_json_atomic(target, {})
    message = str(err.value)
    assert str(blocker / "run") in message
    assert "--reports-dir" in message and "WORKBOOK_RUN_DIR" in message


def test_default_run_dir_honours_the_environment(tmp_path, monkeypatch):
    monkeypatch.setenv("WORKBOOK_RUN_DIR", str(tmp_path))
    assert results.default_run_dir() == tmp_path
    assert Results("c").path == tmp_path / "c" / "results.json"


@pytest.mark.parametrize("umask", [0o022, 0o027, 0o077])
def test_results_files_get_the_umask_mode_not_the_temp_file_default(tmp_path, umask):
    old = os.umask(umask)
    try:
        write_json_atomic(tmp_path / "results.json", {"a": 1})
        Results("00_x", run_dir=tmp_path).record("k", 1.0)
        plain = tmp_path / "plain.txt"
        plain.write_text("x")
    finally:
        os.umask(old)
    expected = 0o666 & ~umask
    assert (tmp_path / "results.json").stat().st_mode & 0o777 == expected
    assert (tmp_path / "00_x" / "results.json").stat().st_mode & 0o777 == expected
    assert plain.stat().st_mode & 0o777 == expected
