"""Wrap the comments and docstrings of code cells whose lines are longer than the site's column (100 characters).

What this script changes, in a code cell's line longer than the limit (nbdev's `#|` lines aside):

* a comment line is wrapped onto several comment lines of the same indentation;
* a docstring with a long line is reflowed, paragraph by paragraph, to the width (a one-line docstring becomes two
  or more lines); one laid out otherwise than as plain paragraphs (a list, an example) has only its long lines
  wrapped;
* a statement with a trailing comment that fits once the comment is moved gets the comment on the line(s) above it.

It changes no code, so what a cell computes stays the same, and it leaves every other long line (a long statement,
a long string) for a person to split; `tests/test_layout.py` names those. A cell that Python cannot parse (IPython
magics, shell lines) is left as it is. Re-export the library (nbdev-export) after changing an exported cell.

    python tools/wrap_code_lines.py [NOTEBOOK ...] [--check] [--width 100]

Without paths, every notebook of book/. Idempotent; `--check` changes nothing and exits 1 when a notebook would change.
"""
from __future__ import annotations

import io
import re
import sys
import textwrap
import tokenize
from pathlib import Path

from nbjson import run, set_source, source

WIDTH = 100
NBDEV = re.compile(r"^#\|")
SKIPPED_TAGS = {"remove-input", "remove-cell"}


def _wrap(text: str, prefix: str, width: int) -> list[str]:
    return textwrap.wrap(text, width=width, initial_indent=prefix, subsequent_indent=prefix,
                         break_long_words=False, break_on_hyphens=False) or [prefix.rstrip()]


def _docstrings(code: str) -> list[tuple[int, int]]:
    """The (first, last) 0-based lines of each docstring (a triple-quoted string statement on its own)."""
    spans: list[tuple[int, int]] = []
    tokens = list(tokenize.generate_tokens(io.StringIO(code).readline))
    for i, tok in enumerate(tokens):
        if tok.type != tokenize.STRING or not re.match(r"^[rRuU]?(\"\"\"|''')", tok.string):
            continue
        before = next((t for t in reversed(tokens[:i]) if t.type not in (tokenize.NL, tokenize.COMMENT)), None)
        after = tokens[i + 1] if i + 1 < len(tokens) else None
        starts_statement = before is None or before.type in (tokenize.INDENT, tokenize.DEDENT, tokenize.NEWLINE)
        if starts_statement and after is not None and after.type in (tokenize.NEWLINE, tokenize.ENDMARKER):
            spans.append((tok.start[0] - 1, tok.end[0] - 1))
    return spans


PLAIN = re.compile(r"^\s*(?:[-*+] |\d+[.)] |>>>|\w+:$)")  # list items, examples, sections: not to reflow


def _reflow_docstring(lines: list[str], width: int) -> list[str] | None:
    """A docstring's lines with its paragraphs reflowed to width, or None when its layout is not plain prose
    (lists, examples, lines indented further than the first)."""
    indent = lines[0][: len(lines[0]) - len(lines[0].lstrip())]
    body = lines[0].strip()
    head = re.match(r"^[rRuU]?\"\"\"", body)
    if not head:
        return None
    texts = [body[head.end():]] + [line for line in lines[1:]]
    if any(PLAIN.match(t) or (t.strip() and not t.startswith(indent)) or
           (t.strip() and len(t) - len(t.lstrip()) > len(indent)) for t in texts[1:]):
        return None
    joined = "\n".join(t.strip() for t in texts)
    if not joined.endswith('"""'):
        return None
    joined = joined[:-3]
    closing_alone = joined.endswith("\n")
    paragraphs = [" ".join(p.split()) for p in re.split(r"\n\s*\n", joined.strip())]
    out: list[str] = []
    for n, paragraph in enumerate(paragraphs):
        if n:
            out.append("")
        first = indent + head.group(0) if n == 0 else indent
        pieces = textwrap.wrap(paragraph, width=width - len(indent), break_long_words=False,
                               break_on_hyphens=False, initial_indent=first[len(indent):])
        out += [indent + piece for piece in pieces]
    if closing_alone:
        out.append(indent + '"""')
    elif len(out[-1]) + 3 <= width:
        out[-1] += '"""'
    else:
        out.append(indent + '"""')
    return out


def _comment_starts(code: str) -> dict[int, int]:
    """For each 0-based line with a comment, the column where the comment starts."""
    return {tok.start[0] - 1: tok.start[1] for tok in tokenize.generate_tokens(io.StringIO(code).readline)
            if tok.type == tokenize.COMMENT}


def _wrap_docstring_line(line: str, width: int) -> list[str]:
    indent = line[: len(line) - len(line.lstrip())]
    body = line.strip()
    opening = re.match(r"^([rRuU]?\"\"\")", body)
    closing = body.endswith('"""') and (not opening or len(body) >= 6)
    head = opening.group(1) if opening else ""
    text = body[len(head): len(body) - 3 if closing else len(body)]
    pieces = _wrap(text, "", width - len(indent) - 3)
    out = [indent + (head if n == 0 else "") + piece for n, piece in enumerate(pieces)]
    if closing:
        out[-1] += '"""'
    return out


def wrap_code(code: str, width: int = WIDTH) -> str:
    """The cell's source with its long comments and docstrings wrapped and long trailing comments moved."""
    try:
        docstrings = _docstrings(code)
        comments = _comment_starts(code)
    except (tokenize.TokenError, IndentationError, SyntaxError):
        return code
    lines = code.split("\n")
    in_docstring = {n for first, last in docstrings for n in range(first, last + 1)}
    starts = {first: last for first, last in docstrings}
    out: list[str] = []
    n = 0
    while n < len(lines):
        line = lines[n]
        if n in starts:
            block = lines[n: starts[n] + 1]
            reflowed = _reflow_docstring(block, width) if any(len(b) > width for b in block) else None
            if reflowed is not None:
                out += reflowed
            else:
                out += [piece for b in block
                        for piece in (_wrap_docstring_line(b, width) if len(b) > width else [b])]
            n = starts[n] + 1
            continue
        n += 1
        if len(line) <= width or NBDEV.match(line) or (n - 1) in in_docstring:
            out.append(line)
            continue
        indent = line[: len(line) - len(line.lstrip())]
        at = comments.get(n - 1)
        if at is not None and line[:at].strip() == "":
            out += _wrap(line.strip()[1:].strip(), indent + "# ", width)
        elif at is not None and len(line[:at].rstrip()) <= width:
            out += _wrap(line[at:][1:].strip(), indent + "# ", width)
            out.append(line[:at].rstrip())
        else:
            out.append(line)
    return "\n".join(out)


def change(path: Path, nb: dict, width: int = WIDTH) -> dict:
    for cell in nb["cells"]:
        if cell["cell_type"] != "code" or SKIPPED_TAGS & set(cell["metadata"].get("tags", [])):
            continue
        code = source(cell)
        new = wrap_code(code, width)
        if new != code:
            set_source(cell, new)
    return nb


if __name__ == "__main__":
    args = sys.argv[1:]
    if "--width" in args:
        at = args.index("--width")
        WIDTH = int(args[at + 1])
        del args[at: at + 2]
    sys.exit(run(__doc__, lambda path, nb: change(path, nb, WIDTH), args))
