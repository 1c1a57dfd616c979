"""Do the pinned sets install on every Python version and platform docs/support.md claims?

For each claimed (set, Python, platform) this asks pip to resolve the set with wheels only, for
that interpreter version and platform, without installing anything:

    pip install --dry-run --ignore-installed --only-binary :all: --python-version 3.9 \
        --platform manylinux_2_28_aarch64 ... --target <tmp> -r requirements-legacy.txt torch -c <torch range>

pip reads the packages' metadata (Requires-Python, wheel tags, dependencies) from the index, so a
pin that drops a claimed Python version or platform fails here. Local pip configuration (find-links,
constraint files, extra indexes) is ignored so that the real index answers; WORKBOOK_PIP_INDEX_URL
points the check at a mirror. Needs network. Run by tests/test_pins.py, or by hand:

    .venv/bin/python scripts/check_pins.py            # every claim, one line each
    .venv/bin/python scripts/check_pins.py --record   # the same, and on success record what was checked

``--record`` (what ``make test-pins`` runs) writes the sha256 of every requirements file it resolved into
``tests/fixtures/pins-checked.txt``; ``tests/test_pins.py`` fails in ``make test`` as soon as a
requirements file differs from what that file records, so a changed pin cannot skip this check.
"""
from __future__ import annotations

import os
import subprocess
import sys
import tempfile
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Dict, List, Optional, Tuple

REPO = Path(__file__).resolve().parent.parent
INDEX_URL = os.environ.get("WORKBOOK_PIP_INDEX_URL", "https://pypi.org/simple")

# What the support matrix (docs/support.md) claims. glibc 2.28 is EulerOS 2.10's (the oldest Ascend image
# OS in the matrix); HCE 2.0 and Ubuntu 22.04 images have a newer glibc and accept these wheels too.
ARCHES = ("x86_64", "aarch64")
GLIBC_MINOR_MAX = 28
# image_torch: the torch an image brings, exact (a range lets pip backtrack through every release):
# the oldest of the set's range that has wheels for that Python. pinned_torch: what setup installs
# where no image torch is reused (scripts/choose_pin_set.py).
CLAIMS = {
    "current": {"requirements": "requirements-common.txt", "python": ("3.11", "3.12"),
                "image_torch": {"3.11": "torch==2.6.0", "3.12": "torch==2.6.0"},
                "pinned_torch": {"3.11": "torch==2.13.0", "3.12": "torch==2.13.0"},
                "extra": ("requirements.txt",)},
    "legacy": {"requirements": "requirements-legacy.txt", "python": ("3.9", "3.10", "3.11", "3.12"),
               "image_torch": {"3.9": "torch==2.1.0", "3.10": "torch==2.1.0", "3.11": "torch==2.1.0",
                               "3.12": "torch==2.2.0"},
               "pinned_torch": {"3.9": "torch==2.8.0", "3.10": "torch==2.13.0", "3.11": "torch==2.13.0",
                                "3.12": "torch==2.13.0"},
               "extra": ()},
}


def platform_args(arch: str) -> List[str]:
    """--platform for every manylinux tag a glibc-2.28 machine of this architecture accepts."""
    tags = [f"manylinux_2_{minor}_{arch}" for minor in range(GLIBC_MINOR_MAX, 16, -1)]
    tags.append(f"manylinux2014_{arch}")
    if arch == "x86_64":
        tags += ["manylinux2010_x86_64", "manylinux1_x86_64"]
    args = []
    for tag in tags:
        args += ["--platform", tag]
    return args


def clean_pip_env() -> Dict[str, str]:
    """The environment without pip settings: no local wheel folders, constraints or extra indexes."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("PIP_")}
    env["PIP_CONFIG_FILE"] = os.devnull  # pip then reads no configuration file at all
    env["PIP_DISABLE_PIP_VERSION_CHECK"] = "1"
    return env


def stub_torch_wheel(folder: Path, version: str) -> str:
    """A dependency-free ``torch <version>+stub`` wheel in ``folder``; returns its requirement.

    pip evaluates environment markers for the machine it runs on, not for --platform: checking
    aarch64 from an x86_64 machine would demand torch's x86_64-only dependencies (nvidia-*,
    triton). torch's own dependencies are the image's or torch's business; the sets are checked
    against a torch of the right version, and the pinned torch wheel separately (--no-deps).
    """
    import zipfile

    name = f"torch-{version}+stub"
    info = f"torch-{version}+stub.dist-info"
    path = folder / f"{name}-py3-none-any.whl"
    files = {f"{info}/METADATA": f"Metadata-Version: 2.1\nName: torch\nVersion: {version}+stub\n",
             f"{info}/WHEEL": "Wheel-Version: 1.0\nGenerator: check_pins\nRoot-Is-Purelib: true\n"
                              "Tag: py3-none-any\n"}
    files[f"{info}/RECORD"] = "".join(f"{n},,\n" for n in files) + f"{info}/RECORD,,\n"
    with zipfile.ZipFile(path, "w") as archive:
        for member, text in files.items():
            archive.writestr(member, text)
    return f"torch=={version}+stub"


def resolve(requirement_args: List[str], python: str, arch: str, constraints: str = "",
            python_exe: str = sys.executable, timeout: int = 1200,
            torch_stub: Optional[str] = None, no_deps: bool = False) -> subprocess.CompletedProcess:
    """Ask pip whether ``requirement_args`` resolve to wheels for ``python`` on ``arch``
    (with ``torch_stub``: next to a dependency-free torch of that version)."""
    with tempfile.TemporaryDirectory(prefix="pin-check-") as tmp:
        cmd = [python_exe, "-m", "pip", "install", "--dry-run", "--ignore-installed", "--quiet",
               "--only-binary", ":all:", "--python-version", python, *platform_args(arch),
               "--target", str(Path(tmp) / "target"), "--index-url", INDEX_URL]
        if no_deps:
            cmd.append("--no-deps")
        if torch_stub:
            cmd += ["--find-links", tmp]
            requirement_args = [*requirement_args, stub_torch_wheel(Path(tmp), torch_stub)]
        if constraints:
            cfile = Path(tmp) / "constraints.txt"
            cfile.write_text(constraints + "\n")
            cmd += ["-c", str(cfile)]
        cmd += requirement_args
        return subprocess.run(cmd, cwd=REPO, env=clean_pip_env(), capture_output=True, text=True,
                              timeout=timeout)


def claimed_checks() -> List[Tuple[str, str, str, List[str], dict]]:
    """(label, python, arch, requirement args, resolve() options) for every claim of CLAIMS."""
    checks = []
    for name, claim in CLAIMS.items():
        for python in claim["python"]:
            for arch in ARCHES:
                where = f"{name} set, Python {python}, linux {arch}"
                # On an image: the set next to the image's torch.
                image_torch = claim["image_torch"][python]
                checks.append((f"{where}, next to image {image_torch}", python, arch,
                               ["-r", claim["requirements"]], {"torch_stub": image_torch.split("==")[1]}))
                # Elsewhere: the set (plus torchao for current) next to the torch setup pins, and
                # that torch's own wheel for this Python and platform.
                pinned = claim["pinned_torch"][python]
                extra = [arg for path in claim["extra"] for arg in ("-r", path)]
                checks.append((f"{where}, next to pinned {pinned}", python, arch,
                               ["-r", claim["requirements"], *extra], {"torch_stub": pinned.split("==")[1]}))
                checks.append((f"{where}, pinned {pinned} wheel", python, arch, [pinned], {"no_deps": True}))
    return checks


def first_error(proc: subprocess.CompletedProcess) -> str:
    lines = [line for line in (proc.stderr + proc.stdout).splitlines() if line.strip()]
    errors = [line for line in lines if line.startswith("ERROR") and "Ignored the following" not in line]
    return (errors or lines or ["(no output)"])[0][:300]


def run_all(workers: int = 4) -> List[Tuple[str, Optional[str]]]:
    """[(label, None when it resolves, else pip's first error line)] for every claim."""
    checks = claimed_checks()

    def one(check):
        label, python, arch, args, options = check
        proc = resolve(args, python, arch, **options)
        return label, (None if proc.returncode == 0 else first_error(proc))

    with ThreadPoolExecutor(max_workers=workers) as pool:
        return list(pool.map(one, checks))


STAMP = REPO / "tests" / "fixtures" / "pins-checked.txt"


def requirement_files() -> List[str]:
    """Every requirements file a claim resolves (with the files they include by ``-r``)."""
    names = {name for claim in CLAIMS.values() for name in (claim["requirements"], *claim["extra"])}
    for name in list(names):
        for line in (REPO / name).read_text().splitlines():
            if line.strip().startswith("-r "):
                names.add(line.strip()[3:].strip())
    return sorted(names)


def fingerprints() -> Dict[str, str]:
    """{requirements file: sha256 of its bytes} for ``requirement_files()``."""
    import hashlib

    return {name: hashlib.sha256((REPO / name).read_bytes()).hexdigest() for name in requirement_files()}


def recorded_fingerprints(path: Path = STAMP) -> Dict[str, str]:
    """What the last successful ``--record`` wrote: {file: sha256}; empty when nothing was recorded."""
    if not path.exists():
        return {}
    rows = [line.split() for line in path.read_text().splitlines() if line.strip() and not line.startswith("#")]
    return {name: digest for digest, name in rows}


def record(path: Path = STAMP) -> None:
    lines = ["# sha256 of each requirements file that `python scripts/check_pins.py --record` (make test-pins)",
             "# resolved for every claimed Python and platform; make test fails when a file differs."]
    lines += [f"{digest}  {name}" for name, digest in fingerprints().items()]
    path.write_text("\n".join(lines) + "\n")


def main(argv: Optional[List[str]] = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv not in ([], ["--record"]):
        print("usage: python scripts/check_pins.py [--record]", file=sys.stderr)
        return 2
    results = run_all()
    for label, error in results:
        print(("ok    " if error is None else "FAIL  ") + label + ("" if error is None else f": {error}"))
    if any(error is not None for _, error in results):
        return 1
    if argv == ["--record"]:
        record()
        print(f"recorded the checked requirements files in {STAMP.relative_to(REPO)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
