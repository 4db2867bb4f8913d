"""Write tests/durations.json, the seconds each test file and notebook took, from pytest's JUnit XML reports.

    python -m pytest ... --junitxml=report.xml
    python tools/durations.py report.xml [more.xml ...]

The root conftest.py hands the longest files to the two pytest workers first, so that they finish together instead
of one waiting while the other runs a long notebook taken last. The numbers only order the work: a stale or missing
entry makes a run slower, never wrong. A file measured in several reports keeps its largest time.
"""
import argparse
import json
import xml.etree.ElementTree as ET
from collections import Counter
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
DURATIONS = ROOT / "tests" / "durations.json"


def file_of(case: ET.Element) -> str:
    """The repository path of a test case's file ("tests/test_x.py", "book/x.ipynb")."""
    if case.get("file"):
        return case.get("file")
    name = case.get("classname", "")
    if ".ipynb" in name:  # nbval: "book.14_inside_the_translator.ipynb"
        folder, notebook = name.split(".", 1)
        return f"{folder}/{notebook}"
    folder, module = name.split(".")[:2]  # "tests.test_x" or "tests.test_x.Class"
    return f"{folder}/{module}.py"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("reports", nargs="+", type=Path)
    args = parser.parse_args()
    seconds: Counter = Counter()
    for report in args.reports:
        per_file: Counter = Counter()
        for case in ET.parse(report).iter("testcase"):
            per_file[file_of(case)] += float(case.get("time", 0))
        for name, s in per_file.items():
            seconds[name] = max(seconds[name], s)
    durations = {name: round(s, 1) for name, s in sorted(seconds.items(), key=lambda kv: -kv[1])}
    DURATIONS.write_text(json.dumps(durations, indent=1) + "\n", encoding="utf-8")
    print(f"{len(durations)} files, {sum(durations.values()):.0f} s in all -> {DURATIONS.relative_to(ROOT)}")


if __name__ == "__main__":
    main()
