"""The house stays one-way (ORDER below, bottom to top): no module imports one above it, and inference never loads
training. book/api.ipynb lists the modules and the chapter that explains each."""
import ast
import json
import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = ROOT / "transformer_lib"
# bottom to top: a module may import only modules before it in this list
ORDER = ["files", "data", "tokenizer", "runtime", "embeddings", "positional", "attention", "layers", "model", "recipe",
         "config", "corpus", "checkpoints", "decoding", "translate", "pretrained", "analysis", "beyond", "decoder_only",
         "distributed", "training_step", "records", "clock", "trainer", "training_run", "cli",
         "__init__", "__main__"]


def imported_modules(path: Path) -> set[str]:
    """The package's modules that a file imports, at the top or inside a function."""
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom):
            name = node.module or ""
            if node.level == 1:
                found.add(name.split(".")[0] if name else "")
            elif name.startswith("transformer_lib."):
                found.add(name.split(".")[1])
            if node.level == 1 and not name:
                found.update(a.name for a in node.names)
        elif isinstance(node, ast.Import):
            found.update(a.name.split(".")[1] for a in node.names if a.name.startswith("transformer_lib."))
    return found - {""}


def test_every_module_has_a_place_in_the_house():
    modules = {p.stem for p in PACKAGE.glob("*.py")} - {"_modidx"}
    assert modules == set(ORDER), (sorted(modules - set(ORDER)), sorted(set(ORDER) - modules))


def test_the_api_page_lists_every_module():
    """book/api.ipynb's table of modules names each module of the package, with a link to the page that explains it."""
    cells = json.loads((ROOT / "book" / "api.ipynb").read_text(encoding="utf-8"))["cells"]
    prose = "\n".join("".join(c["source"]) for c in cells if c["cell_type"] == "markdown")
    rows = re.findall(r"^\| `(transformer_lib(?:\.\w+)?)` \| ([^|]+) \|", prose, re.M)
    listed = {name.split(".")[1] if "." in name else "__init__" for name, _ in rows}
    modules = {p.stem for p in PACKAGE.glob("*.py")} - {"_modidx"}
    assert listed == modules, (sorted(modules - listed), sorted(listed - modules))
    unlinked = [name for name, where in rows if name != "transformer_lib" and "](" not in where]
    assert not unlinked, unlinked


def test_imports_run_one_way():
    upward = []
    for name in ORDER:
        for other in imported_modules(PACKAGE / f"{name}.py"):
            if other in ORDER and ORDER.index(other) >= ORDER.index(name):
                upward.append(f"{name} imports {other}")
    assert not upward, upward


def test_inference_loads_nothing_of_training():
    code = ("import sys, transformer_lib.translate, transformer_lib.decoding, transformer_lib.analysis, "
            "transformer_lib.cli, transformer_lib; "
            "print(sorted(m for m in sys.modules if m.startswith('transformer_lib.')))")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT, check=True)
    loaded = done.stdout
    for module in ("transformer_lib.trainer", "transformer_lib.distributed", "transformer_lib.training_run",
                   "transformer_lib.records", "transformer_lib.clock", "transformer_lib.training_step"):
        assert f"'{module}'" not in loaded, loaded


def test_train_is_still_a_name_of_the_package():
    code = "from transformer_lib import train, TrainConfig, PRESETS, load_model; print(train.__module__)"
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT, check=True)
    assert done.stdout.strip() == "transformer_lib.training_run"


def test_evaluate_checkpoint_is_still_a_name_of_the_package():
    code = "import transformer_lib; print(transformer_lib.evaluate_checkpoint.__module__)"
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT, check=True)
    assert done.stdout.strip() == "transformer_lib.records"
