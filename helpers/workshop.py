"""Prepare a class: ``python -m helpers.workshop prepare /srv/class`` (``make workshop-prep``)
(layer: entry points; used before 00_environment_check, for what every chapter reads).

A workshop shares one machine or one network folder. The instructor prepares, once and online
if need be, everything the notebooks read: the converted embedded model (``<dir>/cache``, the
folder ``WORKBOOK_CACHE`` points at), optionally a reference report with the ``default``
profile (``<dir>/reports/reference``), and a ``workshop.env`` file to source. ``make
workshop-prep`` also builds the venv in ``<dir>/venv`` first. Every file gets the modes the
umask allows, so with umask 022 the class can read them; anything others cannot read is listed.

Each attendee works in a clone of their own: a kernel imports the ``helpers`` of the clone it
was started from, and interactive results land under that clone's ``reports/``. The shared venv
holds no path to any clone (``scripts/setup.sh`` writes its ``.pth`` only into a venv inside the
clone); ``make lab`` puts the clone on ``PYTHONPATH``, and ``python -m helpers.workshop kernel``
(``make kernel``) registers this venv as a Jupyter kernel that starts with this clone's helpers,
for a JupyterLab that is already running (ModelArts).

``python -m helpers.workshop cache [--cache-dir DIR] [--rebuild]`` checks a cache (size and
header of ``model.safetensors``, the JSON files) and rebuilds the embedded model on request.
"""
from __future__ import annotations

import argparse
import hashlib
import itertools
import os
import re
import shlex
import stat
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Optional

from . import REPO, model_files, results

ENV_FILE = "workshop.env"
REFERENCE_RUN = "reference"


def unreadable_by_others(folder: "str | Path", limit: int = 20) -> list[Path]:
    """Paths under ``folder`` that other users cannot read (folders: cannot list or enter)."""
    def private(path: Path) -> bool:
        need = (stat.S_IROTH | stat.S_IXOTH) if path.is_dir() else stat.S_IROTH
        return not path.is_symlink() and path.stat().st_mode & need != need

    paths = itertools.chain([Path(folder)], Path(folder).rglob("*"))
    return list(itertools.islice(filter(private, paths), limit))


def check_cache(cache_dir=None, rebuild: bool = False) -> tuple[bool, str]:
    """(ok, one-line message) for the embedded model in ``cache_dir``; rebuilds when asked."""
    folder = model_files.embedded_cache_path(cache_dir)
    if rebuild:
        model_files.cache_root(cache_dir)  # a clear error when the folder is not writable
        folder = model_files.convert_embedded(cache_dir, force=True)
        model_files.share_readable(folder)
    if not folder.exists():
        return False, (f"{folder} does not exist yet; the first notebook converts it, or run: "
                       f"{model_files.rebuild_command(cache_dir)}")
    problem = model_files.embedded_cache_problem(folder)
    if problem:
        return False, f"{folder} is damaged ({problem}); rebuild it with: {model_files.rebuild_command(cache_dir)}"
    return True, f"{folder} is complete"


CLASS_PROFILE = "quick"  # what attendees run: every chapter in minutes (profiles/quick.yaml)
CLASS_MARKER = ".workbook-class"  # in the class's venvs: setup only checks them from an attendee's clone


def fair_share(attendees: int, cores: Optional[int] = None) -> int:
    """Threads per attendee's kernel: the cores shared out, at least one. Twenty kernels each using
    every core would make the load many times the cores, and every timing (dtype=auto's too) noise."""
    if isinstance(attendees, bool) or not isinstance(attendees, int) or attendees < 1:
        raise ValueError(f"attendees={attendees!r} is not valid; give the number of attendees, an integer >= 1")
    cores = cores or (len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1)
    return max(1, cores // attendees)


def prepare(workshop_dir: "str | Path", report: bool = False, profile: str = "default",
            out=sys.stdout, attendees: int = 1) -> int:
    """Convert the model into ``<dir>/cache``, optionally run a reference report, write the env file
    (the cache, no hub, the class's venvs, each attendee's share of the cores, the class profile).

    Returns 0, or 1 when the reference report failed; files others cannot read are listed with
    the umask that caused it.
    """
    threads = fair_share(attendees)
    workshop_dir = Path(workshop_dir).expanduser().resolve()
    workshop_dir.mkdir(parents=True, exist_ok=True)
    cache = workshop_dir / "cache"
    folder = model_files.ensure_embedded_cache(cache)
    ok, message = check_cache(cache)
    print(f"model cache: {message}", file=out)
    if not ok:
        return 1
    model_files.share_readable(cache)
    code = 0
    if report:
        reference = workshop_dir / "reports" / REFERENCE_RUN
        command = [sys.executable, "-m", "helpers.run", "--profile", profile,
                   "--reports-dir", str(reference.parent), "--run-id", REFERENCE_RUN]
        env = {**os.environ, "WORKBOOK_CACHE": str(cache)}
        code = 1 if subprocess.run(command, cwd=REPO, env=env).returncode else 0
        if reference.exists():
            model_files.share_readable(reference)
            print(f"reference report: {reference / 'index.html'}"
                  + (" (some chapters failed; see the index)" if code else ""), file=out)
    cores = os.cpu_count() or 1
    lines = ["# Source this file in your own clone before make lab, make kernel or the runner: the class",
             "# reads the prepared cache; your kernels import your clone's helpers and write under its reports/.",
             f"export WORKBOOK_CLASS_DIR={shlex.quote(str(workshop_dir))}",
             f"export WORKBOOK_CACHE={shlex.quote(str(cache))}",
             "# The embedded model needs no network; keep transformers from trying to reach the hub.",
             "export HF_HUB_OFFLINE=1",
             f"# Each attendee's kernel computes on a fair share of the {cores} cores ({attendees} attendees).",
             f"export OMP_NUM_THREADS={threads}",
             f"# The class's profile: make report and python -m helpers.run use it unless told otherwise.",
             f"export WORKBOOK_PROFILE={CLASS_PROFILE}"]
    for name, variable in (("venv", "VENV"), ("venv-vllm", "VLLM_VENV")):  # built there by make workshop-prep
        venv = workshop_dir / name
        if venv.is_dir():
            (venv / CLASS_MARKER).write_text(f"{workshop_dir}\n", encoding="utf-8")
            model_files.share_readable(venv / CLASS_MARKER)
            lines.append(f"export {variable}={shlex.quote(str(venv))}")
    env_file = workshop_dir / ENV_FILE
    env_file.write_text("\n".join(lines) + "\n", encoding="utf-8")
    model_files.share_readable(env_file)
    private = unreadable_by_others(workshop_dir)
    if private:
        shown = ", ".join(str(p) for p in private[:5]) + (" ..." if len(private) > 5 else "")
        print(f"warning: other users cannot read {shown}. Your umask is {results.current_umask():03o}; prepare with "
              f"'umask 022' for a class, or give a shared group access with "
              f"'chmod -R g+rX {shlex.quote(str(workshop_dir))}'.", file=out)
    print(f"prepared {folder}; each attendee's kernel gets {threads} of the {cores} cores.\n"
          f"Attendees: in their own clone, source {env_file}, then run 'make lab' (or 'make kernel' for a "
          "JupyterLab already running) or the runner as usual; answers to the exercises are in solutions/.",
          file=out)
    return code


# A kernel of this venv that imports this clone's helpers whatever folder it starts in (a notebook's)
# and whatever the JupyterLab's own environment holds: the clone goes first on sys.path, and on
# PYTHONPATH for the processes the kernel starts; everything else comes from the JupyterLab's
# environment (on an Ascend image, CANN's variables). Then what ``python -m ipykernel_launcher`` does.
_KERNEL_START = ("import os, sys; repo = {repo!r}; "
                 "sys.path[:] = [repo] + [p for p in sys.path if p not in ('', repo)]; "
                 "os.environ['PYTHONPATH'] = os.pathsep.join("
                 "filter(None, [repo, os.environ.get('PYTHONPATH')])); "
                 "from ipykernel.kernelapp import launch_new_instance; launch_new_instance()")


def kernel_name(repo: "str | Path" = REPO) -> str:
    """The kernel spec's name for a clone: its folder's name and a short hash of its path, so two
    clones (two attendees, or two copies of one user) register two kernels."""
    repo = Path(repo)
    slug = re.sub(r"[^a-z0-9]+", "-", repo.name.lower()).strip("-") or "clone"
    return f"workbook-{slug}-{hashlib.sha1(str(repo).encode()).hexdigest()[:6]}"


# What a kernel of this workbook reads from the environment it was registered in: a class's
# workshop.env (the shared model cache, no hub, the vLLM venv, the thread share) and a hub mirror.
# kernel.json carries the ones set at registration, so a JupyterLab started without them (ModelArts,
# a JupyterHub) still gives them to the kernel.
CARRIED_VARIABLES = ("WORKBOOK_CACHE", "HF_HUB_OFFLINE", "HF_ENDPOINT", "VLLM_VENV", "OMP_NUM_THREADS",
                     "WORKBOOK_CLASS_DIR", "WORKBOOK_PROFILE")
# CANN's environment script, where Ascend images keep it (CANN 8.5 and newer: cann/)
CANN_SET_ENV = ("/usr/local/Ascend/ascend-toolkit/set_env.sh", "/usr/local/Ascend/cann/set_env.sh")
# A kernel that must see the NPU starts through bash, which sources CANN's set_env.sh before Python
# starts (its LD_LIBRARY_PATH must be set before torch_npu loads), whatever the JupyterLab's own
# environment holds.
_CANN_LAUNCH = ('set_env=$1; shift; . "$set_env" >/dev/null 2>&1 || '
                'echo "warning: sourcing $set_env failed; this kernel may see no NPU" >&2; exec "$@"')


def cann_set_env(environ=None) -> Optional[Path]:
    """CANN's ``set_env.sh``: next to the toolkit the environment names (``ASCEND_TOOLKIT_HOME``,
    ``ASCEND_HOME_PATH``, set by sourcing it), else where Ascend images keep it; None without CANN."""
    environ = os.environ if environ is None else environ
    for variable in ("ASCEND_TOOLKIT_HOME", "ASCEND_HOME_PATH"):
        if environ.get(variable):
            home = Path(environ[variable])
            for folder in (home, *list(home.parents)[:2]):
                if (folder / "set_env.sh").is_file():
                    return folder / "set_env.sh"
    return next((Path(p) for p in CANN_SET_ENV if Path(p).is_file()), None)


def npu_venv(python: str = sys.executable) -> bool:
    """Whether this venv's Python has torch_npu installed (an Ascend image's venv), loadable or not."""
    import importlib.util

    if python == sys.executable:
        return importlib.util.find_spec("torch_npu") is not None
    probe = "import importlib.util, sys; sys.exit(importlib.util.find_spec('torch_npu') is None)"
    return subprocess.run([python, "-c", probe], capture_output=True).returncode == 0


def kernel_spec(repo: "str | Path" = REPO, python: str = sys.executable, environ=None) -> dict:
    """What ``register_kernel`` writes into ``kernel.json`` besides ipykernel's defaults: the clone's
    helpers first; the variables of ``CARRIED_VARIABLES`` set now (``env``); on an Ascend venv, a
    start through CANN's ``set_env.sh`` (or, without one, the CANN variables set now)."""
    environ = dict(os.environ if environ is None else environ)
    home = str(Path.home())
    shown = "~" + str(repo)[len(home):] if str(repo).startswith(home + os.sep) else str(repo)
    argv = [python, "-c", _KERNEL_START.format(repo=str(repo)), "-f", "{connection_file}"]
    env = {k: environ[k] for k in CARRIED_VARIABLES if environ.get(k)}
    metadata = {"workbook": {"carried": sorted(env)}}
    if npu_venv(python):
        set_env = cann_set_env(environ)
        if set_env is not None:
            argv = ["/bin/bash", "-c", _CANN_LAUNCH, "workbook-kernel", str(set_env), *argv]
            metadata["workbook"]["cann_set_env"] = str(set_env)
        else:
            cann = {k: v for k, v in environ.items()
                    if k.startswith("ASCEND_") or k in ("LD_LIBRARY_PATH", "PYTHONPATH", "TOOLCHAIN_HOME")}
            env.update(cann)
            metadata["workbook"]["cann_variables"] = sorted(cann)
    spec = {"argv": argv, "display_name": f"Ascend Llama workbook ({shown})", "metadata": metadata}
    if env:
        spec["env"] = env
    return spec


def register_kernel(name: Optional[str] = None, prefix: Optional[str] = None, out=sys.stdout) -> Path:
    """Register this venv's Python as a Jupyter kernel bound to this clone; returns its folder.

    Installed for the current user (``jupyter --data-dir``), or under ``prefix``; registering again
    replaces it. A JupyterLab that is already running lists it after a reload of the page.
    """
    from ipykernel.kernelspec import write_kernel_spec
    from jupyter_client.kernelspec import KernelSpecManager

    name = name or kernel_name()
    spec = kernel_spec()
    facts = spec["metadata"]["workbook"]
    with tempfile.TemporaryDirectory() as tmp:
        source = write_kernel_spec(Path(tmp) / name, overrides=spec)
        where = Path(KernelSpecManager().install_kernel_spec(source, name, user=prefix is None, prefix=prefix))
    print(f"registered the Jupyter kernel '{spec['display_name']}' ({name}) in {where}: {sys.executable} "
          f"with the helpers of {REPO}.", file=out)
    if facts.get("cann_set_env"):
        print(f"It sources {facts['cann_set_env']} before it starts, so it sees the NPU whatever the "
              "JupyterLab's own environment holds.", file=out)
    elif "cann_variables" in facts:
        print("warning: no CANN set_env.sh was found; the kernel carries the CANN variables set now ("
              + (", ".join(facts["cann_variables"]) or "none: it will see no NPU unless the JupyterLab's "
                 "environment has them; source set_env.sh and run make kernel again") + ").", file=out)
    if facts["carried"]:
        print("It carries " + ", ".join(f"{k}={spec['env'][k]}" for k in facts["carried"])
              + " from the environment it was registered in (workshop.env).", file=out)
    print(f"In JupyterLab (reload the page if it is open): Kernel > Change Kernel... > {spec['display_name']}. "
          f"Remove it with: {Path(sys.executable).parent / 'jupyter'} kernelspec uninstall -y {name}", file=out)
    return where


def main(argv: Optional[list[str]] = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m helpers.workshop", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="command", required=True)
    prep = sub.add_parser("prepare", help="prepare a folder for a class")
    prep.add_argument("workshop_dir")
    prep.add_argument("--report", action="store_true",
                      help="also run every chapter with --profile into <dir>/reports/reference")
    prep.add_argument("--profile", default="default", help="the reference report's profile")
    prep.add_argument("--attendees", type=int, default=1,
                      help="how many attendees share this machine: each kernel gets cores // attendees threads")
    cache = sub.add_parser("cache", help="check (or rebuild) the embedded model in a cache")
    cache.add_argument("--cache-dir", default=None, help="default: $WORKBOOK_CACHE or <repo>/.cache")
    cache.add_argument("--rebuild", action="store_true", help="convert the embedded model again")
    kernel = sub.add_parser("kernel", help="register this venv as a Jupyter kernel that imports this clone's "
                                           "helpers (for a JupyterLab already running, e.g. ModelArts)")
    kernel.add_argument("--name", default=None, help=f"kernel spec name (default: {kernel_name()})")
    kernel.add_argument("--prefix", default=None,
                        help="install under PREFIX/share/jupyter/kernels instead of for the current user")
    sub.add_parser("name", help="print the name `kernel` registers this clone's kernel under (for the "
                                "runner's --kernel)")
    args = parser.parse_args(argv)
    if args.command == "name":
        print(kernel_name())
        return 0
    if args.command == "prepare":
        return prepare(args.workshop_dir, report=args.report, profile=args.profile, attendees=args.attendees)
    if args.command == "kernel":
        register_kernel(args.name, args.prefix)
        return 0
    ok, message = check_cache(args.cache_dir, rebuild=args.rebuild)
    print(message, file=sys.stdout if ok else sys.stderr)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
