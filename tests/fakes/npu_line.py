"""What one torch_npu line is made of, as the fakes need it: the facts live in ``line_*.py``.

Every ``line_*.py`` module in this folder describes one supported torch_npu line (a torch_npu
release, the CANN it pairs with, and the op-plugin and torchair commits it was built from) with the
names below. ``fake_torch_npu.build`` and ``fake_torchair.build`` turn one description into a strict
``torch_npu`` and ``torchair``. A name a line file leaves out falls back to ``DEFAULTS``.

Sources are named as ``repo@commit:path[:line]``, read from stored copies of the public
repositories Ascend/pytorch, Ascend/op-plugin and Ascend/torchair; a fact that could not be
checked for that line says so in the line file (``UNVERIFIED``).
"""
from __future__ import annotations

import importlib.util
from pathlib import Path

HERE = Path(__file__).resolve().parent
# Oldest first; the test ids are the torch_npu versions.
LINE_FILES = ("line_2_1_0", "line_2_1_0_post6", "line_2_1_0_post10", "line_2_5_1", "line_2_7_1",
              "line_2_9_0_post2")

DEFAULTS = {
    "IMAGE": "",
    "UNVERIFIED": (),
    "HAS_MEM_GET_INFO": True,
    "BACKEND_OPTIONS": None,   # None: _npu_backend takes no **kwargs; else the option names it accepts
    "REDUCE_OVERHEAD_DEPRECATED": False,
    "OPTION_ERROR_STYLE": "repr",
    "WRAPS_CONFIG_ERRORS": True,
    "GET_NPU_BACKEND_TAKES_AOT_CONFIG": False,
}


def load(name: str):
    """The line module ``name`` (a file name from ``LINE_FILES``), with ``DEFAULTS`` filled in."""
    spec = importlib.util.spec_from_file_location(f"_npu_line_{name}", HERE / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    for key, value in DEFAULTS.items():
        if not hasattr(module, key):
            setattr(module, key, value)
    return module


def all_lines():
    return [load(name) for name in LINE_FILES]
