"""transformer_lib.attention: equal to PyTorch's, masks that never give NaN, a cache that changes nothing."""
import math
from collections import Counter

import pytest
import torch
import torch.nn.functional as F
from hypothesis import given, settings
from hypothesis import strategies as st
from torch import nn
from torch.utils._python_dispatch import TorchDispatchMode

from transformer_lib.attention import (
    KVCache,
    MultiHeadAttention,
    causal_mask,
    padding_mask,
    rows_have_keys,
    scaled_dot_product_attention,
)

ATOL = 1e-5
FAST = settings(max_examples=20, deadline=None)


def _lengths_mask(lengths: list[int], S: int) -> torch.Tensor:
    """Padding mask (B, 1, 1, S) for right-padded sequences of the given lengths."""
    ids = torch.ones(len(lengths), S, dtype=torch.long)  # (B, S)
    for b, n in enumerate(lengths):
        ids[b, n:] = 0
    return padding_mask(ids)


# --- the masks ------------------------------------------------------------------------------------------


def test_padding_mask_marks_real_tokens():
    ids = torch.tensor([[5, 6, 0, 0], [7, 8, 9, 2]])  # (B, S)
    m = padding_mask(ids)  # (B, 1, 1, S)
    assert m.shape == (2, 1, 1, 4) and m.dtype == torch.bool
    assert m[:, 0, 0].tolist() == [[True, True, False, False], [True, True, True, True]]
    assert padding_mask(ids, pad_id=2)[1, 0, 0].tolist() == [True, True, True, False]


def test_causal_mask_is_lower_triangular():
    m = causal_mask(4)  # (1, 1, T, T)
    assert m.shape == (1, 1, 4, 4) and m.dtype == torch.bool
    assert torch.equal(m[0, 0], torch.tril(torch.ones(4, 4, dtype=torch.bool)))


@given(T=st.integers(1, 6), offset=st.integers(0, 6))
@FAST
def test_causal_mask_with_offset_is_the_last_rows_of_the_full_mask(T, offset):
    assert torch.equal(causal_mask(T, offset=offset), causal_mask(offset + T)[:, :, offset:])


# --- scaled dot-product attention vs F.scaled_dot_product_attention -----------------------------------


def _mask(kind: str, B: int, T: int, S: int, g: torch.Generator) -> torch.Tensor | None:
    """A mask of the given kind in which every query row keeps at least one key."""
    if kind == "none":
        return None
    if kind == "padding":
        lengths = torch.randint(1, S + 1, (B,), generator=g).tolist()
        return _lengths_mask(lengths, S)  # (B, 1, 1, S)
    if kind == "causal":
        return causal_mask(T, offset=S - T)  # (1, 1, T, S)
    m = torch.rand(B, 1, T, S, generator=g) < 0.6  # (B, 1, T, S)
    m[..., 0] = True
    return m


@pytest.mark.parametrize("kind", ["none", "padding", "causal", "random"])
@given(
    B=st.integers(1, 3),
    H=st.integers(1, 3),
    T=st.integers(1, 6),
    extra=st.integers(0, 4),
    Dh=st.sampled_from([1, 4, 8]),
    seed=st.integers(0, 2**16),
)
@FAST
def test_sdpa_matches_torch(kind, B, H, T, extra, Dh, seed):
    g = torch.Generator().manual_seed(seed)
    S = T + extra
    q = torch.randn(B, H, T, Dh, generator=g)  # (B, H, T, Dh)
    k = torch.randn(B, H, S, Dh, generator=g)  # (B, H, S, Dh)
    v = torch.randn(B, H, S, Dh + 1, generator=g)  # (B, H, S, Dv)
    mask = _mask(kind, B, T, S, g)
    out, weights = scaled_dot_product_attention(q, k, v, mask)
    assert out.shape == (B, H, T, Dh + 1) and weights.shape == (B, H, T, S)
    expected = F.scaled_dot_product_attention(q, k, v, attn_mask=mask)  # (B, H, T, Dv)
    torch.testing.assert_close(out, expected, atol=ATOL, rtol=0)
    torch.testing.assert_close(weights.sum(-1), torch.ones(B, H, T), atol=ATOL, rtol=0)
    if mask is not None:
        assert (weights.masked_select(~mask.expand_as(weights)) == 0).all()


def test_uniform_scores_average_the_values():
    v = torch.randn(2, 5, 3)  # (B, S, Dv)
    q, k = torch.zeros(2, 4, 8), torch.randn(2, 5, 8)  # (B, T, Dh), (B, S, Dh)
    out, _ = scaled_dot_product_attention(q, k, v)
    torch.testing.assert_close(out, v.mean(1, keepdim=True).expand(2, 4, 3))


def test_non_boolean_mask_is_refused():
    q = torch.randn(1, 2, 4)
    with pytest.raises(ValueError, match="boolean"):
        scaled_dot_product_attention(q, q, q, mask=torch.zeros(1, 2, 2))
    with pytest.raises(ValueError, match="boolean"):
        MultiHeadAttention(4, 2)(q, q, mask=torch.zeros(1, 1, 2, 2))


# --- rows with no key to attend to ------------------------------------------------------------------------


def test_fully_masked_row_gives_zeros_and_finite_gradients():
    torch.manual_seed(0)
    q = torch.randn(2, 2, 3, 4, requires_grad=True)  # (B, H, T, Dh)
    k = torch.randn(2, 2, 5, 4, requires_grad=True)  # (B, H, S, Dh)
    v = torch.randn(2, 2, 5, 4, requires_grad=True)  # (B, H, S, Dh)
    mask = torch.ones(2, 1, 3, 5, dtype=torch.bool)  # (B, 1, T, S)
    mask[1] = False  # the second sequence has no key at all
    mask[0, 0, 1] = False  # one query row of the first has none either
    out, weights = scaled_dot_product_attention(q, k, v, mask)
    assert (out[1] == 0).all() and (out[0, :, 1] == 0).all() and (weights[1] == 0).all()
    assert (out[0, :, 0].abs() > 0).any()
    out.sum().backward()
    assert all(torch.isfinite(t.grad).all() for t in (q, k, v))


@pytest.mark.parametrize("use_sdpa", [True, False])
def test_multi_head_fully_masked_row_gives_zeros_in_both_paths(use_sdpa):
    torch.manual_seed(0)
    mha = MultiHeadAttention(8, 2, use_sdpa=use_sdpa)
    x = torch.randn(3, 4, 8, requires_grad=True)  # (B, T, D)
    mask = _lengths_mask([4, 0, 2], 4)  # (B, 1, 1, S): the second sequence is all padding
    out, _ = mha(x, x, mask)
    # the output projection's bias is all a query with nothing to attend to receives
    torch.testing.assert_close(out[1], mha.out_proj.bias.expand(4, 8))
    assert torch.isfinite(out).all()
    out.sum().backward()
    assert torch.isfinite(x.grad).all() and all(torch.isfinite(p.grad).all() for p in mha.parameters())


def _nan_prone_sdpa(q, k, v, attn_mask=None, dropout_p=0.0):
    """F.scaled_dot_product_attention as older PyTorch releases computed it: NaN where no key is allowed."""
    scores = q @ k.transpose(-2, -1) / math.sqrt(q.size(-1))  # (B, H, T, S)
    if attn_mask is not None:
        scores = scores.masked_fill(~attn_mask, float("-inf"))
    return scores.softmax(-1) @ v  # (B, H, T, Dv)


def test_fast_path_gives_zeros_even_where_torch_gives_nan(monkeypatch):
    import transformer_lib.attention as attention

    monkeypatch.setattr(attention.F, "scaled_dot_product_attention", _nan_prone_sdpa)
    torch.manual_seed(0)
    mha = MultiHeadAttention(8, 2, use_sdpa=True)
    x = torch.randn(2, 3, 8, requires_grad=True)  # (B, T, D)
    mask = _lengths_mask([3, 0], 3)  # (B, 1, 1, S): the second sequence is all padding
    q = torch.randn(2, 2, 3, 4)  # (B, H, T, Dh)
    assert _nan_prone_sdpa(q, q, q, mask).isnan().any()  # the stand-in really does produce NaN
    out, _ = mha(x, x, mask)
    torch.testing.assert_close(out[1], mha.out_proj.bias.expand(3, 8))
    out.sum().backward()
    assert torch.isfinite(x.grad).all()


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_masked_weights_are_exactly_zero_in_low_precision(dtype):
    torch.manual_seed(0)
    q, k, v = (torch.randn(2, 4, 5, 8).to(dtype) for _ in range(3))  # (B, H, T, Dh)
    mask = causal_mask(5) & _lengths_mask([5, 3], 5)  # (B, 1, T, S)
    out, weights = scaled_dot_product_attention(q, k, v, mask)
    assert weights.dtype == dtype and torch.isfinite(out).all()
    assert (weights.masked_select(~mask.expand_as(weights)) == 0).all()


# --- rows_have_keys: the promise that every query row has a key -------------------------------------------


def _promise_kept(kind: str) -> torch.Tensor:
    """A mask (B|1, 1, T|1, S) for B=3, T=5, S=7 in which every query row has a key, as in training."""
    if kind == "padding":
        return _lengths_mask([7, 3, 1], 7)  # (B, 1, 1, S)
    if kind == "causal":
        return causal_mask(5, offset=2)  # (1, 1, T, S)
    return causal_mask(5, offset=2) & _lengths_mask([7, 4, 3], 7)  # (B, 1, T, S)


@pytest.mark.parametrize("kind", ["padding", "causal", "padding & causal"])
@pytest.mark.parametrize("dropout", [0.0, 0.3])
def test_rows_have_keys_changes_nothing_where_every_row_has_a_key(kind, dropout):
    """Inside the block the fast path gives the same outputs and gradients, dropout from the same seed."""
    torch.manual_seed(0)
    mha = MultiHeadAttention(32, 4, dropout=dropout).train(dropout > 0)
    x_q, x_kv = torch.randn(3, 5, 32), torch.randn(3, 7, 32)  # (B, T, D), (B, S, D)
    mask = _promise_kept(kind)
    results = []
    for promised in (False, True):
        x = x_kv.clone().requires_grad_()
        torch.manual_seed(1)
        with rows_have_keys() if promised else torch.enable_grad():
            out, _ = mha(x_q, x, mask)  # (B, T, D)
        out.sum().backward()
        results.append((out, x.grad))
    (outside, grad_outside), (inside, grad_inside) = results
    torch.testing.assert_close(inside, outside, atol=0, rtol=0)
    torch.testing.assert_close(grad_inside, grad_outside, atol=0, rtol=0)
    if dropout:  # and the dropout did act: without it the output differs
        torch.manual_seed(1)
        assert not torch.allclose(inside, mha.eval()(x_q, x_kv, mask)[0], atol=1e-3)


def test_a_row_with_no_key_gives_zeros_by_default_and_after_the_block(monkeypatch):
    """Outside rows_have_keys (the default, and after the block, even one left by an error) the zeros rule
    holds; inside, the mask goes to PyTorch as it is, so a stand-in kernel that gives NaN there shows it."""
    import transformer_lib.attention as attention

    monkeypatch.setattr(attention.F, "scaled_dot_product_attention", _nan_prone_sdpa)
    torch.manual_seed(0)
    mha = MultiHeadAttention(8, 2)
    x = torch.randn(2, 3, 8)  # (B, T, D)
    mask = _lengths_mask([3, 0], 3)  # (B, 1, 1, S): the second sequence is all padding
    bias = mha.out_proj.bias.expand(3, 8)  # (T, D): what a query with no key gives
    torch.testing.assert_close(mha(x, x, mask)[0][1], bias)
    with rows_have_keys():
        with rows_have_keys():
            pass
        assert mha(x, x, mask)[0][1].isnan().all()  # no rule inside, even after leaving a nested block
    with pytest.raises(RuntimeError, match="left by an error"), rows_have_keys():
        raise RuntimeError("left by an error")
    torch.testing.assert_close(mha(x, x, mask)[0][1], bias)


class _CountOps(TorchDispatchMode):
    """Counts the aten operators run while it is active (forward and backward)."""

    def __init__(self):
        super().__init__()
        self.counts: Counter[str] = Counter()

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.counts[str(func.overloadpacket)] += 1
        return func(*args, **(kwargs or {}))


@pytest.mark.parametrize("dropout", [0.0, 0.3])
def test_rows_have_keys_runs_no_any_or_and_masked_fill(dropout):
    """Inside the block no aten.any, | or masked_fill runs, forward or backward; outside, they do."""
    torch.manual_seed(0)
    mha = MultiHeadAttention(16, 4, dropout=dropout).train(dropout > 0)
    x = torch.randn(2, 5, 16, requires_grad=True)  # (B, T, D)
    mask = causal_mask(5) & _lengths_mask([5, 3], 5)  # (B, 1, T, S): every row has a key
    rule = ("aten.any", "aten.bitwise_or", "aten.masked_fill")
    counted = {}
    for promised in (False, True):
        with _CountOps() as ops, rows_have_keys() if promised else torch.enable_grad():
            mha(x, x, mask)[0].sum().backward()
        counted[promised] = {name: ops.counts[name] for name in rule}
    assert counted[False]["aten.any"] == 1 and counted[False]["aten.masked_fill"] >= 1, counted
    assert counted[True] == dict.fromkeys(rule, 0), counted


def test_rows_have_keys_under_torch_compile():
    """torch.compile reads the flag without a graph break (fullgraph=True) and keeps one graph per value:
    the one compiled inside the block has no `any`, and leaving the block returns to the first graph."""
    torch._dynamo.reset()
    graphs = []

    def record(gm: torch.fx.GraphModule, example_inputs):
        graphs.append({str(node.target) for node in gm.graph.nodes})
        return gm.forward

    torch.manual_seed(0)
    mha = MultiHeadAttention(16, 4).eval()
    compiled = torch.compile(mha, backend=record, fullgraph=True)
    x = torch.randn(2, 5, 16)  # (B, T, D)
    mask = _lengths_mask([5, 2], 5)  # (B, 1, 1, S)
    with torch.no_grad():
        outside = compiled(x, x, mask)[0]
        with rows_have_keys():
            inside = compiled(x, x, mask)[0]
        again = compiled(x, x, mask)[0]
    torch._dynamo.reset()
    assert len(graphs) == 2, graphs
    assert any("any" in target for target in graphs[0]) and not any("any" in target for target in graphs[1])
    torch.testing.assert_close(inside, outside, atol=ATOL, rtol=0)
    torch.testing.assert_close(again, outside, atol=0, rtol=0)


# --- multi-head attention ---------------------------------------------------------------------------------


def test_d_model_not_divisible_by_heads_is_a_clear_error():
    with pytest.raises(ValueError, match="d_model=10 is not divisible by n_heads=4"):
        MultiHeadAttention(10, 4)


def test_parameter_count_is_4d2_plus_4d():
    D = 64
    assert sum(p.numel() for p in MultiHeadAttention(D, 8).parameters()) == 4 * D * D + 4 * D
    assert sum(p.numel() for p in MultiHeadAttention(D, 8, bias=False).parameters()) == 4 * D * D


@pytest.mark.parametrize("kind", ["none", "padding", "causal", "random"])
def test_fast_and_explicit_paths_agree(kind):
    g = torch.Generator().manual_seed(1)
    torch.manual_seed(1)
    fast = MultiHeadAttention(32, 4, use_sdpa=True)
    slow = MultiHeadAttention(32, 4, use_sdpa=False)
    slow.load_state_dict(fast.state_dict())
    x_q, x_kv = torch.randn(3, 5, 32, generator=g), torch.randn(3, 7, 32, generator=g)  # (B, T, D), (B, S, D)
    mask = _mask(kind, 3, 5, 7, g)
    out_fast, no_weights = fast(x_q, x_kv, mask)
    out_slow, weights = slow(x_q, x_kv, mask, need_weights=True)
    assert no_weights is None and weights.shape == (3, 4, 5, 7)
    torch.testing.assert_close(out_fast, out_slow, atol=ATOL, rtol=0)
    # asking the fast module for weights takes the explicit path, with the same result
    out_w, weights_fast = fast(x_q, x_kv, mask, need_weights=True)
    torch.testing.assert_close(out_w, out_fast, atol=ATOL, rtol=0)
    torch.testing.assert_close(weights_fast, weights)


@pytest.mark.parametrize("use_sdpa", [True, False])
def test_dropout_only_in_training(use_sdpa):
    torch.manual_seed(0)
    mha = MultiHeadAttention(16, 2, dropout=0.5, use_sdpa=use_sdpa)
    no_dropout = MultiHeadAttention(16, 2, use_sdpa=use_sdpa)
    no_dropout.load_state_dict(mha.state_dict())
    x = torch.randn(2, 6, 16)  # (B, T, D)
    mha.eval()
    torch.testing.assert_close(mha(x, x)[0], no_dropout(x, x)[0], atol=0, rtol=0)
    mha.train()
    first, second = mha(x, x)[0], mha(x, x)[0]
    assert not torch.allclose(first, second) and not torch.allclose(first, no_dropout(x, x)[0])


# --- equal to nn.MultiheadAttention with the same weights ------------------------------------------------


@pytest.mark.parametrize("cross", [False, True])
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("use_sdpa", [True, False])
def test_from_torch_matches_nn_multihead_attention(cross, causal, use_sdpa):
    torch.manual_seed(0)
    D, H, B, T = 32, 4, 3, 6
    S = 9 if cross else T
    ref = nn.MultiheadAttention(D, H, batch_first=True).eval()
    ours = MultiHeadAttention.from_torch(ref).eval()
    ours.use_sdpa = use_sdpa
    x_q = torch.randn(B, T, D)  # (B, T, D)
    x_kv = torch.randn(B, S, D) if cross else x_q  # (B, S, D)
    keep = _lengths_mask([S, S - 2, 3], S)  # (B, 1, 1, S), True = may attend
    attn_mask = causal_mask(T, offset=S - T) if causal else None  # (1, 1, T, S)
    mask = keep if attn_mask is None else keep & attn_mask  # (B, 1, T|1, S)
    # nn.MultiheadAttention's masks say the opposite: True = blocked
    key_padding_mask = ~keep[:, 0, 0]  # (B, S)
    blocked = None if attn_mask is None else ~attn_mask[0, 0]  # (T, S)
    expected, expected_w = ref(
        x_q, x_kv, x_kv, key_padding_mask=key_padding_mask, attn_mask=blocked, average_attn_weights=False
    )
    got, _ = ours(x_q, x_kv, mask)
    torch.testing.assert_close(got, expected, atol=ATOL, rtol=0)
    got_w, weights = ours(x_q, x_kv, mask, need_weights=True)
    torch.testing.assert_close(got_w, expected, atol=ATOL, rtol=0)
    torch.testing.assert_close(weights, expected_w, atol=ATOL, rtol=0)


def test_from_torch_without_bias_and_refusals():
    ref = nn.MultiheadAttention(16, 2, bias=False, batch_first=True)
    ours = MultiHeadAttention.from_torch(ref)
    assert ours.q_proj.bias is None and sum(p.numel() for p in ours.parameters()) == 4 * 16 * 16
    x = torch.randn(2, 3, 16)  # (B, T, D)
    torch.testing.assert_close(ours(x, x)[0], ref(x, x, x, need_weights=False)[0], atol=ATOL, rtol=0)
    with pytest.raises(ValueError, match="batch_first"):
        MultiHeadAttention.from_torch(nn.MultiheadAttention(16, 2))
    with pytest.raises(ValueError, match="kdim"):
        MultiHeadAttention.from_torch(nn.MultiheadAttention(16, 2, kdim=8, vdim=8, batch_first=True))


# --- properties ---------------------------------------------------------------------------------------------


@given(B=st.integers(1, 3), T=st.integers(1, 7), seed=st.integers(0, 2**16), use_sdpa=st.booleans())
@FAST
def test_self_attention_is_permutation_equivariant(B, T, seed, use_sdpa):
    torch.manual_seed(seed)
    mha = MultiHeadAttention(16, 4, use_sdpa=use_sdpa)
    x = torch.randn(B, T, 16)  # (B, T, D)
    perm = torch.randperm(T)
    out, _ = mha(x, x)
    out_perm, _ = mha(x[:, perm], x[:, perm])
    torch.testing.assert_close(out_perm, out[:, perm], atol=ATOL, rtol=0)


@given(T=st.integers(1, 6), n_pad=st.integers(1, 5), seed=st.integers(0, 2**16), use_sdpa=st.booleans())
@FAST
def test_padding_never_changes_real_positions(T, n_pad, seed, use_sdpa):
    torch.manual_seed(seed)
    mha = MultiHeadAttention(16, 4, use_sdpa=use_sdpa)
    x = torch.randn(2, T, 16)  # (B, T, D)
    padded = torch.cat([x, 100 * torch.randn(2, n_pad, 16)], dim=1)  # (B, T + n_pad, D): junk at the pads
    mask = _lengths_mask([T, T], T + n_pad)  # (B, 1, 1, T + n_pad)
    out, _ = mha(x, x)
    out_padded, _ = mha(padded, padded, mask)
    torch.testing.assert_close(out_padded[:, :T], out, atol=ATOL, rtol=0)


@given(T=st.integers(2, 8), data=st.data(), seed=st.integers(0, 2**16), use_sdpa=st.booleans())
@FAST
def test_future_tokens_never_change_earlier_outputs(T, data, seed, use_sdpa):
    torch.manual_seed(seed)
    j = data.draw(st.integers(1, T - 1), label="changed position")
    mha = MultiHeadAttention(16, 4, use_sdpa=use_sdpa)
    x = torch.randn(2, T, 16)  # (B, T, D)
    changed = x.clone()
    changed[:, j:] = torch.randn(2, T - j, 16)
    out, _ = mha(x, x, causal_mask(T))
    out_changed, _ = mha(changed, changed, causal_mask(T))
    torch.testing.assert_close(out_changed[:, :j], out[:, :j], atol=ATOL, rtol=0)
    assert not torch.allclose(out_changed[:, j:], out[:, j:])


# --- the key/value cache ---------------------------------------------------------------------------------


@given(
    chunks=st.lists(st.integers(1, 3), min_size=1, max_size=4),
    seed=st.integers(0, 2**16),
    use_sdpa=st.booleans(),
)
@FAST
def test_cached_self_attention_equals_full_recomputation(chunks, seed, use_sdpa):
    """Feeding the sequence in pieces (one or several new positions each) through a cache changes nothing."""
    torch.manual_seed(seed)
    mha = MultiHeadAttention(16, 4, use_sdpa=use_sdpa).eval()
    T = sum(chunks)
    x = torch.randn(2, T, 16)  # (B, T, D)
    full, _ = mha(x, x, causal_mask(T))
    cache, start, pieces = KVCache(), 0, []
    for n in chunks:
        step = x[:, start : start + n]  # (B, n, D)
        mask = None if n == 1 else causal_mask(n, offset=start)  # (1, 1, n, start + n)
        out, _ = mha(step, step, mask, cache=cache)
        pieces.append(out)
        start += n
        assert len(cache) == start and cache.k.shape == (2, 4, start, 4)
    torch.testing.assert_close(torch.cat(pieces, dim=1), full, atol=ATOL, rtol=0)


@pytest.mark.parametrize("use_sdpa", [True, False])
def test_static_cache_computes_cross_attention_keys_once(use_sdpa):
    torch.manual_seed(0)
    mha = MultiHeadAttention(16, 4, use_sdpa=use_sdpa).eval()
    memory = torch.randn(2, 7, 16)  # (B, S, D)
    memory_mask = _lengths_mask([7, 4], 7)  # (B, 1, 1, S)
    y = torch.randn(2, 5, 16)  # (B, T, D)
    full, _ = mha(y, memory, memory_mask)
    cache = KVCache(static=True)
    steps = []
    for t in range(5):
        # after the first step the memory is not even read: any tensor (here zeros) gives the same result
        x_kv = memory if t == 0 else torch.zeros_like(memory)
        steps.append(mha(y[:, t : t + 1], x_kv, memory_mask, cache=cache)[0])
        assert len(cache) == 7
    torch.testing.assert_close(torch.cat(steps, dim=1), full, atol=ATOL, rtol=0)


def test_cache_reorder_selects_batch_rows():
    torch.manual_seed(0)
    mha = MultiHeadAttention(8, 2).eval()
    x = torch.randn(3, 4, 8)  # (B, T, D)
    cache = KVCache()
    mha(x, x, causal_mask(4), cache=cache)
    k, v = cache.k.clone(), cache.v.clone()
    index = torch.tensor([2, 2, 0])
    assert cache.reorder(index) is cache
    assert torch.equal(cache.k, k[index]) and torch.equal(cache.v, v[index])
    assert KVCache().reorder(index).k is None
    # decoding continues from the reordered rows exactly as if those sequences had been run directly
    nxt = torch.randn(3, 1, 8)  # (B, 1, D)
    out, _ = mha(nxt, nxt, cache=cache)
    direct = torch.cat([x[index], nxt], dim=1)  # (B, 5, D)
    expected, _ = mha(direct, direct, causal_mask(5))
    torch.testing.assert_close(out, expected[:, -1:], atol=ATOL, rtol=0)

@pytest.mark.parametrize("use_sdpa", [True, False])
@pytest.mark.parametrize("training", [False, True])
def test_is_causal_equals_the_causal_mask(use_sdpa, training):
    """is_causal=True gives what the plain-math path gives with causal_mask(T), and with dropout under the same seed:
    on the CPU, F.scaled_dot_product_attention with dropout runs its math kernel, which draws the dropout mask of
    the (B, H, T, T) weights from the same generator as the explicit path's F.dropout."""
    torch.manual_seed(0)
    mha = MultiHeadAttention(16, 4, dropout=0.3 if training else 0.0, use_sdpa=use_sdpa).train(training)
    plain = MultiHeadAttention(16, 4, dropout=0.3 if training else 0.0, use_sdpa=False).train(training)
    plain.load_state_dict(mha.state_dict())
    x = torch.randn(2, 6, 16)  # (B, T, D)
    torch.manual_seed(1)
    flagged, _ = mha(x, x, is_causal=True)
    torch.manual_seed(1)
    masked, _ = plain(x, x, causal_mask(6))
    torch.testing.assert_close(flagged, masked, atol=ATOL, rtol=0)
    if training:  # and the dropout did act: without it the output differs
        assert not torch.allclose(flagged, plain.eval()(x, x, causal_mask(6))[0], atol=1e-3)


def test_is_causal_weights_are_lower_triangular():
    mha = MultiHeadAttention(16, 4)
    x = torch.randn(1, 5, 16)  # (B, T, D)
    _, weights = mha(x, x, is_causal=True, need_weights=True)  # (B, H, T, T)
    assert torch.equal(weights == 0, ~causal_mask(5).expand(1, 4, 5, 5))


def test_is_causal_refuses_a_mask_a_cache_or_cross_attention():
    mha = MultiHeadAttention(16, 4)
    x = torch.randn(1, 4, 16)  # (B, T, D)
    with pytest.raises(ValueError, match="is_causal"):
        mha(x, x, causal_mask(4), is_causal=True)
    with pytest.raises(ValueError, match="is_causal"):
        mha(x, torch.randn(1, 6, 16), is_causal=True)
    cache = KVCache()
    mha(x[:, :2], x[:, :2], causal_mask(2), cache)
    with pytest.raises(ValueError, match="2 cached"):
        mha(x[:, 2:], x[:, 2:], cache=cache, is_causal=True)
    mha(x[:, :2], x[:, :2], cache=KVCache(), is_causal=True)  # an empty cache is fine: nothing to offset
