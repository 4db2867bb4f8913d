"""transformer_lib.embeddings: the scaled token embedding of chapter 3."""
import math

import pytest
import torch
import torch.nn.functional as F
from hypothesis import given, settings
from hypothesis import strategies as st

from transformer_lib.embeddings import TokenEmbedding
from transformer_lib.model import Transformer, TransformerConfig


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


def test_a_rows_gradient_adds_up_the_uses_of_its_token():
    torch.manual_seed(0)
    embed = TokenEmbedding(10, 6)
    ids = torch.tensor([[4, 0, 0], [0, 7, 0]])  # (B, T): token 0 four times, 4 and 7 once
    embed(ids).sum().backward()
    uses = torch.bincount(ids.flatten(), minlength=10).float()  # (V,)
    torch.testing.assert_close(embed.embedding.weight.grad, uses[:, None].expand(10, 6) * math.sqrt(6))


def tied_model(tie_embeddings: bool = True) -> Transformer:
    torch.manual_seed(0)
    return Transformer(TransformerConfig(vocab_size=20, d_model=8, n_heads=2, n_encoder_layers=1, n_decoder_layers=1,
                                         d_ff=16, dropout=0.0, tie_embeddings=tie_embeddings))


def embeds_generator_rows(model: Transformer) -> bool:
    """Whether source and target embeddings of every token are sqrt(D) times its row of the generator's weight."""
    ids = torch.arange(model.config.vocab_size)[None]  # (1, V)
    rows = model.generator.weight * math.sqrt(model.config.d_model)  # (V, D)
    return all(torch.allclose(embed(ids)[0], rows) for embed in (model.src_embed, model.tgt_embed))


def test_transformer_ties_both_embeddings_to_the_generator():
    """Sec. 3.4: one (V, D) matrix serves the source embedding, the target embedding and the output layer."""
    model, untied = tied_model(), tied_model(tie_embeddings=False)
    assert embeds_generator_rows(model)
    assert not embeds_generator_rows(untied)
    # the generator's scores are dot products with the vectors the embedding looks up (before the sqrt(D) scale)
    h = torch.randn(2, 3, 8)  # (B, T, D)
    looked_up = model.tgt_embed(torch.arange(20)[None])[0] / math.sqrt(8)  # (V, D)
    torch.testing.assert_close(model.generator.logits(h), h @ looked_up.T + model.generator.bias)


@pytest.mark.parametrize("optimizer", [torch.optim.SGD, torch.optim.Adam])
def test_tied_weights_stay_one_matrix_through_training_steps(optimizer):
    """Gradients from all three uses update the one matrix: after optimiser steps the three still agree."""
    model = tied_model()
    before = model.generator.weight.detach().clone()
    opt = optimizer(model.parameters(), lr=0.1)
    src, tgt = torch.tensor([[3, 4, 5, 2]]), torch.tensor([[1, 6, 7]])  # (B, S), (B, T)
    for _ in range(3):
        opt.zero_grad()
        (-model(src, tgt)[0, :, 8].sum()).backward()
        opt.step()
    assert not torch.allclose(model.generator.weight, before)
    assert embeds_generator_rows(model)
    assert len(list(model.parameters())) == len(list(tied_model(tie_embeddings=False).parameters())) - 2


@pytest.mark.parametrize("vocab_size,d_model", [(0, 8), (8, 0)])
def test_rejects_empty_sizes(vocab_size, d_model):
    with pytest.raises(ValueError, match="must be positive"):
        TokenEmbedding(vocab_size, d_model)
