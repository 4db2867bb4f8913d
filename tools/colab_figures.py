"""Point the notebooks' figures at an address Colab can open: the file in the repository at the notebook's version.

A notebook opened alone (Colab, or a download) has no `figures/` folder beside it, so a relative image
`![...](figures/x.svg)` shows nothing there. This script writes each such image of a markdown cell as the file's
raw address in the repository at the ref the set-up cell installs (tools/install_cell.py: the tag `vX.Y.Z` of a
release, the branch of a development version), built from _config.yml's `repository.url`:

    ![alt](https://raw.githubusercontent.com/OWNER/REPO/REF/book/figures/x.svg?sanitize=true)

(`?sanitize=true` makes GitHub serve an SVG as an image rather than as text.) A MyST `{figure}` directive, which
Colab shows as a code block, becomes such an image followed by its caption in italics, the form the other chapters'
figures take. An address written for another version is rewritten to this one, so the script is re-run after a
version change, as install_cell.py is.

The site is built offline from the files in book/figures/: the book's Sphinx extension (_ext/book_layout.py) reads
these addresses back as the relative paths `figures/x.svg`.

    python tools/colab_figures.py [NOTEBOOK ...] [--check]

Without paths, every notebook of book/. Idempotent; `--check` changes nothing and exits 1 when a notebook would
change (tests/test_layout.py checks that no markdown cell keeps a relative figure or a directive).
"""
from __future__ import annotations

import re
import sys
from pathlib import Path

import install_cell
from nbjson import run, set_source, source  # noqa: E402

# A figure of book/figures/ named relatively or by a raw address at any ref (the form this script writes).
TARGET = (r"(?:figures/|https://raw\.githubusercontent\.com/[\w.-]+/[\w.-]+/[\w.-]+/book/figures/)"
          r"(?P<name>[\w.-]+)(?:\?sanitize=true)?")
IMAGE = re.compile(r"!\[(?P<alt>[^\]]*)\]\(" + TARGET + r"(?P<title>\s+\"[^\"]*\")?\)")
DIRECTIVE = re.compile(r"^(?P<fence>`{3,}|:{3,})\{figure\}\s+" + TARGET + r"[ \t]*\n(?P<body>.*?)^(?P=fence)[ \t]*$",
                       re.S | re.M)
OPTION = re.compile(r"^:(?P<key>[\w-]+):[ \t]*(?P<value>.*)$")


def address(name: str) -> str:
    """The raw address of book/figures/NAME at the ref of this version."""
    repo = install_cell.repository_url().removesuffix(".git").rstrip("/")
    owner_repo = repo.split("github.com/", 1)[1]
    return f"https://raw.githubusercontent.com/{owner_repo}/{install_cell.git_ref()}/book/figures/{name}?sanitize=true"


def image(alt: str, name: str, title: str = "") -> str:
    return f"![{alt}]({address(name)}{title})"


def from_directive(match: re.Match) -> str:
    """A `{figure}` directive as an image and its caption in italics (one italic span per paragraph)."""
    lines = match.group("body").split("\n")
    options = {}
    while lines and (option := OPTION.match(lines[0])):
        options[option.group("key")] = option.group("value").strip()
        lines.pop(0)
    caption = "\n".join(lines).strip()
    paragraphs = [p.strip() for p in re.split(r"\n\s*\n", caption) if p.strip()]
    out = image(options.get("alt", ""), match.group("name"))
    return out + "".join(f"\n\n*{p}*" for p in paragraphs)


def convert(text: str) -> str:
    text = DIRECTIVE.sub(from_directive, text)
    return IMAGE.sub(lambda m: image(m.group("alt"), m.group("name"), m.group("title") or ""), text)


def change(path: Path, nb: dict) -> dict:
    for cell in nb["cells"]:
        if cell["cell_type"] == "markdown":
            text = source(cell)
            new = convert(text)
            if new != text:
                set_source(cell, new)
    return nb


if __name__ == "__main__":
    sys.exit(run(__doc__, change))
