"""Each notebook's ``results.json``: parameters, environment and every figure with its context
(layer: foundations; taught in 00_environment_check and read back in 08_report).

Written atomically after every ``record`` call, so an interrupted run keeps whatever it measured;
every chapter records its figures here from ``00_environment_check.ipynb`` on. ``read_run`` reads a
run folder back for everything that shows one (the runner's ``index.html``, the report chapter
``08_report.ipynb`` that teaches it, the claims audit and ``helpers.compare``): one status per
chapter, merged from ``results.json`` and the runner's ``run.json`` in one place; nothing is
re-measured.
"""
from __future__ import annotations

import contextlib
import json
import math
import os
import sys
import tempfile
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterable, Optional

RESULTS_NAME = "results.json"
SCHEMA = 1
# A sentence a helper composed for the reader (``prose.Message``) is recorded as its English text
# under its key and, beside it, as its catalog key and arguments under ``<key>_msg``: a page renders
# it in its reader's language (``prose.recorded``), a tool reads the text as before.
MESSAGE_SUFFIX = "_msg"
TABLE_MESSAGES = "table_messages"  # results.json: the messages behind table cells (``table_messages``)


def default_run_dir() -> Path:
    """Where interactive (non-runner) executions write: ``reports/interactive``."""
    return Path(os.environ.get("WORKBOOK_RUN_DIR") or
                Path(__file__).resolve().parent.parent / "reports" / "interactive")


def _jsonable(value: Any) -> Any:
    if isinstance(value, dict):
        return {str(k): _jsonable(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_jsonable(v) for v in value]
    if isinstance(value, Path):
        return str(value)
    torch = sys.modules.get("torch")  # not imported means no torch value can be here (the runner)
    if torch is not None:
        if isinstance(value, torch.dtype):
            return str(value).replace("torch.", "")
        if isinstance(value, torch.Tensor):
            return value.tolist()
    if hasattr(value, "item") and callable(value.item):  # numpy scalars
        with contextlib.suppress(Exception):
            return _jsonable(value.item())
    if hasattr(value, "to_dict") and callable(value.to_dict):  # pandas
        try:
            return _jsonable(value.to_dict(orient="records"))
        except TypeError:
            return _jsonable(value.to_dict())
    if hasattr(value, "summary") and callable(value.summary):  # bench.Timing
        return _jsonable(value.summary())
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if value is None or isinstance(value, (str, int, float, bool)):
        return value
    return str(value)


def with_messages(value: Any) -> Any:
    """``value`` with a ``<key>_msg`` field (the message's catalog key and arguments) beside every
    field that holds a message, in nested records and lists too. Tables (``Results.table``) are
    not passed here: their columns stay what the chapter named them."""
    if isinstance(value, dict):
        out = {}
        for key, item in value.items():
            out[key] = with_messages(item)
            record = getattr(item, "message_record", None)  # a prose.Message (prose sits above results)
            if callable(record) and isinstance(key, str):
                out[key + MESSAGE_SUFFIX] = record()
        return out
    if isinstance(value, (list, tuple)):
        return [with_messages(v) for v in value]
    return value


def table_messages(tables: dict) -> dict:
    """``{table: {row: {column: record}}}`` for every table cell a message made (its catalog key and
    arguments, as ``with_messages`` keeps a field's), so a page in another language says the cell in
    its own words. The rows themselves stay as the chapter wrote them (English text)."""
    out = {}
    for name, rows in tables.items():
        if hasattr(rows, "to_dict") and callable(rows.to_dict):  # pandas
            with contextlib.suppress(TypeError):
                rows = rows.to_dict(orient="records")
        if not isinstance(rows, (list, tuple)):
            continue
        cells = {}
        for i, row in enumerate(rows):
            said = {str(col): value.message_record() for col, value in row.items()
                    if callable(getattr(value, "message_record", None))} if isinstance(row, dict) else {}
            if said:
                cells[str(i)] = said
        if cells:
            out[name] = cells
    return out


def current_umask() -> int:
    """The process umask (reading it means setting it, so it is put straight back)."""
    mask = os.umask(0o022)
    os.umask(mask)
    return mask


def file_mode() -> int:
    """The mode ``open()`` would give a new file: 0666 less the umask.

    ``tempfile.mkstemp`` always creates 0600 files, so a report written through it would be
    unreadable to a web server or a CI artifact store that copies the run folder.
    """
    return 0o666 & ~current_umask()


def write_json_atomic(path: Path, data: Any) -> None:
    """Write via a temp file in the same folder and ``os.replace``: readers never see half a file.

    The file gets the mode a plain ``open()`` would give it (the umask is respected).
    """
    path = Path(path)
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    except OSError as exc:
        raise PermissionError(
            f"cannot write results to {path.parent} ({exc.strerror or exc}); choose a writable "
            "folder with the runner's --reports-dir option or the WORKBOOK_RUN_DIR variable"
        ) from exc
    try:
        os.chmod(tmp, file_mode())
        with os.fdopen(fd, "w", encoding="utf-8") as fh:
            json.dump(_jsonable(data), fh, indent=2, ensure_ascii=False, allow_nan=False)
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise


# --- the machine's load while a chapter measures ---------------------------------------------------

# Load average per core above which a page warns that its figures were taken under load: more
# runnable processes than cores, so the chapter's threads wait for the others' (the threshold
# backend.cpu_contention has always used, now for every chapter and the index).
LOAD_PER_CORE_WARNING = 1.0
BUSY_SHOWN = 5  # the busiest other processes a load record keeps


def _proc_times() -> dict[int, tuple[str, int, float]]:
    """``{pid: (name, parent pid, CPU seconds so far)}`` of every process, from ``/proc`` (Linux)."""
    ticks = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100
    out = {}
    for entry in os.scandir("/proc"):
        if not entry.name.isdigit():
            continue
        try:
            text = Path(entry.path, "stat").read_text()
        except OSError:  # the process ended while we looked
            continue
        # the name is in parentheses and may hold spaces: split after the last ')'
        name = text[text.index("(") + 1:text.rindex(")")]
        fields = text[text.rindex(")") + 2:].split()
        out[int(entry.name)] = (name, int(fields[1]), (int(fields[11]) + int(fields[12])) / ticks)
    return out


def _this_run(procs: dict) -> set[int]:
    """This process, its ancestors (the runner, the Jupyter kernel's launcher) and its descendants
    (a vLLM server it started): the processes of this run, which are not competing with it."""
    mine, pid = set(), os.getpid()
    while pid > 1 and pid not in mine:
        mine.add(pid)
        pid = procs.get(pid, ("", 0, 0.0))[1]
    children = {}
    for pid, (_, parent, _) in procs.items():
        children.setdefault(parent, []).append(pid)
    todo = [os.getpid()]
    while todo:
        for child in children.get(todo.pop(), []):
            if child not in mine:
                mine.add(child)
                todo.append(child)
    return mine


def busy_processes(interval: float = 0.2, top: int = BUSY_SHOWN) -> Optional[list[dict]]:
    """The ``top`` processes not of this run that used the most CPU over ``interval`` seconds:
    ``[{"pid", "name", "cpu_pct"}]`` (100 % is one core), busiest first; None where ``/proc`` cannot
    be read (not Linux). ``psutil`` is not needed: two readings of ``/proc/<pid>/stat``."""
    if not os.path.isdir("/proc"):
        return None
    try:
        before = _proc_times()
        time.sleep(interval)
        after = _proc_times()
    except (OSError, ValueError, IndexError):
        return None
    ours = _this_run(after)
    used = [{"pid": pid, "name": name, "cpu_pct": round(100.0 * (cpu - before[pid][2]) / interval, 1)}
            for pid, (name, _, cpu) in after.items() if pid in before and pid not in ours]
    return sorted((u for u in used if u["cpu_pct"] > 0), key=lambda u: -u["cpu_pct"])[:top]


def machine_load(interval: float = 0.2) -> dict:
    """The machine's load now: ``load_1m`` (the 1-minute load average), ``cores``, ``load_per_core``,
    ``under_load`` (above ``LOAD_PER_CORE_WARNING``) and ``busy`` (``busy_processes``), with the time."""
    cores = os.cpu_count() or 1
    load = os.getloadavg()[0] if hasattr(os, "getloadavg") else None
    per_core = load / cores if load is not None else None
    return {"time": time.strftime("%Y-%m-%dT%H:%M:%S%z"), "load_1m": load, "cores": cores,
            "load_per_core": per_core, "threshold_per_core": LOAD_PER_CORE_WARNING,
            "under_load": per_core is not None and per_core > LOAD_PER_CORE_WARNING,
            "busy": busy_processes(interval) or []}


def under_load(load: Optional[dict]) -> list[tuple[str, dict]]:
    """The readings of a chapter's ``load`` record (``{"start": ..., "end": ...}``) taken under
    load, as ``(when, reading)``: what a page warns about."""
    return [(when, reading) for when, reading in (load or {}).items()
            if isinstance(reading, dict) and reading.get("under_load")]


def load_warning(load: Optional[dict], phrase: str, when_words: dict, separator: str = ", ") -> str:
    """One sentence for every reading of a chapter's ``load`` taken under load ('' when none):
    ``phrase`` (a page's or a chapter's words) filled with ``when`` (``when_words`` of start / end),
    ``load``, ``cores``, ``per_core``, ``threshold`` and ``busy`` (the busiest other processes)."""
    texts = []
    for when, r in under_load(load):
        busy = separator.join(f"{b['name']} ({b['pid']}, {b['cpu_pct']:.0f} %)" for b in r.get("busy") or [])
        texts.append(phrase.format(when=when_words.get(when, when), load=f"{r['load_1m']:.1f}", cores=r["cores"],
                                   per_core=f"{r['load_per_core']:.2f}", threshold=f"{r['threshold_per_core']:g}",
                                   busy=busy or "–"))
    return " ".join(texts)


class Results:
    """Figures of one chapter, saved to ``<run_dir>/<chapter>/results.json`` as they come.

    Every figure carries its context: ``record("decode_tok_s", 18.7, unit="tok/s",
    device="cpu", dtype="float32", shape="batch 1, prompt 30", code_path="HF generate, eager")``.
    """

    def __init__(self, chapter: str, run_dir: "str | Path | None" = None,
                 parameters: Optional[dict] = None, environment: Optional[dict] = None):
        self.chapter = chapter
        self.run_dir = Path(run_dir) if run_dir else default_run_dir()
        self.path = self.run_dir / chapter / RESULTS_NAME
        self.data: dict = {
            "schema": SCHEMA,
            "chapter": chapter,
            "status": "running",
            "started": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
            "parameters": parameters or {},
            "environment": environment or {},
            "metrics": {},
            "tables": {},
            "key_figures": [],
            "notes": [],
            "artifacts": [],
        }
        self.save()

    def record(self, key: str, value: Any, unit: str = "", *, key_figure: bool = False,
               **context) -> Any:
        """Store one figure with its unit and context (device, dtype, shape, code_path, ...)."""
        self.data["metrics"][key] = with_messages({"value": value, "unit": unit, **context})
        if key_figure and key not in self.data["key_figures"]:
            self.data["key_figures"].append(key)
        self.save()
        return value

    def table(self, name: str, rows: Any) -> None:
        """Store a table (a DataFrame or a list of dicts)."""
        self.data["tables"][name] = rows
        self.save()

    def not_recorded(self, key: str, why: str) -> None:
        """A figure the chapter could not record, and why (a sentence): kept under ``not_recorded``,
        which the claims audit quotes, and shown to the reader as a note."""
        self.data["not_recorded"] = with_messages({**self.data.get("not_recorded", {}), key: why})
        self.note(f"{key} not recorded: {why}")

    def note(self, text: str) -> None:
        self.data["notes"].append(text)
        self.save()

    def artifact(self, path: "str | Path", label: str = "") -> None:
        """A file (plot, HTML export) the index should link, relative to the run folder."""
        rel = os.path.relpath(Path(path), self.run_dir)
        self.data["artifacts"].append({"path": rel, "label": label or Path(path).name})
        self.save()

    def record_load(self, when: str) -> dict:
        """The machine's load (``machine_load``) at the ``start`` or ``end`` of the chapter's
        measurements, kept under ``load``: every page shows a warning beside figures taken under load."""
        if when not in ("start", "end"):
            raise ValueError(f"when={when!r} is not valid; choose one of start, end")
        reading = machine_load()
        self.data.setdefault("load", {})[when] = reading
        self.save()
        return reading

    def set(self, field: str, value: Any) -> None:
        self.data.pop(field + MESSAGE_SUFFIX, None)  # a message set before, replaced by a plain value
        self.data.update(with_messages({field: value}))
        self.save()

    def finish(self, status: str = "ok", reason: str = "") -> None:
        """Mark the chapter ok / skipped (with the reason) at the end of the notebook."""
        if status not in ("ok", "skipped"):
            raise ValueError(f"status={status!r}: use 'ok' or 'skipped'")
        self.data["status"] = status
        if reason:
            self.data.pop("status_reason" + MESSAGE_SUFFIX, None)
            self.data.update(with_messages({"status_reason": reason}))
        if "load" in self.data:  # a chapter that recorded the load as it opened records it as it ends
            self.data["load"]["end"] = machine_load()
        self.data["finished"] = time.strftime("%Y-%m-%dT%H:%M:%S%z")
        self.save()

    def save(self) -> None:
        cells = table_messages(self.data["tables"])
        write_json_atomic(self.path, {**self.data, TABLE_MESSAGES: cells} if cells else self.data)

    @property
    def folder(self) -> Path:
        return self.path.parent


# --- reading runs back: the index, the report chapter, the claims audit and the compare page -------

REPORT_CHAPTER = "08_report"  # the chapter that reads the others (it is not one of its own inputs)
RUN_FILE = "run.json"
NOTEBOOKS = Path(__file__).resolve().parent.parent / "notebooks"
# The one status vocabulary of a chapter on every page; only the first two put figures into ratios.
STATUSES = ("ok", "skipped", "failed", "unfinished", "not run", "unreadable")
FINISHED = ("ok", "skipped")
DEVICE_CLASSES = ("npu", "cuda", "cpu")


def device_class(device: Any) -> str:
    """``"npu:0"`` -> ``"npu"``, ``"cuda:1"`` -> ``"cuda"``, ``"cpu"`` -> ``"cpu"``; '' for anything else."""
    kind = str(device or "").split(":")[0].strip().lower()
    return kind if kind in DEVICE_CLASSES else ""


def workbook_chapters() -> list[str]:
    """The chapters of this workbook, by notebook name (a run may hold fewer)."""
    return sorted(p.stem for p in NOTEBOOKS.glob("*.ipynb") if not p.name.startswith("_"))


def read_json(path: "str | Path") -> tuple[Any, str]:
    """(data, '') or (None, why not): 'missing', 'unreadable (...)' or 'not valid JSON (...)'."""
    try:
        return json.loads(Path(path).read_text(encoding="utf-8")), ""
    except FileNotFoundError:
        return None, "missing"
    except OSError as exc:
        return None, f"unreadable ({exc.strerror or exc})"
    except ValueError as exc:
        return None, f"not valid JSON ({exc})"


def read_results_file(path: "str | Path") -> tuple[Optional[dict], str]:
    """A chapter's results.json as ``Results`` writes it, or None and the reason it cannot be read.

    Only schema 1 exists; a file of any other shape is reported, never adapted.
    """
    data, problem = read_json(path)
    if problem:
        return None, problem
    if not isinstance(data, dict):
        return None, "not a JSON object"
    if data.get("schema") != SCHEMA:
        return None, f"schema {data.get('schema')!r}, but this workbook writes and reads schema {SCHEMA}"
    wrong = [k for k, kind in (("metrics", dict), ("tables", dict), ("key_figures", list),
                               ("parameters", dict), ("environment", dict)) if not isinstance(data.get(k), kind)]
    if wrong:
        return None, f"schema {SCHEMA} without a valid {', '.join(wrong)}"
    return data, ""


def load_results(run_dir: "str | Path", chapter: str) -> Optional[dict]:
    """The results of one chapter of a run, or None if it did not run or its file is unreadable."""
    return read_results_file(Path(run_dir) / chapter / RESULTS_NAME)[0]


def chapter_results(run_dir: "str | Path", chapter: str) -> tuple[Path, dict]:
    """A worked answers notebook's start: the run folder (``run_dir``, or ``default_run_dir()`` when
    empty) and ``chapter``'s results there; FileNotFoundError with the command that writes them."""
    folder = Path(run_dir) if run_dir else default_run_dir()
    found = load_results(folder, chapter)
    if found is None:
        raise FileNotFoundError(f"run_dir={str(folder)!r} has no {chapter}/results.json; run the chapter first, "
                                f"for example python -m helpers.run --profile quick --only {chapter[:2]}")
    return folder, found


def chapter_status(data: Optional[dict], problem: str, entry: dict) -> tuple[str, str]:
    """The status (one of ``STATUSES``) and its reason, from results.json and the runner's entry.

    The runner knows whether a notebook failed or finished; the file knows whether the chapter
    called ``finish()``. A file still saying "running" with no runner verdict is unfinished.
    """
    said, error = str(entry.get("status") or ""), str(entry.get("error") or "")
    if said == "failed":
        return "failed", error or "the runner recorded a failure without an error"
    if problem and problem != "missing":
        return "unreadable", f"results.json {problem}"
    if said in FINISHED:
        return said, str((data or {}).get("status_reason") or ("" if data else "it wrote no results.json"))
    if said == "running" or (data or {}).get("status") == "running":
        return "unfinished", ("results.json still says running: the chapter is running, was interrupted "
                              "or its kernel died" if data else "the runner started it; nothing recorded")
    if data is None:
        return "not run", ""
    if data.get("status") in FINISHED:
        return data["status"], str(data.get("status_reason") or "")
    return "unreadable", f"results.json status {data.get('status')!r} is none of {', '.join(FINISHED)}"


@dataclass
class ChapterRecord:
    """One chapter of a run folder as recorded: its status, why, its results.json and the runner's
    entry (``helpers.chapter.Chapter`` is the open chapter a notebook records into)."""

    name: str
    status: str
    reason: str = ""
    data: Optional[dict] = None  # results.json when readable
    entry: dict = field(default_factory=dict)  # run.json's entry when the runner ran it


@dataclass
class RunFolder:
    """A run folder as read: run.json (or {}), every chapter, and notes on what could not be read."""

    path: Path
    run: dict
    chapters: dict  # chapter name -> ChapterRecord, in chapter order
    notes: list

    def results(self) -> dict[str, dict]:
        """Readable results of every chapter but the report chapter (what the audit and the plots read)."""
        return {n: c.data for n, c in self.chapters.items() if c.data is not None and n != REPORT_CHAPTER}

    @property
    def device(self) -> str:
        """The run's device: chapter 00's recorded device, else what most chapters ran on."""
        env00 = self.results().get("00_environment_check") or {}
        recorded = str(env00.get("metrics", {}).get("device", {}).get("value") or "")
        return recorded or most_common(d["environment"].get("device") for d in self.results().values())

    def status_table(self):
        """One row per chapter but the report chapter: status, reason, figures, device, duration."""
        import pandas as pd

        rows = [{"chapter": c.name, "status": c.status, "reason": c.reason[:300],
                 "figures": len((c.data or {}).get("metrics", {})),
                 "device": str((c.data or {}).get("environment", {}).get("device", "")),
                 "duration_s": round(c.entry["duration_s"], 1) if c.entry.get("duration_s") else None}
                for c in self.chapters.values() if c.name != REPORT_CHAPTER]
        return pd.DataFrame(rows, columns=["chapter", "status", "reason", "figures", "device", "duration_s"])


def most_common(values) -> str:
    values = [str(v) for v in values if v not in (None, "", "auto")]
    return Counter(values).most_common(1)[0][0] if values else ""


def read_run(path: "str | Path", expected: Iterable[str] = (), run: Optional[dict] = None) -> RunFolder:
    """Read a run folder: ``run.json`` (or ``run`` as given) and every ``<chapter>/results.json``.

    ``expected`` chapters that left nothing are listed as "not run". Raises only when the folder
    does not exist; everything unreadable inside it becomes a status with its reason and a note.
    """
    folder = Path(path)
    if not folder.is_dir():
        raise FileNotFoundError(f"{str(path)!r} is not a folder; give run folders such as reports/<run-id> "
                                "(made by make report / python -m helpers.run)")
    notes = []
    if run is None:
        run, problem = read_json(folder / RUN_FILE)
        if problem or not isinstance(run, dict):
            notes.append(f"run.json {problem or 'is not a JSON object'}: chapter statuses come from the "
                         "results.json files alone")
            run = {}
    entries = {str(e["notebook"]): e for e in run.get("notebooks") or [] if isinstance(e, dict) and e.get("notebook")}
    names = set(expected) | set(entries) | {p.parent.name for p in folder.glob(f"*/{RESULTS_NAME}")}
    chapters = {}
    for name in sorted(names):
        data, problem = read_results_file(folder / name / RESULTS_NAME)
        status, reason = chapter_status(data, problem, entries.get(name, {}))
        chapters[name] = ChapterRecord(name, status, reason, data, entries.get(name, {}))
        if status not in (*FINISHED, "not run"):  # the last line of a traceback says what failed
            notes.append(f"{name}: {status}" + (f" ({reason.strip().splitlines()[-1][:300]})" if reason.strip() else ""))
    return RunFolder(folder, run, chapters, notes)


def metric(results: Optional[dict], key: str, default: Any = None) -> Any:
    """The value of a recorded figure, or ``default`` when the chapter or figure is missing."""
    entry = (results or {}).get("metrics", {}).get(key)
    return default if entry is None else entry.get("value", default)
