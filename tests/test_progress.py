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


def test_a_label_is_said_in_the_notebooks_edition(capsys, monkeypatch, tmp_path):
    from helpers.prose import message, tr, translate_cell

    label = message("{n} calibration samples", n=8)
    said = tr(label, "zh"), translate_cell("+ static cache", "zh")  # a message, a table's word
    assert said != ("8 calibration samples", "+ static cache")  # the catalog translates both
    (tmp_path / "zh").mkdir()
    monkeypatch.chdir(tmp_path / "zh")  # a Chinese notebook's kernel runs in notebooks/zh
    list(progress.steps([8], lambda n: message("{n} calibration samples", n=n)))
    list(progress.steps(["+ static cache"]))
    out = capsys.readouterr().out
    assert f"1/1 {said[0]}" in out and f"1/1 {said[1]}" in out
    monkeypatch.chdir(tmp_path)
    list(progress.steps([8], lambda n: message("{n} calibration samples", n=n)))
    assert "1/1 8 calibration samples" in capsys.readouterr().out
