"""The machines users really have, simulated and run as written: a ModelArts Ascend image and one
machine shared by a class (make test's ``machines`` level).

**The Ascend image.** A base interpreter whose own site-packages hold the image's torch (another
version than the pins: the workbook's CPU torch relabelled 2.7.1, since no other torch can be had
here) and a strict ``torch_npu`` that imports only after a fake CANN ``set_env.sh`` has been sourced
(the real one fails with ``libhccl.so`` without it, and refuses a torch of another version). Its
Python is a base interpreter, as an image's conda Python is (a venv made from a venv does not see
that venv's packages). The shell steps of ``docs/ascend.md`` and ``docs/zh/ascend.md`` (the two
editions' commands are the same) run as written in a clone, CANN's folder being the fake's; then an
instance restart: a new shell without ``set_env.sh``, ``make kernel`` again. It must end in a message
that names ``set_env.sh``, with the venv's torch still the image's, never a CPU venv; and the kernel
``make kernel`` registered must see the NPU from a JupyterLab environment without CANN.

**The class.** The instructor runs ``make workshop-prep`` (venv, vLLM venv, model cache, workshop.env
for two attendees) with a Python every user can run; the class folder is then made read-only. Two
attendees, other users with their own HOME and clone, source ``workshop.env``, register their kernel
with ``make kernel`` and run chapters 00, 03 and 07 (vLLM serving) with it, side by side. Nothing in
the class folder may change; each kernel carries the class's variables and its share of the cores.
What each attendee used (CPU time, peak memory of their processes, disk) is written to
``reports/class-sizing.json`` for docs/workshop.md's sizing table.
"""
from __future__ import annotations

import json
import os
import pwd
import shlex
import shutil
import stat
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import pytest

from test_docs_commands import code_blocks

REPO = Path(__file__).resolve().parent.parent
pytestmark = pytest.mark.machines

# What a test's own environment must not hand to the simulated users' shells.
DROPPED = ("VENV", "VLLM_VENV", "PYTHONPATH", "VIRTUAL_ENV", "WORKBOOK_CACHE", "WORKBOOK_RUN_DIR",
           "WORKBOOK_REPORTS", "OMP_NUM_THREADS", "JUPYTER_DATA_DIR", "PYTHON", "USE_SYSTEM_TORCH",
           "WORKBOOK_PIN_SET", "WORKBOOK_TIMES", "MAKEFLAGS", "MAKELEVEL", "MFLAGS", "LANG_EDITION")


def base_env(home: Path, **extra) -> dict:
    env = {k: v for k, v in os.environ.items() if k not in DROPPED and not k.startswith("PYTEST")}
    # pip's cache stays the machine's: a new HOME must not mean downloading every package again
    cache = subprocess.run([sys.executable, "-m", "pip", "cache", "dir"], capture_output=True, text=True).stdout.strip()
    env.update(HOME=str(home), PIP_CACHE_DIR=cache or str(Path.home() / ".cache" / "pip"),
               PATH=os.pathsep.join(p for p in env.get("PATH", "").split(os.pathsep) if ".venv" not in p))
    env.update({k: str(v) for k, v in extra.items()})
    return env


def copy_clone(dest: Path) -> Path:
    """A clone of this checkout: the files git tracks or would add (what a fresh clone holds, with
    this checkout's changes), without venvs, reports or caches."""
    listed = subprocess.run(["git", "ls-files", "-co", "--exclude-standard", "-z"], cwd=REPO,
                            capture_output=True, text=True, check=True).stdout.split("\0")
    for name in filter(None, listed):
        source = REPO / name
        if source.is_file():
            (dest / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(source, dest / name)
    return dest


def open_folder(prefix: str) -> Path:
    """A folder every user may enter (pytest's own tmp_path is private to its user)."""
    folder = Path(tempfile.mkdtemp(prefix=prefix))
    folder.chmod(0o755)
    return folder


def run(command: str, env: dict, cwd: Path, *, user=None, timeout: int = 900) -> subprocess.CompletedProcess:
    argv = ["bash", "-c", command]
    if user is not None:  # another user, with no groups of this one
        argv = ["setpriv", f"--reuid={user}", f"--regid={user}", "--clear-groups", *argv]
    return subprocess.run(argv, cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout)


def shell_steps(page: Path) -> list[str]:
    """The page's shell blocks, each as written (the lines a reader pastes, comments kept)."""
    return [code for info, code in code_blocks(page.read_text()) if info.strip() in ("bash", "sh")]


# --- the Ascend image ------------------------------------------------------------------------------

IMAGE_TORCH = "2.7.1"
FAKE_SET_ENV = """\
# a stand-in for CANN's set_env.sh: the variables the real one exports, pointing at this fake toolkit
export ASCEND_TOOLKIT_HOME={root}/ascend-toolkit/latest
export ASCEND_HOME_PATH=$ASCEND_TOOLKIT_HOME
export ASCEND_OPP_PATH=$ASCEND_TOOLKIT_HOME/opp
export LD_LIBRARY_PATH=$ASCEND_TOOLKIT_HOME/lib64${{LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}}
"""
# Strict: without CANN's libraries on LD_LIBRARY_PATH it fails as the real wheel does, and it refuses a
# torch of another version than its own (the real torch_npu 2.7.1 cannot load against torch 2.13).
FAKE_TORCH_NPU = f'''\
import os, types
import torch
__version__ = "{IMAGE_TORCH}"
libs = [p for p in os.environ.get("LD_LIBRARY_PATH", "").split(":") if p and os.path.isfile(os.path.join(p, "libhccl.so"))]
if not libs:
    raise ImportError("libhccl.so: cannot open shared object file: No such file or directory")
if torch.__version__.split("+")[0] != __version__:
    raise RuntimeError("torch_npu " + __version__ + " needs torch " + __version__ + ", found " + torch.__version__)
torch.npu = types.SimpleNamespace(is_available=lambda: True, device_count=lambda: 1)
'''


def make_image(root: Path) -> tuple[Path, Path]:
    """(the image's python, the fake CANN root). The interpreter is this machine's base Python with a
    site-packages of its own: the stdlib linked in, the image's torch and torch_npu installed there."""
    base = Path(sys.base_prefix)
    version = f"python{sys.version_info.major}.{sys.version_info.minor}"
    image = root / "image"
    lib = image / "lib" / version
    site = lib / "site-packages"
    site.mkdir(parents=True)
    (image / "bin").mkdir()
    for entry in (base / "lib" / version).iterdir():
        if entry.name != "site-packages":
            (lib / entry.name).symlink_to(entry)
    shutil.copy2(os.path.realpath(sys._base_executable), image / "bin" / "python3")
    (image / "bin" / "python").symlink_to("python3")
    # the image's torch: this venv's, relabelled, its files linked (no copy of a 700 MB package)
    import torch
    from importlib import metadata

    def link(dist, skip=()):
        found = metadata.distribution(dist)
        for file in found.files or []:
            target = site / file
            if str(file).startswith("..") or ".dist-info" in str(file) or str(file) in skip or target.exists():
                continue
            target.parent.mkdir(parents=True, exist_ok=True)
            target.symlink_to(Path(found.locate_file(file)).resolve())

    link("torch", skip=("torch/version.py",))
    text = (Path(torch.__file__).parent / "version.py").read_text()
    (site / "torch" / "version.py").write_text(text.replace(torch.__version__, IMAGE_TORCH))
    info = site / f"torch-{IMAGE_TORCH}.dist-info"
    info.mkdir()
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: torch\nVersion: {IMAGE_TORCH}\n")
    (info / "INSTALLER").write_text("image\n")
    (info / "RECORD").write_text("")
    for dist in ("numpy", "typing_extensions", "sympy", "mpmath", "networkx", "filelock", "fsspec", "jinja2",
                 "markupsafe", "setuptools"):  # what torch itself imports, as an image has it
        link(dist)
    (site / "torch_npu").mkdir()
    (site / "torch_npu" / "__init__.py").write_text(FAKE_TORCH_NPU)
    cann = root / "Ascend"
    (cann / "ascend-toolkit" / "latest" / "lib64").mkdir(parents=True)
    (cann / "ascend-toolkit" / "latest" / "lib64" / "libhccl.so").write_bytes(b"")
    (cann / "ascend-toolkit" / "set_env.sh").write_text(FAKE_SET_ENV.format(root=cann))
    return image / "bin" / "python3", cann


def test_the_ascend_image_steps_as_written_and_an_instance_restart(tmp_path):
    english, chinese = REPO / "docs" / "ascend.md", REPO / "docs" / "zh" / "ascend.md"
    steps = shell_steps(english)
    # both editions give the same commands (comments are the reader's language)
    assert [_commands(s) for s in steps] == [_commands(s) for s in shell_steps(chinese)]
    python, cann = make_image(tmp_path)
    home = tmp_path / "home"
    home.mkdir()
    copy_clone(home / "ascend-llama-workbook")
    # the image's Python is the one on PATH, as in a ModelArts terminal
    env = base_env(home, PATH=f"{python.parent}{os.pathsep}{os.environ['PATH']}", JUPYTER_DATA_DIR=home / "jupyter")
    # step 2 (CANN, the check) and step 3 (clone, setup, kernel); the restart's block comes later
    setup_steps = steps[:next(i for i, s in enumerate(steps) if "make setup" in s) + 1]
    restart_step = next(s for s in steps if "make kernel" in s and "make setup" not in s)
    assert len(setup_steps) == 2 and "set_env.sh" in setup_steps[0] and "set_env.sh" in restart_step, steps
    script = "set -e\n" + "\n".join(setup_steps).replace("/usr/local/Ascend", str(cann))
    first = run(script, env, home, timeout=900)
    out = first.stdout + first.stderr
    assert first.returncode == 0, out[-4000:]
    assert "True" in first.stdout and "USE_SYSTEM_TORCH=auto -> 1" in out, out[-4000:]
    venv = home / "ascend-llama-workbook" / ".venv"
    check = "import torch, torch_npu; print(torch.__version__, torch.__file__)"

    def venv_torch(extra_env=None):
        proc = subprocess.run([str(venv / "bin" / "python"), "-c", check], env={**env, **(extra_env or {})},
                              capture_output=True, text=True)
        return proc.returncode, proc.stdout + proc.stderr

    cann_env = {"LD_LIBRARY_PATH": str(cann / "ascend-toolkit" / "latest" / "lib64")}
    code, seen = venv_torch(cann_env)
    assert code == 0 and seen.startswith(IMAGE_TORCH) and str(tmp_path / "image") in seen, seen

    # the kernel make kernel registered sees the NPU even where the JupyterLab has no CANN variables
    kernel = json.loads(next((home / "jupyter" / "kernels").glob("*/kernel.json")).read_text())
    assert kernel["metadata"]["workbook"]["cann_set_env"] == str(cann / "ascend-toolkit" / "set_env.sh")
    launch = kernel["argv"][:kernel["argv"].index("-c", 3)]  # bash -c <launcher> name set_env python
    proc = subprocess.run([*launch, "-c", "import torch, torch_npu; print(torch.npu.is_available())"],
                          env=env, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0 and proc.stdout.strip() == "True", proc.stdout + proc.stderr

    # an instance restart: a new shell, no set_env.sh, make kernel again as the docs say
    restart = run("cd ascend-llama-workbook && make kernel", env, home, timeout=300)
    said = restart.stdout + restart.stderr
    assert restart.returncode != 0, said[-3000:]
    assert "set_env.sh" in said and "never installs a pinned CPU torch" in said, said[-3000:]
    code, seen = venv_torch(cann_env)
    assert code == 0 and seen.startswith(IMAGE_TORCH), seen  # still the image's torch, never 2.13 in the venv
    assert not list((venv / "lib").glob("python3*/site-packages/torch")), "a torch was installed into the venv"
    # and a chapter started there says plainly that this NPU venv sees no NPU
    note = subprocess.run([str(venv / "bin" / "python"), "-c",
                           "from helpers import backend; print(backend.npu_unseen('cpu'))"],
                          cwd=home / "ascend-llama-workbook", env=env, capture_output=True, text=True)
    assert "made for an NPU" in note.stdout and "set_env.sh" in note.stdout, note.stdout + note.stderr
    # the docs' restart steps, as written: set_env.sh again, then make kernel works as before
    again = run("set -e\n" + restart_step.replace("/usr/local/Ascend", str(cann)), env, home, timeout=300)
    assert again.returncode == 0, (again.stdout + again.stderr)[-3000:]


def _commands(block: str) -> list[str]:
    """A block's commands without comments and without the Chinese edition's LANG=zh."""
    return [line.split("#")[0].replace(" LANG=zh", "").strip() for line in block.replace("\\\n", " ").splitlines()
            if line.split("#")[0].strip()]


# --- the class -------------------------------------------------------------------------------------

def world_python() -> "str | None":
    """A Python 3.11+ that every user can run (the pyenv one under root's home is not), or None."""
    for candidate in ("/usr/bin/python3", "/usr/local/bin/python3", shutil.which("python3") or ""):
        if not candidate or not os.path.exists(candidate):
            continue
        real = Path(os.path.realpath(candidate))
        if any(not p.stat().st_mode & stat.S_IXOTH for p in [real, *real.parents]):
            continue
        probe = subprocess.run([str(real), "-c", "import sys, venv, ensurepip; print(sys.version_info >= (3, 11))"],
                               capture_output=True, text=True)
        if probe.stdout.strip() == "True":
            return candidate
    return None


def _rss_watch(uids: dict, stop: threading.Event, peaks: dict) -> None:
    """Peak resident memory of each user's processes together, and of those that are not the vLLM
    server (``peaks[(uid, "without vllm")]``), sampled every half second."""
    while not stop.is_set():
        totals = {key: 0 for uid in uids for key in (uid, (uid, "without vllm"))}
        for proc in Path("/proc").iterdir():
            if not proc.name.isdigit():
                continue
            try:
                status = (proc / "status").read_text()
                command = (proc / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
            except OSError:
                continue
            fields = dict(line.split(":", 1) for line in status.splitlines() if ":" in line)
            uid = int(fields.get("Uid", "0").split()[0])
            if uid in uids and "VmRSS" in fields:
                rss = int(fields["VmRSS"].split()[0]) * 1024
                totals[uid] += rss
                if "vllm" not in command:
                    totals[(uid, "without vllm")] += rss
        for key, total in totals.items():
            peaks[key] = max(peaks.get(key, 0), total)
        stop.wait(0.5)


def _tree_bytes(folder: Path) -> int:
    return sum(p.lstat().st_size for p in folder.rglob("*") if p.is_file() and not p.is_symlink())


def _snapshot(folder: Path) -> dict:
    return {str(p): (p.stat().st_mtime_ns, p.stat().st_size) for p in [folder, *folder.rglob("*")]
            if not p.is_symlink()}


def test_a_class_on_one_machine_with_two_attendees_as_other_users():
    python = world_python()
    if python is None:
        pytest.skip("no Python 3.11+ here that other users can run (a class machine has one in /usr/bin)")
    root = open_folder("workbook-class-")
    _class_run(root, python)  # a failed run leaves its folder for a look (its path is in the failure)
    subprocess.run(["chmod", "-R", "u+w", str(root)], check=False)
    shutil.rmtree(root, ignore_errors=True)


def _class_run(root: Path, python: str) -> None:
    instructor = root / "instructor"
    instructor.mkdir()
    clone = copy_clone(instructor / "ascend-llama-workbook")
    class_dir = root / "class"
    env = base_env(instructor)
    started = time.perf_counter()
    prep = run(f"umask 022 && make workshop-prep WORKSHOP_DIR={class_dir} ATTENDEES=2 PYTHON={python}",
               env, clone, timeout=1500)
    prep_s = time.perf_counter() - started
    assert prep.returncode == 0, (prep.stdout + prep.stderr)[-5000:]
    workshop_env = (class_dir / "workshop.env").read_text()
    for line in ("OMP_NUM_THREADS=", "VLLM_VENV=", "VENV=", "WORKBOOK_CACHE=", "WORKBOOK_PROFILE=quick"):
        assert line in workshop_env, workshop_env
    assert not (class_dir / "venv-vllm" / ".vllm-unavailable").exists(), \
        (class_dir / "venv-vllm" / ".vllm-unavailable").read_text()
    # read-only for everyone (root ignores modes, so the attendees are other users)
    subprocess.run(["chmod", "-R", "a-w", str(class_dir)], check=True)
    before = _snapshot(class_dir)

    as_root = os.geteuid() == 0
    attendees = {}
    for index in (1, 2):
        home = root / f"attendee{index}"
        home.mkdir()
        copy_clone(home / "ascend-llama-workbook")
        uid = 61000 + index if as_root else None
        if as_root:
            subprocess.run(["chown", "-R", f"{uid}:{uid}", str(home)], check=True)
        attendees[index] = (home, uid)
    command = (f"source {class_dir}/workshop.env && cd ascend-llama-workbook && make kernel && "
               '"$VENV/bin/python" -m helpers.run --profile smoke --only 00 03 07 --run-id class '
               '--kernel "$("$VENV/bin/python" -m helpers.workshop name)"')
    peaks: dict = {}
    stop = threading.Event()
    watcher = threading.Thread(target=_rss_watch, args=({uid: i for i, (_, uid) in attendees.items()}, stop, peaks),
                               daemon=True)
    if as_root:
        watcher.start()
    procs, times = {}, {}
    for index, (home, uid) in attendees.items():
        user_env = base_env(home, USER=f"attendee{index}", LOGNAME=f"attendee{index}")
        user_env.pop("PIP_CACHE_DIR")  # an attendee installs nothing
        argv = ["bash", "-c", command]
        if uid is not None:
            argv = ["setpriv", f"--reuid={uid}", f"--regid={uid}", "--clear-groups", *argv]
        times[index] = time.perf_counter()
        procs[index] = subprocess.Popen(argv, cwd=home, env=user_env, stdout=subprocess.PIPE,
                                        stderr=subprocess.STDOUT, text=True)
    outputs, usage = {}, {}
    for index, proc in procs.items():
        outputs[index] = proc.communicate(timeout=1800)[0]
        times[index] = time.perf_counter() - times[index]
    stop.set()
    for index, proc in procs.items():
        assert proc.returncode == 0, f"attendee {index}:\n" + outputs[index][-5000:]

    assert _snapshot(class_dir) == before, "an attendee's run changed the class folder"
    sizing = {"prepare_s": round(prep_s, 1), "cores": os.cpu_count(), "attendees": {}}
    for index, (home, uid) in attendees.items():
        clone = home / "ascend-llama-workbook"
        run_dir = clone / "reports" / "class"
        chapters = json.loads((run_dir / "run.json").read_text())["notebooks"]
        status = {c["notebook"][:2]: c["status"] for c in chapters}
        assert status == {"00": "ok", "03": "ok", "07": "ok"}, (index, chapters)
        kernel = json.loads(next((home / ".local" / "share" / "jupyter" / "kernels").glob("*/kernel.json")).read_text())
        assert kernel["env"]["OMP_NUM_THREADS"] == str(max(1, (os.cpu_count() or 1) // 2)), kernel
        assert kernel["env"]["WORKBOOK_CACHE"] == str(class_dir / "cache") and kernel["env"]["VLLM_VENV"]
        setup = json.loads((run_dir / "00_environment_check" / "results.json").read_text())
        assert any("OMP_NUM_THREADS" in str(n) for n in setup.get("notes", [])), setup.get("notes")
        launch = json.loads((run_dir / "07_serving" / "results.json").read_text())["metrics"]["serving_launch"]
        assert launch["python"].startswith(str(class_dir / "venv-vllm")), ("chapter 07 served with", launch)
        sizing["attendees"][index] = {"wall_s": round(times[index], 1),
                                      "peak_rss_gib": round(peaks.get(uid, 0) / 2**30, 2) if uid else None,
                                      "peak_rss_without_vllm_gib": (round(peaks.get((uid, "without vllm"), 0) / 2**30, 2)
                                                                    if uid else None),
                                      "disk_mib": round(_tree_bytes(home) / 2**20, 1)}
    sizing["class_folder_gib"] = round(_tree_bytes(class_dir) / 2**30, 2)
    out = REPO / "reports" / "class-sizing.json"
    out.parent.mkdir(exist_ok=True)
    out.write_text(json.dumps(sizing, indent=1))
    print("class sizing:", json.dumps(sizing))
