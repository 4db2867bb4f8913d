"""Settings for every pytest run in the repository (tests/ and the notebooks in book/)."""
import json
from pathlib import Path

DURATIONS = Path(__file__).parent / "tests" / "durations.json"


def pytest_collection_modifyitems(config, items) -> None:
    """The longest files first (seconds from tests/durations.json, written by tools/durations.py): with
    `--dist loadfile --no-loadscope-reorder` the two workers take files in this order, so neither is left running
    a long notebook alone at the end. A file keeps its own items' order; files not listed go last."""
    if not DURATIONS.exists():
        return
    seconds = json.loads(DURATIONS.read_text(encoding="utf-8"))
    items.sort(key=lambda item: -seconds.get(item.nodeid.split("::")[0], 0.0))
