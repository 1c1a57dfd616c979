"""Progress inside a long cell: which step of how many is running, and for how long.

Layer: foundations. Seen wherever a cell runs for more than a few seconds: chapter 06's rungs and
rounds (``06_optimization_ladder``), chapter 07's serving levels and its wait for the server, the
sweeps of chapters 03 to 05, the dtype probe of 00_environment_check and the operator timings of
chapters 01 and 02.

``steps`` wraps a loop in one tqdm line on stdout, ``3/9 + graph mode |██████    | 02:41``: JupyterLab
redraws it in place, and the runner keeps its last state in the executed notebook (it merges a
cell's stream output the way a notebook front end shows it, ``helpers.run.keep_output``), so an
executed notebook holds one line per loop, not one per update. The runner silences the libraries'
own bars (``TQDM_DISABLE``); these are shown on purpose.
"""
from __future__ import annotations

import sys
from typing import Callable, Iterable, Iterator, Optional, TypeVar

from tqdm.std import tqdm

from .catalogs import edition_language
from .prose import translate_cell

T = TypeVar("T")

# A refresh at most this often between two steps (each step's start is always shown), so a wait of
# minutes writes a few dozen updates, not thousands.
MIN_INTERVAL_S = 10.0


def steps(items: Iterable[T], name: Callable[[T], str] = str, total: Optional[int] = None) -> Iterator[T]:
    """Each of ``items``, while one line says ``i/n name(item)`` (in the notebook's edition: a message
    or a catalog word is translated) and the time since the loop began.

    ``total`` defaults to ``len(items)``; an iterable without a length and no ``total`` (a wait
    polled until it ends) shows ``name(item)`` and the elapsed time only.
    """
    lang = edition_language()  # a label is a message or a table's word: said in the notebook's edition
    if total is None and hasattr(items, "__len__"):
        total = len(items)
    shape = "{desc} |{bar:12}| {elapsed}" if total else "{desc} {elapsed}"
    bar = tqdm(total=total, file=sys.stdout, disable=False, mininterval=MIN_INTERVAL_S, ascii=False,
               bar_format=shape, dynamic_ncols=False, leave=True)
    try:
        for i, item in enumerate(items, 1):
            label = translate_cell(name(item), lang)
            desc = f"{i}/{total} {label}" if total else str(label)
            if desc != bar.desc:
                bar.set_description_str(desc)
            yield item
            bar.update()
    finally:
        bar.close()
