"""tools/execute.py --keep-run-outputs: a recorded run's outputs come back only where the code that made them did not change."""
import sys
from pathlib import Path

import nbformat

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tools"))
import execute  # noqa: E402


def _cell(source: str, text: str, tags: list[str] | None = None, count: int = 1):
    cell = nbformat.v4.new_code_cell(source, execution_count=count)
    cell.outputs = [nbformat.v4.new_output("stream", name="stdout", text=text)]
    if tags:
        cell.metadata["tags"] = tags
    return cell


def test_run_outputs_come_back_where_the_code_is_unchanged():
    recorded = nbformat.v4.new_notebook(cells=[
        _cell("train()", "loss 1.47 after an hour\n", ["nbval-ignore-output"], 1),
        _cell("score(old=True)", "BLEU 41.81\n", ["nbval-ignore-output"], 2),
        _cell("print(2 + 2)", "4\n", None, 3),
    ])
    fresh = nbformat.v4.new_notebook(cells=[
        _cell("train()", "loss 4.10 after a minute\n", ["nbval-ignore-output"], 5),
        nbformat.v4.new_markdown_cell("a new paragraph"),
        _cell("glue_cell()", "glued\n", None, 6),
        _cell("score(old=False)", "BLEU 3.2\n", ["nbval-ignore-output"], 7),
        _cell("print(2 + 2)", "4\n", None, 8),
    ])
    assert execute.keep_run_outputs(recorded, fresh) == 1
    code = [c for c in fresh.cells if c.cell_type == "code"]
    assert code[0].outputs[0]["text"] == "loss 1.47 after an hour\n"  # the hour's output, kept
    assert code[2].outputs[0]["text"] == "BLEU 3.2\n"  # changed code: this execution's output
    assert [c.execution_count for c in code] == [1, 2, 3, 4]
