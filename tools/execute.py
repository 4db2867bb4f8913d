"""Run notebooks top to bottom in a fresh kernel and store their outputs: python tools/execute.py book/05_attention.ipynb ..."""
import sys
from pathlib import Path

import nbformat
from nbclient import NotebookClient


def execute(path: Path, timeout: int = 3600) -> None:
    """Execute one notebook in place, with its own folder as the working directory."""
    nb = nbformat.read(path, as_version=4)
    NotebookClient(nb, timeout=timeout, kernel_name="python3", resources={"metadata": {"path": str(path.parent)}}).execute()
    nbformat.write(nb, path)


if __name__ == "__main__":
    if len(sys.argv) < 2:
        sys.exit(__doc__)
    for name in sys.argv[1:]:
        execute(Path(name))
        print(f"executed {name}")
