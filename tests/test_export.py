"""The library is exported from the notebooks: exporting again must not change transformer_lib/."""
import filecmp
import shutil
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def _differences(a: Path, b: Path) -> list[str]:
    cmp = filecmp.dircmp(a, b, ignore=["__pycache__"])
    found = [f"only in the repository: {n}" for n in cmp.left_only]
    found += [f"only in a fresh export: {n}" for n in cmp.right_only]
    found += [f"differs: {n}" for n in cmp.diff_files]
    for name, sub in cmp.subdirs.items():
        found += _differences(a / name, b / name)
    return found


def test_library_is_in_sync_with_notebooks(tmp_path):
    for name in ["book", "pyproject.toml", "transformer_lib"]:
        src = ROOT / name
        (shutil.copytree if src.is_dir() else shutil.copy)(src, tmp_path / name)
    # Export from scratch: generated modules are rewritten, so start from an empty package.
    for py in (tmp_path / "transformer_lib").glob("*.py"):
        py.unlink()
    exporter = Path(sys.executable).with_name("nbdev-export")
    subprocess.run([str(exporter)], cwd=tmp_path, check=True, capture_output=True)
    diffs = _differences(ROOT / "transformer_lib", tmp_path / "transformer_lib")
    assert not diffs, "transformer_lib/ is out of date; run `make export`:\n" + "\n".join(diffs)
