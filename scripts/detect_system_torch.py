"""Should setup reuse this interpreter's torch? One line on stdout says why, and the exit status:

  0  yes: torch_npu imports and an NPU is visible (an Ascend image with CANN loaded)
  1  no: no torch, or no torch_npu installed (a CPU or CUDA machine)
  3  stop: torch_npu is installed but does not import, or sees no NPU (an Ascend image whose CANN
     environment was not loaded in this shell, e.g. after an instance restart). Building a CPU venv
     here would hide the NPU; setup stops and says what to run instead.

Run by scripts/setup.sh with the interpreter it would build the venv from, or with the venv's own
Python when the venv already reuses an image's torch.

Keep this file runnable by any Python 3 (the guide's image has 3.8) and free of side effects:
a machine with torch_npu but without CANN must answer, not crash.
"""
import sys

CANN_HINT = ("load CANN's environment first: source /usr/local/Ascend/ascend-toolkit/set_env.sh "
             "(CANN 8.5 and newer: /usr/local/Ascend/cann/set_env.sh)")


def installed(name):
    try:
        import importlib.util
        return importlib.util.find_spec(name) is not None
    except Exception:  # noqa: BLE001  (a broken package still counts as installed)
        return True


def main():
    try:
        import torch
    except Exception as exc:  # noqa: BLE001  (torch_npu's auto-load can raise anything here)
        if installed("torch_npu"):
            print("torch_npu is installed in %s but torch does not import (%s: %s); %s"
                  % (sys.executable, type(exc).__name__, exc, CANN_HINT))
            return 3
        print("no usable torch in %s (%s: %s)" % (sys.executable, type(exc).__name__, exc))
        return 1
    if not installed("torch_npu"):
        print("torch %s without torch_npu" % torch.__version__)
        return 1
    try:
        import torch_npu  # noqa: F401
    except Exception as exc:  # noqa: BLE001
        first = str(exc).strip().splitlines()[0][:200] if str(exc).strip() else ""
        print("torch %s with a torch_npu that does not import in %s (%s: %s); %s"
              % (torch.__version__, sys.executable, type(exc).__name__, first, CANN_HINT))
        return 3
    try:
        available = bool(torch.npu.is_available()) and torch.npu.device_count() > 0
    except Exception as exc:  # noqa: BLE001
        print("torch_npu imports but the NPU query failed (%s: %s); %s" % (type(exc).__name__, exc, CANN_HINT))
        return 3
    if not available:
        print("torch_npu %s imports but no NPU is visible (check npu-smi info, and that this shell "
              "loaded CANN's set_env.sh)" % getattr(torch_npu, "__version__", "?"))
        return 3
    print("torch %s + torch_npu %s with %d NPU(s)"
          % (torch.__version__, getattr(torch_npu, "__version__", "?"), torch.npu.device_count()))
    return 0


if __name__ == "__main__":
    sys.exit(main())
