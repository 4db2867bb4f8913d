"""transformer_lib.beyond: rotary embeddings keep norms and see only offsets, the cache and causality hold."""
import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from transformer_lib.attention import KVCache, MultiHeadAttention, causal_mask
from transformer_lib.beyond import (
    BOS_ID,
    COPY_VOCAB,
    N_DIGITS,
    SEP_ID,
    DecoderOnlyConfig,
    DecoderOnlyLayer,
    DecoderOnlyLM,
    RotaryEmbedding,
    RotaryMultiHeadAttention,
    copy_config,
    copy_loss,
    copy_sequences,
    train_copy,
)

FAST = settings(max_examples=20, deadline=None)
D, H, V = 32, 4, 40


def reference_rotation(x: torch.Tensor, positions: list[int], base: float = 10000.0) -> torch.Tensor:
    """Rotate row x[t] (T, Dh) by 2x2 block rotations of angles positions[t] * theta_i, in float64."""
    d = x.size(-1)
    rows = []
    for t, p in enumerate(positions):
        blocks = []
        for i in range(d // 2):
            angle = p * base ** (-2 * i / d)
            c, s = math.cos(angle), math.sin(angle)
            blocks.append(torch.tensor([[c, -s], [s, c]], dtype=torch.float64))
        rows.append(torch.block_diag(*blocks) @ x[t].double())
    return torch.stack(rows)


def small_lm(rotary: bool = True, norm_first: bool = True, seed: int = 0, max_len: int = 32) -> DecoderOnlyLM:
    torch.manual_seed(seed)
    config = DecoderOnlyConfig(vocab_size=V, d_model=D, n_heads=H, n_layers=2, d_ff=64, dropout=0.0,
                               max_len=max_len, rotary=rotary, norm_first=norm_first)
    return DecoderOnlyLM(config).eval()


# --- RotaryEmbedding ---------------------------------------------------------------------------------


@pytest.mark.parametrize("offset", [0, 5])
def test_rotary_equals_explicit_rotation_matrices(offset):
    x = torch.randn(6, 8, generator=torch.Generator().manual_seed(0))  # (T, Dh)
    ours = RotaryEmbedding(8, max_len=16)(x, offset)
    expected = reference_rotation(x, list(range(offset, offset + 6))).float()
    torch.testing.assert_close(ours, expected, atol=1e-6, rtol=0)


@given(T=st.integers(1, 20), half=st.integers(1, 16), offset=st.integers(0, 40), seed=st.integers(0, 1000))
@FAST
def test_rotary_preserves_norms(T, half, offset, seed):
    x = torch.randn(2, 3, T, 2 * half, generator=torch.Generator().manual_seed(seed))  # (B, H, T, Dh)
    y = RotaryEmbedding(2 * half, max_len=64)(x, offset)
    assert y.shape == x.shape
    torch.testing.assert_close(y.norm(dim=-1), x.norm(dim=-1), atol=1e-4, rtol=1e-5)


@given(p=st.integers(0, 60), s=st.integers(0, 60), shift=st.integers(0, 60), seed=st.integers(0, 1000))
@FAST
def test_rotated_scores_depend_only_on_the_offset(p, s, shift, seed):
    g = torch.Generator().manual_seed(seed)
    q, k = torch.randn(1, 16, generator=g), torch.randn(1, 16, generator=g)  # (1, Dh)
    rope = RotaryEmbedding(16, max_len=128)
    here = (rope(q, p) * rope(k, s)).sum()
    there = (rope(q, p + shift) * rope(k, s + shift)).sum()
    torch.testing.assert_close(here, there, atol=1e-4, rtol=1e-4)


def test_rotary_offset_is_the_slice_of_a_longer_pass():
    x = torch.randn(1, 2, 12, 8)  # (B, H, T, Dh)
    rope = RotaryEmbedding(8, max_len=12)
    torch.testing.assert_close(rope(x[:, :, 7:], offset=7), rope(x)[:, :, 7:])


def test_rotary_position_zero_is_the_identity_and_no_parameters():
    rope = RotaryEmbedding(8)
    x = torch.randn(1, 8)
    torch.testing.assert_close(rope(x), x)
    assert sum(p.numel() for p in rope.parameters()) == 0
    assert "cos" not in rope.state_dict()  # tables are rebuilt, not saved


def test_rotary_errors_are_clear():
    with pytest.raises(ValueError, match="even"):
        RotaryEmbedding(7)
    rope = RotaryEmbedding(8, max_len=10)
    with pytest.raises(ValueError, match="max_len=10"):
        rope(torch.randn(11, 8))
    with pytest.raises(ValueError, match="max_len=10"):
        rope(torch.randn(4, 8), offset=7)
    with pytest.raises(ValueError, match="offset"):
        rope(torch.randn(4, 8), offset=-1)
    with pytest.raises(ValueError, match="head width"):
        rope(torch.randn(4, 6))


# --- RotaryMultiHeadAttention ------------------------------------------------------------------------


@given(chunks=st.lists(st.integers(1, 4), min_size=1, max_size=4), seed=st.integers(0, 1000),
       use_sdpa=st.booleans())
@FAST
def test_rotary_attention_with_cache_equals_full_causal_pass(chunks, seed, use_sdpa):
    torch.manual_seed(seed)
    attn = RotaryMultiHeadAttention(D, H, use_sdpa=use_sdpa, max_len=32).eval()
    T = sum(chunks)
    x = torch.randn(2, T, D)  # (B, T, D)
    with torch.no_grad():
        full, _ = attn(x, x, causal_mask(T))
        cache, outs, start = KVCache(), [], 0
        for n in chunks:
            piece = x[:, start : start + n]
            mask = None if n == 1 else causal_mask(n, offset=start)
            outs.append(attn(piece, piece, mask, cache)[0])
            start += n
    torch.testing.assert_close(torch.cat(outs, dim=1), full, atol=1e-5, rtol=1e-5)
    assert len(cache) == T


@given(T=st.integers(1, 8), shift=st.integers(1, 20), seed=st.integers(0, 1000), use_sdpa=st.booleans())
@FAST
def test_rotary_attention_sees_only_relative_positions(T, shift, seed, use_sdpa):
    """The same tokens at positions shift.. (after `shift` cached ones, masked out) give the same outputs as at 0.."""
    torch.manual_seed(seed)
    attn = RotaryMultiHeadAttention(D, H, use_sdpa=use_sdpa, max_len=32).eval()
    x, filler = torch.randn(2, T, D), torch.randn(2, shift, D)  # (B, T, D), (B, shift, D)
    with torch.no_grad():
        at_start, _ = attn(x, x, causal_mask(T))
        cache = KVCache()
        attn(filler, filler, causal_mask(shift), cache)
        mask = causal_mask(T, offset=shift).clone()  # (1, 1, T, shift + T)
        mask[..., :shift] = False  # the filler is cached, so it shifts the positions, but is not attended to
        shifted, _ = attn(x, x, mask, cache)
    torch.testing.assert_close(shifted, at_start, atol=1e-5, rtol=1e-5)


def test_rotary_attention_is_not_permutation_equivariant_but_plain_attention_is():
    torch.manual_seed(0)
    rotary = RotaryMultiHeadAttention(D, H).eval()
    plain = MultiHeadAttention(D, H).eval()
    plain.load_state_dict(rotary.state_dict())
    x = torch.randn(1, 6, D)
    perm = torch.tensor([3, 0, 5, 1, 4, 2])
    with torch.no_grad():
        torch.testing.assert_close(plain(x[:, perm], x[:, perm])[0], plain(x, x)[0][:, perm])
        assert not torch.allclose(rotary(x[:, perm], x[:, perm])[0], rotary(x, x)[0][:, perm], atol=1e-4)


def test_rotary_attention_fast_and_explicit_paths_agree():
    torch.manual_seed(0)
    attn = RotaryMultiHeadAttention(D, H).eval()
    x = torch.randn(2, 7, D)
    with torch.no_grad():
        fast, none = attn(x, x, causal_mask(7))
        explicit, weights = attn(x, x, causal_mask(7), need_weights=True)
    assert none is None and weights.shape == (2, H, 7, 7)
    torch.testing.assert_close(fast, explicit, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(weights.sum(-1), torch.ones(2, H, 7))


def test_rotary_attention_errors_are_clear():
    with pytest.raises(ValueError, match="even head width"):
        RotaryMultiHeadAttention(12, 4)  # Dh = 3
    attn = RotaryMultiHeadAttention(D, H, max_len=8)
    x = torch.randn(1, 5, D)
    with pytest.raises(ValueError, match="self-attention"):
        attn(x, torch.randn(1, 6, D))
    with pytest.raises(ValueError, match="static"):
        attn(x, x, cache=KVCache(static=True))
    with pytest.raises(ValueError, match="boolean"):
        attn(x, x, causal_mask(5).float())
    with pytest.raises(ValueError, match="max_len=8"):
        long = torch.randn(1, 9, D)
        attn(long, long)


# --- DecoderOnlyLM -----------------------------------------------------------------------------------


@pytest.mark.parametrize("rotary", [True, False])
@pytest.mark.parametrize("norm_first", [True, False])
def test_lm_shapes_and_log_probabilities(rotary, norm_first):
    lm = small_lm(rotary, norm_first)
    ids = torch.randint(0, V, (3, 9))
    with torch.no_grad():
        out = lm(ids)
    assert out.shape == (3, 9, V)
    torch.testing.assert_close(out.exp().sum(-1), torch.ones(3, 9))


def test_lm_ties_the_generator_to_the_embedding_and_uses_the_same_blocks():
    lm = small_lm()
    assert lm.generator.weight is lm.embed.embedding.weight
    assert all(isinstance(layer, DecoderOnlyLayer) for layer in lm.layers)
    assert all(isinstance(layer.self_attn, RotaryMultiHeadAttention) for layer in lm.layers)
    assert lm.positional is None
    assert type(small_lm(rotary=False).layers[0].self_attn) is MultiHeadAttention


@given(T=st.integers(2, 12), cut=st.data(), seed=st.integers(0, 1000), rotary=st.booleans())
@FAST
def test_lm_future_tokens_never_change_past_outputs(T, cut, seed, rotary):
    lm = small_lm(rotary, seed=seed % 3)
    t = cut.draw(st.integers(1, T - 1))
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(0, V, (2, T), generator=g)
    other = ids.clone()
    other[:, t:] = torch.randint(0, V, (2, T - t), generator=g)
    with torch.no_grad():
        torch.testing.assert_close(lm(ids)[:, :t], lm(other)[:, :t], atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("rotary", [True, False])
def test_lm_right_padding_never_changes_real_positions(rotary):
    lm = small_lm(rotary)
    ids = torch.randint(3, V, (2, 6))
    padded = torch.cat([ids, torch.zeros(2, 4, dtype=torch.long)], dim=1)  # pad id 0 on the right
    with torch.no_grad():
        torch.testing.assert_close(lm(padded)[:, :6], lm(ids), atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("rotary", [True, False])
def test_lm_cache_step_by_step_equals_full_pass(rotary):
    lm = small_lm(rotary)
    ids = torch.randint(0, V, (2, 10))
    with torch.no_grad():
        full = lm(ids)
        cache = lm.new_cache()
        parts = [lm(ids[:, :4], cache)] + [lm(ids[:, t : t + 1], cache) for t in range(4, 10)]
    torch.testing.assert_close(torch.cat(parts, dim=1), full, atol=1e-5, rtol=1e-5)
    assert all(len(c) == 10 for c in cache)


def test_lm_generate_is_greedy_and_equal_with_and_without_cache():
    lm = small_lm()
    prompt = torch.randint(0, V, (3, 4))
    out = lm.generate(prompt, 6)
    assert out.shape == (3, 10) and torch.equal(out[:, :4], prompt)
    assert torch.equal(out, lm.generate(prompt, 6, use_cache=False))
    with torch.no_grad():
        for t in range(4, 10):  # each new token is the argmax of a full pass over what came before
            assert torch.equal(out[:, t], lm(out[:, :t])[:, -1].argmax(-1))


def test_lm_generate_restores_training_mode():
    lm = small_lm().train()
    lm.generate(torch.randint(0, V, (1, 3)), 2)
    assert lm.training


def test_lm_errors_are_clear():
    lm = small_lm(max_len=8)
    with pytest.raises(ValueError, match="max_len=8"):
        lm(torch.randint(0, V, (1, 9)))
    with pytest.raises(ValueError, match="max_len=8"):
        lm.generate(torch.randint(0, V, (1, 5)), 4)
    cache = lm.new_cache()
    lm(torch.randint(0, V, (1, 6)), cache)
    with pytest.raises(ValueError, match="max_len=8"):
        lm(torch.randint(0, V, (1, 3)), cache)
    with pytest.raises(ValueError, match="new_cache"):
        lm(torch.randint(0, V, (1, 3)), [KVCache()])
    with pytest.raises(ValueError, match="even head width"):
        DecoderOnlyConfig(vocab_size=V, d_model=12, n_heads=4)
    with pytest.raises(ValueError, match="divisible"):
        DecoderOnlyConfig(vocab_size=V, d_model=30, n_heads=4)
    with pytest.raises(ValueError, match="positive integer"):
        DecoderOnlyConfig(vocab_size=0)
    with pytest.raises(ValueError, match="dropout"):
        DecoderOnlyConfig(vocab_size=V, dropout=1.0)
    DecoderOnlyConfig(vocab_size=V, d_model=12, n_heads=4, rotary=False)  # an odd head width is fine here


def test_lm_learns_to_copy_a_fixed_offset(record_margin):
    """60 Adam steps on '<bos> a b | a b': the loss on the copied digits must fall well below chance."""
    torch.manual_seed(0)
    config = DecoderOnlyConfig(vocab_size=13, d_model=32, n_heads=4, n_layers=1, d_ff=64, dropout=0.0,
                               max_len=8)
    lm = DecoderOnlyLM(config).train()
    optimizer = torch.optim.Adam(lm.parameters(), lr=1e-2)
    g = torch.Generator().manual_seed(1)
    for _ in range(60):
        digits = torch.randint(3, 13, (64, 2), generator=g)
        ids = torch.cat([torch.ones(64, 1, dtype=torch.long), digits, torch.full((64, 1), 2), digits], dim=1)
        log_probs = lm(ids[:, :-1])
        loss = -log_probs[:, 3:].gather(-1, ids[:, 4:, None]).mean()  # the two copied digits
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    record_margin("copy LM: loss on the copied digits", loss.item())
    assert loss.item() < 0.5 * math.log(10)


# --- The copy task -----------------------------------------------------------------------------------


def test_copy_sequences_repeat_the_digits_after_the_separator():
    ids = copy_sequences(50, torch.Generator().manual_seed(0))
    assert ids.shape == (50, 2 * N_DIGITS + 2)
    assert (ids[:, 0] == BOS_ID).all() and (ids[:, N_DIGITS + 1] == SEP_ID).all()
    digits = ids[:, 1 : N_DIGITS + 1]
    assert torch.equal(ids[:, N_DIGITS + 2 :], digits)
    assert all(COPY_VOCAB[i] in "0123456789" for i in digits.flatten().tolist())
    assert torch.equal(ids, copy_sequences(50, torch.Generator().manual_seed(0)))


def test_copy_loss_scores_only_the_copied_digits():
    torch.manual_seed(0)
    lm = DecoderOnlyLM(copy_config(n_layers=1)).eval()
    ids = copy_sequences(4, torch.Generator().manual_seed(1))
    with torch.no_grad():
        log_probs = lm(ids[:, :-1])  # (B, T, V)
        expected = -log_probs[:, N_DIGITS + 1 :].gather(-1, ids[:, N_DIGITS + 2 :, None]).mean()
        torch.testing.assert_close(copy_loss(lm, ids), expected)


def test_copy_config_takes_changes_and_train_copy_is_seeded():
    assert copy_config().n_layers == 2 and copy_config(n_layers=3, rotary=False).n_layers == 3
    assert copy_config().vocab_size == len(COPY_VOCAB)
    first, losses = train_copy(copy_config(n_layers=1), steps=3, lr=1e-3)
    again, losses_again = train_copy(copy_config(n_layers=1), steps=3, lr=1e-3)
    assert not first.training and len(losses) == 3 and losses == losses_again
    assert all(torch.equal(a, b) for a, b in zip(first.parameters(), again.parameters()))
