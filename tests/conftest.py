"""Shared test settings and fixtures."""
import json
import os
import re
import sys
from pathlib import Path

import pytest
import torch

# The suite runs as two pytest workers on two cores; one thread each avoids OpenMP threads competing
# for the same core, which makes small tensor operations many times slower.
torch.set_num_threads(1)

# A seed sweep (tools/margins.py --tests): every seed the tests and the library give torch is moved by this offset.
if os.environ.get("MARGINS_SEED_OFFSET"):
    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tools"))
    from margins import move_seeds

    move_seeds(int(os.environ["MARGINS_SEED_OFFSET"]))


@pytest.fixture
def record_margin():
    """record_margin(name, value): a value a test asserts a margin on, written where tools/margins.py reads it
    (only during a sweep; otherwise nothing happens)."""
    def record(name: str, value: float) -> None:
        if os.environ.get("MARGINS_RECORD"):
            with open(os.environ["MARGINS_RECORD"], "a") as f:
                f.write(json.dumps({"name": name, "value": float(value)}) + "\n")

    return record


@pytest.fixture(scope="module")
def small_tokenizer(tmp_path_factory):
    """The path of a 400-token BPE tokenizer trained on 300 Multi30k pairs: quick to train, enough for tiny runs."""
    from transformer_lib.data import load_multi30k
    from transformer_lib.tokenizer import BPETokenizer

    pairs = load_multi30k("train")[:300]
    path = tmp_path_factory.mktemp("tok") / "tokenizer.json"
    BPETokenizer.train([s for pair in pairs for s in pair], vocab_size=400).save(path)
    return path


@pytest.fixture(scope="session")
def small_translator():
    """small_translator(sentences, n_decoder_layers=2): a Translator with random weights (seed 0, D=32, 2 heads, two
    encoder layers) and a 300-token BPE trained on sentences: quick to build, enough to exercise the plumbing."""
    from transformer_lib.model import Transformer, TransformerConfig
    from transformer_lib.tokenizer import BPETokenizer
    from transformer_lib.translate import Translator

    def make(sentences: list[str], n_decoder_layers: int = 2) -> Translator:
        tokenizer = BPETokenizer.train(sentences, 300)
        torch.manual_seed(0)
        model = Transformer(TransformerConfig(vocab_size=tokenizer.vocab_size, d_model=32, n_heads=2,
                                              n_encoder_layers=2, n_decoder_layers=n_decoder_layers, d_ff=64,
                                              max_len=24))
        return Translator(model, tokenizer)

    return make


@pytest.fixture(scope="session")
def book_definition():
    """define(notebook, name, **names): run the code cell of book/notebook that defines `name` (a class or function the
    chapter teaches and the library does not export) in a namespace holding `names`, and return the definition."""

    def define(notebook: str, name: str, **names):
        cells = json.loads((Path(__file__).parents[1] / "book" / notebook).read_text(encoding="utf-8"))["cells"]
        sources = ["".join(cell["source"]) for cell in cells if cell["cell_type"] == "code"]
        namespace = dict(names)
        # a folded cell opens with its Colab title line (tools/colab_forms.py)
        exec(next(s for s in sources if re.match(rf"(?:#@title [^\n]*\n)?(?:#\| export\n)?(class|def) {name}\b", s)),
             namespace)
        return namespace[name]

    return define
