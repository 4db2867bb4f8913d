"""Decoding (chapter 12): the cache changes nothing but speed; beam search is greedy at K=1, never worse than greedy,
and exhaustive when the beam holds every hypothesis; sampling is reproducible and top-1 sampling is greedy."""
import itertools

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from transformer_lib.decoding import (
    beam_search,
    evaluating,
    greedy_decode,
    length_penalty,
    next_token_log_probs,
    output_budget,
    sample,
    sequence_scores,
)
from transformer_lib.model import Transformer, TransformerConfig

torch.set_num_threads(1)


def random_model(seed: int, vocab_size: int = 30, max_len: int = 40) -> Transformer:
    """A small Transformer with random weights (dropout on, to check that decoding switches it off)."""
    torch.manual_seed(seed)
    config = TransformerConfig(vocab_size=vocab_size, d_model=32, n_heads=4, n_encoder_layers=2,
                               n_decoder_layers=2, d_ff=64, dropout=0.3, max_len=max_len)
    return Transformer(config)


def random_sources(seed: int, batch: int, length: int, vocab_size: int = 30) -> torch.Tensor:
    """Source ids (B, S): random tokens, an <eos>, then padding of random length."""
    g = torch.Generator().manual_seed(seed)
    src = torch.zeros(batch, length, dtype=torch.long)
    for row in src:
        n = int(torch.randint(1, length, (), generator=g))
        row[:n] = torch.randint(4, vocab_size, (n,), generator=g)
        row[n] = 2
    return src


MODELS = [random_model(seed) for seed in range(3)]


@settings(max_examples=30, deadline=None)
@given(st.integers(0, 2), st.integers(0, 10_000), st.integers(1, 6), st.integers(2, 9), st.integers(1, 25))
def test_cache_gives_the_same_tokens(m, seed, batch, length, max_len):
    model, src = MODELS[m], random_sources(seed, batch, length)
    assert greedy_decode(model, src, max_len) == greedy_decode(model, src, max_len, use_cache=False)


def test_cached_step_equals_uncached_step():
    model, src = MODELS[0], random_sources(0, 4, 7)
    with evaluating(model):
        memory, src_mask = model.encode(src)
        cache = model.new_cache()
        ys = torch.full((4, 1), 1)
        for _ in range(10):
            cached = next_token_log_probs(model, ys, memory, src_mask, cache)
            full = next_token_log_probs(model, ys, memory, src_mask)
            torch.testing.assert_close(cached, full, atol=1e-5, rtol=1e-5)
            ys = torch.cat([ys, full.argmax(-1, keepdim=True)], dim=1)


def test_decoding_never_outputs_pad_or_bos_and_restores_training_mode():
    model = MODELS[1]
    model.train()
    src = random_sources(1, 8, 6)
    outputs = greedy_decode(model, src, 20) + beam_search(model, src, 3, max_len=20)
    assert model.training
    assert all(t not in (0, 1, 2) for out in outputs for t in out)


def test_greedy_stops_at_eos_and_respects_the_budget():
    model = random_model(5)
    src = random_sources(5, 3, 6)
    with torch.no_grad():
        model.generator.bias[2] = 1e4  # <eos> always wins
    assert greedy_decode(model, src, 10) == [[], [], []]
    assert beam_search(model, src, 4, max_len=10) == [[], [], []]
    with torch.no_grad():
        model.generator.bias[2] = float("-inf")  # <eos> never wins
    assert [len(y) for y in greedy_decode(model, src, 7)] == [7, 7, 7]
    assert [len(y) for y in beam_search(model, src, 2, max_len=7)] == [7, 7, 7]


def test_output_budget():
    model = random_model(0, max_len=40)
    assert output_budget(model, torch.zeros(2, 12, dtype=torch.long)) == 40  # 12 + 50, capped at max_len
    assert output_budget(model, torch.zeros(2, 5, dtype=torch.long), 9) == 9
    with pytest.raises(ValueError, match="max_len=41"):
        output_budget(model, torch.zeros(2, 5, dtype=torch.long), 41)


@settings(max_examples=25, deadline=None)
@given(st.integers(0, 2), st.integers(0, 10_000), st.integers(1, 5), st.integers(2, 8), st.integers(1, 15))
def test_beam_of_one_is_greedy(m, seed, batch, length, max_len):
    model, src = MODELS[m], random_sources(seed, batch, length)
    greedy = greedy_decode(model, src, max_len)
    assert beam_search(model, src, beam_size=1, max_len=max_len, include_greedy=False) == greedy
    assert beam_search(model, src, beam_size=1, max_len=max_len) == greedy


@settings(max_examples=25, deadline=None)
@given(st.integers(0, 2), st.integers(0, 10_000), st.integers(2, 6), st.sampled_from([0.0, 0.6, 1.0]))
def test_beam_never_scores_below_greedy(m, seed, beam_size, alpha):
    model, src = MODELS[m], random_sources(seed, 6, 7)
    greedy = greedy_decode(model, src, 12)
    beam = beam_search(model, src, beam_size, alpha, max_len=12)
    beam_scores = sequence_scores(model, src, beam, alpha, max_len=12)
    greedy_scores = sequence_scores(model, src, greedy, alpha, max_len=12)
    assert (beam_scores >= greedy_scores - 1e-5).all()


def test_a_beam_holding_every_hypothesis_finds_the_exhaustive_optimum():
    # 6 tokens: <pad> and <bos> are never output, so hypotheses are words over {<unk>, 4, 5} then <eos>,
    # or 3 words without <eos> when the budget runs out: 1 + 3 + 9 + 27 = 40 hypotheses in all.
    torch.manual_seed(0)
    model = Transformer(TransformerConfig(vocab_size=6, d_model=16, n_heads=2, n_encoder_layers=1,
                                          n_decoder_layers=1, d_ff=32, dropout=0.0))
    src = torch.tensor([[4, 5, 4, 2]])
    hyps = [list(h) for n in range(4) for h in itertools.product([3, 4, 5], repeat=n)]
    for alpha in (0.0, 0.6):
        scores = sequence_scores(model, src.expand(len(hyps), -1), hyps, alpha, max_len=3)
        best = hyps[int(scores.argmax())]
        assert beam_search(model, src, beam_size=40, alpha=alpha, max_len=3, include_greedy=False) == [best]


def test_sequence_scores_is_the_length_normalised_log_probability():
    model, src = MODELS[0], random_sources(3, 2, 5)
    hyps = [[7, 8], [9, 10, 11]]
    with torch.no_grad():
        model.eval()
        log_probs = model(src, torch.tensor([[1, 7, 8, 0], [1, 9, 10, 11]]))
    expected = [log_probs[0, [0, 1, 2], [7, 8, 2]].sum() / length_penalty(3, 0.6),
                log_probs[1, [0, 1, 2, 3], [9, 10, 11, 2]].sum() / length_penalty(4, 0.6)]
    torch.testing.assert_close(sequence_scores(model, src, hyps, 0.6, max_len=10), torch.stack(expected))


def test_length_penalty_is_gnmt():
    assert length_penalty(1, 0.6) == 1.0
    assert length_penalty(10, 0.0) == 1.0
    assert abs(length_penalty(7, 1.0) - 2.0) < 1e-12


def test_sampling_is_reproducible_and_top_1_is_greedy():
    model, src = MODELS[2], random_sources(4, 5, 6)
    assert sample(model, src, top_k=1, max_len=15, seed=1) == greedy_decode(model, src, 15)
    assert sample(model, src, max_len=15, seed=3) == sample(model, src, max_len=15, seed=3)
    many = sample(model, src.repeat(20, 1), temperature=2.0, max_len=15, seed=0)
    assert len({tuple(y) for y in many}) > 5  # a flat distribution gives varied outputs
    with pytest.raises(ValueError, match="temperature"):
        sample(model, src, temperature=0.0)
    with pytest.raises(ValueError, match="top_k"):
        sample(model, src, top_k=0)
