"""Every notebook, executed headlessly with the ``quick`` profile through the real runner.

The run happens once per session (the ``quick_run`` fixture in conftest.py, shared with the
browser test; about 10 minutes on 2 cores); each notebook is then its own
test, so one failing chapter is reported by name while the others still count.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
NOTEBOOKS = sorted(p.stem for p in (REPO / "notebooks").glob("*.ipynb"))

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
    entry = next(e for e in run["notebooks"] if e["notebook"] == notebook)
    assert entry["status"] == "ok", f"{notebook}: {entry.get('error')}"
    results = json.loads((quick_run["run_dir"] / notebook / "results.json").read_text())
    assert results["status"] == "ok"
    assert results["metrics"], f"{notebook} recorded no figures"
    for key, figure in results["metrics"].items():
        assert "value" in figure, key


def test_runner_exit_code_matches_statuses(quick_run):
    failed = [e for e in quick_run["run"]["notebooks"] if e["status"] == "failed"]
    assert (quick_run["proc"].returncode != 0) == bool(failed)
