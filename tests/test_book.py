"""Static checks of the book: every page is in the table of contents, notebooks are clean and runnable on Colab."""
import json
import re
import subprocess
import sys
import tomllib
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


def test_version_is_one_version():
    """The install cells name the version that pyproject.toml names, and the package says the same version."""
    init = (ROOT / "transformer_lib" / "__init__.py").read_text()
    assert f'__version__ = "{install_cell.version()}"' in init


def test_install_ref_follows_the_version():
    """A release installs its tag; anything else installs the branch, never an older release."""
    assert install_cell.git_ref("1.2.0") == "v1.2.0"
    assert install_cell.git_ref("1.2.0.dev0") == install_cell.git_ref("1.2.0rc1") == "main"


def test_install_cells_name_the_version_of_pyproject_and_its_ref():
    """Read without the generator: the version from pyproject.toml, the ref by the rule (a release X.Y.Z installs
    its tag vX.Y.Z, any other version the branch main)."""
    version = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["version"]
    ref = f"v{version}" if re.fullmatch(r"\d+\.\d+\.\d+", version) else "main"
    for path in NOTEBOOKS:
        first_code = next(c for c in json.loads(path.read_text())["cells"] if c["cell_type"] == "code")
        assert f'BOOK_VERSION, BOOK_REF = "{version}", "{ref}"' in "".join(first_code["source"]), path.name


def _git(root: Path, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run(["git", *args], cwd=root, capture_output=True, text=True)


def release_problem(root: Path, version: str) -> str | None:
    """Why notebooks of `version` would not install the library beside them, or None when they would.

    A release's notebooks install its tag: the tag must exist and hold this library. Between releases the version is
    a development version (`X.Y.Z.devN`), whose notebooks install the branch.
    """
    if not install_cell.is_release(version):
        ok = re.fullmatch(r"\d+\.\d+\.\d+\.dev\d+", version)
        return None if ok else f"{version!r} is neither a release X.Y.Z nor a development version X.Y.Z.devN"
    tag = install_cell.git_ref(version)
    if _git(root, "rev-parse", "--verify", "--quiet", f"refs/tags/{tag}").returncode != 0:
        return f"pyproject.toml names release {version}, but there is no tag {tag}"
    changed = _git(root, "diff", "--name-only", tag, "--", "transformer_lib", "pyproject.toml").stdout.split()
    if changed:
        return (f"the library changed since release {version} ({', '.join(changed)}), but the notebooks install {tag}: "
                "make the version the next development version (X.Y.Z.dev0) and run `python tools/install_cell.py`")
    return None


def test_notebooks_install_the_library_beside_them():
    if _git(ROOT, "rev-parse", "--git-dir").returncode != 0:
        pytest.skip("not a git checkout: a release's tag cannot be checked here")
    problem = release_problem(ROOT, install_cell.version())
    assert problem is None, problem


def test_release_check_fails_on_a_stale_or_missing_tag(tmp_path):
    """The check above on a throwaway repository: a release without its tag, then a library changed after it."""
    def git(*args: str) -> None:
        done = _git(tmp_path, "-c", "user.name=t", "-c", "user.email=t@t", *args)
        assert done.returncode == 0, done.stderr

    (tmp_path / "transformer_lib").mkdir()
    (tmp_path / "transformer_lib" / "model.py").write_text("x = 1\n")
    git("init", "-q")
    git("add", ".")
    git("commit", "-q", "-m", "release")
    assert "no tag v1.0.0" in release_problem(tmp_path, "1.0.0")
    git("tag", "v1.0.0")
    assert release_problem(tmp_path, "1.0.0") is None
    (tmp_path / "transformer_lib" / "model.py").write_text("x = 2\n")
    assert "changed since release 1.0.0" in release_problem(tmp_path, "1.0.0")
    assert release_problem(tmp_path, "1.0.1.dev0") is None
    assert "neither" in release_problem(tmp_path, "1.0.1-beta")


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


MAIN_PATH = sorted((ROOT / "book").glob("[0-9][0-9]*.ipynb"))  # the chapters and their sections


@pytest.mark.parametrize("path", MAIN_PATH, ids=lambda p: p.name)
def test_a_main_path_page_stays_short_and_so_do_its_code_cells(path):
    """A page a reader can take in (at most 55 cells) and code cells that fit a screen (at most 60 lines)."""
    cells = json.loads(path.read_text())["cells"]
    assert len(cells) <= 55, f"{path.name} has {len(cells)} cells: split it into sections"
    longest = max(len("".join(c["source"]).splitlines()) for c in cells if c["cell_type"] == "code")
    assert longest <= 60, f"{path.name} has a code cell of {longest} lines"
