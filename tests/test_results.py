"""results.json: atomic writes, context kept with every figure, read-back helpers, clear errors."""
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
from helpers.results import Results, load_all, load_results, metric, write_json_atomic


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
    assert set(load_all(tmp_path)) == {"ok"}
    assert metric(None, "k", "d") == "d" and metric(load_results(tmp_path, "ok"), "zz", 0) == 0


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
