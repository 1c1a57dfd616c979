"""Every notebook and every solutions notebook, executed with the ``quick`` profile by the runner.

The run happens once per session (the ``quick_run`` fixture in conftest.py, shared with the
browser test; about 10 minutes on 2 cores); each notebook is then its own
test, so one failing chapter is reported by name while the others still count. Solutions run
with ``--solutions``, each right after its chapter, and are tested one by one too, so an answer
that stops working fails CI (whether every exercise has an answer is checked in test_hygiene).
"""
from __future__ import annotations

import json
import os
import warnings
from pathlib import Path

import psutil
import pytest

from helpers import serving

REPO = Path(__file__).resolve().parent.parent
NOTEBOOKS = sorted(p.stem for p in (REPO / "notebooks").glob("*.ipynb"))
SOLUTIONS = sorted(p.stem for p in (REPO / "solutions").glob("*_solutions.ipynb"))

pytestmark = pytest.mark.notebooks


def test_runner_wrote_index(quick_run):
    assert quick_run["run"] is not None, quick_run["proc"].stdout + quick_run["proc"].stderr
    assert (quick_run["run_dir"] / "index.html").exists()
    ran = [e["notebook"] for e in quick_run["run"]["notebooks"]]
    assert ran == NOTEBOOKS


@pytest.mark.parametrize("notebook", NOTEBOOKS)
def test_notebook_runs_with_quick_profile(quick_run, notebook):
    run = quick_run["run"]
    assert run is not None, quick_run["proc"].stdout + quick_run["proc"].stderr
    entry = next((e for e in run["notebooks"] if e["notebook"] == notebook), None)
    assert entry is not None, f"{notebook} did not run{quick_run['timed_out']}"
    results = json.loads((quick_run["run_dir"] / notebook / "results.json").read_text())
    if notebook == SERVING and entry["status"] == "skipped":
        _vllm_skip_is_justified(results)
    assert entry["status"] == "ok", f"{notebook}: {entry.get('error')}"
    assert results["status"] == "ok"
    assert results["metrics"], f"{notebook} recorded no figures"
    for key, figure in results["metrics"].items():
        assert "value" in figure, key


SERVING = "07_serving"


def _vllm_skip_is_justified(results):
    """The serving chapter may be skipped only when scripts/setup_vllm.sh could not build vLLM here;
    then the run says so loudly instead of passing quietly."""
    marker = serving.VLLM_VENV / serving.UNAVAILABLE_FILE
    if not marker.is_file():
        pytest.fail(f"{SERVING} was skipped although the vLLM venv was built: {results.get('status_reason')}")
    why = marker.read_text().strip()
    warnings.warn(f"VLLM UNAVAILABLE: {SERVING} started no server in this test run: {why}")
    pytest.skip(f"VLLM UNAVAILABLE (the venv could not be built: {why}); {SERVING} measured nothing")


def test_the_serving_chapter_served_and_left_no_process(quick_run):
    """make test starts the real vLLM server once (quick profile); every request of its sweep
    succeeded, the log is kept, and no process of the server's group outlived the run."""
    path = quick_run["run_dir"] / SERVING / "results.json"
    assert path.exists(), f"{SERVING} did not run{quick_run['timed_out']}"
    results = json.loads(path.read_text())
    if results["status"] == "skipped":
        _vllm_skip_is_justified(results)
    start = results["metrics"]["vllm_server_start_s"]
    assert (quick_run["run_dir"] / SERVING / "vllm_server.log").exists()
    sweep = results["tables"]["sweep"]
    assert [r["concurrency"] for r in sweep] == [1, 2] and all(r["failed"] == 0 for r in sweep), sweep
    assert all(r["output_tokens"] == r["requests"] * r["output_len"] for r in sweep)
    left = [p.pid for p in psutil.process_iter() if _pgid(p) == start["server_pgid"]]
    assert not left, f"processes of the vLLM server's group are still running: {left}"


def _pgid(process):
    try:
        return os.getpgid(process.pid)
    except (ProcessLookupError, PermissionError):
        return None


@pytest.mark.parametrize("solution", SOLUTIONS)
def test_solution_runs_after_its_chapter(quick_run, solution):
    run = quick_run["run"]
    assert run is not None, quick_run["proc"].stdout + quick_run["proc"].stderr
    chapter = solution[: -len("_solutions")]
    entry = next((e for e in run["notebooks"] if e["notebook"] == chapter), None)
    answer = (entry or {}).get("solution")
    assert answer is not None, f"{solution} did not run after {chapter}{quick_run['timed_out']}"
    assert answer["status"] == "ok", f"{solution}: {answer.get('error') or answer.get('reason')}"
    executed = quick_run["run_dir"] / f"{solution}.ipynb"
    assert executed.exists() and executed.with_suffix(".html").exists()
    page = (quick_run["run_dir"] / "index.html").read_text()
    assert f'href="{solution}.html"' in page


def test_runner_exit_code_matches_statuses(quick_run):
    assert not quick_run["timed_out"], quick_run["timed_out"]
    entries = quick_run["run"]["notebooks"]
    failed = [e for e in entries if e["status"] == "failed"
              or (e.get("solution") or {}).get("status") == "failed"]
    assert (quick_run["proc"].returncode != 0) == bool(failed)
