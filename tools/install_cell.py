"""Write the set-up cell, built from the repository URL and branch in _config.yml and the version in pyproject.toml,
at the top of every notebook.

Run `python tools/install_cell.py` after changing either (or `python tools/install_cell.py NOTEBOOK ...` for
some); tests/test_book.py fails when a notebook disagrees. Every line of the cell is at most 100 characters, the
width of the book's code column.
The cell carries the `remove-cell` tag: it runs in Colab and under nbval, and the rendered book leaves it out.

The rule that keeps a notebook and its library together: the cell installs the code of the same commit line as
the notebook. A development version (`0.3.0.dev0`, what `main` carries between releases) names the branch; a
release (`0.3.0`) names its tag `v0.3.0`, and tests/test_book.py checks that the tag exists and holds the same
library. A notebook opened alone (Colab) clones the repository at that ref and works inside the copy, so that
`results/` and `figures/` are where they are in a clone; in a clone, the cell installs the clone itself.
"""
import re
import sys
import tomllib
from pathlib import Path

import nbformat

ROOT = Path(__file__).resolve().parents[1]
MARKER = "# Colab: set up this chapter"
TAG = "remove-cell"
COPY = "transformer-book"  # the folder a notebook opened alone clones the repository into


def _repository_field(name: str) -> str:
    """A field of the `repository:` block of _config.yml (the one place the repository is named)."""
    block = re.search(r"^repository:\s*\n((?:[ \t]+.*\n?)+)", (ROOT / "_config.yml").read_text(), re.M)
    match = block and re.search(rf"^\s+{name}:\s*(\S+)", block.group(1), re.M)
    if not match:
        sys.exit(f"_config.yml has no repository.{name}")
    return match.group(1)


def repository_url() -> str:
    """The repository URL, written once in _config.yml."""
    return _repository_field("url")


def version() -> str:
    """The package version in pyproject.toml: a release (`0.3.0`) or a development version (`0.3.0.dev0`)."""
    return tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["version"]


def is_release(ver: str) -> bool:
    """Whether ver names a release (tagged `v<version>`), not a development version of the branch."""
    return re.fullmatch(r"\d+\.\d+\.\d+", ver) is not None


def git_ref(ver: str | None = None) -> str:
    """What a notebook of this version installs: the tag of a release, the branch of a development version."""
    ver = version() if ver is None else ver
    return f"v{ver}" if is_release(ver) else _repository_field("branch")


def install_source() -> str:
    """The source of the first code cell of every notebook."""
    return (
        f"{MARKER}. Opened alone (as in Colab), a notebook clones the book's repository\n"
        f"# at the ref of its version into {COPY}/ and works in its book/ folder (figures/ is in it,\n"
        "# results/ beside it). Then, as in any clone, it installs the clone's transformer_lib unless that\n"
        "# version is there.\n"
        "import importlib, importlib.metadata, os, subprocess, sys\n"
        "from pathlib import Path\n"
        f'BOOK_VERSION, BOOK_REF = "{version()}", "{git_ref()}"\n'
        "if not (Path.cwd().parent / \"transformer_lib\").is_dir():\n"
        f'    if not Path("{COPY}").is_dir():\n'
        f'        subprocess.run(["git", "clone", "-q", "--depth", "1", "--branch", BOOK_REF,\n'
        f'                        "{repository_url()}",\n'
        f'                        "{COPY}"], check=True)\n'
        f'    os.chdir("{COPY}/book")\n'
        f'    print(f"Working in {COPY}/book, the repository at {{BOOK_REF}}.")\n'
        "try:\n"
        '    installed = importlib.metadata.version("transformer-lib")\n'
        "except importlib.metadata.PackageNotFoundError:\n"
        "    installed = None\n"
        "if installed != BOOK_VERSION:\n"
        '    subprocess.run([sys.executable, "-m", "pip", "install", "-q", ".."], check=True)\n'
        "    importlib.invalidate_caches()"
    )


def first_code_cell(nb: nbformat.NotebookNode):
    return next((c for c in nb.cells if c.cell_type == "code"), None)


def is_install_cell(cell) -> bool:
    """The set-up cell of this or an earlier version of this script."""
    return cell.source.startswith("# Colab: ")


def main(paths: list[str]) -> None:
    """Write the cell into the notebooks named, or into every notebook of book/."""
    for path in [Path(p).resolve() for p in paths] or sorted((ROOT / "book").glob("*.ipynb")):
        nb = nbformat.read(path, as_version=4)
        cell = first_code_cell(nb)
        if cell is not None and is_install_cell(cell):
            if cell.source == install_source() and TAG in cell.metadata.get("tags", []):
                continue
            cell.source = install_source()
        else:
            cell = nbformat.v4.new_code_cell(install_source())
            at = next((i for i, c in enumerate(nb.cells) if c.cell_type == "code"), len(nb.cells))
            nb.cells.insert(at, cell)
        tags = cell.metadata.setdefault("tags", [])
        if TAG not in tags:
            tags.append(TAG)
        nbformat.write(nb, path)
        print(f"updated {path.relative_to(ROOT)}")


if __name__ == "__main__":
    main(sys.argv[1:])
