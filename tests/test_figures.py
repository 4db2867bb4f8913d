"""The book's diagrams are drawn by tools/architecture.py: the committed SVGs must be what the code draws now."""
import json
import re
import sys
from pathlib import Path

import matplotlib.pyplot as plt
import pytest

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tools"))
import architecture  # noqa: E402

BOOK = ROOT / "book"
PAGES = sorted(BOOK.glob("*.ipynb")) + sorted(BOOK.glob("*.md"))
# Markdown images, ![alt](figures/x.svg), and MyST directives, ```{figure} figures/x.svg or :::{image} ...
FIGURE_REF = re.compile(r"!\[[^\]]*\]\((figures/[^)\s]+)\)|\{(?:figure|image)\}\s+(figures/\S+)")


def test_committed_figures_equal_a_fresh_drawing(tmp_path):
    fresh = architecture.write_figures(tmp_path)
    committed = sorted(p.name for p in architecture.FIGURES.glob("*.svg"))
    assert committed == sorted(p.name for p in fresh), "book/figures/ and tools/architecture.py name other figures"
    stale = [p.name for p in fresh if p.read_bytes() != (architecture.FIGURES / p.name).read_bytes()]
    assert not stale, f"run `python tools/architecture.py`: these figures differ from what the code draws: {stale}"


def test_drawing_is_byte_identical_each_run(tmp_path):
    first = architecture.write_figures(tmp_path / "a")
    second = architecture.write_figures(tmp_path / "b")
    assert [p.read_bytes() for p in first] == [p.read_bytes() for p in second]


@pytest.mark.parametrize("name", list(architecture.FIGURE_BUILDERS))
def test_no_two_labels_overlap(name):
    with plt.rc_context(architecture.RC):
        fig = architecture.FIGURE_BUILDERS[name]()
        overlaps = architecture.text_overlaps(fig)
        plt.close(fig)
    assert not overlaps, f"{name}: labels overlap: {overlaps}"


def markdown_of(page: Path) -> str:
    """The text a reader sees: a notebook's markdown cells, or a Markdown page."""
    if page.suffix != ".ipynb":
        return page.read_text()
    cells = json.loads(page.read_text())["cells"]
    return "\n".join("".join(c["source"]) for c in cells if c["cell_type"] == "markdown")


def test_every_referenced_figure_exists():
    referenced = {}
    for page in PAGES:
        for match in FIGURE_REF.finditer(markdown_of(page)):
            referenced.setdefault(match.group(1) or match.group(2), page.name)
    missing = {ref: page for ref, page in referenced.items() if not (BOOK / ref).is_file()}
    assert referenced, "no page shows a figure from book/figures/"
    assert not missing, f"pages refer to figures that do not exist: {missing}"


def test_the_labels_name_real_classes():
    """Every class a box is labelled with is a class of transformer_lib."""
    import transformer_lib.embeddings
    import transformer_lib.layers
    import transformer_lib.model
    import transformer_lib.positional
    import transformer_lib.attention

    modules = [transformer_lib.embeddings, transformer_lib.positional, transformer_lib.attention,
               transformer_lib.layers, transformer_lib.model]
    names = ["TokenEmbedding", "SinusoidalPositionalEncoding", "MultiHeadAttention", "SublayerConnection",
             "PositionwiseFeedForward", "EncoderLayer", "Encoder", "DecoderLayer", "Decoder", "Generator",
             "Transformer", "TransformerConfig", "KVCache", "LayerCache"]
    source = Path(architecture.__file__).read_text()
    for name in names:
        assert name in source, f"{name} is not drawn"
        assert any(isinstance(getattr(m, name, None), type) for m in modules), f"{name} is not in transformer_lib"
