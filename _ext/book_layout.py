"""The book's Sphinx extension: what the site shows of a notebook differs from the notebook in two ways.

* nbdev's directive lines (`#| export`, `#| default_exp`, `#| hide`: any line of a code cell that starts with `#|`)
  are left out of the code the site shows; the notebook keeps them (nbdev exports from them, Colab shows them).
* A figure of book/figures/ that a markdown cell names by its raw address in the repository (tools/colab_figures.py
  writes those, so that Colab shows it) is read as the relative path `figures/x.svg`, so that the site is built from
  the files of this tree, offline, and shows the figures of this very commit.

* A solution's code cells (the code cells right after a `<details>` solution, tools/fold_solutions.py) are moved
  inside that `<details>` element and lose their own fold, so that one click opens the solution with its code.

A code cell's Colab title line (`#@title ...`, which folds the cell in Colab) is left out like the `#|` lines.

Registered in _config.yml under `sphinx.local_extensions`. It rewrites the notebook's text as Sphinx reads it
(the `source-read` event), before MyST-NB parses it; the file on disk is untouched.
"""
from __future__ import annotations

import json
import re
from pathlib import Path

from docutils import nodes
from sphinx.transforms.post_transforms import SphinxPostTransform

DIRECTIVE_LINE = re.compile(r"^#(?:\||@title\b).*(?:\n|$)", re.M)
RAW_FIGURE = re.compile(r"https://raw\.githubusercontent\.com/[\w.-]+/[\w.-]+/[\w.-]+/book/figures/"
                        r"(?P<name>[\w.-]+)(?:\?sanitize=true)?")


def without_directives(code: str) -> str:
    """A code cell's source without its `#|` lines and its Colab `#@title` line."""
    return DIRECTIVE_LINE.sub("", code)


def local_figures(markdown: str, folder: Path) -> str:
    """Raw addresses of figures that exist in folder/figures/ as relative paths."""
    def local(match: re.Match) -> str:
        name = match.group("name")
        return f"figures/{name}" if (folder / "figures" / name).is_file() else match.group(0)
    return RAW_FIGURE.sub(local, markdown)


def rewrite_notebook(text: str, folder: Path) -> str:
    nb = json.loads(text)
    for cell in nb.get("cells", []):
        src = cell.get("source", "")
        src = src if isinstance(src, str) else "".join(src)
        if cell.get("cell_type") == "code":
            cell["source"] = without_directives(src)
        elif cell.get("cell_type") == "markdown":
            cell["source"] = local_figures(src, folder)
    return json.dumps(nb)


def on_source_read(app, docname: str, source: list[str]) -> None:
    path = Path(app.env.doc2path(docname))
    if path.suffix == ".ipynb":
        source[0] = rewrite_notebook(source[0], path.parent)


def is_cell(node) -> bool:
    return isinstance(node, nodes.container) and node.get("nb_element") == "cell_code"


class SolutionCodeInsideFold(SphinxPostTransform):
    """Move the code cells that follow a solution's closing `</details>` inside it (before MyST-NB folds cells)."""

    default_priority = 198  # before myst_nb's HideInputCells (199)
    formats = ("html",)

    def run(self, **kwargs):
        for raw in list(self.document.findall(nodes.raw)):
            text = raw.astext()
            if raw.get("format") != "html" or not text.rstrip().endswith("</details>"):
                continue
            parent = raw.parent
            opening = None
            for sibling in parent.children[:parent.index(raw) + 1][::-1]:
                if isinstance(sibling, nodes.raw) and "<details>" in sibling.astext():
                    opening = sibling
                    break
            if opening is None or "<summary>Solution" not in opening.astext():
                continue
            cells = []
            for sibling in parent.children[parent.index(raw) + 1:]:
                if not is_cell(sibling):
                    break
                cells.append(sibling)
            if not cells:
                continue
            head = text.rstrip()[:-len("</details>")]
            closing = nodes.raw("", "</details>\n", format="html")
            for cell in cells:
                parent.remove(cell)
                cell["hide_mode"] = None
            at = parent.index(raw)
            if head.strip():
                raw.replace_self(nodes.raw("", head, format="html"))
                at += 1
            else:
                parent.remove(raw)
            parent[at:at] = [*cells, closing]


def setup(app):
    app.connect("source-read", on_source_read)
    app.add_post_transform(SolutionCodeInsideFold)
    return {"parallel_read_safe": True, "parallel_write_safe": True}
