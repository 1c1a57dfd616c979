"""The pinned sets resolve, wheels only, for every Python version and platform the docs claim
(the support matrix in docs/support.md).

pip reads Requires-Python, wheel tags and dependencies from the package index (no download of the
wheels themselves), so a pin that drops a claimed version fails here. The resolution needs network
and minutes, so it runs in ``make test-slow`` (the tests marked ``pins``, and ``make test-pins``:
``scripts/check_pins.py --record``); ``make test`` checks that the requirements files are the ones
that check last resolved (``tests/fixtures/pins-checked.txt``), so a changed pin cannot skip it.
"""
from __future__ import annotations

import importlib.util
import os
import re
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent


def _load(name):
    spec = importlib.util.spec_from_file_location(name, REPO / "scripts" / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


check_pins = _load("check_pins")


def test_the_requirements_are_the_ones_the_last_pin_check_resolved():
    recorded, now = check_pins.recorded_fingerprints(), check_pins.fingerprints()
    changed = sorted(name for name in now if recorded.get(name) != now[name])
    assert not changed, (f"{', '.join(changed)} changed since the last pin check "
                         f"({check_pins.STAMP.relative_to(REPO)}): run `make test-pins` (minutes, needs the "
                         "package index), which resolves every claimed Python and platform and records them")


def test_the_pin_stamp_check_sees_a_changed_file(tmp_path, monkeypatch):
    stamp = tmp_path / "pins-checked.txt"
    check_pins.record(stamp)
    assert check_pins.recorded_fingerprints(stamp) == check_pins.fingerprints()
    stamp.write_text(stamp.read_text().replace(check_pins.fingerprints()["requirements.txt"], "0" * 64))
    assert check_pins.recorded_fingerprints(stamp)["requirements.txt"] != check_pins.fingerprints()["requirements.txt"]
    assert "requirements-common.txt" in check_pins.requirement_files()  # included by requirements.txt (-r)


@pytest.mark.pins
def test_every_claimed_set_resolves_for_every_claimed_python_and_platform():
    results = check_pins.run_all()
    assert len(results) == sum(len(c["python"]) for c in check_pins.CLAIMS.values()) * len(check_pins.ARCHES) * 3
    failures = [f"{label}: {error}" for label, error in results if error is not None]
    assert not failures, "\n".join(failures)


@pytest.mark.pins
def test_the_check_fails_for_a_pin_without_a_cp39_wheel(tmp_path):
    bad = tmp_path / "requirements-bad.txt"
    bad.write_text("numpy==2.4.6\n")  # wheels for cp311+ only
    proc = check_pins.resolve(["-r", str(bad)], "3.9", "aarch64")
    assert proc.returncode != 0, proc.stdout + proc.stderr
    # The same file resolves where the wheel exists: the failure above is the Python version.
    assert check_pins.resolve(["-r", str(bad)], "3.12", "aarch64").returncode == 0


@pytest.mark.pins
def test_the_check_fails_for_a_pure_python_pin_that_needs_a_newer_python():
    proc = check_pins.resolve(["pytest==9.2.0"], "3.9", "x86_64")  # Requires-Python >= 3.10
    assert proc.returncode != 0
    assert "pytest" in check_pins.first_error(proc)


def test_the_check_ignores_local_pip_configuration(monkeypatch):
    monkeypatch.setenv("PIP_FIND_LINKS", "/somewhere/wheels")
    monkeypatch.setenv("PIP_CONSTRAINT", "/somewhere/constraints.txt")
    env = check_pins.clean_pip_env()
    assert env["PIP_CONFIG_FILE"] == os.devnull
    assert "PIP_FIND_LINKS" not in env and "PIP_CONSTRAINT" not in env


def test_the_platforms_cover_glibc_228_wheels_of_both_arches():
    for arch in check_pins.ARCHES:
        tags = check_pins.platform_args(arch)[1::2]
        assert f"manylinux_2_28_{arch}" in tags and f"manylinux2014_{arch}" in tags
        assert not any("_2_29_" in tag or "_2_3" in tag for tag in tags)


SUPPORT_PAGE = REPO / "docs" / "support.md"


def _support_matrix():
    """{set: python versions} from the support matrix rows of docs/support.md."""
    text = SUPPORT_PAGE.read_text(encoding="utf-8")
    rows = {}
    for line in text.splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if len(cells) >= 4 and cells[0] in ("current", "legacy"):
            rows[cells[0]] = tuple(re.findall(r"3\.\d+", cells[1]))
    return rows


def test_the_support_matrix_claims_exactly_what_is_checked():
    rows = _support_matrix()
    assert set(rows) == set(check_pins.CLAIMS), rows
    for name, claim in check_pins.CLAIMS.items():
        assert rows[name] == claim["python"], (name, rows[name], claim["python"])


def test_the_claims_match_the_pin_files_and_setup():
    choose = _load("choose_pin_set")
    for name, claim in check_pins.CLAIMS.items():
        assert choose.SETS[name] == claim["requirements"]
        for python, torch_pin in claim["pinned_torch"].items():
            forced_ok = choose.choose(python + ".0", None, None, use_system_torch=False, forced=name)
            assert forced_ok["torch"] == torch_pin, (name, python)
    assert check_pins.CLAIMS["current"]["pinned_torch"]["3.11"] == choose.pinned_torch()
