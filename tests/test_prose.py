"""Numbers in prose come from the code (STYLE.md, habit 19).

A number of two or more digits in a page's prose (41.17, 847, 1,223, 36, 2.6) and every percentage (7%, 83%) must
appear in that page's stored outputs or glued values (a percentage also as a fraction: 0.803 states 80.3%), or be a
constant of the paper or the configuration (ALLOWED, ALLOWED_PHRASES): a number typed by hand drifts when the code or
a run changes, and this check makes the drift fail CI instead of reaching a reader. Maths, code spans, links' targets,
headings, HTML and glue roles are not prose; years (1990-2029) are dates; the numbers of chapters, sections,
equations, tables and figures are names, not measurements.
"""
import json
import re
from decimal import Decimal
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
BOOK = ROOT / "book"
PAGES = sorted(BOOK.glob("*.ipynb")) + [p for p in sorted(BOOK.glob("*.md")) if p.name != "references.md"]

# Constants of the paper, of the presets and of the data, which prose may type (strings as a reader writes them).
ALLOWED = {
    "128", "256", "512", "1024", "2048",  # widths and sizes of the paper and the presets (D, F, bytes)
    "37000", "25000", "100000",  # the paper's vocabulary, tokens per batch and training steps
    "0.98", "0.999",  # Adam's beta_2, the paper's and the usual default
    "1014", "31014",  # Multi30k's validation pairs, and all its pairs: 29,000 + 1,014 + 1,000
    "65504",  # the largest float16
    "41.02",  # a published result the book cites (Wu et al., 2021), not one of its runs
    "64",  # the paper's head width d_k = d_v, and the `tiny` preset's width and positions
    "8000", "1500", "20000",  # the presets' vocabulary; the `tiny` and `gpu` presets' tokens per batch
    "29000", "1000",  # Multi30k's training and test2016 pairs
}
# Numbers that are constants only in their phrase: a bare 12 or 80% elsewhere is still checked.
ALLOWED_PHRASES = [
    "12 hours on 8 GPUs",  # the paper's base model's training (Sec. 5.2)
    "4.5 million sentence pairs",  # the paper's WMT 2014 English-German data (Sec. 5.1)
    "16 GB",  # a GPU's memory, the size the `gpu` preset aims at
    "8 or 11 bits", "24 significant bits",  # the mantissas of bfloat16, float16 and float32
    "RTX 30xx", "capability 7.5",  # names of GPUs and of their generations
    "at least 93%",  # a bound that chapter 11's check asserts, typed in its code
    "9.0M parameters", "2.6M parameters",  # published peers' sizes, cited from their sources (chapter 13)
]
# Names, not measurements: "chapter 14", "chapters 5 and 6", "Sec. 5.4", "Eq. 3", "Table 2", "[12b Fast decoding]".
REFERENCE = re.compile(r"(?i)(?:\b(?:chapters?|sections?|secs?\.|eqs?\.|equations?|tables?|figures?|figs?\.|appendix)|§)"
                       r"\s*\d+(?:\.\d+)*[bc]?(?:\s*(?:,|and|or|to|–)\s*\d+(?:\.\d+)*[bc]?)*|(?<=\[)\d+[bc]?(?= [A-Z])")
YEAR = re.compile(r"^(?:199\d|20[0-2]\d)$")
NUMBER = re.compile(r"(?<![\w.,/#:-])[-−]?\d{1,3}(?:,\d{3})+(?:\.\d+)?(?![\w,]*\d)|(?<![\w.,/#:-])[-−]?\d+(?:\.\d+)?(?:e-?\d+)?(?![\w.]?\d)")
STRIP = [
    re.compile(r"\[\d+[bc]?(?=\]\()"),  # a link whose text is a chapter's number: "chapters [3](...) to [13](...)"
    re.compile(r"\$\$.*?\$\$", re.S),  # display maths
    re.compile(r"\$[^$\n]+\$"),  # inline maths
    re.compile(r"```.*?```", re.S),  # fenced code and directives
    re.compile(r"\{glue:\w+\}`[^`]*`"),  # glued values: they come from the code
    re.compile(r"\{[\w:-]+\}`[^`]*`"),  # other roles ({cite}, {doc}, {math})
    re.compile(r"`[^`\n]*`"),  # code spans
    re.compile(r"\]\([^)]*\)"),  # links' targets
    re.compile(r"<[^>\n]+>"),  # HTML tags
    re.compile(r"^#+ .*$", re.M),  # headings
    re.compile(r"^\([\w-]+\)=$", re.M),  # labels
    REFERENCE,
]


def prose_of(page: Path) -> list[str]:
    """The markdown a reader reads as sentences: one string per cell (the whole file for a .md page)."""
    if page.suffix != ".ipynb":
        texts = [page.read_text()]
    else:
        texts = ["".join(c["source"]) for c in json.loads(page.read_text())["cells"] if c["cell_type"] == "markdown"]
    return [clean(text) for text in texts]


def clean(text: str) -> str:
    """The markdown without what is not prose: maths, code, links' targets, roles, HTML, headings, names."""
    for pattern in STRIP:
        text = pattern.sub(" ", text)
    return text


def outputs_of(page: Path) -> str:
    """Every text a page's code prints or displays, glued values included."""
    if page.suffix != ".ipynb":
        return ""
    parts = []
    for cell in json.loads(page.read_text())["cells"]:
        for out in cell.get("outputs", []):
            parts.append("".join(out.get("text", "")))
            for mime, value in out.get("data", {}).items():
                if mime.endswith(("text/plain", "text/html", "text/markdown", "text/latex")):
                    parts.append(value if isinstance(value, str) else "".join(value))
    return "\n".join(parts)


def _value(number: str) -> Decimal:
    return Decimal(number.replace(",", "").replace("−", "-"))


def stated_by(number: str, outputs: set[Decimal], percent: bool = False) -> bool:
    """The number is an output's value, as printed or rounded to the digits the prose shows (a percentage: or the
    output's fraction times 100)."""
    if percent and stated_by(number, {v * 100 for v in outputs}):
        return True
    value = _value(number)
    plain = number.replace(",", "").lstrip("-−")
    if "." in plain and "e" not in plain:
        quantum = Decimal(1).scaleb(-len(plain.split(".")[1]))
    else:  # 228,000 states its first three digits: an output of 227,952 rounds to it
        quantum = Decimal(1).scaleb(len(plain) - len(plain.rstrip("0")))
    return any(v == value or abs(v).quantize(quantum) == abs(value) for v in outputs)


def output_numbers(text: str) -> set[Decimal]:
    found = set()
    for match in NUMBER.finditer(text):
        try:
            found.add(_value(match.group(0)))
        except ArithmeticError:
            pass
    return found


def digits(number: str) -> int:
    """How many digits a reader reads: 36 and 2.6 have two, 0.5 and 7 one, 8,000 four."""
    return len(number.replace(",", "").lstrip("-−").split("e")[0].replace(".", "").lstrip("0"))


PERCENT = re.compile(r"\s?(?:%|per ?cent)")


def drifted_numbers(prose: list[str], outputs: str) -> list[str]:
    """The numbers of two or more digits, and the percentages, in the prose that no output states and no constant is."""
    values = output_numbers(outputs)
    allowed = {_value(a) for a in ALLOWED}
    drifted = []
    for text in prose:
        text = " ".join(text.split())  # a phrase may break across lines
        for phrase in ALLOWED_PHRASES:
            text = text.replace(phrase, " ")
        for match in NUMBER.finditer(text):
            number = match.group(0)
            plain = number.replace(",", "").lstrip("-−")
            percent = bool(PERCENT.match(text, match.end()))
            if (digits(number) < 2 and not percent) or YEAR.match(plain) or _value(number) in allowed:
                continue
            if digits(number) >= 3 and stated_by(number, allowed):  # about 31,000 pairs: 31,014 rounded
                continue
            if not stated_by(number, values, percent):
                start = max(0, match.start() - 40)
                drifted.append(f"{number!r} in ...{' '.join(text[start:match.end() + 20].split())}...")
    return drifted


@pytest.mark.parametrize("page", PAGES, ids=lambda p: p.name)
def test_prose_numbers_come_from_the_code(page):
    drifted = drifted_numbers(prose_of(page), outputs_of(page))
    assert not drifted, f"{page.name}: numbers in prose that no output states; glue them:\n" + "\n".join(drifted)


def test_a_drifted_number_is_caught():
    outputs = "val BLEU 41.17 after 2,238 steps\n"
    assert drifted_numbers(["the hour reaches 41.17 BLEU in 2,238 steps"], outputs) == []
    assert drifted_numbers(["the hour reaches 41.2 BLEU"], outputs) == []  # rounded from the output
    assert drifted_numbers(["about 2,240 steps"], outputs) == []
    assert drifted_numbers(["a model of d_model 512 and 8,000 tokens, in 2017"], "") == []  # constants and years
    drifted = drifted_numbers(["the hour reaches 40.37 BLEU in 2,283 steps"], outputs)
    assert [d.split(" in ")[0] for d in drifted] == ["'40.37'", "'2,283'"]


def test_a_drift_injected_into_a_real_page_fails(tmp_path):
    """Chapter 13's prose with one number changed, as a run or an edit would change it, no longer passes."""
    page = BOOK / "13_translator.ipynb"
    nb = json.loads(page.read_text())
    cell = next(c for c in nb["cells"] if c["cell_type"] == "markdown" and "{glue:text}`peer_steps" in "".join(c["source"]))
    cell["source"] = "".join(cell["source"]).replace("{glue:text}`peer_steps:,`", "874")  # a typed, drifted step count
    drifted = tmp_path / page.name
    drifted.write_text(json.dumps(nb))
    before = drifted_numbers(prose_of(page), outputs_of(page))
    after = drifted_numbers(prose_of(drifted), outputs_of(drifted))
    assert [d.split(" in ")[0] for d in after if d not in before] == ["'874'"]


def test_maths_code_and_links_are_not_prose(tmp_path):
    page = tmp_path / "page.md"
    page.write_text("# Heading 1234\n\n$x = 12.34$ and `steps=5678` and [a link](https://example.org/v1.2.3/9876)\n"
                    "and {glue:text}`bleu:.2f` BLEU, but 43.71 is typed.\n")
    assert [d.split(" in ")[0] for d in drifted_numbers(prose_of(page), "")] == ["'43.71'"]


def test_two_digit_figures_and_percentages_are_checked():
    """A typed 36 or 83% is caught; a percentage matches its output as a fraction; names and constants pass."""
    outputs = "accuracy 0.803 over 36 heads\n"
    assert drifted_numbers(["80.3% of the pairs, 80% in round figures, over the 36 heads"], outputs) == []
    names = clean("as [chapter 14](14_inside_the_translator.ipynb), chapters 5 and 6 and Sec. 5.4 show, with Eq. 3")
    assert drifted_numbers([names], "") == []
    assert drifted_numbers(["the base model trains 12 hours on 8 GPUs, 8 heads of width 64"], "") == []
    drifted = drifted_numbers(["only 83% of the pairs, 24 of 36 heads, in 12 minutes, 7% faster"], outputs)
    assert [d.split(" in ")[0] for d in drifted] == ["'83'", "'24'", "'12'", "'7'"]
