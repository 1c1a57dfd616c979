"""Every notebook and every solutions notebook, executed with the ``quick`` profile by the runner.

The run happens once per session (the ``quick_run`` fixture in conftest.py, shared with the
browser test; about 10 minutes on 2 cores); each notebook is then its own
test, so one failing chapter is reported by name while the others still count. Solutions run
with ``--solutions``, each right after its chapter, and are tested one by one too, so an answer
that stops working fails CI (whether every exercise has an answer is checked in test_hygiene).
"""
from __future__ import annotations

import json
from pathlib import Path

import pytest

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
    assert entry["status"] == "ok", f"{notebook}: {entry.get('error')}"
    results = json.loads((quick_run["run_dir"] / notebook / "results.json").read_text())
    assert results["status"] == "ok"
    assert_key_figures_are_measured(results, notebook)


def assert_key_figures_are_measured(results: dict, notebook: str) -> None:
    """Each key figure the index shows has a value (NaN and inf are written as null) and, the device
    itself aside, names the code path that measured it."""
    assert results["key_figures"], f"{notebook} marked no key figures for the index"
    for key in results["key_figures"]:
        entry = results["metrics"][key]
        assert entry["value"] is not None, f"{notebook}: key figure {key} has no value: {entry}"
        if key != "device":  # the device is the context of every other figure
            assert entry.get("code_path"), f"{notebook}: key figure {key} does not say how it was measured"


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
