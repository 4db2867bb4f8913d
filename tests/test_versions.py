"""The versions the package declares are the ones it runs on: the floors hold here, and every torch API the package
names exists in the torch that runs the tests (CI's, and the GPU machine's older one when a GPU session runs them)."""
import ast
import re
import sys
from pathlib import Path

import pytest
import torch

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = ROOT / "transformer_lib"


def _floor(spec: str) -> tuple[int, ...]:
    return tuple(int(part) for part in re.fullmatch(r">=(\d+(?:\.\d+)*)", spec).group(1).split("."))


def _declared() -> tuple[str, str]:
    text = (ROOT / "pyproject.toml").read_text()
    python = re.search(r'requires-python = "([^"]+)"', text).group(1)
    torch_spec = re.search(r'"torch(>=[^"]+)"', text).group(1)
    return python, torch_spec


def test_requirements_and_pyproject_declare_the_same_torch_floor():
    _, torch_spec = _declared()
    lines = [line.strip() for line in (ROOT / "requirements.txt").read_text().splitlines()]
    assert f"torch{torch_spec}" in lines


def test_this_python_and_torch_meet_the_declared_floors():
    python, torch_spec = _declared()
    assert sys.version_info[:2] >= _floor(python), (sys.version, python)
    ours = tuple(int(p) for p in re.match(r"(\d+)\.(\d+)", torch.__version__).groups())
    assert ours >= _floor(torch_spec)[:2], (torch.__version__, torch_spec)


def _torch_names(tree: ast.AST) -> set[str]:
    """Dotted names the module reads from torch: torch.a.b, and F.x / nn.x under their usual aliases."""
    aliases = {"torch": "torch", "F": "torch.nn.functional", "nn": "torch.nn"}
    names = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute):
            parts, inner = [], node
            while isinstance(inner, ast.Attribute):
                parts.append(inner.attr)
                inner = inner.value
            if isinstance(inner, ast.Name) and inner.id in aliases:
                names.add(".".join([aliases[inner.id], *reversed(parts)]))
    return names


def _resolves(name: str) -> bool:
    obj = torch
    for part in name.split(".")[1:]:
        if not hasattr(obj, part):
            return False
        obj = getattr(obj, part)
    return True


@pytest.mark.parametrize("module", sorted(p.name for p in PACKAGE.glob("*.py")))
def test_every_torch_api_the_package_names_exists_in_this_torch(module):
    tree = ast.parse((PACKAGE / module).read_text())
    # torch.ops resolves operators lazily, by name; methods of tensors and modules are not torch's namespace
    names = {n for n in _torch_names(tree) if not n.startswith("torch.ops.")}
    missing = sorted(n for n in names if not _resolves(n))
    assert not missing, f"{module} uses {missing}, which torch {torch.__version__} lacks"


def test_the_check_catches_an_api_this_torch_lacks():
    tree = ast.parse("import torch\nfrom torch import nn\nx = torch.nn.functional.relu\ny = nn.NotALayer(3)\n")
    names = _torch_names(tree)
    assert {"torch.nn.functional.relu", "torch.nn.NotALayer"} <= names
    assert [n for n in sorted(names) if not _resolves(n)] == ["torch.nn.NotALayer"]
