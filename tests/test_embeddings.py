"""transformer_lib.embeddings: the scaled token embedding of chapter 3."""
import math

import pytest
import torch
import torch.nn.functional as F
from hypothesis import given, settings
from hypothesis import strategies as st
from torch import nn

from transformer_lib.embeddings import TokenEmbedding


@settings(max_examples=50, deadline=None)
@given(
    vocab_size=st.integers(1, 50),
    d_model=st.integers(1, 32),
    shape=st.tuples(st.integers(1, 4), st.integers(1, 6)),
    seed=st.integers(0, 2**16),
)
def test_equals_one_hot_times_weight_times_sqrt_d(vocab_size, d_model, shape, seed):
    torch.manual_seed(seed)
    embed = TokenEmbedding(vocab_size, d_model)
    ids = torch.randint(vocab_size, shape)  # (B, T)
    expected = F.one_hot(ids, vocab_size).float() @ embed.embedding.weight * math.sqrt(d_model)  # (B, T, D)
    out = embed(ids)
    assert out.shape == (*shape, d_model)
    torch.testing.assert_close(out, expected)


def test_padding_row_is_zero_and_gets_no_gradient():
    torch.manual_seed(0)
    embed = TokenEmbedding(10, 6, padding_idx=0)
    assert torch.equal(embed.embedding.weight[0], torch.zeros(6))
    ids = torch.tensor([[4, 0, 0], [0, 7, 0]])  # (B, T), mostly padding
    (embed(ids) ** 2).sum().backward()
    grad = embed.embedding.weight.grad  # (V, D)
    assert torch.equal(grad[0], torch.zeros(6))
    assert grad[4].abs().sum() > 0 and grad[7].abs().sum() > 0
    assert torch.equal(grad[1], torch.zeros(6))  # unused tokens get nothing either
    assert torch.equal(embed(torch.tensor([[0]])), torch.zeros(1, 1, 6))


def test_weight_can_be_tied_to_a_generator():
    src, tgt, generator = TokenEmbedding(100, 16), TokenEmbedding(100, 16), nn.Linear(16, 100)
    tgt.embedding.weight = src.embedding.weight
    generator.weight = src.embedding.weight
    assert generator.weight is src.embedding.weight is tgt.embedding.weight
    shared = sum(p.numel() for p in nn.ModuleList([src, tgt, generator]).parameters())
    assert shared == 100 * 16 + 100  # one (V, D) matrix plus the generator's bias


@pytest.mark.parametrize("vocab_size,d_model", [(0, 8), (8, 0)])
def test_rejects_empty_sizes(vocab_size, d_model):
    with pytest.raises(ValueError, match="must be positive"):
        TokenEmbedding(vocab_size, d_model)
