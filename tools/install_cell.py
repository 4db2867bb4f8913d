"""Write the install cell, built from the repository URL in _config.yml and the release in pyproject.toml,
at the top of every notebook.

Run `python tools/install_cell.py` after changing either; tests/test_book.py fails when a notebook disagrees.
The cell carries the `remove-cell` tag: it runs in Colab and under nbval, and the rendered book leaves it out.
"""
import re
import sys
import tomllib
from pathlib import Path

import nbformat

ROOT = Path(__file__).resolve().parents[1]
MARKER = "# Colab: install the transformer_lib of this book's release"
TAG = "remove-cell"


def repository_url() -> str:
    """The repository URL, written once in _config.yml."""
    match = re.search(r"^repository:\s*\n(?:\s+#.*\n)*\s+url:\s*(\S+)", (ROOT / "_config.yml").read_text(), re.M)
    if not match:
        sys.exit("_config.yml has no repository.url")
    return match.group(1)


def release() -> str:
    """The book's release: the package version in pyproject.toml, tagged `v<version>` in the repository."""
    return tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["version"]


def install_source() -> str:
    """The source of the first code cell of every notebook."""
    return (
        f"{MARKER} when it is missing or another version (elsewhere this does nothing).\n"
        "import importlib.metadata, subprocess, sys\n"
        f'BOOK_RELEASE = "{release()}"\n'
        "try:\n"
        '    installed = importlib.metadata.version("transformer-lib")\n'
        "except importlib.metadata.PackageNotFoundError:\n"
        "    installed = None\n"
        "if installed != BOOK_RELEASE:\n"
        f'    url = f"git+{repository_url()}@v{{BOOK_RELEASE}}"\n'
        '    subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--upgrade", f"transformer-lib @ {url}"],\n'
        "                   check=True)"
    )


def first_code_cell(nb: nbformat.NotebookNode):
    return next((c for c in nb.cells if c.cell_type == "code"), None)


def is_install_cell(cell) -> bool:
    """The install cell of this or an earlier version of this script."""
    return cell.source.startswith("# Colab: install")


def main() -> None:
    for path in sorted((ROOT / "book").glob("*.ipynb")):
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
    main()
