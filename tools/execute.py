"""Run notebooks top to bottom in a fresh kernel and store their outputs: python tools/execute.py book/05_attention.ipynb ...

--keep-run-outputs serves a notebook whose stored outputs come from a run that cannot be repeated here (chapter 13's
hour of training): it executes the notebook as usual (at whatever preset the environment names), then gives every
code cell whose source is unchanged since the last commit, and that is tagged nbval-ignore-output or shows a figure,
HTML or Markdown, the outputs it had there, and numbers the execution counts 1..n in order. (The last commit, not
the file on disk: a cell edited since then holds outputs of its old code, which must not come back.)
"""
import subprocess
import sys
from pathlib import Path

import nbformat
from nbclient import NotebookClient

RICH = ("image/svg+xml", "image/png", "text/html", "text/markdown")


def _from_the_run(cell) -> bool:
    """A cell whose stored outputs belong to the recorded run rather than to this execution."""
    if "nbval-ignore-output" in cell.metadata.get("tags", []):
        return True
    return any(mime.startswith(RICH) for out in cell.get("outputs", []) for mime in out.get("data", {}))


def keep_run_outputs(before, after) -> int:
    """Put back the stored outputs of `before`'s run cells into `after` where the source is unchanged; renumber."""
    stored = {}
    for cell in before.cells:
        if cell.cell_type == "code" and _from_the_run(cell):
            stored.setdefault(cell.source, cell.outputs)
    kept = 0
    for cell in after.cells:
        if cell.cell_type == "code" and cell.source in stored:
            cell.outputs = stored[cell.source]
            kept += 1
    code = [cell for cell in after.cells if cell.cell_type == "code"]
    for n, cell in enumerate(code, start=1):
        cell.execution_count = n
        for out in cell.outputs:
            if "execution_count" in out:
                out["execution_count"] = n
    return kept


def committed(path: Path):
    """The notebook as the last commit holds it, or as it is on disk outside a git checkout or when it is new."""
    shown = subprocess.run(["git", "-C", str(path.parent), "show", f"HEAD:./{path.name}"], capture_output=True, text=True)
    return nbformat.reads(shown.stdout, as_version=4) if shown.returncode == 0 else nbformat.read(path, as_version=4)


def execute(path: Path, timeout: int = 3600, keep_run: bool = False) -> None:
    """Execute one notebook in place, with its own folder as the working directory."""
    nb = nbformat.read(path, as_version=4)
    before = committed(path) if keep_run else None
    NotebookClient(nb, timeout=timeout, kernel_name="python3", resources={"metadata": {"path": str(path.parent)}}).execute()
    if keep_run:
        print(f"kept the stored outputs of {keep_run_outputs(before, nb)} cells")
    nbformat.write(nb, path)


if __name__ == "__main__":
    args = sys.argv[1:]
    keep = "--keep-run-outputs" in args
    names = [a for a in args if a != "--keep-run-outputs"]
    if not names:
        sys.exit(__doc__)
    for name in names:
        execute(Path(name), keep_run=keep)
        print(f"executed {name}")
