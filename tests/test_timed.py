"""scripts/timed.py, the budget guard of the test levels: a level past 1.5 x its budget fails on an
idle machine and only warns under load; the closing summary shows each level once."""
from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "scripts"))
import timed  # noqa: E402


def test_a_level_over_its_budget_fails_when_idle_and_warns_under_load():
    assert timed.verdict("unit", 250, 240, 0.0, 0) == ("[time] unit: 250 s of its 240 s budget (exit status 0)", 0)
    line, rc = timed.verdict("unit", 400, 240, 0.1, 0)
    assert rc == 3 and "otherwise idle" in line
    line, rc = timed.verdict("unit", 400, 240, 1.2, 0)
    assert rc == 0 and "only a warning" in line
    assert timed.verdict("unit", 400, 240, 0.0, 1)[1] == 1  # a failing level keeps its own status
    assert timed.verdict("setup", 999, 0, 0.0, 0) == ("[time] setup: 999 s (exit status 0)", 0)  # no budget


def test_the_summary_shows_each_level_once_by_its_longer_run(tmp_path, capsys):
    times = tmp_path / "times"
    times.write_text("\n".join([
        "[time] setup-vllm: 290 s (exit status 0)",  # a step inside a level: detail, not a level
        "[time] setup: 299 s of its 300 s budget (exit status 0)",
        "[time] setup: 0 s of its 300 s budget (exit status 0)",  # make test checking the build again
        "[time] unit: 201 s of its 240 s budget (exit status 0)",
    ]) + "\n")
    assert timed.summary(str(times)) == 0
    shown = capsys.readouterr().out.splitlines()
    assert shown[1:] == ["[time] setup: 299 s of its 300 s budget (exit status 0)",
                         "[time] unit: 201 s of its 240 s budget (exit status 0)"]
