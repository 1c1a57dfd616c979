"""Reusable code of the ascend-llama-workbook; each module names the notebook that teaches it.

Importing ``helpers`` checks the support floor (Python >= 3.9, torch >= 2.1, the transformers
range of the notebooks) with a clear message, and sets quiet defaults for notebook output (no
progress bars, no torchao .so noise).

This file must stay parseable by Python 3.8 (the guide's image), so that an old interpreter gets
the message below instead of a SyntaxError: no f-strings with '=', no walrus, no match, no PEP 604.
"""
import logging
import os
import sys
import warnings
from pathlib import Path

MIN_PYTHON = (3, 9)  # the torch floor is versions.MIN_TORCH, checked once torch is imported

if sys.version_info < MIN_PYTHON:
    raise ImportError(
        "ascend-llama-workbook needs Python >= %d.%d, this is %s. On ModelArts pick an image with "
        "Python 3.9+ and torch >= 2.1, for example pytorch_2.1.0-cann_8.0.rc2-py_3.9-euler_2.10.7-"
        "aarch64-snt9b (legacy pinned set) or pytorch_2.7.1-cann_8.3.rc1-py_3.11-hce_2.0.2509-aarch64-"
        "snt9b (current set), not the guide's euler2.9-py38-torch2.1.0 image."
        % (MIN_PYTHON + (sys.version.split()[0],))
    )

# The repository's root: notebooks/, profiles/, data/ and reports/ are found from here.
REPO = Path(__file__).resolve().parent.parent

# Where a module sits. Each layer imports only from the layers below it, and a module imports only
# from modules listed before it (in its own layer or a lower one), at module level or inside a
# function alike (tests/test_layers.py reads every import with ast). A new function goes in the
# lowest module whose imports it needs; a function that names one chapter's table, figure or claim
# goes in that chapter's study module. CONTRIBUTING.md draws the same table.
LAYERS = (
    ("foundations", ("params", "results", "decide", "catalogs", "pages", "prose", "plots", "roofline",
                     "versions", "guide_api", "progress")),
    ("the guides' claims", ("claims",)),
    ("the device", ("backend",)),
    ("measurement", ("profiling", "bench", "quality")),
    ("model and kernels", ("model_files", "dtype_choice", "models", "ops", "quant", "ge_support",
                           "static_decode", "generation", "llamacpp")),
    ("chapter studies", ("environment_study", "operator_study", "end_to_end_study", "batching_study",
                         "int8_study", "decode_loop", "round_robin", "ladder", "rungs", "mindspeed", "serving",
                         "report")),
    ("entry points", ("workshop", "compare", "editions", "run", "chapter")),
)

# Before transformers / torchao are imported anywhere in the process.
for _name, _value in (
    ("HF_HUB_DISABLE_PROGRESS_BARS", "1"),
    ("TOKENIZERS_PARALLELISM", "false"),
    ("TRANSFORMERS_VERBOSITY", "error"),
):
    os.environ.setdefault(_name, _value)

TORCH_NPU_AUTOLOAD_HINT = (
    "torch_npu is installed but could not be loaded. If this machine has an NPU, run "
    "'source /usr/local/Ascend/ascend-toolkit/set_env.sh' (older CANN) or "
    "'source /usr/local/Ascend/cann/set_env.sh' (CANN 8.5 and newer) before starting Jupyter. "
    "On a machine without an NPU, uninstall torch_npu or export TORCH_DEVICE_BACKEND_AUTOLOAD=0 "
    "so that 'import torch' does not try to load it."
)
_CANN_ENV_VARS = ("ASCEND_HOME_PATH", "ASCEND_TOOLKIT_HOME", "ASCEND_OPP_PATH")

# Why TORCH_DEVICE_BACKEND_AUTOLOAD was turned off by this package, or None.
AUTOLOAD_DISABLED_REASON = None


def _torch_npu_autoload_registered():
    """Does an installed package register a torch.backends entry point for torch_npu?"""
    try:
        from importlib.metadata import entry_points

        groups = entry_points()  # Python 3.9 returns a dict of groups; select() arrived in 3.10
        found = (groups.select(group="torch.backends") if hasattr(groups, "select")
                 else groups.get("torch.backends", []))
        return any(ep.name == "torch_npu" or ep.value.split(":")[0].split(".")[0] == "torch_npu"
                   for ep in found)
    except Exception:
        return False


def _guard_torch_npu_autoload():
    """Turn off torch's auto-loading of torch_npu when CANN's environment is clearly absent.

    Since torch 2.5, torch_npu registers itself to load inside 'import torch'; without CANN that
    load fails and takes 'import torch' down with it. The helpers import torch_npu explicitly
    (``backend.import_torch_npu``), so auto-loading adds nothing for them: switching it off lets
    device='auto' fall back to CPU/CUDA, while device='npu' still fails with the reason.
    """
    global AUTOLOAD_DISABLED_REASON
    if "torch" in sys.modules or "TORCH_DEVICE_BACKEND_AUTOLOAD" in os.environ:
        return
    if any(os.environ.get(name) for name in _CANN_ENV_VARS):
        return  # set_env.sh was sourced: let torch_npu load as its docs describe
    if not _torch_npu_autoload_registered():
        return
    os.environ["TORCH_DEVICE_BACKEND_AUTOLOAD"] = "0"
    AUTOLOAD_DISABLED_REASON = (
        "torch_npu is installed but CANN's set_env.sh has not been sourced (no %s), so "
        "TORCH_DEVICE_BACKEND_AUTOLOAD=0 was set for this process; torch_npu is imported "
        "explicitly when a device is picked." % "/".join(_CANN_ENV_VARS)
    )


_guard_torch_npu_autoload()


def _runner_command_line() -> bool:
    """True in ``python -m helpers.run`` (and ``helpers.editions``): that process only reads notebooks
    and parameters and starts kernels (which import helpers again, with every check), so it skips the
    1-3 s torch import and a misspelt ``-p`` is reported at once. ``sys.orig_argv`` exists from Python 3.10."""
    argv = list(getattr(sys, "orig_argv", None) or [])
    return "-m" in argv and argv[argv.index("-m") + 1:argv.index("-m") + 2] in (["helpers.run"], ["helpers.editions"])


def _import_torch_and_check_floors() -> None:
    try:
        import torch  # noqa: F401
    except Exception as exc:  # torch_npu's auto-load raises RuntimeError from inside torch
        if "backend extension" in str(exc) or "torch_npu" in str(exc):
            raise ImportError("'import torch' failed while auto-loading torch_npu (%s: %s). %s"
                              % (type(exc).__name__, exc, TORCH_NPU_AUTOLOAD_HINT)) from exc
        raise
    from .versions import check_support_floor, check_transformers_floor

    check_support_floor()
    check_transformers_floor()


# tqdm.auto warns once per kernel that ipywidgets is missing; notebooks show no progress bars anyway.
warnings.filterwarnings("ignore", message="IProgress not found")

# transformers imports torchao during from_pretrained; on CPU torchao logs that its CUDA-only
# extensions do not load, and torch logs a pytree deprecation for torchao's enums. Neither
# teaches anything, so keep them out of executed notebooks.
for _logger in ("torchao", "torch.utils._pytree"):
    logging.getLogger(_logger).setLevel(logging.ERROR)

if not _runner_command_line():
    _import_torch_and_check_floors()

__version__ = "0.1.0"
