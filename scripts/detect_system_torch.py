"""Should setup reuse this interpreter's torch? Exit 0 (yes) when torch_npu imports and an NPU is
visible, 1 otherwise; one line on stdout says why. Run by scripts/setup.sh with the interpreter it
would build the venv from.

Keep this file runnable by any Python 3 (the guide's image has 3.8) and free of side effects:
a machine with torch_npu but without CANN must answer 1, not crash.
"""
import sys


def main():
    try:
        import torch
    except Exception as exc:  # noqa: BLE001  (torch_npu's auto-load can raise anything here)
        print("no usable torch in %s (%s: %s)" % (sys.executable, type(exc).__name__, exc))
        return 1
    try:
        import torch_npu  # noqa: F401
    except Exception as exc:  # noqa: BLE001
        print("torch %s without a loadable torch_npu (%s)" % (torch.__version__, type(exc).__name__))
        return 1
    try:
        available = bool(torch.npu.is_available()) and torch.npu.device_count() > 0
    except Exception as exc:  # noqa: BLE001
        print("torch_npu imports but the NPU query failed (%s: %s)" % (type(exc).__name__, exc))
        return 1
    if not available:
        print("torch_npu %s imports but no NPU is visible" % getattr(torch_npu, "__version__", "?"))
        return 1
    print("torch %s + torch_npu %s with %d NPU(s)"
          % (torch.__version__, getattr(torch_npu, "__version__", "?"), torch.npu.device_count()))
    return 0


if __name__ == "__main__":
    sys.exit(main())
