"""helpers.progress: one line per loop, shown even where the runner silences the libraries' bars."""
from __future__ import annotations

import itertools

from helpers import progress


def test_steps_yields_every_item_and_names_the_step_running(capsys, monkeypatch):
    monkeypatch.setenv("TQDM_DISABLE", "1")  # what the runner sets for the libraries' own bars
    seen = list(progress.steps(["native eager", "+ static cache", "+ graph mode"]))
    out = capsys.readouterr().out
    assert seen == ["native eager", "+ static cache", "+ graph mode"]
    assert "1/3 native eager" in out and "3/3 + graph mode" in out
    assert out.endswith("\n") and out.count("\n") == 1  # one line, redrawn with carriage returns


def test_a_wait_without_a_length_shows_its_name_and_the_time(capsys):
    for n in progress.steps(itertools.count(), lambda _: "waiting for the server"):
        if n == 2:
            break
    out = capsys.readouterr().out
    assert "waiting for the server" in out and "/" not in out.split("server")[0]


def test_a_failing_step_still_closes_the_line(capsys):
    try:
        for _ in progress.steps([1, 2], lambda i: f"point {i}"):
            raise RuntimeError("out of memory")
    except RuntimeError:
        pass
    assert capsys.readouterr().out.endswith("\n")
