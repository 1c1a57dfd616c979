"""Workshop kit: a prepared cache the class can read, and a damaged cache found before loading.

The conversion runs the real ``convert_embedded`` (temporary folder, ``save_pretrained`` through
the real safetensors writer, rename) with the GGUF read replaced by a tiny random Llama, so each
test takes about a second instead of converting 540 MB.
"""
from __future__ import annotations

import io
import json
import os
import shlex
import shutil
import stat
import subprocess
import sys
from pathlib import Path

import pytest
import torch
import transformers
from safetensors.torch import save_file

from helpers import REPO, model_files, models, workshop
from helpers.model_files import ModelLoadError


@pytest.fixture
def fake_gguf(monkeypatch, tmp_path):
    """``convert_embedded`` reads a tiny random Llama instead of the shipped GGUF."""
    tiny, tokenizer = model_files.tiny_llama(seed=0)
    gguf = tmp_path / "gguf" / "fake.gguf"
    gguf.parent.mkdir()
    gguf.write_bytes(b"GGUF")
    monkeypatch.setattr(model_files, "locate_embedded_gguf", lambda: gguf)
    calls = []
    real_model = transformers.AutoModelForCausalLM.from_pretrained
    real_tokenizer = transformers.AutoTokenizer.from_pretrained

    def model_from(name, *args, **kwargs):
        if kwargs.get("gguf_file"):
            calls.append(str(name))
            return tiny
        return real_model(name, *args, **kwargs)

    def tokenizer_from(name, *args, **kwargs):
        return tokenizer if kwargs.get("gguf_file") else real_tokenizer(name, *args, **kwargs)

    monkeypatch.setattr(transformers.AutoModelForCausalLM, "from_pretrained", staticmethod(model_from))
    monkeypatch.setattr(transformers.AutoTokenizer, "from_pretrained", staticmethod(tokenizer_from))
    return calls


@pytest.fixture
def umask():
    """Set the process umask for one test and restore it afterwards."""
    previous = os.umask(0o022)
    os.umask(previous)
    yield lambda mask: os.umask(mask)
    os.umask(previous)


def _modes(folder: Path) -> dict:
    return {str(p.relative_to(folder)): stat.S_IMODE(p.stat().st_mode)
            for p in [folder, *folder.rglob("*")]}


@pytest.mark.parametrize("mask, folder_mode, file_mode", [(0o022, 0o755, 0o644), (0o077, 0o700, 0o600)])
def test_a_converted_cache_gets_the_modes_the_umask_allows(tmp_path, fake_gguf, umask, mask,
                                                           folder_mode, file_mode):
    umask(mask)
    folder = model_files.ensure_embedded_cache(tmp_path / "cache")
    assert fake_gguf == [str(folder.parent.parent.parent / "gguf")]  # the real conversion ran
    modes = _modes(tmp_path / "cache")
    assert (folder / "model.safetensors").exists()
    for name, mode in modes.items():
        is_dir = (tmp_path / "cache" / name).is_dir()
        assert mode == (folder_mode if is_dir else file_mode), f"{name}: {oct(mode)}"


def test_share_readable_fixes_whatever_mode_the_safetensors_writer_left(tmp_path, umask):
    # Some safetensors releases write 0600 whatever the umask, others respect it; either way the
    # cache must end up with the modes the umask allows.
    umask(0o022)
    save_file({"w": torch.zeros(2)}, str(tmp_path / "w.safetensors"))
    os.chmod(tmp_path / "w.safetensors", 0o600)  # the private case, whatever this release did
    model_files.share_readable(tmp_path)
    assert stat.S_IMODE((tmp_path / "w.safetensors").stat().st_mode) == 0o644


@pytest.mark.parametrize("mask", [0o022, 0o077])
def test_prepare_makes_a_class_folder_and_names_what_others_cannot_read(tmp_path, fake_gguf, umask, mask):
    umask(mask)
    out = io.StringIO()
    assert workshop.prepare(tmp_path / "class", out=out) == 0
    text = out.getvalue()
    env_file = tmp_path / "class" / workshop.ENV_FILE
    assert f"export WORKBOOK_CACHE={tmp_path / 'class' / 'cache'}" in env_file.read_text()
    assert "model cache: " in text and "is complete" in text and str(env_file) in text
    private = workshop.unreadable_by_others(tmp_path / "class")
    if mask == 0o022:
        assert private == [] and "warning" not in text
    else:
        assert (model_files.embedded_cache_path(tmp_path / "class" / "cache") / "model.safetensors") in \
            workshop.unreadable_by_others(tmp_path / "class", limit=100)
        assert "warning: other users cannot read" in text and "Your umask is 077" in text
        assert "umask 022" in text


def test_prepare_writes_the_class_share_of_the_cores_its_venvs_and_its_profile(tmp_path, fake_gguf, umask):
    umask(0o022)
    class_dir = tmp_path / "class"
    for venv in ("venv", "venv-vllm"):  # as make workshop-prep builds them before prepare
        (class_dir / venv).mkdir(parents=True)
    assert workshop.prepare(class_dir, out=io.StringIO(), attendees=3) == 0
    text = (class_dir / workshop.ENV_FILE).read_text()
    cores = len(os.sched_getaffinity(0))
    assert f"export OMP_NUM_THREADS={max(1, cores // 3)}" in text and "export WORKBOOK_PROFILE=quick" in text
    assert f"export VENV={class_dir / 'venv'}" in text and f"export VLLM_VENV={class_dir / 'venv-vllm'}" in text
    assert f"export WORKBOOK_CLASS_DIR={class_dir}" in text
    # both venvs are marked as the class's: setup only checks them from an attendee's clone
    assert all((class_dir / v / workshop.CLASS_MARKER).is_file() for v in ("venv", "venv-vllm"))


@pytest.mark.parametrize("attendees,cores,share", [(1, 2, 2), (2, 2, 1), (20, 2, 1), (4, 16, 4), (3, 16, 5)])
def test_the_fair_share_of_the_cores(attendees, cores, share):
    assert workshop.fair_share(attendees, cores) == share


@pytest.mark.parametrize("bad", [0, -1, 1.5, "2", True])
def test_a_bad_attendee_count_names_the_parameter(bad):
    with pytest.raises(ValueError, match="attendees"):
        workshop.fair_share(bad)


def test_a_kernel_carries_the_class_variables_set_at_registration(monkeypatch):
    monkeypatch.setattr(workshop, "npu_venv", lambda python=None: False)
    env = {"WORKBOOK_CACHE": "/srv/class/cache", "HF_HUB_OFFLINE": "1", "OMP_NUM_THREADS": "1",
           "VLLM_VENV": "/srv/class/venv-vllm", "HOME": "/home/a", "UNRELATED": "x"}
    spec = workshop.kernel_spec("/home/a/clone", "/srv/class/venv/bin/python", environ=env)
    assert spec["env"] == {k: env[k] for k in ("WORKBOOK_CACHE", "HF_HUB_OFFLINE", "OMP_NUM_THREADS", "VLLM_VENV")}
    assert spec["argv"][0] == "/srv/class/venv/bin/python" and spec["argv"][-1] == "{connection_file}"
    assert "env" not in workshop.kernel_spec("/home/a/clone", "/usr/bin/python3", environ={"HOME": "/home/a"})


def test_an_npu_kernel_sources_cann_before_python_starts(tmp_path, monkeypatch):
    monkeypatch.setattr(workshop, "npu_venv", lambda python=None: True)
    toolkit = tmp_path / "Ascend" / "ascend-toolkit"
    (toolkit / "latest").mkdir(parents=True)
    (toolkit / "set_env.sh").write_text("export ASCEND_OPP_PATH=/x\n")
    environ = {"ASCEND_TOOLKIT_HOME": str(toolkit / "latest")}  # what sourcing set_env.sh exported
    assert workshop.cann_set_env(environ) == toolkit / "set_env.sh"
    spec = workshop.kernel_spec(tmp_path / "clone", sys.executable, environ=environ)
    assert spec["argv"][:2] == ["/bin/bash", "-c"] and spec["argv"][4] == str(toolkit / "set_env.sh")
    assert spec["metadata"]["workbook"]["cann_set_env"] == str(toolkit / "set_env.sh")
    # the launcher really sources it, then runs Python with the kernel's arguments
    launch = spec["argv"][:spec["argv"].index("-c", 3)]
    proc = subprocess.run([*launch, "-c", "import os; print(os.environ['ASCEND_OPP_PATH'])"], capture_output=True,
                          text=True, env={"PATH": os.environ["PATH"]})
    assert proc.stdout.strip() == "/x", proc.stderr
    # no set_env.sh anywhere: the CANN variables set now are carried instead
    monkeypatch.setattr(workshop, "CANN_SET_ENV", ())
    spec = workshop.kernel_spec(tmp_path / "clone", sys.executable,
                                environ={"ASCEND_OPP_PATH": "/opp", "LD_LIBRARY_PATH": "/cann/lib64"})
    assert spec["argv"][0] == sys.executable and spec["env"] == {"ASCEND_OPP_PATH": "/opp", "LD_LIBRARY_PATH": "/cann/lib64"}


# --- damaged caches ---------------------------------------------------------------------------

def _tensors(path: Path) -> Path:
    save_file({"a": torch.arange(64, dtype=torch.float32), "b": torch.ones(8, 8)}, str(path))
    return path


def test_a_whole_safetensors_file_passes(tmp_path):
    assert model_files.safetensors_problem(_tensors(tmp_path / "m.safetensors")) is None


def test_a_truncated_safetensors_file_is_found_by_its_size(tmp_path):
    path = _tensors(tmp_path / "m.safetensors")
    size = path.stat().st_size
    with open(path, "r+b") as fh:
        fh.truncate(size - 1)
    problem = model_files.safetensors_problem(path)
    assert problem == f"m.safetensors is truncated: {size - 1} bytes, its header needs {size}"
    with open(path, "r+b") as fh:
        fh.truncate(40)  # inside the header, like a copy cut off early
    assert "truncated or not a safetensors file" in model_files.safetensors_problem(path)
    with open(path, "r+b") as fh:
        fh.truncate(3)
    assert model_files.safetensors_problem(path) == "m.safetensors is 3 bytes, too short to be a safetensors file"


def test_a_garbled_header_and_a_missing_file_are_named(tmp_path):
    path = tmp_path / "m.safetensors"
    path.write_bytes((20).to_bytes(8, "little") + b"{not json at all....")
    assert model_files.safetensors_problem(path) == "m.safetensors has a damaged header (not valid JSON)"
    assert model_files.safetensors_problem(tmp_path / "gone.safetensors") == "gone.safetensors is missing"


def _whole_cache(tmp_path: Path) -> Path:
    folder = model_files.embedded_cache_path(tmp_path / "cache")
    folder.mkdir(parents=True)
    for name in ("config.json", "tokenizer.json", "tokenizer_config.json"):
        (folder / name).write_text("{}")
    _tensors(folder / "model.safetensors")
    return folder


def test_a_missing_or_broken_config_is_named(tmp_path):
    folder = _whole_cache(tmp_path)
    assert model_files.embedded_cache_problem(folder) is None
    (folder / "config.json").write_text('{"hidden_size": 5')
    assert model_files.embedded_cache_problem(folder) == "config.json is damaged (not valid JSON)"
    (folder / "config.json").unlink()
    assert model_files.embedded_cache_problem(folder) == "config.json is missing"


def test_a_damaged_cache_is_rebuilt_before_loading(tmp_path, fake_gguf, umask):
    umask(0o022)
    cache = tmp_path / "cache"
    folder = model_files.ensure_embedded_cache(cache)
    weights = folder / "model.safetensors"
    with open(weights, "r+b") as fh:
        fh.truncate(weights.stat().st_size // 2)  # a partial copy
    with pytest.warns(UserWarning, match=r"damaged \(model.safetensors is truncated.*rebuilding"):
        model, tokenizer = models.load_model("smollm2-135m", dtype="float32", device="cpu",
                                             cache_dir=cache)
    assert len(fake_gguf) == 2  # converted, then rebuilt
    assert model_files.embedded_cache_problem(folder) is None
    assert stat.S_IMODE(weights.stat().st_mode) == 0o644
    assert model.config.num_hidden_layers == 2  # the rebuilt (tiny) weights loaded


def test_a_damaged_read_only_cache_names_the_command_that_rebuilds_it(tmp_path, monkeypatch):
    folder = _whole_cache(tmp_path)
    (folder / "config.json").unlink()

    def read_only(cache_dir=None):
        raise PermissionError("the model cache folder is not writable")

    def no_conversion(*a, **k):
        raise AssertionError("a read-only cache must not be converted")

    monkeypatch.setattr(model_files, "cache_root", read_only)
    monkeypatch.setattr(model_files, "convert_embedded", no_conversion)
    with pytest.raises(ModelLoadError) as err:
        model_files.ensure_embedded_cache(tmp_path / "cache")
    message = str(err.value)
    assert f"the cached smollm2-135m in {folder} is damaged (config.json is missing)" in message
    assert f"-m helpers.workshop cache --rebuild --cache-dir {tmp_path / 'cache'}" in message
    assert "\n" not in message  # a one-line fix


def test_the_cache_command_reports_then_rebuilds(tmp_path, fake_gguf, capsys, umask):
    umask(0o022)
    folder = _whole_cache(tmp_path)
    (folder / "model.safetensors").write_bytes(b"\0" * 4)
    assert workshop.main(["cache", "--cache-dir", str(tmp_path / "cache")]) == 1
    err = capsys.readouterr().err
    assert "is damaged (model.safetensors is 4 bytes" in err and "cache --rebuild --cache-dir" in err
    assert workshop.main(["cache", "--cache-dir", str(tmp_path / "cache"), "--rebuild"]) == 0
    assert "is complete" in capsys.readouterr().out
    assert json.loads((folder / "config.json").read_text())["num_hidden_layers"] == 2


# --- an attendee in a clone of their own ------------------------------------------------------

def _files(folder: Path) -> dict:
    return {str(p): (p.stat().st_mtime_ns, p.stat().st_size) for p in [folder, *folder.rglob("*")]}


def _second_clone(home: Path) -> Path:
    """Another user's clone: the package, the Makefile and empty notebook folders are all it needs here."""
    clone = home / "ascend-llama-workbook"
    shutil.copytree(REPO / "helpers", clone / "helpers", ignore=shutil.ignore_patterns("__pycache__"))
    shutil.copy(REPO / "Makefile", clone / "Makefile")
    (clone / "notebooks" / "zh").mkdir(parents=True)
    return clone


def _attendee_env(class_dir: Path, home: Path) -> dict:
    """The instructor's environment minus what ties it to a clone, plus the sourced workshop.env."""
    env = {k: v for k, v in os.environ.items()
           if k not in ("PYTHONPATH", "WORKBOOK_RUN_DIR", "WORKBOOK_REPORTS", "WORKBOOK_CACHE")}
    for line in (class_dir / workshop.ENV_FILE).read_text().splitlines():
        if line.startswith("export "):
            name, _, value = line[len("export "):].partition("=")
            env[name] = shlex.split(value)[0]
    env.update(VENV=sys.prefix, JUPYTER_DATA_DIR=str(home / "jupyter"))
    return env


# What a chapter's first cell does with the class's files: find the model in the shared cache
# (checked, not written) and open its results where an interactive run keeps them.
ATTENDEE_CELL = """
import json, os, helpers
# a wrong clone's helpers stops here, before it writes into that clone
assert helpers.__file__ == EXPECTED, "imported " + helpers.__file__
from helpers import model_files, results
folder = model_files.ensure_embedded_cache()
chapter = results.Results("00_environment_check", parameters={"profile": "interactive"})
chapter.record("layers", json.loads((folder / "config.json").read_text())["num_hidden_layers"], "")
chapter.finish()
print("ATTENDEE " + json.dumps({"helpers": helpers.__file__, "results": str(chapter.path), "model": str(folder),
                                "cwd": os.getcwd(), "pythonpath": os.environ["PYTHONPATH"]}))
"""


def test_an_attendee_runs_their_own_clone_against_a_read_only_class_folder(tmp_path, fake_gguf, umask,
                                                                          monkeypatch):
    """The instructor prepares a class folder (tiny model for speed) and it is made read-only; a second
    user in a second clone registers the shared venv as their kernel and starts it in a notebook
    folder, as JupyterLab would: it must import that clone's helpers (not the instructor's, which
    the venv's own path file may name), read the class cache, and write its results under that
    clone, leaving the class folder and the instructor's clone untouched. ``make lab`` must give its
    kernels the same clone."""
    from jupyter_client import KernelManager

    umask(0o022)
    class_dir = tmp_path / "class"
    assert workshop.prepare(class_dir, out=io.StringIO()) == 0
    home = tmp_path / "attendee"
    clone = _second_clone(home)
    env = _attendee_env(class_dir, home)
    mine = REPO / "reports" / "interactive" / "00_environment_check" / "results.json"
    before = (_files(class_dir), mine.stat().st_mtime_ns if mine.exists() else None)
    for path in [class_dir, *class_dir.rglob("*")]:
        path.chmod(0o555 if path.is_dir() else 0o444)
    try:
        proc = subprocess.run([sys.executable, "-m", "helpers.workshop", "kernel"], cwd=clone, env=env,
                              capture_output=True, text=True, timeout=120)
        assert proc.returncode == 0, proc.stderr
        name = workshop.kernel_name(clone)
        assert (home / "jupyter" / "kernels" / name / "kernel.json").is_file(), proc.stdout

        monkeypatch.setenv("JUPYTER_DATA_DIR", env["JUPYTER_DATA_DIR"])
        km = KernelManager(kernel_name=name)
        km.start_kernel(cwd=str(clone / "notebooks" / "zh"), env=env)
        kc = km.client()
        try:
            kc.start_channels()
            kc.wait_for_ready(timeout=60)
            out = []
            cell = ATTENDEE_CELL.replace("EXPECTED", repr(str(clone / "helpers" / "__init__.py")))
            reply = kc.execute_interactive(cell, timeout=120, output_hook=lambda msg: out.append(
                msg["content"].get("text", "") + "".join(msg["content"].get("traceback", []))))
        finally:
            kc.stop_channels()
            km.shutdown_kernel(now=True)
        text = "".join(out)
        assert reply["content"]["status"] == "ok", text
        seen = json.loads(text.split("ATTENDEE ", 1)[1].splitlines()[0])

        # make lab starts JupyterLab with PY; a stand-in for it starts a Python in a notebook folder
        # with the environment make gives it, as the Lab's kernels would be
        lab = home / "jupyter-lab"
        lab.write_text(f"#!/bin/sh\ncd notebooks/zh && exec {shlex.quote(sys.executable)} -c "
                       "'import importlib.util; print(importlib.util.find_spec(\"helpers\").origin)'\n")
        lab.chmod(0o755)
        lab_kernel = subprocess.run(["make", "-s", "-o", "setup", "lab", f"PY={lab}"], cwd=clone, env=env,
                                    capture_output=True, text=True, timeout=60)
    finally:
        for path in [class_dir, *class_dir.rglob("*")]:
            path.chmod(0o755 if path.is_dir() else 0o644)
    assert seen["helpers"] == str(clone / "helpers" / "__init__.py")
    assert seen["results"] == str(clone / "reports" / "interactive" / "00_environment_check" / "results.json")
    assert json.loads(Path(seen["results"]).read_text())["metrics"]["layers"]["value"] == 2  # the class's model
    assert seen["model"].startswith(str(class_dir / "cache"))
    assert seen["cwd"] == str(clone / "notebooks" / "zh")  # started in its notebook's folder
    assert seen["pythonpath"].split(os.pathsep)[0] == str(clone)  # and so are the processes it starts
    assert (_files(class_dir), mine.stat().st_mtime_ns if mine.exists() else None) == before
    assert lab_kernel.returncode == 0, lab_kernel.stderr
    assert lab_kernel.stdout.strip() == str(clone / "helpers" / "__init__.py")
