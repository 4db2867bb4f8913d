"""Shared test settings and fixtures."""
import pytest
import torch

# The suite runs as two pytest workers on two cores; one thread each avoids OpenMP threads competing
# for the same core, which makes small tensor operations many times slower.
torch.set_num_threads(1)


@pytest.fixture(scope="module")
def small_tokenizer(tmp_path_factory):
    """The path of a 400-token BPE tokenizer trained on 300 Multi30k pairs: quick to train, enough for tiny runs."""
    from transformer_lib.data import load_multi30k
    from transformer_lib.tokenizer import BPETokenizer

    pairs = load_multi30k("train")[:300]
    path = tmp_path_factory.mktemp("tok") / "tokenizer.json"
    BPETokenizer.train([s for pair in pairs for s in pair], vocab_size=400).save(path)
    return path
