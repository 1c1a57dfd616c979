"""The notebooks' code cells stay Python 3.9 compatible (the legacy set's floor), like helpers/."""
from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import nbformat
import pytest

REPO = Path(__file__).resolve().parent.parent


def _vermin():
    vermin = shutil.which("vermin") or str(Path(sys.executable).parent / "vermin")
    if not Path(vermin).exists():
        pytest.fail("vermin is not installed; it is pinned in both requirements sets")
    return vermin


def _cells_as_modules(folder: Path, notebooks) -> list:
    files = []
    for path in notebooks:
        nb = nbformat.read(str(path), as_version=4)
        # IPython magics and shell escapes are not Python; everything else must parse on 3.9.
        code = "\n\n".join("\n".join(line for line in cell.source.splitlines()
                                     if not line.lstrip().startswith(("%", "!")))
                           for cell in nb.cells if cell.cell_type == "code")
        target = folder / f"{path.parent.name}_{path.stem}.py"
        target.write_text(code + "\n")
        files.append(str(target))
    return files


def _check(files):
    # Notebook cells have no `from __future__ import annotations`: a PEP 604 annotation there is
    # evaluated on 3.9 and fails, hence --feature union-types (helpers/ may keep them as strings).
    return subprocess.run([_vermin(), "-t=3.9-", "--no-tips", "--violations", "--eval-annotations",
                           "--feature", "union-types", "--backport", "typing", "--backport", "dataclasses", *files],
                          capture_output=True, text=True, timeout=300)


def test_notebook_code_needs_nothing_newer_than_python_39(tmp_path):
    notebooks = sorted(REPO.glob("notebooks/*.ipynb")) + sorted(REPO.glob("solutions/*.ipynb"))
    assert notebooks
    proc = _check(_cells_as_modules(tmp_path, notebooks))
    assert proc.returncode == 0, proc.stdout + proc.stderr


@pytest.mark.parametrize("source", ["x: int | None = None\nprint(x)",
                                    "print(list(zip([1], [2], strict=True)))"])
def test_the_notebook_check_catches_a_310_construct(tmp_path, source):
    nb = nbformat.v4.new_notebook()
    nb.cells = [nbformat.v4.new_code_cell("%matplotlib inline\n" + source)]
    path = tmp_path / "bad.ipynb"
    nbformat.write(nb, str(path))
    out = tmp_path / "out"
    out.mkdir()
    proc = _check(_cells_as_modules(out, [path]))
    assert proc.returncode != 0
