"""Read and write the book's notebooks as nbformat writes them, so that a script's diff holds only its change.

nbformat writes JSON with an indent of 1, sorted keys, non-ASCII characters as they are and a trailing newline, and
each cell's source as a list of lines. `write` does the same and leaves a file untouched when nothing changed; the
page scripts (fold_solutions.py, number_titles.py, colab_figures.py) share these helpers and their command line.
"""
from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Callable
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
BOOK = ROOT / "book"


def dumps(nb: dict) -> str:
    """The notebook's text as nbformat writes it."""
    return json.dumps(nb, indent=1, sort_keys=True, ensure_ascii=False) + "\n"


def source(cell: dict) -> str:
    """A cell's source as one string."""
    src = cell["source"]
    return src if isinstance(src, str) else "".join(src)


def set_source(cell: dict, text: str) -> None:
    """Store text as nbformat does: a list of lines, each but the last ending in a newline."""
    cell["source"] = text.splitlines(keepends=True)


def notebooks(paths: list[str]) -> list[Path]:
    """The notebooks named on the command line, or every notebook of book/."""
    return [Path(p) for p in paths] if paths else sorted(BOOK.glob("*.ipynb"))


def run(doc: str, change: Callable[[Path, dict], dict], argv: list[str] | None = None) -> int:
    """The command line of a page script: `change(path, nb)` returns the changed notebook (it may edit nb in place);
    each notebook whose text would change is written, or with --check only named, and the exit status is 1 then."""
    parser = argparse.ArgumentParser(description=doc, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("paths", nargs="*", help="notebooks (default: every notebook of book/)")
    parser.add_argument("--check", action="store_true", help="change nothing; exit 1 if a notebook would change")
    args = parser.parse_args(argv)
    changed = []
    for path in notebooks(args.paths):
        text = path.read_text(encoding="utf-8")
        new = dumps(change(path, json.loads(text)))
        if new != text:
            changed.append(path)
            if not args.check:
                path.write_text(new, encoding="utf-8")
    verb = "would change" if args.check else "changed"
    for path in changed:
        print(f"{verb} {path}")
    return 1 if (args.check and changed) else 0


if __name__ == "__main__":
    sys.exit("a helper module: run fold_solutions.py, number_titles.py or colab_figures.py")
