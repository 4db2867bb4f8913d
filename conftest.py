"""Settings for every pytest run in the repository (tests/ and the notebooks in book/)."""
import json
import os
from pathlib import Path

import pytest

DURATIONS = Path(__file__).parent / "tests" / "durations.json"


def pytest_collection_modifyitems(config, items) -> None:
    """The longest files first (seconds from tests/durations.json, written by tools/durations.py): with
    `--dist loadfile --no-loadscope-reorder` the two workers take files in this order, so neither is left running
    a long notebook alone at the end. A file keeps its own items' order; files not listed go last."""
    if not DURATIONS.exists():
        return
    seconds = json.loads(DURATIONS.read_text(encoding="utf-8"))
    items.sort(key=lambda item: -seconds.get(item.nodeid.split("::")[0], 0.0))


# NOTEBOOK_KERNEL_ENV="NAME=value ...": variables that the notebooks' kernels start with and the rest of the run
# does not see. CI's second pass runs the notebooks on another path through PyTorch's math kernels (a stored output
# must hold on every path) and the library's tests on the default one, where they compare against references with
# tolerances of their own.
NOTEBOOK_ENV: dict[str, str] = {}
OUTSIDE_NOTEBOOKS: dict[str, str | None] = {}


def pytest_configure(config) -> None:
    """NOTEBOOK_KERNEL_ENV read, and the run's own values of its names kept; an entry that is not NAME=value stops
    the run before any test, naming the entry."""
    text = os.environ.get("NOTEBOOK_KERNEL_ENV", "")
    for pair in text.split():
        name, equals, value = pair.partition("=")
        if not (name and equals):
            raise pytest.UsageError(f"NOTEBOOK_KERNEL_ENV={text!r}: {pair!r} is not NAME=value")
        NOTEBOOK_ENV[name] = value
        OUTSIDE_NOTEBOOKS[name] = os.environ.get(name)


@pytest.hookimpl(tryfirst=True)
def pytest_runtest_setup(item) -> None:
    """Before a notebook's first cell starts its kernel, its variables; before any other test, the run's own."""
    in_notebook = item.nodeid.split("::")[0].endswith(".ipynb")
    for name, value in (NOTEBOOK_ENV if in_notebook else OUTSIDE_NOTEBOOKS).items():
        if value is None:
            os.environ.pop(name, None)
        else:
            os.environ[name] = value
