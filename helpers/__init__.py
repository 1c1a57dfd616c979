"""Reusable code of the ascend-llama-workbook; each module names the notebook that teaches it.

Importing ``helpers`` checks the support floor (Python >= 3.10, torch >= 2.1) with a clear
message, and sets quiet defaults for notebook output (no progress bars, no torchao .so noise).
"""
import os
import sys

MIN_PYTHON = (3, 10)
MIN_TORCH = (2, 1, 0)

if sys.version_info < MIN_PYTHON:  # must stay parseable by old Pythons: keep this file simple
    raise ImportError(
        "ascend-llama-workbook needs Python >= %d.%d, this is %s. On ModelArts pick an image with "
        "Python 3.10+ and torch >= 2.1 (for example a PyTorch 2.1+ / CANN 8.x image), not the "
        "guide's euler2.9-py38-torch2.1.0 image." % (MIN_PYTHON + (sys.version.split()[0],))
    )

# Before transformers / torchao are imported anywhere in the process.
for _name, _value in (
    ("HF_HUB_DISABLE_PROGRESS_BARS", "1"),
    ("TOKENIZERS_PARALLELISM", "false"),
    ("TRANSFORMERS_VERBOSITY", "error"),
):
    os.environ.setdefault(_name, _value)

import logging  # noqa: E402

# transformers imports torchao during from_pretrained; on CPU torchao logs that its CUDA-only
# extensions do not load, and torch logs a pytree deprecation for torchao's enums. Neither
# teaches anything, so keep them out of executed notebooks.
for _logger in ("torchao", "torch.utils._pytree"):
    logging.getLogger(_logger).setLevel(logging.ERROR)

from .compat import check_support_floor  # noqa: E402

check_support_floor()

__version__ = "0.1.0"
