"""Every notebook and every solutions notebook, executed with the ``smoke`` profile by the runner.

The run happens once per session (the ``en_run`` fixture in conftest.py, shared with the
browser test; minutes on 2 cores, beside the Chinese and dtype runs); each notebook is then its own
test, so one failing chapter is reported by name while the others still count. Solutions run
with ``--solutions``, each right after its chapter, and are tested one by one too, so an answer
that stops working fails CI (whether every exercise has an answer is checked in test_hygiene).
The Chinese edition's run (``zh_run``: every chapter of ``notebooks/zh`` and its answer, on the small
random Llama) is checked here too: the Chinese notebooks ran, and they recorded what the English ones
recorded.
"""
from __future__ import annotations

import json
import os
import signal
import textwrap
import time
import warnings
from pathlib import Path

import psutil
import pytest

from helpers import decide, ladder, serving
from helpers import run as runner

REPO = Path(__file__).resolve().parent.parent
NOTEBOOKS = sorted(p.stem for p in (REPO / "notebooks").glob("*.ipynb"))
SOLUTIONS = sorted(p.stem for p in (REPO / "solutions").glob("*_solutions.ipynb"))

pytestmark = pytest.mark.notebooks


def test_runner_wrote_index(en_run):
    assert en_run["run"] is not None, en_run["proc"].stdout + en_run["proc"].stderr
    assert (en_run["run_dir"] / "index.html").exists()
    ran = [e["notebook"] for e in en_run["run"]["notebooks"]]
    assert ran == NOTEBOOKS


@pytest.mark.parametrize("notebook", NOTEBOOKS)
def test_notebook_runs(en_run, notebook):
    run = en_run["run"]
    assert run is not None, en_run["proc"].stdout + en_run["proc"].stderr
    entry = next((e for e in run["notebooks"] if e["notebook"] == notebook), None)
    assert entry is not None, f"{notebook} did not run{en_run['timed_out']}"
    results = json.loads((en_run["run_dir"] / notebook / "results.json").read_text())
    if notebook == SERVING and entry["status"] == "skipped":
        _vllm_skip_is_justified(results)
    assert entry["status"] == "ok", f"{notebook}: {entry.get('error')}"
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


def test_the_ladder_table_records_its_counts_as_whole_numbers(en_run):
    # chapter 06 records its table twice (after the rungs, again with the reference columns);
    # both go through ladder.ladder_rows, else pandas' floats come back ("2.00 graphs built")
    path = en_run["run_dir"] / "06_optimization_ladder" / "results.json"
    rows = json.loads(path.read_text())["tables"]["ladder"]
    assert rows and all("vs_float32_eager" in r for r in rows)  # the second recording
    counts = [r[k] for r in rows for k in ladder.COUNT_COLUMNS if r.get(k) is not None]
    assert counts and all(type(c) is int for c in counts), counts


def test_the_serving_chapter_served_and_left_no_process(en_run):
    """make test starts the real vLLM server (smoke profile, eager); every request of its sweep
    succeeded, the log is kept, and no process of the server's group outlived the run."""
    path = en_run["run_dir"] / SERVING / "results.json"
    assert path.exists(), f"{SERVING} did not run{en_run['timed_out']}"
    results = json.loads(path.read_text())
    if results["status"] == "skipped":
        _vllm_skip_is_justified(results)
    start = results["metrics"]["vllm_server_start_s"]
    assert (en_run["run_dir"] / SERVING / "vllm_server.log").exists()
    sweep = results["tables"]["sweep"]
    assert [r["concurrency"] for r in sweep] == [1, 2] and all(r["failed"] == 0 for r in sweep), sweep
    assert all(r["output_tokens"] == r["requests"] * r["output_len"] for r in sweep)
    left = _group(start["server_pgid"])
    assert not left, f"processes of the vLLM server's group are still running: {left}"


def _pgid(process):
    try:
        return os.getpgid(process.pid)
    except (ProcessLookupError, PermissionError):
        return None


@pytest.mark.parametrize("solution", SOLUTIONS)
def test_solution_runs_after_its_chapter(en_run, solution):
    run = en_run["run"]
    assert run is not None, en_run["proc"].stdout + en_run["proc"].stderr
    chapter = solution[: -len("_solutions")]
    entry = next((e for e in run["notebooks"] if e["notebook"] == chapter), None)
    answer = (entry or {}).get("solution")
    assert answer is not None, f"{solution} did not run after {chapter}{en_run['timed_out']}"
    assert answer["status"] == "ok", f"{solution}: {answer.get('error') or answer.get('reason')}"
    executed = en_run["run_dir"] / f"{solution}.ipynb"
    assert executed.exists() and executed.with_suffix(".html").exists()
    # every decision an answer prints is phrased (prose.say), never its key ("too few samples: 2 of 5")
    shown = json.dumps([o for c in json.loads(executed.read_text())["cells"] for o in c.get("outputs", [])])
    assert decide.TOO_FEW + ":" not in shown, f"{solution} printed a decision's key instead of its phrase"
    page = (en_run["run_dir"] / "index.html").read_text()
    assert f'href="{solution}.html"' in page


def test_runner_exit_code_matches_statuses(en_run):
    assert not en_run["timed_out"], en_run["timed_out"]
    entries = en_run["run"]["notebooks"]
    failed = [e for e in entries if e["status"] == "failed"
              or (e.get("solution") or {}).get("status") == "failed"]
    assert (en_run["proc"].returncode != 0) == bool(failed)


def test_killing_the_kernel_mid_sweep_stops_the_real_vllm_server(en_run, tmp_path):
    """The real server, started from a Jupyter kernel as chapter 07 starts it (eager, as make test's
    runs start it: what is checked is the process group, not the compile), streaming when the
    kernel is SIGKILLed: nothing of it may remain."""
    from jupyter_client.manager import start_new_kernel

    try:
        serving.find_vllm("cpu")
    except serving.ServingUnavailable:
        _vllm_skip_is_justified({"status_reason": "no vLLM here"})
    info = tmp_path / "server.json"
    code = textwrap.dedent(f"""
        import json, sys
        sys.path.insert(0, {str(REPO)!r})
        from helpers import serving
        launch = serving.launch("cpu", "smollm2-135m", "bfloat16", {str(tmp_path)!r}, port=8000, kv_cache_gib=1,
                                enforce_eager=True)
        launch.server.wait_healthy(900)
        open({str(info)!r}, "w").write(json.dumps({{"pgid": launch.server.process.pid,
                                                  "port": launch.server.port}}))
        serving.run_level(launch.url, serving.served_model_id(launch.url), [[1] * 8] * 8, 512, 2)
    """)
    km, kc = start_new_kernel(kernel_name="python3")
    try:
        kc.execute(code)
        deadline = time.monotonic() + 960
        while not info.exists() and time.monotonic() < deadline and km.is_alive():
            time.sleep(1)
        assert info.exists(), "the vLLM server did not become healthy: " + serving.log_tail(tmp_path / "vllm_server.log")
        server = json.loads(info.read_text())
        time.sleep(3)  # the requests are streaming now
        os.kill(km.provisioner.pid, signal.SIGKILL)
    finally:
        kc.stop_channels()
        if km.is_alive():
            km.shutdown_kernel(now=True)
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline and _group(server["pgid"]):
        time.sleep(1)
    assert not _group(server["pgid"]), f"vLLM processes outlived the kernel: {_group(server['pgid'])}"
    port = f"--port {server['port']}"
    assert not [p.pid for p in psutil.process_iter(["cmdline"])
                if "vllm.entrypoints" in " ".join(p.info["cmdline"] or []) and port in " ".join(p.info["cmdline"] or [])]


# --- the Chinese edition (notebooks/zh): the same code, so the same figures, in Chinese prose -------

MEASURING = [name for name in NOTEBOOKS if name not in ("00_environment_check", "08_report")]


def _zh_entries(zh_run):
    run = zh_run["run"]
    assert run is not None, zh_run["proc"].stdout[-3000:] + zh_run["proc"].stderr[-3000:]
    return run, {e["notebook"]: e for e in run["notebooks"]}


def test_the_chinese_run_executed_every_chinese_notebook_and_answer(zh_run):
    run, entries = _zh_entries(zh_run)
    assert run["lang"] == "zh" and list(entries) == NOTEBOOKS == zh_run["chapters"], (run.get("lang"), list(entries))
    for name, entry in entries.items():
        assert entry["status"] == "ok", f"notebooks/zh/{name}: {entry.get('error')}{zh_run['timed_out']}"
        results = json.loads((zh_run["run_dir"] / name / "results.json").read_text())
        assert results["status"] == "ok" and results["parameters"]["lang"] == "zh", results["parameters"]
        assert_key_figures_are_measured(results, f"zh/{name}")
        # the notebook that ran is the Chinese edition (its markdown), and lang=auto resolved to zh above,
        # so its summaries came from the chapter's template in Chinese (its zh catalog)
        executed = json.loads((zh_run["run_dir"] / f"{name}.ipynb").read_text(encoding="utf-8"))
        source = json.loads((REPO / "notebooks" / "zh" / f"{name}.ipynb").read_text(encoding="utf-8"))
        # (the executed copy's links to the repository's files are made relative to the run folder)
        expected = [runner.relink(text, REPO / "notebooks" / "zh", zh_run["run_dir"]) for text in _markdown(source)]
        assert _markdown(executed) == expected, f"{name}: the executed notebook is not notebooks/zh/{name}"
        answer = entry.get("solution") or {}
        assert answer.get("status") == "ok", f"solutions/zh/{name}_solutions: {answer.get('error') or answer.get('reason')}"


def _markdown(nb: dict) -> list[str]:
    return ["".join(c["source"]) for c in nb["cells"] if c["cell_type"] == "markdown"]


def test_the_chinese_run_records_the_figures_of_the_english_run(en_run, zh_run):
    """Same code, so the same figures (names and units, the same tables): only the words around them
    differ. (Values, and the implementation a ranking picks, are measurements, and this run is of the
    small model in another dtype, so they differ.)"""
    _, entries = _zh_entries(zh_run)
    for name in (n for n in entries if n in MEASURING):
        zh = json.loads((zh_run["run_dir"] / name / "results.json").read_text())
        en = json.loads((en_run["run_dir"] / name / "results.json").read_text())
        assert zh["key_figures"] == en["key_figures"], name
        skipped = _figures_of_skipped_rungs(zh) | _figures_of_skipped_rungs(en)
        units = [{k: m.get("unit") for k, m in r["metrics"].items() if k not in skipped} for r in (zh, en)]
        assert units[0] == units[1], name
        assert set(zh["tables"]) == set(en["tables"]), name


def _figures_of_skipped_rungs(results: dict) -> set:
    """The figures chapter 06 records only for a ladder rung that ran, of the rungs this run skipped
    (a rung is skipped by what it measures, e.g. + INT8 where the dense layers were faster here)."""
    names = set()
    for row in results.get("tables", {}).get("ladder", []):
        if row.get("status") == "ok":
            continue
        rung = row["rung"].strip("+ ").replace(" ", "_")
        names |= {f"ladder_tok_s_{rung}"} | ({"int8_rung_step"} if rung == "INT8" else set())
    return names


def _group(pgid):
    return [p.pid for p in psutil.process_iter() if _pgid(p) == pgid and p.status() != psutil.STATUS_ZOMBIE]
