"""Write the install cell, built from the repository URL in _config.yml, at the top of every notebook.

Run `python tools/install_cell.py` after changing the URL; tests/test_book.py fails when a notebook disagrees.
"""
import re
import sys
from pathlib import Path

import nbformat

ROOT = Path(__file__).resolve().parents[1]
MARKER = "# Colab: install transformer_lib when it is missing"


def repository_url() -> str:
    """The repository URL, written once in _config.yml."""
    match = re.search(r"^repository:\s*\n(?:\s+#.*\n)*\s+url:\s*(\S+)", (ROOT / "_config.yml").read_text(), re.M)
    if not match:
        sys.exit("_config.yml has no repository.url")
    return match.group(1)


def install_source() -> str:
    """The source of the first code cell of every notebook."""
    return (
        f"{MARKER} (elsewhere this does nothing).\n"
        "import importlib.util, subprocess, sys\n"
        'if importlib.util.find_spec("transformer_lib") is None:\n'
        f'    subprocess.run([sys.executable, "-m", "pip", "install", "-q", "git+{repository_url()}"], check=True)'
    )


def first_code_cell(nb: nbformat.NotebookNode):
    return next((c for c in nb.cells if c.cell_type == "code"), None)


def main() -> None:
    for path in sorted((ROOT / "book").glob("*.ipynb")):
        nb = nbformat.read(path, as_version=4)
        cell = first_code_cell(nb)
        if cell is not None and cell.source.startswith(MARKER):
            if cell.source == install_source():
                continue
            cell.source = install_source()
        else:
            new = nbformat.v4.new_code_cell(install_source())
            at = next((i for i, c in enumerate(nb.cells) if c.cell_type == "code"), len(nb.cells))
            nb.cells.insert(at, new)
        nbformat.write(nb, path)
        print(f"updated {path.relative_to(ROOT)}")


if __name__ == "__main__":
    main()
