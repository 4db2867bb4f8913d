"""Colab's form title: the first line `#@title What the cell holds` of a code cell whose metadata holds
`"cellView": "form"` makes Colab show the cell folded, as that title (CONTRIBUTING.md, "Folds").

The line is a comment for Python and for Jupyter; the site leaves it out (_ext/book_layout.py); and nbdev leaves it
out of transformer_lib/: `drop_title` is an export processor, named in pyproject.toml (`[tool.nbdev]
export_procs`). nbdev imports it by its module name: `make env` puts tools/ on the path of the project's Python
(a `.pth` file). This module imports nothing of the project, so that nbdev can load it alone.
"""
from __future__ import annotations

import re

# The title line as this project writes it: first in the cell (Colab reads it there), `#@title`, a space, the text.
TITLE = re.compile(r"\A#@title(?:[ \t]+(?P<text>[^\n]*?))?[ \t]*(?:\n|\Z)")


# Titles that say nothing of the cell (Colab's own default among them): a folded cell's title names what it holds.
GENERIC = {"", "code", "hidden code", "hidden", "show code", "title", "cell", "default title text", "code cell"}


def is_generic(text: str) -> bool:
    """Whether a title says nothing of its cell."""
    return text.strip(" .:").lower() in GENERIC or len(text.split()) < 2


def title(source: str) -> str | None:
    """The text of a source's Colab title line, or None when its first line is not one."""
    match = TITLE.match(source)
    return None if match is None else (match.group("text") or "")


def without_title(source: str) -> str:
    """The source without its Colab title line."""
    return TITLE.sub("", source, count=1)


def with_title(source: str, text: str) -> str:
    """The source with `#@title text` as its first line (in the place of a title line it had)."""
    return f"#@title {text}\n{without_title(source)}"


def drop_title(cell) -> None:
    """nbdev export processor: an exported code cell loses its Colab title line."""
    if cell.cell_type == "code" and cell.source:
        cell.source = without_title(cell.source)
