"""Opening a chapter (layer: entry points; taught in 00_environment_check).

One call opens a chapter: its parameters checked, device and dtype picked, ``Results`` opened. Used
as the first code cell of every chapter::

    ch = chapter.open_chapter("03_end_to_end", **parameters_of_this_notebook)

It checks every parameter by its name (``helpers.params.CHECKS``, so the same name means the same
rule in every chapter) before any heavy work, picks the device (``backend.pick_device``) and the
working dtype with the reason (``dtype=auto``: chapter 00's measured choice of this run, see
``resolve_dtype``), opens the chapter's ``results.json`` with the parameters and the
environment, records the machine's load (``results.machine_load``: load average and the busiest
other processes, again when the chapter finishes), and shows one line saying what it picked and why (``import
helpers`` has already quieted the known noise of executed notebooks). ``ch.summary(block)``
renders a paragraph of the chapter's template (``helpers.prose``) from what the chapter recorded.
"""
from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Optional

from . import REPO, backend, bench, dtype_choice, pages, params, prose
from .catalogs import edition_language  # the answers notebooks import it from here too
from .results import Results, read_run
from .run import declared_parameters

# Parameters every chapter declares; they go to the runner, not to results.json's parameters.
RUNNER_PARAMETERS = ("run_dir", "profile")
# The chapter that measures dtype=auto and records it for the run (the others reuse its record).
DTYPE_CHAPTER = "00_environment_check"


@dataclass
class Chapter:
    """What a chapter's cells use: the device, the dtype, the results file and the parameters."""

    name: str
    device: Any
    device_reason: str
    dtype: Any
    dtype_reason: str
    results: Results
    parameters: dict = field(default_factory=dict)
    lang: str = "en"
    # dtype=auto's dtype_choice.DtypeChoice, with the timed rows when it was measured; None when the
    # dtype parameter set the dtype
    dtype_choice: Any = None

    @property
    def DEV(self) -> str:  # noqa: N802  (the short names the chapters print)
        return str(self.device)

    @property
    def DT(self) -> str:  # noqa: N802
        return backend.dtype_name(self.dtype)

    @property
    def run_dir(self) -> Optional[str]:
        return self.parameters.get("run_dir") or None

    def measure(self, fn, name: str, shape: str = "", code_path: str = "", **options):
        """``bench.measure`` on this chapter's device, with its ``min_iters`` / ``min_seconds``
        parameters when it has them, and the figure's dtype, shape and code path attached."""
        budget = {k: self.parameters[k] for k in ("min_iters", "min_seconds") if k in self.parameters}
        return bench.measure(fn, self.device, name=name, dtype=self.DT, shape=shape, code_path=code_path,
                             **{**budget, **options})

    def record(self, key: str, value, unit: str = "", **context):
        """``results.record`` with this chapter's device and dtype filled in (a figure may override them)."""
        return self.results.record(key, value, unit, **{"device": self.DEV, "dtype": self.DT, **context})

    def render(self, block: str, **words) -> str:
        """A paragraph of ``helpers/templates/<chapter>.<lang>.md.j2`` from what was recorded."""
        # What was written to results.json, not the objects in memory: the template sees exactly the
        # record the report and the tests see.
        run = read_run(self.results.run_dir).results()
        recorded = run.get(self.name) or json.loads(self.results.path.read_text(encoding="utf-8"))
        return prose.render(self.name, block, recorded, run, lang=self.lang, **words)

    @staticmethod
    def message(msgid: str, **args):
        """``prose.message``: a chart title or a label the chapter composes, kept as its catalog key so
        the chart says it in its own language (``plots.chart_language``)."""
        return prose.message(msgid, **args)

    def show(self, frame):
        """A table as this chapter's reader sees it (``prose.show``: column names and text cells in
        the edition's language). Record the frame itself: recorded tables keep their English names."""
        return prose.show(frame, self.lang)

    def summary(self, block: str = "summary", **words):
        """``render`` as Markdown in the notebook (a summary is never printed as plain text)."""
        from IPython.display import Markdown

        return Markdown(self.render(block, **words))


def parameter_names(name: str) -> list[str]:
    """The names a notebook's ``parameters`` cell declares (``notebooks/`` or ``solutions/``)."""
    for folder in ("notebooks", "solutions"):
        path = REPO / folder / f"{name}.ipynb"
        if path.exists():
            break
    else:
        raise FileNotFoundError(f"no notebook {name}.ipynb in notebooks/ or solutions/")
    return list(declared_parameters(path))


def resolve_dtype(parameters: dict, device, *, reuse: bool = True) -> tuple[Any, str, str, Any]:
    """``(dtype, reason, source, choice)`` of a chapter (``choice``: dtype=auto's
    ``dtype_choice.DtypeChoice``, None when the parameter set the dtype). ``dtype=auto`` is
    ``dtype_choice.choose_dtype``: on a CPU the choice chapter 00 measured and recorded in this run
    (``run_dir``, else the runner's ``WORKBOOK_RUN_DIR``) when it was made at this CPU kernel level
    and thread count, else measured now at the ``model`` parameter's shapes; so every chapter of a
    run works in the same dtype, the one chapters 05 and 06 get from ``dtype_choice.parse_dtype`` too.
    ``reuse=False`` measures now instead of reading this run's record (chapter 00, which makes
    it)."""
    requested = parameters.get("dtype", "auto")
    if isinstance(requested, str) and requested.strip().lower() == "auto":
        picked = dtype_choice.choose_dtype(device, parameters.get("model") or None,
                                           run_dir=parameters.get("run_dir") or None, reuse=reuse)
        return picked.dtype, picked.reason, picked.source, picked
    dtype = backend.named_dtype(requested, device)
    return dtype, prose.message("set by the dtype parameter"), prose.message("the dtype parameter"), None


def open_chapter(name: str, namespace: Optional[dict] = None, *, checks: Optional[dict] = None,
                 lang: str = "auto", **parameters) -> Chapter:
    """Check the parameters, pick device and dtype, open ``Results``; see the module docstring.

    ``open_chapter(name, globals())`` takes the values of the names the notebook's ``parameters``
    cell declares (papermill's injected values included); keyword arguments add or override.
    ``checks`` adds or overrides rules for this chapter (``{"max_new_tokens": params.at_least(2)}``).
    """
    if namespace is not None:
        parameters = {**{k: namespace[k] for k in parameter_names(name) if k in namespace}, **parameters}
    parameters = params.check_all(parameters, checks)
    lang = edition_language(parameters.get("lang", lang))
    choice = backend.pick_device(parameters.get("device", "auto"))
    # chapter 00 measures dtype=auto afresh (it writes the record the other chapters read)
    dtype, dtype_reason, dtype_source, picked = resolve_dtype(parameters, choice.device,
                                                              reuse=name != DTYPE_CHAPTER)
    kept = {**{k: v for k, v in parameters.items() if k not in RUNNER_PARAMETERS}, "lang": lang,
            "profile": parameters.get("profile", "interactive")}
    results = Results(name, parameters.get("run_dir") or None, parameters=kept,
                      environment=backend.environment_report(choice.device))
    results.set("device_choice", {"device": str(choice.device), "reason": choice.reason,
                                  "dtype": backend.dtype_name(dtype), "dtype_reason": dtype_reason,
                                  "dtype_source": dtype_source})

    # the machine's load as the measurements start (Results.finish records it as they end): every
    # figure of the chapter was taken under it, so the header and the index warn beside them
    results.record_load("start")
    contention = pages.load_warning(results.data.get("load"), lang)
    # said first: a venv made for an NPU that sees none, and a class's thread share
    unseen, share = backend.npu_unseen(choice.device), backend.thread_share()
    for note in (unseen, share, contention):
        if note:
            results.note(note)
    chapter = Chapter(name, choice.device, choice.reason, dtype, dtype_reason, results, dict(parameters),
                      lang, picked)
    _show_choice(chapter, contention, unseen, share)
    return chapter


def _show_choice(chapter: Chapter, contention: Optional[str], unseen: Optional[str] = None,
                 share: Optional[str] = None) -> None:
    lang = chapter.lang
    device, dtype, warning = prose.tell(lang, "device"), prose.tell(lang, "dtype"), prose.tell(lang, "warning:")
    text = (f"**{device}** `{chapter.DEV}` ({prose.tr(chapter.device_reason, lang)}) · "
            f"**{dtype}** `{chapter.DT}` ({prose.tr(chapter.dtype_reason, lang)})")
    if unseen:
        text = f"**{warning}** {prose.tr(unseen, lang)}\n\n" + text
    if share:
        text += f"\n\n{prose.tr(share, lang)}"
    if contention:
        text += f"\n\n**{warning}** {contention}"
    try:
        from IPython.display import Markdown, display
    except ImportError:  # a plain Python session
        print(text)
        return
    display(Markdown(text))
