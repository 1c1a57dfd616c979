"""The chapters whose numerics or kernels depend on the dtype, run for real in float32, bfloat16 and
float16 on this device: the quick run covers the dtype that dtype=auto picks, the smoke runs
(tests/conftest.py ``dtype_runs``, profiles/smoke.yaml, the small random Llama) the other two. One
test per dtype and chapter, so a chapter that fails in one dtype is reported by name with its error."""
from __future__ import annotations

import pytest

from conftest import ALL_DTYPES, DTYPE_CHAPTERS
from helpers.results import read_run

pytestmark = pytest.mark.notebooks


def _run_of(dtype_runs, dtype):
    if dtype == dtype_runs["auto"]:
        pytest.skip(f"dtype=auto picked {dtype}: the English run (tests/test_notebooks.py) runs these chapters in it")
    assert dtype in dtype_runs["runs"], f"no run of make test covers {dtype} (the quick run recorded no dtype)"
    run = dtype_runs["runs"][dtype]
    assert run["run"] is not None, (f"the {dtype} run wrote no run.json{run['timed_out']}:\n"
                                    + run["proc"].stdout[-3000:] + run["proc"].stderr[-3000:])
    return run


@pytest.mark.parametrize("chapter", DTYPE_CHAPTERS)
@pytest.mark.parametrize("dtype", ALL_DTYPES)
def test_the_chapter_runs_in_each_dtype(dtype_runs, dtype, chapter):
    run = _run_of(dtype_runs, dtype)
    entry = next((e for e in run["run"]["notebooks"] if e["notebook"] == chapter), None)
    assert entry is not None, f"{chapter} did not run in {dtype}{run['timed_out']}"
    assert entry["status"] == "ok", f"{chapter} in {dtype}: {entry['status']}: {entry.get('error')}"


@pytest.mark.parametrize("chapter", DTYPE_CHAPTERS)
@pytest.mark.parametrize("dtype", ALL_DTYPES)
def test_each_chapter_records_the_dtype_it_ran_in(dtype_runs, dtype, chapter):
    run = _run_of(dtype_runs, dtype)
    found = read_run(run["run_dir"], expected=DTYPE_CHAPTERS).chapters[chapter]
    assert found.data is not None, f"{chapter} in {dtype}: {found.status} {found.reason[-2000:]}"
    choice = found.data.get("device_choice") or {}
    assert choice.get("dtype") == dtype, f"{chapter} asked for {dtype} recorded {choice}"
    assert choice.get("dtype_source") == "the dtype parameter", choice
    assert found.data["parameters"].get("dtype") == dtype, found.data["parameters"]

