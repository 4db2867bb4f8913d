"""Number the pages' titles with the book's own numbering, the one its prose cites ("chapter 12b", "appendix A").

The number comes from the file's name: a chapter `NN_name.ipynb` is "N" (`01_tokens` is 1), its sections
`NNb_`/`NNc_` are "Nb"/"Nc" (`12b_fast_decoding` is 12b, `15c_...` is 15c), an appendix `appendix_x_name.ipynb` is
the letter "X". The title, the first line `# Title` of the first cell, becomes `# 1. Tokens`, `# 12b. Fast decoding`,
`# A. The data, found and verified` (an earlier "Appendix A: " prefix is dropped: the sidebar's caption says
"Appendices"). The site's sidebar shows these titles, so it carries the same numbers. The engineering pages, the API
page and the introduction are cited by name, not by number, and keep titles without one; the introduction's title is
the book's.

    python tools/number_titles.py [NOTEBOOK ...] [--check]

Without paths, every notebook of book/. Idempotent (a title already numbered keeps its number once); `--check`
changes nothing and exits 1 when a title would change. tests/test_layout.py checks that every title carries its
number.
"""
from __future__ import annotations

import re
import sys
from pathlib import Path

from nbjson import run, set_source, source

CHAPTER = re.compile(r"^(\d\d)([bc]?)_")
APPENDIX = re.compile(r"^appendix_([a-z])_")
PREFIX = re.compile(r"^(?:Appendix [A-Z]: |(?:\d+[bc]?|[A-Z])\. )")


def number_of(path: Path) -> str | None:
    """The book's number of a page, from its file name: "1", "12b", "A"; None for a page cited by name."""
    if match := CHAPTER.match(path.name):
        return f"{int(match.group(1))}{match.group(2)}"
    if match := APPENDIX.match(path.name):
        return match.group(1).upper()
    return None


def numbered(title: str, number: str | None) -> str:
    """A title line `# Title` with the page's number, or without a number for a page that has none."""
    text = PREFIX.sub("", title[2:].strip())
    return f"# {number}. {text}" if number else f"# {text}"


def change(path: Path, nb: dict) -> dict:
    cell = nb["cells"][0]
    text = source(cell)
    if cell["cell_type"] != "markdown" or not text.startswith("# "):
        raise SystemExit(f"{path}: the first cell is not a title `# ...`")
    first, _, rest = text.partition("\n")
    new = numbered(first, number_of(path)) + ("\n" + rest if "\n" in text else "")
    if new != text:
        set_source(cell, new)
    return nb


if __name__ == "__main__":
    sys.exit(run(__doc__, change))
