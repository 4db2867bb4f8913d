"""NOTEBOOK_KERNEL_ENV (conftest.py): its variables reach the notebooks' kernels and no other test, in either order;
an entry that is not NAME=value stops the run, naming it."""
import os
import shutil
import subprocess
import sys
from pathlib import Path

import nbformat

ROOT = Path(__file__).resolve().parents[1]
PROBE = "TRANSFORMER_LIB_TEST_PROBE"


def _pytest(folder: Path, kernel_env: str, *files: str) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if k not in (PROBE, "NOTEBOOK_KERNEL_ENV")}
    env["NOTEBOOK_KERNEL_ENV"] = kernel_env
    return subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-p", "no:xdist",
                           "--nbval", "--nbval-current-env", *files],
                          cwd=folder, env=env, capture_output=True, text=True, timeout=300)


def _folder(tmp_path: Path) -> Path:
    shutil.copy(ROOT / "conftest.py", tmp_path / "conftest.py")
    cell = nbformat.v4.new_code_cell(f"import os\nprint(os.environ.get({PROBE!r}))", execution_count=1)
    cell.outputs = [nbformat.v4.new_output("stream", name="stdout", text="on\n")]
    nbformat.write(nbformat.v4.new_notebook(cells=[cell]), tmp_path / "probe.ipynb")
    (tmp_path / "test_outside.py").write_text(
        f"import os\n\n\ndef test_outside():\n    assert os.environ.get({PROBE!r}) is None\n")
    return tmp_path


def test_the_variables_reach_the_notebooks_kernels_and_no_other_test(tmp_path):
    folder = _folder(tmp_path)
    for order in (["probe.ipynb", "test_outside.py"], ["test_outside.py", "probe.ipynb"]):
        done = _pytest(folder, f"{PROBE}=on", *order)
        assert done.returncode == 0, done.stdout + done.stderr
        assert "2 passed" in done.stdout
    done = _pytest(folder, "", "probe.ipynb")  # without it, the kernel prints None: the notebook fails
    assert done.returncode != 0


def test_an_entry_without_equals_stops_the_run_naming_it(tmp_path):
    done = _pytest(_folder(tmp_path), f"A=1 {PROBE}", "test_outside.py")
    assert done.returncode != 0
    assert f"'{PROBE}' is not NAME=value" in done.stdout + done.stderr
