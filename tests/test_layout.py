"""Every page reads well on the site at a laptop's width and in Colab and Jupyter (CONTRIBUTING.md, "Page layout").

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
* **Folds hold in all three places**: a code cell that the site folds (tagged ``hide-input``, ``hide-cell`` or
  ``hide-output``, or a solution's code) folds in Jupyter (metadata ``jupyter.source_hidden``, and
  ``outputs_hidden`` where the site folds the output) and, where the site folds its source, in Colab (metadata
  ``cellView: "form"`` and a first line ``#@title`` whose text says what the cell holds).
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
import colab_forms  # noqa: E402
import fold_solutions  # noqa: E402
import number_titles  # noqa: E402
import wrap_code_lines  # noqa: E402

NOTEBOOKS = sorted((ROOT / "book").glob("*.ipynb"))
MAX_WIDTH = 100  # characters of a code line the site shows: the content column holds 100 at 1280 px (_static/)
MAX_LINES = 30  # lines of a code cell shown open
MAX_COLUMNS = 6  # columns of a markdown table
NBDEV = re.compile(r"^#(?:\||@title\b)")  # nbdev's lines and Colab's title: the site leaves them out
SHOWN_NOT = {"remove-input", "remove-cell"}
FOLDED = {"hide-input", "hide-cell"} | SHOWN_NOT
SITE_FOLDS = {"hide-input", "hide-cell", "hide-output"}  # a fold on the site: of the source, both, the output
SOURCE_FOLDS = {"hide-input", "hide-cell"}
OUTPUT_FOLDS = {"hide-output", "hide-cell"}
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
    """The lines of a code cell that the site shows (nbdev's `#|` lines and Colab's `#@title` left out)."""
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


def fold_gaps(cells: list[dict]) -> list[str]:
    """The cells that the site folds and Jupyter or Colab does not, each with what it lacks."""
    found, in_solution = [], False
    for i, cell in enumerate(cells):
        if cell["cell_type"] == "markdown":
            in_solution = fold_solutions.is_solution(cell)
            continue
        if cell["cell_type"] != "code" or "remove-cell" in tags(cell):
            continue
        folds = tags(cell) & SITE_FOLDS
        lacks = []
        if in_solution and "hide-cell" not in folds:
            lacks.append("the site: a solution's code without the tag hide-cell")
            folds |= {"hide-cell"}
        if not folds:
            continue
        jupyter, said = cell["metadata"].get("jupyter", {}), colab_forms.title(text(cell))
        if folds & SOURCE_FOLDS and jupyter.get("source_hidden") is not True:
            lacks.append("Jupyter: no source_hidden")
        if folds & OUTPUT_FOLDS and jupyter.get("outputs_hidden") is not True:
            lacks.append("Jupyter: no outputs_hidden")
        if folds & SOURCE_FOLDS and cell["metadata"].get("cellView") != "form":
            lacks.append('Colab: no cellView "form"')
        if folds & SOURCE_FOLDS and said is None:
            lacks.append("Colab: the first line is no #@title")
        elif folds & SOURCE_FOLDS and colab_forms.is_generic(said):
            lacks.append(f"Colab: a title that does not say what the cell holds: {said!r}")
        if lacks:
            found.append(f"cell {i} ({', '.join(sorted(folds))}): " + "; ".join(lacks))
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
    assert not found, f"{path.name}: folds to write (run tools/fold_solutions.py): {', '.join(found)}"


@pytest.mark.parametrize("path", NOTEBOOKS, ids=ids)
def test_folds_hold_in_all_three_places(path):
    found = fold_gaps(load(path))
    assert not found, f"{path.name}: folded on the site, not in Jupyter or Colab (run tools/fold_solutions.py):\n" + \
        "\n".join(found)


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
    assert done["cells"][2]["metadata"] == {"tags": ["hide-cell"], "cellView": "form",
                                            "jupyter": {"source_hidden": True, "outputs_hidden": True}}
    assert "".join(done["cells"][2]["source"]) == "#@title Solution to exercise 1, the code\nprint(1)"
    assert "/book/figures/x.svg?sanitize=true)" in "".join(done["cells"][3]["source"])
    path.write_text(json.dumps(done))
    for change in (fold_solutions.change, number_titles.change, colab_figures.change):
        assert differs(change, path) == []  # idempotent
    assert raw_myst(done["cells"]) == [] and fold_gaps(done["cells"]) == []


def test_folds_missing_in_jupyter_or_colab_are_found():
    def folded(source: str, *tag: str, **metadata) -> dict:
        cell = code(source, *tag)
        cell["metadata"].update(metadata)
        return cell

    both = {"source_hidden": True, "outputs_hidden": True}
    cells = [folded("#@title The function f, in full\ndef f(): pass", "hide-input", cellView="form",
                    jupyter={"source_hidden": True}),  # holds in all three places
             folded("print(runs)", "hide-output"),  # output folded on the site only: the tuning log's case
             folded("print(runs)", "hide-output", jupyter={"outputs_hidden": True}),  # Colab folds no output alone
             folded("#@title The function f, in full\ndef f(): pass", "hide-input", jupyter={"source_hidden": True}),
             folded("def f(): pass", "hide-cell", cellView="form", jupyter=both),
             folded("#| export\n#@title The function f, in full\ndef f(): pass", "hide-input", cellView="form",
                    jupyter={"source_hidden": True}),  # not the first line: Colab shows no title
             folded("#@title Hidden code\ndef f(): pass", "hide-cell", cellView="form", jupyter=both),
             folded("#@title The function f, in full\ndef f(): pass", "hide-cell", cellView="form",
                    jupyter={"source_hidden": True}),
             md("<details>\n<summary>Solution to exercise 1</summary>\n\n</details>"),
             folded("#@title Solution to exercise 1, the code\nprint(1)", cellView="form", jupyter=both),
             folded("print(2)", "remove-cell")]
    found = fold_gaps(cells)
    assert [f.split(" (")[0] for f in found] == ["cell 1", "cell 3", "cell 4", "cell 5", "cell 6", "cell 7",
                                                 "cell 9"]
    assert "Jupyter: no outputs_hidden" in found[0] and "cellView" in found[1] and "#@title" in found[2]
    assert "says" not in found[3] and "Hidden code" in found[4] and "outputs_hidden" in found[5]
    assert "hide-cell" in found[6]


def test_the_fold_tool_titles_each_cell_by_what_it_holds():
    """Colab's title is said from the cell; nbdev's directives move to the metadata, where nbdev reads them."""
    nb = {"cells": [code("#| export attention\nclass MultiHeadAttention:\n    pass\n", "hide-input"),
                    code('fig, ax = plt.subplots()\nax.set(title="BLEU of the snapshots")\n', "hide-input"),
                    code("import math\nimport torch\nfrom transformer_lib.attention import causal_mask\n",
                         "hide-cell"),
                    code("#@title A title a person wrote\nx = 1\n", "hide-input"),
                    code("import math\nimport torch\n\n\ndef agreement(a, b):\n    pass\n", "hide-cell"),
                    code("#@title Hidden code\nx = 1\n", "hide-input"),
                    md("<details>\n<summary>Solution to exercise 3</summary>\n\nBecause.\n\n</details>"),
                    code("print(1)"), code("print(2)", "hide-input"), code("print(3)", "remove-cell")],
          "metadata": {}, "nbformat": 4, "nbformat_minor": 5}
    done = fold_solutions.change(Path("x.ipynb"), copy.deepcopy(nb))
    firsts = ["".join(c["source"]).split("\n")[0] for c in done["cells"]]
    assert firsts == ["#@title The class MultiHeadAttention, in full", "#@title Draws the figure: BLEU of the snapshots",
                      "#@title The imports: math, torch and transformer_lib.attention",
                      "#@title A title a person wrote", "#@title The imports and the function agreement, in full",
                      "#@title Computes x", firsts[6],
                      "#@title Solution to exercise 3, the code", "#@title Solution to exercise 3, the code, part 2",
                      "print(3)"]
    assert done["cells"][0]["metadata"]["nbdev"] == {"export": "attention"}
    assert "".join(done["cells"][0]["source"]).count("#|") == 0
    assert fold_gaps(done["cells"]) == []
    assert fold_solutions.change(Path("x.ipynb"), copy.deepcopy(done)) == done  # idempotent
    assert colab_forms.is_generic("Hidden code") and not colab_forms.is_generic("Computes x")


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
