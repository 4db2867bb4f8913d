"""Fold every exercise's solution, on the site and in Colab and Jupyter alike (CONTRIBUTING.md, "Solutions").

A solution's markdown cell becomes

    <details>
    <summary>Solution to exercise 2</summary>

    The prose of the solution...

    </details>

which Jupyter, Colab and the site all render folded (a MyST `:::{admonition} ... :class: dropdown` fence, the
earlier form, is converted; Colab showed it as raw text). The sentence "The code of the solution follows, folded."
is dropped. The code cells that follow a solution's markdown cell, up to the next markdown cell, get the tag
`hide-cell` (the site folds input and output; it replaces `hide-input` and `hide-output`) and the metadata
`jupyter: {source_hidden: true, outputs_hidden: true}` (Jupyter folds them too). A cell tagged `remove-cell` is left
as it is. Any other code cell that the site folds gets the same metadata, so that Jupyter folds it too: `hide-input`
its source, `hide-cell` its source and output.

    python tools/fold_solutions.py [NOTEBOOK ...] [--check]

Without paths, every notebook of book/. Idempotent; `--check` changes nothing and exits 1 when a notebook would change
(tests/test_layout.py holds the same rule).
"""
from __future__ import annotations

import re
import sys
from pathlib import Path

from nbjson import run, set_source, source

FENCE = re.compile(r"\A\s*(?P<colons>:{3,})\{admonition\}\s*(?P<title>Solution\b[^\n]*)\n"
                   r"(?P<options>(?::[\w-]+:[^\n]*\n)*)(?P<body>.*?)\n?(?P=colons)\s*\Z", re.S)
FOLDED = re.compile(r"\A<details>\n<summary>(?P<title>Solution\b[^<\n]*)</summary>\n")
FOLLOWS = re.compile(r"\n*The code of the solution follows, folded\.[ \t]*(?=\n|\Z)")
FOLLOWS_AND = re.compile(r"The code of the solution follows, folded; it ")
HIDDEN = {"source_hidden": True, "outputs_hidden": True}
TAG = "hide-cell"
REPLACED = ("hide-input", "hide-output")
# what Jupyter folds of a cell that the site folds by its tag
JUPYTER_FOLDS = {"hide-input": {"source_hidden": True}, "hide-cell": HIDDEN}


def folded(title: str, body: str) -> str:
    """The solution's markdown in the folded form."""
    body = FOLLOWS_AND.sub("The code of the solution ", FOLLOWS.sub("", body)).strip("\n")
    return f"<details>\n<summary>{title.strip()}</summary>\n\n{body}\n\n</details>" if body else \
        f"<details>\n<summary>{title.strip()}</summary>\n\n</details>"


def convert_markdown(text: str) -> str:
    """A solution fence in the folded form; a folded solution without the dropped sentence; other text unchanged."""
    match = FENCE.match(text)
    if match:
        return folded(match.group("title"), match.group("body"))
    match = FOLDED.match(text)
    if match and text.rstrip().endswith("</details>"):
        body = text[match.end():].rstrip()[: -len("</details>")]
        return folded(match.group("title"), body)
    return text


def is_solution(cell: dict) -> bool:
    return cell["cell_type"] == "markdown" and bool(FOLDED.match(source(cell)))


def fold_code(cell: dict) -> None:
    """The tag and metadata of a solution's code cell."""
    tags = cell["metadata"].get("tags", [])
    if "remove-cell" in tags:
        return
    if TAG not in tags:  # in the place of the tag it replaces, else last
        at = next((i for i, t in enumerate(tags) if t in REPLACED), len(tags))
        tags = tags[:at] + [TAG] + tags[at:]
    tags = [t for t in tags if t not in REPLACED]
    cell["metadata"]["tags"] = tags
    cell["metadata"]["jupyter"] = {**cell["metadata"].get("jupyter", {}), **HIDDEN}


def fold_tagged(cell: dict) -> None:
    """A code cell that the site folds (hide-input, hide-cell) folds in Jupyter too."""
    for tag, hidden in JUPYTER_FOLDS.items():
        if tag in cell["metadata"].get("tags", []):
            cell["metadata"]["jupyter"] = {**cell["metadata"].get("jupyter", {}), **hidden}


def change(path: Path, nb: dict) -> dict:
    in_solution = False
    for cell in nb["cells"]:
        if cell["cell_type"] == "markdown":
            text = source(cell)
            new = convert_markdown(text)
            if new != text:
                set_source(cell, new)
            in_solution = is_solution(cell)
        elif cell["cell_type"] == "code" and in_solution:
            fold_code(cell)
        elif cell["cell_type"] == "code":
            fold_tagged(cell)
    return nb


if __name__ == "__main__":
    sys.exit(run(__doc__, change))
