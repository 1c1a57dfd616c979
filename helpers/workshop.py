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


def prepare(workshop_dir: "str | Path", report: bool = False, profile: str = "default",
            out=sys.stdout) -> int:
    """Convert the model into ``<dir>/cache``, optionally run a reference report, write the env file.

    Returns 0, or 1 when the reference report failed; files others cannot read are listed with
    the umask that caused it.
    """
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
    lines = ["# Source this file in your own clone before make lab, make kernel or the runner: the class",
             "# reads the prepared cache; your kernels import your clone's helpers and write under its reports/.",
             f"export WORKBOOK_CACHE={shlex.quote(str(cache))}",
             "# The embedded model needs no network; keep transformers from trying to reach the hub.",
             "export HF_HUB_OFFLINE=1"]
    venv = workshop_dir / "venv"  # built there by make workshop-prep
    if (venv / "bin" / "python").exists():
        lines.append(f"export VENV={shlex.quote(str(venv))}")
    env_file = workshop_dir / ENV_FILE
    env_file.write_text("\n".join(lines) + "\n", encoding="utf-8")
    model_files.share_readable(env_file)
    private = unreadable_by_others(workshop_dir)
    if private:
        mask = results.current_umask()
        shown = ", ".join(str(p) for p in private[:5]) + (" ..." if len(private) > 5 else "")
        print(f"warning: other users cannot read {shown}. Your umask is {mask:03o}; prepare with "
              f"'umask 022' for a class, or give a shared group access with "
              f"'chmod -R g+rX {shlex.quote(str(workshop_dir))}'.", file=out)
    print(f"prepared {folder}.\nAttendees: in their own clone, source {env_file} (sets WORKBOOK_CACHE), "
          "then run 'make lab' (or 'make kernel' for a JupyterLab already running) or the runner as "
          "usual; answers to the exercises are in solutions/.", file=out)
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


def kernel_spec(repo: "str | Path" = REPO, python: str = sys.executable) -> dict:
    """What ``register_kernel`` writes into ``kernel.json`` besides ipykernel's defaults."""
    home = str(Path.home())
    shown = "~" + str(repo)[len(home):] if str(repo).startswith(home + os.sep) else str(repo)
    return {"argv": [python, "-c", _KERNEL_START.format(repo=str(repo)), "-f", "{connection_file}"],
            "display_name": f"Ascend Llama workbook ({shown})"}


def register_kernel(name: Optional[str] = None, prefix: Optional[str] = None, out=sys.stdout) -> Path:
    """Register this venv's Python as a Jupyter kernel bound to this clone; returns its folder.

    Installed for the current user (``jupyter --data-dir``), or under ``prefix``; registering again
    replaces it. A JupyterLab that is already running lists it after a reload of the page.
    """
    from ipykernel.kernelspec import write_kernel_spec
    from jupyter_client.kernelspec import KernelSpecManager

    name = name or kernel_name()
    spec = kernel_spec()
    with tempfile.TemporaryDirectory() as tmp:
        source = write_kernel_spec(Path(tmp) / name, overrides=spec)
        where = Path(KernelSpecManager().install_kernel_spec(source, name, user=prefix is None, prefix=prefix))
    jupyter = Path(sys.executable).parent / "jupyter"
    print(f"registered the Jupyter kernel '{spec['display_name']}' ({name}) in {where}: {sys.executable} "
          f"with the helpers of {REPO}.\nIn JupyterLab (reload the page if it is open): Kernel > Change "
          f"Kernel... > {spec['display_name']}. Remove it with: {jupyter} kernelspec uninstall -y {name}",
          file=out)
    return where


def main(argv: Optional[list[str]] = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m helpers.workshop", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="command", required=True)
    prep = sub.add_parser("prepare", help="prepare a folder for a class")
    prep.add_argument("workshop_dir")
    prep.add_argument("--report", action="store_true",
                      help="also run every chapter with --profile into <dir>/reports/reference")
    prep.add_argument("--profile", default="default")
    cache = sub.add_parser("cache", help="check (or rebuild) the embedded model in a cache")
    cache.add_argument("--cache-dir", default=None, help="default: $WORKBOOK_CACHE or <repo>/.cache")
    cache.add_argument("--rebuild", action="store_true", help="convert the embedded model again")
    kernel = sub.add_parser("kernel", help="register this venv as a Jupyter kernel that imports this clone's "
                                           "helpers (for a JupyterLab already running, e.g. ModelArts)")
    kernel.add_argument("--name", default=None, help=f"kernel spec name (default: {kernel_name()})")
    kernel.add_argument("--prefix", default=None,
                        help="install under PREFIX/share/jupyter/kernels instead of for the current user")
    args = parser.parse_args(argv)
    if args.command == "prepare":
        return prepare(args.workshop_dir, report=args.report, profile=args.profile)
    if args.command == "kernel":
        register_kernel(args.name, args.prefix)
        return 0
    ok, message = check_cache(args.cache_dir, rebuild=args.rebuild)
    print(message, file=sys.stdout if ok else sys.stderr)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
