"""The order in which the test suite hands out its files: the slowest first.

`make test` runs two pytest workers that take whole files (`--dist loadfile`) in collection order. A long notebook
collected last keeps one core busy while the other has nothing left to do; started first, it runs beside the many
short files instead. The list holds the files whose cells took longest in CI; the rest keep their usual order.
"""
SLOWEST_FIRST = (
    "book/14_inside_the_translator.ipynb",
    "book/eng_processes.ipynb",
    "book/11_training.ipynb",
    "book/eng_devices.ipynb",
    "book/eng_training_runs.ipynb",
    "book/15b_deep_and_long.ipynb",
    "book/13_translator.ipynb",
    "book/12b_fast_decoding.ipynb",
    "tests/test_gpu_session.py",
    "tests/test_runtime_checks.py",
)


def pytest_collection_modifyitems(session, config, items) -> None:
    """Move the items of the slowest files to the front; a stable sort keeps each file's cells in their order."""
    rank = {path: i for i, path in enumerate(SLOWEST_FIRST)}
    items.sort(key=lambda item: rank.get(item.nodeid.split("::")[0], len(rank)))
