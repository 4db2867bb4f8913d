"""Static checks of the book: every page is in the table of contents, notebooks are clean and runnable on Colab."""
import json
import re
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tools"))
import install_cell  # noqa: E402

NOTEBOOKS = sorted((ROOT / "book").glob("*.ipynb"))
TOC = (ROOT / "_toc.yml").read_text()
MACHINE_PATH = re.compile(r"(?<![\w.:/~-])/(?:home|root|work|tmp|Users|mnt|opt)/[\w.-]+")
# A tiny number printed with its rounding noise (3.8e-06): another CPU prints another one. A bound (1e-05) is fine.
FLOAT_NOISE = re.compile(r"\b(?!1(?:\.0+)?e)\d\.\d+e-(?:0[5-9]|[1-9]\d)\b")


def test_every_toc_entry_exists():
    entries = re.findall(r"(?:file|root):\s*(\S+)", TOC)
    missing = [e for e in entries if not any((ROOT / f"{e}{ext}").exists() for ext in (".ipynb", ".md"))]
    assert entries and not missing, f"_toc.yml names pages that do not exist: {missing}"


@pytest.mark.parametrize("page", NOTEBOOKS + sorted((ROOT / "book").glob("*.md")), ids=lambda p: p.name)
def test_page_is_in_toc(page):
    assert page.relative_to(ROOT).with_suffix("").as_posix() in TOC


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.name)
def test_notebook_starts_with_title_and_install_cell(path):
    nb = json.loads(path.read_text())
    cells = nb["cells"]
    assert cells[0]["cell_type"] == "markdown" and "".join(cells[0]["source"]).startswith("# ")
    first_code = next(c for c in cells if c["cell_type"] == "code")
    assert "".join(first_code["source"]) == install_cell.install_source(), (
        f"{path.name}: the first code cell is not the install cell; run `python tools/install_cell.py`"
    )
    assert install_cell.TAG in first_code["metadata"].get("tags", []), f"{path.name}: the install cell is shown"


def test_release_is_one_version():
    """The install cells pin the release that pyproject.toml names, and the package says the same version."""
    init = (ROOT / "transformer_lib" / "__init__.py").read_text()
    assert f'__version__ = "{install_cell.release()}"' in init


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.name)
def test_notebook_is_executed_in_order_and_clean(path):
    nb = json.loads(path.read_text())
    code = [c for c in nb["cells"] if c["cell_type"] == "code"]
    counts = [c["execution_count"] for c in code]
    assert all(n is not None for n in counts), f"{path.name}: some cells were never executed"
    assert counts == list(range(1, len(code) + 1)), f"{path.name}: not executed top to bottom in one run"
    for i, cell in enumerate(code):
        for out in cell.get("outputs", []):
            assert out["output_type"] != "error" or "raises-exception" in cell["metadata"].get("tags", [])
            text = json.dumps(out.get("text", "")) + json.dumps(out.get("data", {}).get("text/plain", ""))
            assert not MACHINE_PATH.search(text), f"{path.name}, code cell {i}: output shows a machine path"


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.name)
def test_compared_outputs_travel(path):
    """nbval markers are cell tags, not comments readers see; no compared output prints rounding noise."""
    code = [c for c in json.loads(path.read_text())["cells"] if c["cell_type"] == "code"]
    for i, cell in enumerate(code):
        source, tags = "".join(cell["source"]), cell["metadata"].get("tags", [])
        assert "NBVAL_" not in source, f"{path.name}, code cell {i}: use the nbval-ignore-output tag, not a comment"
        if "nbval-ignore-output" in tags or "nbval-skip" in tags:
            continue
        for out in cell.get("outputs", []):
            text = json.dumps(out.get("text", "")) + json.dumps(out.get("data", {}).get("text/plain", ""))
            noise = FLOAT_NOISE.search(text)
            assert not noise, f"{path.name}, code cell {i}: compares {noise.group(0)}, which another CPU prints otherwise"


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.name)
def test_nbdev_directive_cells_are_hidden(path):
    """A cell that only tells nbdev where to export (#| default_exp) is not for readers."""
    for cell in json.loads(path.read_text())["cells"]:
        if cell["cell_type"] == "code" and "".join(cell["source"]).startswith("#| default_exp"):
            assert "remove-cell" in cell["metadata"].get("tags", []), f"{path.name}: tag its default_exp cell remove-cell"
