"""Pointers in prose go to the right page.

A "chapter N" (or "chapters N and M", "chapter Nb") named in a page's prose is a markdown link to that chapter's page:
`[chapter 14](14_inside_the_translator.ipynb)`. A chapter's pages are its own and its sections' (_toc.yml: chapter 12
is 12_decoding and 12b_fast_decoding; chapter 12b only 12b_fast_decoding). An unlinked chapter sends the reader
searching, a link to another chapter's page sends them to the wrong place; both fail here, naming the page, the
sentence and the file the link should name. Maths, code, HTML and headings are not prose.
"""
import json
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
BOOK = ROOT / "book"
PAGES = sorted(BOOK.glob("*.ipynb")) + sorted(BOOK.glob("*.md"))
CHAPTER_PAGES = sorted(p.stem for p in BOOK.glob("[0-9][0-9]*.ipynb"))

NOT_PROSE = [
    re.compile(r"```.*?```", re.S),  # fenced code and directives
    re.compile(r"\$\$.*?\$\$", re.S),  # display maths
    re.compile(r"\$[^$\n]+\$"),  # inline maths
    re.compile(r"`[^`\n]*`"),  # code spans and the text of roles
    re.compile(r"<!--.*?-->", re.S),  # comments
    re.compile(r"^#+ .*$", re.M),  # headings
    re.compile(r"!\[[^\]]*\]\([^)]*\)"),  # images: their alt text describes a picture, it points nowhere
]
LINK = re.compile(r"\[((?:[^\[\]]|\[[^\]]*\])*)\]\(([^)\s]*)[^)]*\)")
NUMBER = r"\d+[bc]?\b"
MENTION = re.compile(rf"\bchapter\s+({NUMBER})|\bchapters\s+({NUMBER}(?:\s*(?:,|and|or|to|–)\s*{NUMBER})*)", re.I)


def pages_of(chapter: str) -> list[str]:
    """The page files of chapter "12" (12_decoding, 12b_fast_decoding) or "12b" (12b_fast_decoding); "15c" likewise."""
    number, section = int(chapter.rstrip("bc")), chapter[-1] if chapter[-1] in "bc" else ""
    prefixes = [f"{number:02d}{section}_"] if section else [f"{number:02d}{s}_" for s in ("", "b", "c")]
    return [stem for stem in CHAPTER_PAGES if stem.startswith(tuple(prefixes))]


def flatten(markdown: str) -> tuple[str, list[str | None]]:
    """The text as a reader reads it (links replaced by their text), and for each character the page it links to."""
    for pattern in NOT_PROSE:
        markdown = pattern.sub(lambda m: " " * len(m.group(0)) if "\n" not in m.group(0) else "\n", markdown)
    text, targets, end = [], [], 0
    for link in LINK.finditer(markdown):
        text.append(markdown[end:link.start()])
        targets += [None] * (link.start() - end)
        target = Path(link.group(2).split("#")[0]).stem or None
        inner, _ = flatten(link.group(1)) if "[" in link.group(1) else (link.group(1), None)
        text.append(inner)
        targets += [target] * len(inner)
        end = link.end()
    text.append(markdown[end:])
    targets += [None] * (len(markdown) - end)
    return "".join(text), targets


BOUNDARIES = (". ", "\n\n", "|", "\n- ", "\n* ")  # sentences, paragraphs, table cells, list items


def sentence_at(text: str, start: int, end: int) -> str:
    left = max([i + (1 if b == ". " else len(b)) for b in BOUNDARIES if (i := text.rfind(b, 0, start)) >= 0] or [0])
    right = min([i for i in (text.find(b, end) for b in BOUNDARIES) if i >= 0] or [len(text)])
    return " ".join(text[left:right + 1].split())


def bad_pointers(markdown: str) -> list[str]:
    """Each chapter named in the prose that is not a link to its page: the sentence, and what the link should be."""
    text, targets = flatten(markdown)
    found = []
    for mention in MENTION.finditer(text):
        group = 1 if mention.group(1) else 2
        for number in re.finditer(NUMBER, mention.group(group)):
            start = mention.start(group) + number.start()
            chapter, target = number.group(0), targets[start]
            expected = pages_of(chapter)
            if target in expected:
                continue
            wanted = " or ".join(f"{stem}.ipynb" for stem in expected) or "a page that does not exist"
            what = "is not a link" if target is None else f"links to {target}"
            found.append(f"chapter {chapter} {what}; expected {wanted}: \"{sentence_at(text, start, start + 1)}\"")
    return found


def markdown_of(page: Path) -> list[str]:
    if page.suffix != ".ipynb":
        return [page.read_text()]
    return ["".join(c["source"]) for c in json.loads(page.read_text())["cells"] if c["cell_type"] == "markdown"]


@pytest.mark.parametrize("page", PAGES, ids=lambda p: p.name)
def test_a_chapter_named_in_prose_links_to_its_page(page):
    bad = [problem for markdown in markdown_of(page) for problem in bad_pointers(markdown)]
    assert not bad, f"{page.name}: chapters named without a link to their page:\n" + "\n".join(bad)


def test_wrong_and_missing_pointers_are_caught():
    """A synthetic page with an unlinked chapter 14 and a link to the wrong page is flagged; right links pass."""
    right = ("As [chapter 14](14_inside_the_translator.ipynb) shows, and [chapters 5](05_attention.ipynb) and "
             "[6](06_multi_head_attention.ipynb) built; [chapter 12](12b_fast_decoding.ipynb#the-cache) caches, "
             "[Chapter 1b](01b_tokenizer.ipynb) trains; `chapter 3` in code and $chapter 4$ in maths are not prose.")
    assert bad_pointers(right) == []
    unlinked = bad_pointers("The heads are drawn in chapter 14. The rest is plain.")
    assert unlinked == ['chapter 14 is not a link; expected 14_inside_the_translator.ipynb: '
                        '"The heads are drawn in chapter 14."']
    wrong = bad_pointers("Cross-attention is drawn in [chapter 14](13_translator.ipynb), see chapters 5 and "
                         "[6](06_multi_head_attention.ipynb), and [chapter 12b](12_decoding.ipynb). In chapter "
                         "[13](13_translator.ipynb), 200 steps; ![chapter 11 trains](architecture_ch11.svg).")
    assert [w.split(";")[0] for w in wrong] == ["chapter 14 links to 13_translator", "chapter 5 is not a link",
                                                "chapter 12b links to 12_decoding"]
    assert "expected 14_inside_the_translator.ipynb" in wrong[0]


def test_a_wrong_pointer_injected_into_a_real_page_fails():
    """Chapter 9's prose with its cross-attention pointer sent to chapter 13's page, as it once was, fails."""
    cells = markdown_of(BOOK / "09_decoder.ipynb")
    text = next(t for t in cells if "(14_inside_the_translator.ipynb)" in t)
    before = bad_pointers(text)
    after = bad_pointers(text.replace("(14_inside_the_translator.ipynb)", "(13_translator.ipynb)", 1))
    assert [a.split(";")[0] for a in after if a not in before] == ["chapter 14 links to 13_translator"]
