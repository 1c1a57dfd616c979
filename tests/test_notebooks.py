"""Every notebook and every solutions notebook, executed with the ``quick`` profile by the runner.

The run happens once per session (about 10 minutes on 2 cores); each notebook is then its own
test, so one failing chapter is reported by name while the others still count. Solutions run
with ``--solutions``, each right after its chapter, and are tested one by one too, so an answer
that stops working fails CI (whether every exercise has an answer is checked in test_hygiene).
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest

REPO = Path(__file__).resolve().parent.parent
NOTEBOOKS = sorted(p.stem for p in (REPO / "notebooks").glob("*.ipynb"))
SOLUTIONS = sorted(p.stem for p in (REPO / "solutions").glob("*_solutions.ipynb"))
# On a CPU shared with other jobs the run can take far longer than its 10 minutes; notebooks
# that finished before the limit are still judged from run.json, the rest fail by name.
RUN_TIMEOUT_S = int(os.environ.get("WORKBOOK_TEST_RUN_TIMEOUT", 40 * 60))

pytestmark = pytest.mark.notebooks


@pytest.fixture(scope="session")
def quick_run(tmp_path_factory):
    reports = tmp_path_factory.mktemp("reports")
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    try:
        proc = subprocess.run(
            [sys.executable, "-m", "helpers.run", "--profile", "quick", "--run-id", "quick",
             "--reports-dir", str(reports), "--solutions"],
            cwd=REPO, env=env, capture_output=True, text=True, timeout=RUN_TIMEOUT_S,
        )
        timed_out = ""
    except subprocess.TimeoutExpired as exc:
        timed_out = f" (the run was stopped after {RUN_TIMEOUT_S} s, WORKBOOK_TEST_RUN_TIMEOUT)"
        proc = SimpleNamespace(returncode=None, stdout=str(exc.stdout or ""), stderr=timed_out)
    run_dir = reports / "quick"
    run = json.loads((run_dir / "run.json").read_text()) if (run_dir / "run.json").exists() else None
    return {"proc": proc, "run_dir": run_dir, "run": run, "timed_out": timed_out}


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
    assert entry["status"] == "ok", f"{notebook}: {entry.get('error')}"
    results = json.loads((quick_run["run_dir"] / notebook / "results.json").read_text())
    assert results["status"] == "ok"
    assert results["metrics"], f"{notebook} recorded no figures"
    for key, figure in results["metrics"].items():
        assert "value" in figure, key


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
