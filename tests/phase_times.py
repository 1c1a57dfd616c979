"""Wall time of each phase of a pytest session, printed at its end (tests/conftest.py).

``make test`` has a time budget; these lines say where it went. A test's own time (setup, call and
teardown as pytest reports them) counts for its phase: the unit tests by file, the vLLM tests, the
browser tests and the checks of the notebook runs. The session fixtures that run notebooks through
the real runner (the quick run, the Chinese run, the dtype runs) are timed on their own: their time
is taken out of the setup or call of the test that happened to start them (a test may ask for one
in its body, with ``request.getfixturevalue``), so it is not counted twice.
"""
from __future__ import annotations

import time
from collections import defaultdict
from contextlib import contextmanager

UNIT = "unit tests"
VLLM = "vLLM tests"
BROWSER = "browser tests"
NOTEBOOK_CHECKS = "notebook-run checks"


def phase_of(nodeid: str, keywords=()) -> str:
    """The phase a test belongs to, from its node id (``tests/test_x.py::test_y[param]``) and markers."""
    path, _, name = nodeid.partition("::")
    file = path.rsplit("/", 1)[-1]
    if file == "test_browser.py":
        return BROWSER
    if file == "test_serving.py" or "vllm" in name.lower():
        return VLLM
    if file == "test_notebooks.py" or "notebooks" in keywords:
        return NOTEBOOK_CHECKS
    return UNIT


class PhaseTimes:
    """Sums pytest's per-test durations by phase (unit tests also by file) and times the run fixtures."""

    def __init__(self, clock=time.monotonic):
        self.clock = clock
        self.by_phase = defaultdict(float)
        self.by_file = defaultdict(float)  # unit tests only
        self.fixtures = {}  # label -> seconds
        self.current = None  # (node id, "setup" or "call") of the test step under way
        self._inside = defaultdict(float)  # (node id, step) -> fixture seconds spent in that step

    @contextmanager
    def fixture(self, label: str):
        """Time a session fixture's work as its own phase (``with times.fixture("quick run"): ...``)."""
        start = self.clock()
        try:
            yield
        finally:
            spent = self.clock() - start
            self.fixtures[label] = self.fixtures.get(label, 0.0) + spent
            if self.current is not None:
                self._inside[self.current] += spent

    def add(self, nodeid: str, when: str, duration: float, keywords=()) -> None:
        """One report of pytest_runtest_logreport (setup, call or teardown of one test)."""
        duration = max(0.0, duration - self._inside.pop((nodeid, when), 0.0))
        phase = phase_of(nodeid, keywords)
        self.by_phase[phase] += duration
        if phase == UNIT:
            self.by_file[nodeid.partition("::")[0]] += duration

    def lines(self, top_files: int = 12) -> list[str]:
        """The summary: each phase's wall time, then the unit test files that took longest."""
        rows = [(label, s) for label, s in self.fixtures.items()]
        rows += [(phase, s) for phase, s in self.by_phase.items()]
        total = sum(s for _, s in rows)
        out = [f"{s:8.1f} s  {label}" for label, s in sorted(rows, key=lambda r: -r[1])]
        out.append(f"{total:8.1f} s  in all")
        files = sorted(self.by_file.items(), key=lambda r: -r[1])
        if files:
            out.append(f"unit tests by file (the {min(top_files, len(files))} longest of {len(files)}):")
            out += [f"{s:8.1f} s  {path}" for path, s in files[:top_files]]
        return out


def coverage_lines(runs: list) -> list[str]:
    """What the notebook runs of a session executed, one line per run: edition, dtype, model, profile,
    the chapters and the worked answers that finished ok (a failed one is marked ``!``), then which
    dtypes each chapter ran in. ``runs``: dicts with ``lang``, ``dtype``, ``model``, ``profile`` and
    ``run`` (the run.json, or None)."""
    lines, by_chapter = [], {}

    def mark(entry):
        return "" if (entry or {}).get("status") in ("ok", "skipped") else "!"

    for r in runs:
        entries = (r.get("run") or {}).get("notebooks", [])
        chapters = " ".join(e["notebook"][:2] + mark(e) for e in entries) or "(none ran)"
        answers = " ".join(e["notebook"][:2] + mark(e.get("solution")) for e in entries if e.get("solution"))
        lines.append(f"{r['lang']:<3}{r['dtype'] or 'auto':<10}{r['model']:<24}{r['profile']:<7}"
                     f"chapters {chapters} | answers {answers or '(none)'}")
        for e in entries:
            if e.get("status") == "ok":
                by_chapter.setdefault(e["notebook"][:2], set()).add(r["dtype"] or "auto")
    lines.append("dtypes per chapter: " + ", ".join(f"{c} {'/'.join(sorted(d))}" for c, d in sorted(by_chapter.items())))
    return lines
