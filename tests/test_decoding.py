"""Decoding (chapter 12): the cache changes nothing but speed; beam search's shared memory cache equals a copy per
beam; beam search is greedy at K=1, makes the choices of a plainly written beam search (ours and the book's), and is
exhaustive when the beam holds every hypothesis; include_greedy adds greedy's hypothesis; sampling is reproducible and
top-1 sampling is greedy."""
import copy
import functools
import itertools

import pytest
import torch
from hypothesis import assume, example, given, settings
from hypothesis import strategies as st

from transformer_lib.attention import KVCache, MultiHeadAttention, padding_mask
from transformer_lib.decoding import (
    BeamMemoryCache,
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
ATOL = 1e-5


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
    assert output_budget(random_model(0, max_len=100), torch.zeros(2, 12, dtype=torch.long)) == 62  # 12 + 50
    assert output_budget(model, torch.zeros(2, 5, dtype=torch.long), 9) == 9
    with pytest.raises(ValueError, match="max_len=41"):
        output_budget(model, torch.zeros(2, 5, dtype=torch.long), 41)


@settings(max_examples=20, deadline=None)
@given(group=st.integers(1, 4), n_groups=st.integers(0, 3), extra=st.lists(st.integers(0, 3), max_size=4),
       T=st.integers(1, 3), seed=st.integers(0, 2**16))
@pytest.mark.parametrize("use_sdpa, need_weights", [(True, False), (True, True), (False, False)])
def test_the_beam_memory_cache_equals_a_copy_per_query_row(use_sdpa, need_weights, group, n_groups, extra, T, seed):
    torch.manual_seed(seed)
    mha = MultiHeadAttention(16, 4, use_sdpa=use_sdpa).eval()
    B = 4  # cached rows (sentences); the groups read the first n_groups, `extra` may name any of them
    memory = torch.randn(B, 6, 16)  # (B, S, D)
    ids = torch.tensor([[5] * n + [0] * (6 - n) for n in (6, 3, 1, 5)])  # (B, S): right-padded
    memory_mask = padding_mask(ids)  # (B, 1, 1, S)
    shared, copies = BeamMemoryCache(), KVCache(static=True)
    mha(memory[:, :1], memory, memory_mask, cache=shared)
    mha(memory[:, :1], memory, memory_mask, cache=copies)
    assert shared.share(group, n_groups, torch.tensor(extra, dtype=torch.long)) is shared
    rows = shared.query_rows()  # (R,)
    assert rows.tolist() == [a for a in range(n_groups) for _ in range(group)] + extra
    y = torch.randn(rows.numel(), T, 16)  # (R, T, D)
    out, weights = mha(y, torch.zeros_like(memory), memory_mask, cache=shared, need_weights=need_weights)
    copies.reorder(rows)
    expected, expected_weights = mha(y, memory[rows], memory_mask[rows], cache=copies, need_weights=need_weights)
    assert out.shape == (rows.numel(), T, 16)
    torch.testing.assert_close(out, expected, atol=ATOL, rtol=0)
    assert (weights is None) == (expected_weights is None)
    if weights is not None:
        torch.testing.assert_close(weights, expected_weights, atol=ATOL, rtol=0)


def test_the_beam_memory_cache_checks_its_rows():
    torch.manual_seed(0)
    mha = MultiHeadAttention(8, 2).eval()
    with pytest.raises(ValueError, match="at least 1"):
        BeamMemoryCache().share(0)
    cache = BeamMemoryCache()
    assert cache.static
    memory = torch.randn(2, 5, 8)  # (B, S, D)
    mha(memory[:, :1], memory, cache=cache)
    cache.share(3)  # every cached row read by 3 query rows: 6 of them
    assert cache.query_rows().tolist() == [0, 0, 0, 1, 1, 1]
    assert mha(torch.randn(6, 1, 8), memory, cache=cache)[0].shape == (6, 1, 8)
    with pytest.raises(ValueError, match="serves 6 query rows, got 4"):
        mha(torch.randn(4, 1, 8), memory, cache=cache)


@settings(max_examples=25, deadline=None)
@given(st.integers(0, 2), st.integers(0, 10_000), st.integers(1, 5), st.integers(2, 8), st.integers(1, 15))
def test_beam_of_one_is_greedy(m, seed, batch, length, max_len):
    model, src = MODELS[m], random_sources(seed, batch, length)
    greedy = greedy_decode(model, src, max_len)
    assert beam_search(model, src, beam_size=1, max_len=max_len, include_greedy=False) == greedy
    assert beam_search(model, src, beam_size=1, max_len=max_len) == greedy


def plain_beam_search(model: Transformer, src: torch.Tensor, beam_size: int, alpha: float, steps: int) -> list[int]:
    """Beam search for one sentence src (1, S), written plainly: lists of hypotheses, every prefix run in full.

    Each step ranks all extensions of the open beams; of the best K, those ending in <eos> are finished (until K
    are), and the best K not ending in <eos> among the best 2K stay open. Open beams left at the end count as
    finished without <eos>. The best finished hypothesis by log p / lp wins.
    """
    cfg, K = model.config, beam_size
    beams, finished = [(0.0, [])], []  # (log p, tokens)
    was_training = model.training
    model.eval()
    try:
        with torch.no_grad():
            for t in range(1, steps + 1):
                prefixes = torch.tensor([[cfg.bos_id, *tokens] for _, tokens in beams])  # (n, t)
                log_probs = model(src.expand(len(beams), -1), prefixes)[:, -1].double()  # (n, V)
                log_probs[:, [cfg.pad_id, cfg.bos_id]] = float("-inf")
                extensions = [(score + log_probs[i, v].item(), tokens, v) for i, (score, tokens) in enumerate(beams)
                              for v in range(cfg.vocab_size) if log_probs[i, v] > float("-inf")]
                candidates = sorted(extensions, key=lambda c: -c[0])[: 2 * K + 1]  # (log p, prefix, next token)
                gaps = [a[0] - b[0] for a, b in zip(candidates, candidates[1:])]
                assume(min(gaps) > 1e-4)  # a near tie could fall either way between two correct implementations
                for score, tokens, v in candidates[:K]:
                    if v == cfg.eos_id and len(finished) < K:
                        finished.append((score / length_penalty(t, alpha), tokens))
                beams = [(score, tokens + [v]) for score, tokens, v in candidates[: 2 * K] if v != cfg.eos_id][:K]
                if len(finished) == K:
                    break
    finally:
        model.train(was_training)
    if len(finished) < K:
        finished += [(score / length_penalty(steps, alpha), tokens) for score, tokens in beams]
    return max(finished, key=lambda scored: scored[0])[1]


@functools.cache
def eos_model(m: int, eos_bias: float) -> Transformer:
    """MODELS[m] with <eos> made likelier, so that hypotheses finish at every step and compete with open ones."""
    model = copy.deepcopy(MODELS[m])
    with torch.no_grad():
        model.generator.bias[2] += eos_bias
    return model


@settings(max_examples=40, deadline=None, derandomize=True)
@given(st.integers(0, 2), st.sampled_from([0.0, 2.0, 3.0, 4.0, 5.0]), st.integers(0, 10_000), st.integers(1, 3),
       st.integers(2, 5), st.sampled_from([0.0, 0.6, 1.0]), st.integers(1, 10))
def test_beam_search_equals_a_plain_beam_search(m, eos_bias, seed, batch, beam_size, alpha, max_len):
    """The batched, cached beam search (without the greedy hypothesis) makes the choices of the plain one."""
    model, src = eos_model(m, eos_bias), random_sources(seed, batch, 6)
    expected = [plain_beam_search(model, src[b : b + 1], beam_size, alpha, max_len) for b in range(batch)]
    assert beam_search(model, src, beam_size, alpha, max_len=max_len, include_greedy=False) == expected


@settings(max_examples=30, deadline=None, derandomize=True)
@given(st.integers(0, 2), st.sampled_from([0.0, 3.0, 5.0]), st.integers(0, 10_000), st.integers(1, 3),
       st.integers(2, 5), st.sampled_from([0.0, 0.6, 1.0]), st.integers(1, 10))
def test_the_books_simple_beam_search_equals_beam_search(book_definition, m, eos_bias, seed, batch, beam_size, alpha,
                                                         max_len):
    """Chapter 12's one-sentence beam search, checked on the examples without near ties, gives beam_search's
    hypotheses (without the greedy hypothesis, which it does not have)."""
    simple_beam_search = book_definition("12_decoding.ipynb", "simple_beam_search", torch=torch, Tensor=torch.Tensor,
                                         Transformer=Transformer, evaluating=evaluating, length_penalty=length_penalty,
                                         next_token_log_probs=next_token_log_probs, output_budget=output_budget)
    model, src = eos_model(m, eos_bias), random_sources(seed, batch, 6)
    expected = [plain_beam_search(model, src[b : b + 1], beam_size, alpha, max_len) for b in range(batch)]
    simple = [simple_beam_search(model, src[b : b + 1], beam_size, alpha, max_len) for b in range(batch)]
    assert simple == expected == beam_search(model, src, beam_size, alpha, max_len=max_len, include_greedy=False)


@settings(max_examples=30, deadline=None, derandomize=True)
@given(st.integers(0, 2), st.sampled_from([0.0, 3.0, 5.0]), st.integers(0, 10_000), st.integers(1, 4),
       st.integers(1, 5), st.sampled_from([0.0, 0.6, 1.0]), st.integers(1, 10))
def test_the_books_batched_beam_search_equals_beam_search(book_definition, m, eos_bias, seed, batch, beam_size, alpha,
                                                          max_len):
    """The fast decoding page's plain batched search (a copy of the memory per beam, no greedy hypothesis) returns
    the library's beam_search hypotheses without the greedy hypothesis; with a beam of one, greedy decoding's."""
    batched_beam_search = book_definition("12b_fast_decoding.ipynb", "batched_beam_search", torch=torch,
                                          Tensor=torch.Tensor, Transformer=Transformer, evaluating=evaluating,
                                          length_penalty=length_penalty, next_token_log_probs=next_token_log_probs,
                                          output_budget=output_budget)
    model, src = eos_model(m, eos_bias), random_sources(seed, batch, 6)
    batched = batched_beam_search(model, src, beam_size, alpha, max_len)
    assert batched == beam_search(model, src, beam_size, alpha, max_len=max_len, include_greedy=False)
    if beam_size == 1:
        assert batched == greedy_decode(model, src, max_len)


@settings(max_examples=25, deadline=None, derandomize=True)
@given(st.integers(0, 2), st.sampled_from([0.0, 3.0]), st.integers(0, 10_000), st.integers(2, 6), st.integers(1, 15))
def test_a_sentence_that_finishes_leaves_the_others_unchanged(m, eos_bias, seed, batch, max_len):
    """Finished sentences leave the batch: each sentence decodes as it would alone."""
    model, src = eos_model(m, eos_bias), random_sources(seed, batch, 6)
    assert greedy_decode(model, src, max_len) == [greedy_decode(model, src[b : b + 1], max_len)[0]
                                                  for b in range(batch)]
    assert beam_search(model, src, 3, max_len=max_len) == [beam_search(model, src[b : b + 1], 3, max_len=max_len)[0]
                                                           for b in range(batch)]


def test_include_greedy_returns_the_better_of_beam_and_greedy():
    """Beam search alone can end below greedy decoding; include_greedy=True then returns greedy's hypothesis."""
    alpha, lost = 0.6, 0
    for seed, model in itertools.product(range(100), MODELS):
        src = random_sources(seed, 6, 7)
        greedy = greedy_decode(model, src, 12)
        beam_only = beam_search(model, src, 2, alpha, max_len=12, include_greedy=False)
        with_greedy = beam_search(model, src, 2, alpha, max_len=12)
        greedy_scores = sequence_scores(model, src, greedy, alpha, max_len=12).tolist()
        beam_scores = sequence_scores(model, src, beam_only, alpha, max_len=12).tolist()
        for b, (g, k) in enumerate(zip(greedy_scores, beam_scores)):
            better = [greedy[b]] if g > k + 1e-5 else [beam_only[b]] if k > g + 1e-5 else [greedy[b], beam_only[b]]
            assert with_greedy[b] in better
            lost += g > k + 1e-2
        if lost:
            return
    pytest.fail("no sentence found on which beam search alone ends below greedy decoding")


def tiny_model(seed: int) -> Transformer:
    """6 tokens: <pad> and <bos> are never output, so hypotheses are words over {<unk>, 4, 5}, then <eos>."""
    torch.manual_seed(seed)
    return Transformer(TransformerConfig(vocab_size=6, d_model=16, n_heads=2, n_encoder_layers=1, n_decoder_layers=1,
                                         d_ff=32, dropout=0.0))


@settings(max_examples=15, deadline=None, derandomize=True)
@given(st.integers(0, 10_000), st.integers(1, 3), st.sampled_from([0.0, 0.6, 1.0]),
       st.lists(st.lists(st.integers(3, 5), min_size=1, max_size=4), min_size=1, max_size=3))
def test_a_beam_holding_every_hypothesis_finds_the_exhaustive_optimum(seed, max_len, alpha, sentences):
    # words shorter than max_len end in <eos>; at max_len the budget runs out: 1 + 3 + .. + 3^max_len hypotheses,
    # and a beam of that many never has to drop one
    model = tiny_model(seed)
    src = torch.zeros(len(sentences), 5, dtype=torch.long)  # (B, S): words, <eos>, padding
    for row, words in zip(src, sentences):
        row[: len(words) + 1] = torch.tensor([*words, 2])
    hyps = [list(h) for n in range(max_len + 1) for h in itertools.product([3, 4, 5], repeat=n)]
    found = beam_search(model, src, beam_size=len(hyps), alpha=alpha, max_len=max_len, include_greedy=False)
    for b in range(len(sentences)):
        scores = sequence_scores(model, src[b : b + 1].expand(len(hyps), -1), hyps, alpha, max_len=max_len)
        assert found[b] in hyps
        assert sequence_scores(model, src[b : b + 1], [found[b]], alpha, max_len=max_len) >= scores.max() - 1e-5


def test_sequence_scores_is_the_length_normalised_log_probability():
    model, src = MODELS[0], random_sources(3, 2, 5)
    hyps = [[7, 8], [9, 10, 11]]
    with torch.no_grad():
        model.eval()
        log_probs = model(src, torch.tensor([[1, 7, 8, 0], [1, 9, 10, 11]]))
    expected = [log_probs[0, [0, 1, 2], [7, 8, 2]].sum() / length_penalty(3, 0.6),
                log_probs[1, [0, 1, 2, 3], [9, 10, 11, 2]].sum() / length_penalty(4, 0.6)]
    torch.testing.assert_close(sequence_scores(model, src, hyps, 0.6, max_len=10), torch.stack(expected))


@settings(max_examples=40, deadline=None, derandomize=True)
@given(st.integers(0, 2), st.sampled_from([0.0, 3.0]), st.integers(0, 10_000), st.integers(1, 5), st.integers(2, 4),
       st.sampled_from([0.0, 0.6, 1.0]), st.integers(1, 12))
@example(0, 3.0, 6, 4, 3, 1.0, 12)  # sentence 1: greedy's eos comes before the beams have 3 hypotheses, the best later
def test_the_greedy_rows_compete_as_a_separate_greedy_decode_would(m, eos_bias, seed, batch, beam_size, alpha,
                                                                     max_len):
    """Greedy decoding rides in the beams' batch: the answer is the better of the beam search alone and of
    greedy_decode, by sequence_scores; and greedy's finished hypothesis does not end a sentence's search early."""
    model, src = eos_model(m, eos_bias), random_sources(seed, batch, 6)
    beam_only = beam_search(model, src, beam_size, alpha, max_len=max_len, include_greedy=False)
    greedy = greedy_decode(model, src, max_len)
    both = beam_search(model, src, beam_size, alpha, max_len=max_len)
    beam_scores = sequence_scores(model, src, beam_only, alpha, max_len=max_len).tolist()
    greedy_scores = sequence_scores(model, src, greedy, alpha, max_len=max_len).tolist()
    for b, (k, g) in enumerate(zip(beam_scores, greedy_scores)):
        better = [greedy[b]] if g > k + 1e-4 else [beam_only[b]] if k > g + 1e-4 else [greedy[b], beam_only[b]]
        assert both[b] in better


def test_length_penalty_is_gnmt():
    assert length_penalty(1, 0.6) == 1.0
    assert length_penalty(10, 0.0) == 1.0
    assert abs(length_penalty(7, 1.0) - 2.0) < 1e-12


@pytest.mark.parametrize("temperature, top_k", [(1.0, None), (0.5, None), (2.0, None), (1.0, 5), (0.5, 3)])
def test_sampling_draws_from_the_tempered_top_k_distribution(temperature, top_k, record_margin):
    """The first tokens of 4000 samples: their frequencies are softmax(log p / temperature) over the top_k."""
    model, src, n = MODELS[2], random_sources(4, 1, 6), 4000
    with torch.no_grad():
        scores = model.eval()(src, torch.tensor([[1]]))[0, -1] / temperature  # (V,)
    model.train()  # as MODELS are kept: dropout on, for decoding to switch off
    scores[[0, 1]] = float("-inf")  # <pad> and <bos> are never drawn
    if top_k is not None:
        scores[scores < scores.topk(top_k).values[-1]] = float("-inf")
    expected = scores.softmax(-1)  # (V,)
    first = [y[0] if y else 2 for y in sample(model, src.expand(n, -1), temperature, top_k, max_len=1, seed=0)]
    frequencies = torch.bincount(torch.tensor(first), minlength=30) / n  # (V,)
    variation = ((frequencies - expected).abs().sum() / 2).item()  # total variation
    record_margin(f"sampling, temperature {temperature}, top_k {top_k}: total variation from the distribution",
                  variation)
    assert variation < 0.05  # about 0.03 at n = 4000 over all tokens (the seed sweep, tools/margins.json)
    assert frequencies[expected == 0].sum() == 0


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
