"""Which pinned set should setup install for this interpreter? Run by scripts/setup.sh with the
interpreter it builds the venv from; prints shell assignments (PIN_SET, PIN_REQUIREMENTS,
PIN_TORCH, PIN_NUMPY_CONSTRAINT, PIN_REASON) for setup.sh to eval, or exits 2 with a message
naming an image that works when a floor is not met.

  current  requirements-common.txt  Python >= 3.11 and torch >= 2.6 (transformers 5.x, numpy 2.x)
  legacy   requirements-legacy.txt  Python 3.9-3.10, or torch 2.1-2.5, or an image whose numpy is
                                    1.x (transformers 4.57.x, numpy 1.26)

Why: transformers 5.x requires Python >= 3.11 and disables PyTorch below torch 2.6; the 4.57 line
needs Python >= 3.9 and torch >= 2.1. torch < 2.3 (and the torch_npu built with it) is compiled
against numpy 1.x, so on an image numpy never moves to a new major.

Keep this file runnable by any Python 3 (the guide's image has 3.8): no f-strings with '=', no
walrus, no match. Arguments override what is detected (the tests use them):
  --use-system-torch 0|1   1: the venv reuses this interpreter's torch (an image); 0: pinned torch
  --python X.Y.Z --torch X.Y.Z|none --numpy X.Y.Z|none
Environment: WORKBOOK_PIN_SET=auto|current|legacy forces a set (it must still meet its floors).
"""
import os
import re
import sys

try:
    from shlex import quote
except ImportError:  # pragma: no cover
    from pipes import quote

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
GOOD_IMAGES = ("pytorch_2.7.1-cann_8.3.rc1-py_3.11-hce_2.0.2509-aarch64-snt9b (current set) or "
               "pytorch_2.1.0-cann_8.0.rc2-py_3.9-euler_2.10.7-aarch64-snt9b (legacy set)")
MIN_PYTHON = (3, 9)
MIN_TORCH = (2, 1)
CURRENT_MIN_PYTHON = (3, 11)
CURRENT_MIN_TORCH = (2, 6)
# torch 2.8 is the last release with cp39 wheels; the pinned torch of requirements.txt needs >= 3.10.
PY39_TORCH = "torch==2.8.0"
SETS = {"current": "requirements-common.txt", "legacy": "requirements-legacy.txt"}


class FloorError(Exception):
    pass


def version_tuple(text):
    numbers = [int(n) for n in re.findall(r"\d+", str(text).split("+")[0])[:3]]
    return tuple((numbers + [0, 0, 0])[:3])


def dotted(numbers):
    return ".".join(str(n) for n in numbers)


def pinned_torch():
    """The torch pin of requirements.txt ('torch==2.13.0')."""
    with open(os.path.join(REPO, "requirements.txt")) as handle:
        for line in handle:
            line = line.split("#")[0].strip()
            if re.match(r"torch\s*==", line):
                return line.replace(" ", "")
    raise FloorError("requirements.txt has no 'torch==' pin")


def choose(python, torch, numpy, use_system_torch, forced="auto"):
    """Return a dict with set, requirements, torch (pip requirement or ''), numpy_constraint, reason.

    python: 'X.Y.Z'; torch / numpy: the interpreter's versions or None; use_system_torch: bool.
    Raises FloorError (message names an image that works) when a floor is not met.
    """
    if forced not in ("auto", "current", "legacy"):
        raise FloorError("WORKBOOK_PIN_SET=%s is not valid; use auto, current or legacy" % forced)
    py = version_tuple(python)[:2]
    if py < MIN_PYTHON:
        raise FloorError(
            "Python %s is below the workbook's floor (Python >= %s). On ModelArts pick an image such as %s, "
            "or set PYTHON=python3.9 (or newer)." % (python, dotted(MIN_PYTHON), GOOD_IMAGES))
    if use_system_torch:
        if torch is None:
            raise FloorError("USE_SYSTEM_TORCH=1 but %s cannot import torch; on an Ascend image run "
                             "'source /usr/local/Ascend/ascend-toolkit/set_env.sh' first, or use "
                             "USE_SYSTEM_TORCH=0" % sys.executable)
        torch_text = "the image's torch %s" % torch
        torch_version = version_tuple(torch)[:2]
        if torch_version < MIN_TORCH:
            raise FloorError(
                "torch %s is below the workbook's floor (torch >= %s; transformers 4.57 disables PyTorch "
                "below it). On ModelArts pick an image such as %s." % (torch, dotted(MIN_TORCH), GOOD_IMAGES))
        torch_requirement = ""
    else:
        torch_requirement = pinned_torch() if py >= (3, 10) else PY39_TORCH
        torch_text = "pinned %s" % torch_requirement
        torch_version = version_tuple(torch_requirement.split("==")[1])[:2]

    legacy_because = []
    if py < CURRENT_MIN_PYTHON:
        legacy_because.append("Python %s < %s (transformers 5.x requires Python >= %s)"
                              % (python, dotted(CURRENT_MIN_PYTHON), dotted(CURRENT_MIN_PYTHON)))
    if torch_version < CURRENT_MIN_TORCH:
        legacy_because.append("%s < %s (transformers 5.x disables PyTorch below %s)"
                              % (torch_text, dotted(CURRENT_MIN_TORCH), dotted(CURRENT_MIN_TORCH)))
    numpy_constraint = ""
    if use_system_torch and (version_tuple(torch)[:2] < (2, 3)
                             or (numpy is not None and version_tuple(numpy)[0] < 2)):
        numpy_constraint = "numpy<2"
        legacy_because.append("the image keeps numpy 1.x (numpy %s; its torch/torch_npu may be built "
                              "against numpy 1.x, the current set needs numpy 2)" % (numpy or "absent"))

    if forced == "current" and legacy_because:
        raise FloorError("WORKBOOK_PIN_SET=current cannot work here: " + "; ".join(legacy_because))
    if forced != "auto":
        chosen, reason = forced, "forced by WORKBOOK_PIN_SET=%s (Python %s, %s)" % (forced, python, torch_text)
    elif legacy_because:
        chosen, reason = "legacy", "; ".join(legacy_because)
    else:
        chosen, reason = "current", "Python %s >= %s and %s >= %s" % (
            python, dotted(CURRENT_MIN_PYTHON), torch_text, dotted(CURRENT_MIN_TORCH))
    return {"set": chosen, "requirements": SETS[chosen], "torch": torch_requirement,
            "numpy_constraint": numpy_constraint, "reason": reason}


def _installed(module):
    try:
        return __import__(module).__version__
    except Exception:  # noqa: BLE001  (torch_npu's auto-load can raise anything here)
        return None


def main(argv):
    args = dict(zip(argv[0::2], argv[1::2]))
    python = args.get("--python", "%d.%d.%d" % sys.version_info[:3])
    use_system = args.get("--use-system-torch", "0") == "1"
    torch = args.get("--torch") or (_installed("torch") if use_system else None)
    numpy = args.get("--numpy") or (_installed("numpy") if use_system else None)
    torch = None if torch == "none" else torch
    numpy = None if numpy == "none" else numpy
    try:
        result = choose(python, torch, numpy, use_system, os.environ.get("WORKBOOK_PIN_SET", "auto") or "auto")
    except FloorError as exc:
        sys.stderr.write("error: %s\n" % exc)
        return 2
    for key in ("set", "requirements", "torch", "numpy_constraint", "reason"):
        print("PIN_%s=%s" % (key.upper(), quote(result[key])))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
