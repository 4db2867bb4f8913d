"""Fold every exercise's solution and every code cell that the site folds, on the site and in Colab and Jupyter
alike (CONTRIBUTING.md, "Folds").

A solution's markdown cell becomes

    <details>
    <summary>Solution to exercise 2</summary>

    The prose of the solution...

    </details>

which Jupyter, Colab and the site all render folded (a MyST `:::{admonition} ... :class: dropdown` fence, the
earlier form, is converted; Colab showed it as raw text). The sentence "The code of the solution follows, folded."
is dropped. The code cells that follow a solution's markdown cell, up to the next markdown cell, get the tag
`hide-cell` (the site folds input and output; it replaces `hide-input` and `hide-output`). A cell tagged
`remove-cell` is left as it is.

Every code cell that the site folds then folds in the two other places too:

* Jupyter: the metadata `jupyter: {source_hidden: true}` for `hide-input`, `{outputs_hidden: true}` for
  `hide-output`, both for `hide-cell`.
* Colab (which folds a cell's source only, as a form): for `hide-input` and `hide-cell`, the metadata
  `cellView: "form"` and a first line `#@title What the cell holds` (tools/colab_forms.py). A cell without a title
  gets one said from its code: "Solution to exercise 2, the code", "The class MultiHeadAttention, in full", "Draws
  the figure: BLEU of the snapshots", "The imports: torch, einops and matplotlib"... A title a person wrote is kept.
  nbdev reads its directives (`#| export attention`) from a cell's first lines only, where the title now stands:
  a folded cell's directives move to its metadata, `nbdev: {export: "attention"}`, which nbdev reads the same, and
  nbdev leaves the title out of transformer_lib/ (`colab_forms.drop_title`).

    python tools/fold_solutions.py [NOTEBOOK ...] [--check]

Without paths, every notebook of book/. Idempotent; `--check` changes nothing and exits 1 when a notebook would change
(tests/test_layout.py holds the same rule).
"""
from __future__ import annotations

import ast
import re
import sys
from pathlib import Path

from colab_forms import is_generic, title, with_title, without_title
from nbjson import run, set_source, source

FENCE = re.compile(r"\A\s*(?P<colons>:{3,})\{admonition\}\s*(?P<title>Solution\b[^\n]*)\n"
                   r"(?P<options>(?::[\w-]+:[^\n]*\n)*)(?P<body>.*?)\n?(?P=colons)\s*\Z", re.S)
FOLDED = re.compile(r"\A<details>\n<summary>(?P<title>Solution\b[^<\n]*)</summary>\n")
FOLLOWS = re.compile(r"\n*The code of the solution follows, folded\.[ \t]*(?=\n|\Z)")
FOLLOWS_AND = re.compile(r"The code of the solution follows, folded; it ")
HIDDEN = {"source_hidden": True, "outputs_hidden": True}
TAG = "hide-cell"
REPLACED = ("hide-input", "hide-output")
# what Jupyter folds of a cell that the site folds by its tag
JUPYTER_FOLDS = {"hide-input": {"source_hidden": True}, "hide-cell": HIDDEN, "hide-output": {"outputs_hidden": True}}
# the tags whose cells Colab folds too: a form shows a cell's title in the place of its source
COLAB_FOLDS = {"hide-input", "hide-cell"}
DIRECTIVE = re.compile(r"#\s*\|\s*(?P<name>[^\s:]+)\s*:?\s?(?P<value>.*?)\s*")
EXERCISE = re.compile(r"Solution to exercise (?P<n>\w+)")
TITLE_LENGTH = 80  # characters of a title said from the code, at most


def folded(title: str, body: str) -> str:
    """The solution's markdown in the folded form."""
    body = FOLLOWS_AND.sub("The code of the solution ", FOLLOWS.sub("", body)).strip("\n")
    return f"<details>\n<summary>{title.strip()}</summary>\n\n{body}\n\n</details>" if body else \
        f"<details>\n<summary>{title.strip()}</summary>\n\n</details>"


def convert_markdown(text: str) -> str:
    """A solution fence in the folded form; a folded solution without the dropped sentence; other text unchanged."""
    match = FENCE.match(text)
    if match:
        return folded(match.group("title"), match.group("body"))
    match = FOLDED.match(text)
    if match and text.rstrip().endswith("</details>"):
        body = text[match.end():].rstrip()[: -len("</details>")]
        return folded(match.group("title"), body)
    return text


def is_solution(cell: dict) -> bool:
    return cell["cell_type"] == "markdown" and bool(FOLDED.match(source(cell)))


def fold_code(cell: dict) -> None:
    """The tag of a solution's code cell."""
    tags = cell["metadata"].get("tags", [])
    if "remove-cell" in tags:
        return
    if TAG not in tags:  # in the place of the tag it replaces, else last
        at = next((i for i, t in enumerate(tags) if t in REPLACED), len(tags))
        tags = tags[:at] + [TAG] + tags[at:]
    tags = [t for t in tags if t not in REPLACED]
    cell["metadata"]["tags"] = tags


def directives_to_metadata(cell: dict, code: str) -> str:
    """The code without its leading nbdev directive lines, which move to the cell's metadata `nbdev` (nbdev reads
    them there the same: a bare directive as "true")."""
    lines = code.splitlines(keepends=True)
    found = {}
    while lines and (DIRECTIVE.fullmatch(lines[0].rstrip("\n")) or not lines[0].strip()):
        match = DIRECTIVE.fullmatch(lines.pop(0).rstrip("\n"))
        if match:
            found[match.group("name")] = match.group("value") or "true"
    if found:
        cell["metadata"]["nbdev"] = {**cell["metadata"].get("nbdev", {}), **found}
        return "".join(lines)
    return code


def fold(cell: dict, solution: str | None = None, part: int = 1) -> None:
    """A code cell that the site folds folds in Jupyter and Colab too (`solution`: the summary of the solution
    whose `part`-th code cell it is)."""
    tags = cell["metadata"].get("tags", [])
    if "remove-cell" in tags:
        return
    for tag, hidden in JUPYTER_FOLDS.items():
        if tag in tags:
            cell["metadata"]["jupyter"] = {**cell["metadata"].get("jupyter", {}), **hidden}
    if not COLAB_FOLDS & set(tags):
        return
    text = source(cell)
    written = title(text)
    code = directives_to_metadata(cell, without_title(text))
    if written is None or is_generic(written):
        written = said_of(code, solution, part)
    new = with_title(code, written)
    if new != text:
        set_source(cell, new)
    cell["metadata"]["cellView"] = "form"


# --- A title said from the code -------------------------------------------------------------------------------------

def listed(words: list[str], most: int = 3) -> str:
    """`a`, `a and b`, `a, b and c`, `a, b, c and 2 more`."""
    if len(words) > most:
        words = words[:most] + [f"{len(words) - most} more"]
    return words[0] if len(words) == 1 else ", ".join(words[:-1]) + " and " + words[-1]


def fits(text: str) -> str:
    text = " ".join(text.split())
    return text if len(text) <= TITLE_LENGTH else text[:TITLE_LENGTH - 3].rstrip(" ,;:") + "..."


def parse(code: str) -> ast.Module | None:
    """The code as Python, IPython's `%` and `!` lines read as `pass`; None when it is not Python."""
    python = re.sub(r"^(\s*)[%!].*$", r"\1pass", code, flags=re.M)
    try:
        return ast.parse(python)
    except SyntaxError:
        return None


def words_of(node: ast.AST | None) -> str | None:
    """The text of a string literal; of an f-string, with each `{name}` read as the name and any other `{...}`
    as "…", when its literal parts say most of it."""
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        return node.value
    if isinstance(node, ast.JoinedStr):
        literal = "".join(v.value for v in node.values if isinstance(v, ast.Constant))
        holes = [v for v in node.values if not isinstance(v, ast.Constant)]
        if len(literal.strip()) >= 16 and len(holes) <= 2:
            return "".join(v.value if isinstance(v, ast.Constant) else
                           v.value.id if isinstance(v.value, ast.Name) else "…" for v in node.values)
    return None


def argument_words(node: ast.AST) -> list[str]:
    """What an argument names: a string's text, a name, the items of a list or tuple of them."""
    if isinstance(node, (ast.List, ast.Tuple)):
        return [w for item in node.elts for w in argument_words(item)]
    words = words_of(node)
    return [words] if words else [node.id] if isinstance(node, ast.Name) else []


def figure_title(tree: ast.Module) -> str | None:
    """What a figure the code draws is called: its suptitle, its axes' titles, its file, its axes' labels."""
    calls = [n for n in ast.walk(tree) if isinstance(n, ast.Call) and isinstance(n.func, (ast.Attribute, ast.Name))]
    name = lambda call: call.func.attr if isinstance(call.func, ast.Attribute) else call.func.id  # noqa: E731
    draws = {"subplots", "figure", "savefig", "imshow", "plot", "bar", "barh", "scatter", "show", "hist", "matshow"}
    if not any(name(c) in draws for c in calls):
        return None
    said = {"suptitle": [], "title": [], "savefig": [], "label": []}
    for call in calls:
        first = words_of(call.args[0]) if call.args else None
        keywords = {k.arg: words_of(k.value) for k in call.keywords if k.arg}
        if name(call) == "suptitle" and first:
            said["suptitle"].append(first)
        elif name(call) in ("set_title", "title") and first:
            said["title"].append(first)
        elif name(call) == "set" and keywords.get("title"):
            said["title"].append(keywords["title"])
        elif name(call) == "savefig" and first:
            said["savefig"].append(Path(first).stem.replace("_", " "))
        elif name(call) == "set" and (keywords.get("ylabel") or keywords.get("xlabel")):
            said["label"].append(" by ".join(w for w in (keywords.get("ylabel"), keywords.get("xlabel")) if w))
        elif name(call) in ("set_ylabel", "ylabel") and first:
            said["label"].append(first)
    for kind in ("suptitle", "title", "savefig", "label"):
        if said[kind]:
            texts = list(dict.fromkeys(t.replace("\n", " ").strip() for t in said[kind]))
            return "Draws the figure: " + (texts[0] if len(texts) == 1 else "; ".join(texts[:2]))
    return None


def definitions(tree: ast.Module) -> str | None:
    """The classes and functions the code defines: "The class X and the function f, in full"."""
    kinds = {"class": [], "function": []}
    for node in tree.body:
        if isinstance(node, ast.ClassDef):
            kinds["class"].append(node.name)
        elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            kinds["function"].append(node.name)
    said = [f"the {kind}{'es' if kind == 'class' and len(names) > 1 else 's' if len(names) > 1 else ''} "
            f"{listed(names)}" for kind, names in kinds.items() if names]
    if not said:
        return None
    text = " and ".join(said)
    return text[0].upper() + text[1:] + ", in full"


def imports(tree: ast.Module) -> str | None:
    """A cell of imports (and a little set-up): "The imports: torch, einops and matplotlib"."""
    modules = []
    for node in tree.body:
        if isinstance(node, ast.Import):
            modules += [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            modules.append("." * node.level + (node.module or ""))
    if not modules or len(modules) * 2 < len(tree.body):
        return None
    # the book's own modules by their full name, others by their package
    roots = list(dict.fromkeys(m if m.startswith("transformer_lib.") else m.split(".")[0] or m for m in modules))
    rest = " and set-up" if len(modules) < len(tree.body) else ""
    return f"The imports{rest}: {listed(roots, 4)}"


def leading_comment(code: str) -> str | None:
    match = re.match(r"\s*#\s*(?P<text>[^\n|@!][^\n]*)", code)
    return match.group("text").strip() if match and len(match.group("text").split()) >= 3 else None


def printed(tree: ast.Module) -> str | None:
    """What the cell prints first, named by its words: "Prints and checks: bias-free, ours and torch"."""
    asserts = any(isinstance(n, ast.Assert) for n in tree.body)
    for node in ast.walk(tree):
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id == "print" and node.args:
            words = words_of(node.args[0])
            if words and len(re.sub(r"\W", "", words)) >= 6:
                return ("Prints and checks: " if asserts else "Prints: ") + words.strip(" :\n")
    return None


def called(tree: ast.Module) -> str | None:
    """A cell that opens with a call of the book's own: "Calls table on HOUR and cpu"."""
    first = tree.body[0] if tree.body else None
    if not (isinstance(first, ast.Expr) and isinstance(first.value, ast.Call)):
        return None
    call = first.value
    name = ast.unparse(call.func)
    words = [w for arg in call.args for w in argument_words(arg)]
    return f"Calls {name} on {listed(words)}" if words else None


def assigned(tree: ast.Module) -> str | None:
    names = [t.id for node in tree.body if isinstance(node, (ast.Assign, ast.AnnAssign))
             for t in (node.targets if isinstance(node, ast.Assign) else [node.target])
             if isinstance(t, ast.Name) and t.id != "_"]
    if not names:
        return None
    checks = " and checks them" if any(isinstance(n, ast.Assert) for n in tree.body) else ""
    return f"Computes {listed(list(dict.fromkeys(names)))}{checks}"


def said_of(code: str, solution: str | None = None, part: int = 1) -> str:
    """A title that says what a code cell holds."""
    if solution is not None:
        match = EXERCISE.match(solution)
        said = f"Solution to exercise {match.group('n')}, the code" if match else f"{solution}, the code"
        return said if part == 1 else f"{said}, part {part}"
    tree = parse(code)
    defined = definitions(tree) if tree is not None else None
    if defined and sum(isinstance(n, (ast.Import, ast.ImportFrom)) for n in tree.body) > 1:  # a chapter's set-up
        return fits(f"The imports{', ' if ' and ' in defined else ' and '}{defined[0].lower()}{defined[1:]}")
    for say in (figure_title, definitions, imports):
        said = say(tree) if tree is not None else None
        if said:
            return fits(said)
    said = leading_comment(code) or (tree is not None and (called(tree) or printed(tree) or assigned(tree))) or None
    if said:
        return fits(said)
    first = next((line.strip() for line in code.splitlines() if line.strip()), "")
    return fits(f"Runs {first}")


def change(path: Path, nb: dict) -> dict:
    solution, part = None, 0
    for cell in nb["cells"]:
        if cell["cell_type"] == "markdown":
            text = source(cell)
            new = convert_markdown(text)
            if new != text:
                set_source(cell, new)
            match = FOLDED.match(source(cell))
            solution, part = (match.group("title").strip(), 0) if is_solution(cell) else (None, 0)
        elif cell["cell_type"] == "code":
            if solution is not None:
                fold_code(cell)
                part += 1
            fold(cell, solution, part)
    return nb


if __name__ == "__main__":
    sys.exit(run(__doc__, change))
