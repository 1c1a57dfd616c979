"""tests/phase_times.py: the per-phase wall times printed at the end of a pytest session."""
from __future__ import annotations

import importlib.util
from pathlib import Path

spec = importlib.util.spec_from_file_location("_phase_times", Path(__file__).parent / "phase_times.py")
phase_times = importlib.util.module_from_spec(spec)
spec.loader.exec_module(phase_times)


def test_tests_are_grouped_into_their_phase():
    assert phase_times.phase_of("tests/test_ops.py::test_rms[2.1]") == phase_times.UNIT
    assert phase_times.phase_of("tests/test_browser.py::test_pages") == phase_times.BROWSER
    assert phase_times.phase_of("tests/test_serving.py::test_parse") == phase_times.VLLM
    assert phase_times.phase_of("tests/test_notebooks.py::test_killing_the_kernel_stops_the_real_vllm_server") \
        == phase_times.VLLM
    assert phase_times.phase_of("tests/test_notebooks.py::test_runner_wrote_index") == phase_times.NOTEBOOK_CHECKS
    assert phase_times.phase_of("tests/test_compare.py::test_x", {"notebooks": 1}) == phase_times.NOTEBOOK_CHECKS


def test_a_fixture_run_is_its_own_phase_and_not_counted_in_the_test_that_started_it():
    now = [0.0]
    times = phase_times.PhaseTimes(clock=lambda: now[0])
    times.current = ("tests/test_notebooks.py::test_runner_wrote_index", "setup")
    with times.fixture("quick run"):
        now[0] += 600.0
    times.current = None
    # pytest's setup duration of that test includes the fixture's 600 s
    times.add("tests/test_notebooks.py::test_runner_wrote_index", "setup", 600.5)
    times.add("tests/test_notebooks.py::test_runner_wrote_index", "call", 0.25)
    times.add("tests/test_ops.py::test_a", "call", 2.0)
    times.add("tests/test_ops.py::test_b", "setup", 1.0)
    times.add("tests/test_hygiene.py::test_c", "call", 0.5)
    assert times.fixtures == {"quick run": 600.0}
    assert times.by_phase[phase_times.NOTEBOOK_CHECKS] == 0.75
    assert times.by_phase[phase_times.UNIT] == 3.5
    assert dict(times.by_file) == {"tests/test_ops.py": 3.0, "tests/test_hygiene.py": 0.5}
    lines = times.lines()
    assert lines[0].split() == ["600.0", "s", "quick", "run"]
    assert "604.2 s  in all" in [line.strip() for line in lines]
    assert lines[-2].endswith("tests/test_ops.py") and lines[-1].endswith("tests/test_hygiene.py")


def test_a_fixture_a_test_asks_for_in_its_body_is_not_counted_in_that_test():
    """test_browser.py asks for the quick run with request.getfixturevalue inside the test: the
    run's time falls in the test's call, and is taken out of it (it was counted twice before)."""
    now = [0.0]
    times = phase_times.PhaseTimes(clock=lambda: now[0])
    times.current = ("tests/test_browser.py::test_pages[quick_run]", "call")
    with times.fixture("quick run"):
        now[0] += 1989.0
    times.current = None
    times.add("tests/test_browser.py::test_pages[quick_run]", "setup", 0.5)
    times.add("tests/test_browser.py::test_pages[quick_run]", "call", 1995.0)
    assert times.fixtures == {"quick run": 1989.0}
    assert times.by_phase[phase_times.BROWSER] == 6.5


def test_the_coverage_lines_name_each_run_its_chapters_answers_and_failures():
    def entry(name, status="ok", answer="ok"):
        return {"notebook": name, "status": status, **({"solution": {"status": answer}} if answer else {})}

    runs = [{"lang": "en", "dtype": "bfloat16", "model": "smollm2-135m", "profile": "quick",
             "run": {"notebooks": [entry("00_environment_check"), entry("01_operator_verification", answer="failed")]}},
            {"lang": "zh", "dtype": "float32", "model": "small random Llama", "profile": "smoke",
             "run": {"notebooks": [entry("01_operator_verification", status="failed", answer=None)]}},
            {"lang": "en", "dtype": "float16", "model": "small random Llama", "profile": "smoke", "run": None}]
    lines = phase_times.coverage_lines(runs)
    assert lines[0].startswith("en bfloat16") and "chapters 00 01 | answers 00 01!" in lines[0]
    assert lines[1].startswith("zh float32") and "chapters 01! | answers (none)" in lines[1]
    assert "chapters (none ran)" in lines[2]
    assert lines[3] == "dtypes per chapter: 00 bfloat16, 01 bfloat16"  # the failed float32 run does not count
