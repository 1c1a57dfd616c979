"""The papermill runner: keeps going after a failed or crashed notebook and reports it.

Runs ``python -m helpers.run`` as a subprocess on the fixture notebooks in
``tests/fixtures/runner_notebooks`` (they do not import torch, so each takes about a second).
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import nbformat
import pytest

from helpers import run as runner

REPO = Path(__file__).resolve().parent.parent
FIXTURES = REPO / "tests" / "fixtures" / "runner_notebooks"


# Credentials a user may have exported; none may reach a report file.
SECRETS = {"HF_TOKEN": "hf_" + "C" * 34, "AWS_SECRET_ACCESS_KEY": "aws-secret-value-456",
           "MODELSCOPE_API_TOKEN": "ms-secret-value-123", "OBS_SECRET_KEY": "obs-secret-value-789"}


def run_cli(*args, timeout=240):
    return subprocess.run([sys.executable, "-m", "helpers.run", "--notebooks-dir", str(FIXTURES),
                           "--no-html", *map(str, args)], cwd=REPO, capture_output=True, text=True,
                          timeout=timeout, env={**os.environ, **SECRETS})


@pytest.fixture(scope="module")
def profile_file(tmp_path_factory):
    path = tmp_path_factory.mktemp("profiles") / "fixture.yaml"
    path.write_text(textwrap.dedent("""\
        cell_timeout: 120
        all:
          value: 2
        notebooks:
          04_after:
            value: 3
    """))
    return path


@pytest.fixture(scope="module")
def failing_run(tmp_path_factory, profile_file):
    """One run over ok, failing, dying and ok notebooks (in that order)."""
    reports = tmp_path_factory.mktemp("reports")
    proc = run_cli("--profile", profile_file, "--reports-dir", reports, "--run-id", "r1",
                   "--only", "01", "02", "03", "04", "-p", "nap=0")
    run_dir = reports / "r1"
    return proc, run_dir, json.loads((run_dir / "run.json").read_text())


def _entry(run, name):
    return next(e for e in run["notebooks"] if e["notebook"] == name)


def test_exit_code_is_non_zero_and_failures_are_named(failing_run):
    proc, _, run = failing_run
    assert proc.returncode == 1, proc.stdout + proc.stderr
    assert "FAILED notebooks: 02_fails, 03_dies" in proc.stderr
    assert run["status"] == "failed"
    assert [e["status"] for e in run["notebooks"]] == ["ok", "failed", "failed", "ok"]


def test_the_run_goes_on_after_a_failure(failing_run):
    _, run_dir, run = failing_run
    after = json.loads((run_dir / "04_after" / "results.json").read_text())
    assert after["status"] == "ok"
    assert _entry(run, "04_after")["status"] == "ok"


def test_failing_notebook_is_kept_with_papermills_error_banner(failing_run):
    _, run_dir, run = failing_run
    entry = _entry(run, "02_fails")
    assert entry["error"] == "ValueError: deliberate failure for the runner test"
    assert entry["failure"] == "error"
    nb = nbformat.read(str(run_dir / "02_fails.ipynb"), as_version=4)
    banner = [c for c in nb.cells if "papermill-error-cell-tag" in str(c.get("metadata", {}))]
    assert banner, "papermill's error banner is missing"
    outputs = [o for c in nb.cells if c.cell_type == "code" for o in c.outputs]
    assert any(o.get("ename") == "ValueError" for o in outputs)


def test_kernel_death_is_reported_as_such_not_a_hang(failing_run):
    _, run_dir, run = failing_run
    entry = _entry(run, "03_dies")
    assert entry["failure"] == "kernel_died"
    assert entry["error"].startswith("kernel died")
    assert entry["duration_s"] < 120  # the cell timeout: the runner noticed, it did not wait it out
    nb = nbformat.read(str(run_dir / "03_dies.ipynb"), as_version=4)
    assert "workbook-failure" in nb.cells[0].metadata.get("tags", [])
    assert "kernel died" in nb.cells[0].source


def test_index_lists_every_notebook_with_status_figures_and_links(failing_run):
    _, run_dir, _ = failing_run
    page = (run_dir / "index.html").read_text()
    for name in ("01_ok", "02_fails", "03_dies", "04_after"):
        assert f"<td>{name}</td>" in page
    assert page.count("<tr class='failed'>") == 2 and page.count("<tr class='ok'>") == 2
    assert 'href="02_fails.ipynb"' in page and 'href="04_after/results.json"' in page
    assert "deliberate failure for the runner test" in page and "kernel died" in page
    # a key figure read back from results.json, labelled by helpers.report (the raw key as tooltip)
    assert 'title="fixture_value">fixture value: <b>3 count</b>' in page and ">cpu</span>" in page


def test_profile_values_and_overrides_are_injected(failing_run):
    _, run_dir, run = failing_run
    first = json.loads((run_dir / "01_ok" / "results.json").read_text())
    after = json.loads((run_dir / "04_after" / "results.json").read_text())
    assert first["parameters"] == {"value": 2, "profile": "fixture"}  # `all`
    assert after["parameters"]["value"] == 3  # the notebook's own section wins over `all`
    assert _entry(run, "01_ok")["parameters"]["run_dir"] == str(run_dir)
    assert run["overrides"] == {"nap": 0}
    assert _entry(run, "04_after")["ignored_overrides"] == ["nap"]  # only 05_naps declares it


def test_the_kernel_tcp_warning_is_silenced(failing_run):
    proc, _, _ = failing_run
    assert "without encryption" not in proc.stderr + proc.stdout


def test_run_files_never_include_secrets(failing_run):
    _, run_dir, _ = failing_run
    files = [p for p in run_dir.rglob("*") if p.is_file()]
    assert len(files) >= 6
    for path in files:
        text = path.read_text(errors="replace")
        assert not any(value in text for value in SECRETS.values()), path.name


# --- in-process checks of the argument handling (no kernels) ---------------------------------

def test_command_line_overrides_win_and_unknown_ones_are_reported(tmp_path):
    profile = {"name": "p", "all": {"value": 2}, "notebooks": {"01_ok": {"value": 3}}}
    chosen = runner.notebook_parameters(FIXTURES / "01_ok.ipynb", profile,
                                        {"value": 9, "batch_size": 4}, tmp_path)
    assert chosen["parameters"] == {"value": 9, "run_dir": str(tmp_path), "profile": "p"}
    assert chosen["ignored_overrides"] == ["batch_size"]


def test_overrides_are_yaml_literals():
    assert runner.parse_overrides(["batch_sizes=[1, 2]", "device=cpu", "flag=true", "x="]) == {
        "batch_sizes": [1, 2], "device": "cpu", "flag": True, "x": ""}
    with pytest.raises(SystemExit, match=r"-p 'device': use -p name=value"):
        runner.parse_overrides(["device"])


def test_unknown_profile_names_the_choices():
    with pytest.raises(SystemExit) as err:
        runner.load_profile("fastest")
    assert "--profile 'fastest' not found; choose one of default, npu, quick" in str(err.value)


def test_unknown_notebook_selection_names_the_choices():
    with pytest.raises(SystemExit, match=r"--only 99: no such notebook; choose from 01_ok, 02_fails"):
        runner.select_notebooks(FIXTURES, ["99"])
    assert [p.stem for p in runner.select_notebooks(FIXTURES, ["01", "04_after"])] == ["01_ok", "04_after"]


def test_unwritable_reports_folder_is_a_clear_error(tmp_path, capsys):
    blocker = tmp_path / "a_file"
    blocker.write_text("")
    code = runner.main(["--profile", "quick", "--reports-dir", str(blocker), "--run-id", "x",
                        "--notebooks-dir", str(FIXTURES), "--only", "01"])
    err = capsys.readouterr().err
    assert code == 2
    assert str(blocker / "x") in err and "--reports-dir" in err and "WORKBOOK_REPORTS" in err


def test_resume_without_an_earlier_run_is_a_clear_error(tmp_path):
    with pytest.raises(SystemExit, match="--resume needs --run-id"):
        runner.main(["--profile", "quick", "--reports-dir", str(tmp_path), "--resume",
                     "--notebooks-dir", str(FIXTURES)])


def test_every_profile_is_a_mapping_with_known_notebooks():
    real = {p.stem for p in (REPO / "notebooks").glob("*.ipynb")}
    for name in runner.available_profiles():
        profile = runner.load_profile(name)
        assert isinstance(profile["all"], dict) and isinstance(profile["notebooks"], dict)
        assert real <= set(profile["notebooks"]), f"profile {name} misses {real - set(profile['notebooks'])}"
        assert "trust_remote_code" not in json.dumps(profile)  # off unless a user sets it
