"""Each notebook's ``results.json``: parameters, environment and every figure with its context.

Written atomically after every ``record`` call, so an interrupted run keeps whatever it measured;
read back by later chapters, ``08_report`` and the runner's ``index.html`` (which never re-measure).
"""
from __future__ import annotations

import json
import math
import os
import tempfile
import time
from pathlib import Path
import sys
from typing import Any, Optional

RESULTS_NAME = "results.json"
SCHEMA = 1


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
        if isinstance(value, torch.device):
            return str(value)
        if isinstance(value, torch.Size):
            return list(value)
        if isinstance(value, torch.Tensor):
            return value.tolist()
    if hasattr(value, "item") and callable(value.item):  # numpy scalars
        try:
            return _jsonable(value.item())
        except Exception:
            pass
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
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise


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
        self.data["metrics"][key] = {"value": value, "unit": unit, **context}
        if key_figure and key not in self.data["key_figures"]:
            self.data["key_figures"].append(key)
        self.save()
        return value

    def table(self, name: str, rows: Any) -> None:
        """Store a table (a DataFrame or a list of dicts)."""
        self.data["tables"][name] = rows
        self.save()

    def note(self, text: str) -> None:
        self.data["notes"].append(text)
        self.save()

    def artifact(self, path: "str | Path", label: str = "") -> None:
        """A file (plot, HTML export) the index should link, relative to the run folder."""
        rel = os.path.relpath(Path(path), self.run_dir)
        self.data["artifacts"].append({"path": rel, "label": label or Path(path).name})
        self.save()

    def set(self, field: str, value: Any) -> None:
        self.data[field] = value
        self.save()

    def finish(self, status: str = "ok", reason: str = "") -> None:
        """Mark the chapter ok / skipped (with the reason) at the end of the notebook."""
        if status not in ("ok", "skipped"):
            raise ValueError(f"status={status!r}: use 'ok' or 'skipped'")
        self.data["status"] = status
        if reason:
            self.data["status_reason"] = reason
        self.data["finished"] = time.strftime("%Y-%m-%dT%H:%M:%S%z")
        self.save()

    def save(self) -> None:
        write_json_atomic(self.path, self.data)

    @property
    def folder(self) -> Path:
        return self.path.parent


def load_results(run_dir: "str | Path", chapter: str) -> Optional[dict]:
    """The results of one chapter of a run, or None if it did not run or its file is unreadable."""
    path = Path(run_dir) / chapter / RESULTS_NAME
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None


def load_all(run_dir: "str | Path") -> dict[str, dict]:
    """Every chapter's results in a run folder, keyed by chapter name."""
    out = {}
    for path in sorted(Path(run_dir).glob(f"*/{RESULTS_NAME}")):
        data = load_results(run_dir, path.parent.name)
        if data is not None:
            out[path.parent.name] = data
    return out


def metric(results: Optional[dict], key: str, default: Any = None) -> Any:
    """The value of a recorded figure, or ``default`` when the chapter or figure is missing."""
    if not results:
        return default
    entry = results.get("metrics", {}).get(key)
    if entry is None:
        return default
    return entry.get("value", default)
