"""The library is exported from the notebooks: exporting again must not change transformer_lib/."""
import filecmp
import json
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


def test_library_holds_no_colab_title():
    """A folded cell's Colab title line (`#@title ...`, tools/colab_forms.py) stays in the notebook."""
    found = [f"{py.name}, line {n}: {line.strip()}" for py in sorted((ROOT / "transformer_lib").rglob("*.py"))
             for n, line in enumerate(py.read_text(encoding="utf-8").splitlines(), 1) if "#@title" in line]
    assert not found, "a Colab title in the library (is `export_procs` of pyproject.toml in use?):\n" + \
        "\n".join(found)


def test_the_export_processor_leaves_the_title_out(tmp_path):
    """The processor pyproject.toml names drops a folded cell's title; its directive, in the metadata, still holds."""
    import tomllib

    from nbdev.config import import_obj
    from nbdev.export import nb_export

    procs = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))["tool"]["nbdev"]["export_procs"]
    cell = {"cell_type": "code", "execution_count": None, "outputs": [], "source": "",
            "metadata": {"cellView": "form", "nbdev": {"export": "true"}, "tags": ["hide-input"]}}
    nb = {"cells": [{**cell, "metadata": {}, "source": "#| default_exp folded"},
                    {**cell, "source": "#@title The function f, in full\ndef f() -> int:\n    return 1"}],
          "metadata": {"kernelspec": {"language": "python", "name": "python3", "display_name": "Python 3"}},
          "nbformat": 4, "nbformat_minor": 5}
    (tmp_path / "folded.ipynb").write_text(json.dumps(nb), encoding="utf-8")
    nb_export(tmp_path / "folded.ipynb", lib_path=tmp_path / "lib", procs=[import_obj(p) for p in procs])
    module = (tmp_path / "lib" / "folded.py").read_text(encoding="utf-8")
    assert "def f() -> int:" in module and "#@title" not in module
