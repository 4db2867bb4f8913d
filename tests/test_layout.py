"""Every page reads well on the site at a laptop's width and in Colab and Jupyter (CONTRIBUTING.md, "Layout").

Each check runs on every notebook, one test per page, so that a failure names the page and the cells:

* **Colab shows no MyST.** A markdown cell holds no MyST role (``{glue}``, ``{numref}`` ...), no directive fence
  (``:::{admonition}``, a ``{figure}`` block), no label ``(name)=``, and no figure named by a relative path
  (``figures/x.svg``, which a notebook opened alone cannot find; tools/colab_figures.py writes the raw address).
* **Code fits the column**: a line of a code cell that the site shows, folded or not, has at most ``MAX_WIDTH``
  characters (nbdev's ``#|`` lines aside, the site leaves them out; cells tagged ``remove-input`` or ``remove-cell``
  are not shown).
* **A visible code cell fits a screen**: at most ``MAX_LINES`` lines in a cell the site shows open (not tagged
  ``hide-input``, ``hide-cell``, ``remove-input`` or ``remove-cell``).
* **Tables fit**: a markdown table, in the prose or in a cell's displayed Markdown, has at most ``MAX_COLUMNS``
  columns.
* **Solutions fold**: every solution is in the ``<details>`` form and its code cells fold
  (tools/fold_solutions.py would change nothing).
* **Figures open in Colab**: named by their raw address at the ref of this version (tools/colab_figures.py would
  change nothing).
* **Titles carry the book's numbers** (tools/number_titles.py would change nothing).

The checkers are tested on planted cells below, so that each one can fail.
"""
from __future__ import annotations

import copy
import json
import re
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tools"))
import colab_figures  # noqa: E402
import fold_solutions  # noqa: E402
import number_titles  # noqa: E402
import wrap_code_lines  # noqa: E402

NOTEBOOKS = sorted((ROOT / "book").glob("*.ipynb"))
MAX_WIDTH = 100  # characters of a code line the site shows: the content column holds 100 at 1280 px (_static/)
MAX_LINES = 30  # lines of a code cell shown open
MAX_COLUMNS = 6  # columns of a markdown table
NBDEV = re.compile(r"^#\|")
SHOWN_NOT = {"remove-input", "remove-cell"}
FOLDED = {"hide-input", "hide-cell"} | SHOWN_NOT
# MyST that CommonMark shows raw: a role, a directive fence, a label line.
MYST = re.compile(r"\{[a-z][\w:-]*\}`[^`\n]*`|^\s*(?:`{3,}|:{3,})\{[a-z][\w-]*\}.*$|^\([\w-]+\)=\s*$", re.M)
RELATIVE_FIGURE = re.compile(r"!\[[^\]]*\]\((?!https?://)[^)]*\)|<img\s[^>]*src=\"(?!https?://|data:)[^\"]*\"")
FENCE = re.compile(r"^\s*(?:```|~~~)")
DELIMITER_ROW = re.compile(r"^\s*\|?\s*:?-+:?\s*(?:\|\s*:?-+:?\s*)*\|?\s*$")


def load(path: Path) -> list[dict]:
    return json.loads(path.read_text(encoding="utf-8"))["cells"]


def text(cell: dict) -> str:
    return "".join(cell["source"])


def tags(cell: dict) -> set[str]:
    return set(cell["metadata"].get("tags", []))


def code_lines(cell: dict) -> list[str]:
    """The lines of a code cell that the site shows (nbdev's `#|` lines left out)."""
    return [line for line in text(cell).splitlines() if not NBDEV.match(line)]


def in_code_span(markdown: str, at: int) -> bool:
    """Whether position `at` lies inside a code span: an odd number of backticks before it in its paragraph."""
    start = markdown.rfind("\n\n", 0, at) + 1
    return markdown.count("`", start, at) % 2 == 1


def raw_myst(cells: list[dict]) -> list[str]:
    found = []
    for i, cell in enumerate(cells):
        if cell["cell_type"] == "markdown":
            found += [f"cell {i}: {m.group(0).strip()[:70]}" for m in MYST.finditer(text(cell))
                      if not in_code_span(text(cell), m.start())]
            found += [f"cell {i}: relative figure {m.group(0)[:70]}" for m in RELATIVE_FIGURE.finditer(text(cell))]
    return found


def wide_lines(cells: list[dict]) -> list[str]:
    found = []
    for i, cell in enumerate(cells):
        if cell["cell_type"] == "code" and not tags(cell) & SHOWN_NOT:
            found += [f"cell {i}: {len(line)} characters: {line[:60]}..." for line in code_lines(cell)
                      if len(line) > MAX_WIDTH]
    return found


def long_cells(cells: list[dict]) -> list[str]:
    return [f"cell {i}: {len(code_lines(cell))} lines" for i, cell in enumerate(cells)
            if cell["cell_type"] == "code" and not tags(cell) & FOLDED and len(code_lines(cell)) > MAX_LINES]


def table_widths(markdown: str) -> list[int]:
    """The number of columns of each table of a markdown text (outside code fences)."""
    widths, fenced = [], False
    for line in markdown.splitlines():
        if FENCE.match(line):
            fenced = not fenced
        elif not fenced and DELIMITER_ROW.match(line) and "|" in line:
            widths.append(len([c for c in line.strip().strip("|").split("|")]))
    return widths


def wide_tables(cells: list[dict]) -> list[str]:
    found = []
    for i, cell in enumerate(cells):
        texts = [text(cell)] if cell["cell_type"] == "markdown" else []
        for out in cell.get("outputs", []):
            markdown = out.get("data", {}).get("text/markdown")
            if markdown is not None:
                texts.append(markdown if isinstance(markdown, str) else "".join(markdown))
        for markdown in texts:
            found += [f"cell {i}: a table of {n} columns" for n in table_widths(markdown) if n > MAX_COLUMNS]
    return found


def differs(change, path: Path) -> list[str]:
    """The cells that a page script would change."""
    nb = json.loads(path.read_text(encoding="utf-8"))
    new = change(path, copy.deepcopy(nb))
    return [f"cell {i}" for i, (a, b) in enumerate(zip(nb["cells"], new["cells"])) if a != b]


ids = [p.name for p in NOTEBOOKS]


@pytest.mark.parametrize("path", NOTEBOOKS, ids=ids)
def test_colab_shows_no_myst(path):
    found = raw_myst(load(path))
    assert not found, f"{path.name}: MyST that Colab shows raw (run tools/colab_figures.py for figures):\n" + \
        "\n".join(found)


@pytest.mark.parametrize("path", NOTEBOOKS, ids=ids)
def test_code_lines_fit_the_column(path):
    found = wide_lines(load(path))
    assert not found, f"{path.name}: code lines over {MAX_WIDTH} characters:\n" + "\n".join(found)


@pytest.mark.parametrize("path", NOTEBOOKS, ids=ids)
def test_visible_code_cells_fit_a_screen(path):
    found = long_cells(load(path))
    assert not found, f"{path.name}: code cells shown open with over {MAX_LINES} lines:\n" + "\n".join(found)


@pytest.mark.parametrize("path", NOTEBOOKS, ids=ids)
def test_tables_fit(path):
    found = wide_tables(load(path))
    assert not found, f"{path.name}: tables over {MAX_COLUMNS} columns:\n" + "\n".join(found)


@pytest.mark.parametrize("path", NOTEBOOKS, ids=ids)
def test_solutions_fold(path):
    found = differs(fold_solutions.change, path)
    assert not found, f"{path.name}: solutions not folded (run tools/fold_solutions.py): {', '.join(found)}"


@pytest.mark.parametrize("path", NOTEBOOKS, ids=ids)
def test_figures_open_in_colab(path):
    """Every figure of book/figures/ is named by its raw address at this version's ref (the set-up cell's)."""
    found = differs(colab_figures.change, path)
    assert not found, f"{path.name}: figures to point at this version (run tools/colab_figures.py): {', '.join(found)}"


@pytest.mark.parametrize("path", NOTEBOOKS, ids=ids)
def test_title_carries_its_number(path):
    assert not differs(number_titles.change, path), f"{path.name}: run tools/number_titles.py"


# --- The checkers on planted cells --------------------------------------------------------------------------------

def md(source: str) -> dict:
    return {"cell_type": "markdown", "metadata": {}, "source": source}


def code(source: str, *tag: str, markdown: str | None = None) -> dict:
    outputs = [{"output_type": "display_data", "metadata": {}, "data": {"text/markdown": markdown}}] if markdown else []
    return {"cell_type": "code", "metadata": {"tags": list(tag)}, "source": source, "outputs": outputs}


def test_raw_myst_is_found():
    cells = [md("BLEU {glue:text}`bleu:.2f` and {numref}`fig-x`.\n"), md(":::{admonition} Solution\n:::\n"),
             md("```{figure} figures/x.svg\n```\n"), md("(sec-label)=\n# Heading\n"), md("![a](figures/x.svg)\n"),
             md("Plain `code` and $x$ and ![a](https://example.org/x.svg) and <details>.\n"),
             md("A command `zip -r run.zip {run_dir}` and then `files.download()`.\n")]
    assert [f.split(":")[0] for f in raw_myst(cells)] == ["cell 0", "cell 0", "cell 1", "cell 2", "cell 3", "cell 4"]


def test_wide_lines_and_long_cells_are_found():
    wide = "x = 1  # " + "y" * 95
    cells = [code("#| export " + "z" * 100 + "\n" + "a" * 100), code(wide), code(wide, "hide-cell"),
             code(wide, "remove-input"), code("\n".join(["pass"] * 31)), code("\n".join(["pass"] * 31), "hide-input"),
             code("#| export\n" + "\n".join(["pass"] * 30))]
    assert [f.split(":")[0] for f in wide_lines(cells)] == ["cell 1", "cell 2"]
    assert [f.split(":")[0] for f in long_cells(cells)] == ["cell 4"]


def test_wide_tables_are_found():
    seven = "| a | b | c | d | e | f | g |\n|---|---|---|---|---|---|---|\n| 1 | 2 | 3 | 4 | 5 | 6 | 7 |\n"
    six = "a | b | c | d | e | f\n:--|---|---|---|---|--:\n"
    cells = [md(seven), md(six), md("```\n" + seven + "```\n"), code("show()", markdown=seven)]
    assert [f.split(":")[0] for f in wide_tables(cells)] == ["cell 0", "cell 3"]
    assert table_widths(six) == [6]


def test_the_page_scripts_find_what_is_left_to_do(tmp_path):
    nb = {"cells": [md("# Appendix A: Data\n"),
                    md(":::{admonition} Solution to exercise 1\n:class: dropdown\n\nBecause.\n\n"
                       "The code of the solution follows, folded.\n:::"),
                    code("print(1)", "hide-input"), md("![a](figures/x.svg)\n")],
          "metadata": {}, "nbformat": 4, "nbformat_minor": 5}
    path = tmp_path / "appendix_a_data.ipynb"
    path.write_text(json.dumps(nb))
    assert differs(fold_solutions.change, path) == ["cell 1", "cell 2"]
    assert differs(number_titles.change, path) == ["cell 0"]
    assert differs(colab_figures.change, path) == ["cell 3"]
    done = colab_figures.change(path, number_titles.change(path, fold_solutions.change(path, nb)))
    assert "".join(done["cells"][0]["source"]) == "# A. Data\n"
    assert "".join(done["cells"][1]["source"]) == "<details>\n<summary>Solution to exercise 1</summary>\n\n" \
                                                  "Because.\n\n</details>"
    assert done["cells"][2]["metadata"] == {"tags": ["hide-cell"],
                                            "jupyter": {"source_hidden": True, "outputs_hidden": True}}
    assert "/book/figures/x.svg?sanitize=true)" in "".join(done["cells"][3]["source"])
    path.write_text(json.dumps(done))
    for change in (fold_solutions.change, number_titles.change, colab_figures.change):
        assert differs(change, path) == []  # idempotent
    assert raw_myst(done["cells"]) == []


def test_wrapping_moves_comments_and_reflows_docstrings_only():
    """tools/wrap_code_lines.py: long comments and docstrings fit; a long statement is left for a person."""
    code = ('def f(x):\n'
            '    """' + "A docstring long enough to pass the limit of the column, " * 2 + 'it goes on."""\n'
            '    y = x + 1  # ' + "a trailing comment that pushes the line over the limit " * 2 + '\n'
            '    return [x, y, "' + "a long string that no tool should break " * 3 + '"]\n')
    wrapped = wrap_code_lines.wrap_code(code)
    lines = wrapped.split("\n")
    assert [len(line) > MAX_WIDTH for line in lines].count(True) == 1 and lines[-2] == code.split("\n")[-2]
    assert lines[0] == "def f(x):" and lines[1].startswith('    """A docstring') and '"""' in lines[2]
    at = lines.index("    y = x + 1")
    assert lines[3].strip().startswith("# a trailing comment") and all(
        line.startswith("    # ") for line in lines[3:at])
    compile(wrapped, "cell", "exec")
    assert wrap_code_lines.wrap_code(wrapped) == wrapped
