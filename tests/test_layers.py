"""transformer_lib.layers: the building blocks equal PyTorch's, and padding, causality and the cache behave."""
import pytest
import torch
import torch.nn.functional as F
from hypothesis import given, settings
from hypothesis import strategies as st
from torch import nn

from transformer_lib.attention import causal_mask, padding_mask
from transformer_lib.layers import (
    Decoder,
    DecoderLayer,
    Encoder,
    EncoderLayer,
    LayerCache,
    PositionwiseFeedForward,
    SublayerConnection,
)

D, H, FF = 16, 4, 32

# Tiny tensors: one thread is faster, and `pytest -n 2` already runs a worker per core.
torch.set_num_threads(1)


def random_ids(lengths: list[int], max_len: int, generator: torch.Generator) -> torch.Tensor:
    """Right-padded ids (B, max_len) with the given lengths; pad id 0, real ids from 4."""
    ids = torch.randint(4, 50, (len(lengths), max_len), generator=generator)
    for row, n in enumerate(lengths):
        ids[row, n:] = 0
    return ids


@pytest.fixture(scope="module")
def LayerNorm(book_definition):
    """Chapter 7's LayerNorm, written out; the layers use nn.LayerNorm, which it must equal."""
    return book_definition("07_feed_forward_residual_norm.ipynb", "LayerNorm", torch=torch, nn=nn)


def test_layer_norm_equals_torch(LayerNorm):
    torch.manual_seed(0)
    ours, ref = LayerNorm(D), nn.LayerNorm(D)
    with torch.no_grad():
        ours.weight.normal_()
        ours.bias.normal_()
    ref.load_state_dict(ours.state_dict())
    x = 4 + 3 * torch.randn(3, 5, D)
    torch.testing.assert_close(ours(x), ref(x), atol=1e-5, rtol=0)


def test_layer_norm_standardises_each_token(LayerNorm):
    y = LayerNorm(D)(10 * torch.randn(4, 6, D) - 3)
    torch.testing.assert_close(y.mean(-1), torch.zeros(4, 6), atol=1e-5, rtol=0)
    torch.testing.assert_close(y.var(-1, unbiased=False), torch.ones(4, 6), atol=1e-3, rtol=0)


def test_feed_forward_is_position_wise():
    torch.manual_seed(0)
    ffn = PositionwiseFeedForward(D, FF)
    x = torch.randn(2, 7, D)
    perm = torch.randperm(7)
    torch.testing.assert_close(ffn(x)[:, perm], ffn(x[:, perm]))
    expected = F.linear(F.relu(F.linear(x, ffn.linear1.weight, ffn.linear1.bias)), ffn.linear2.weight, ffn.linear2.bias)
    torch.testing.assert_close(ffn(x), expected)


def _dropout_mask(shape: tuple[int, ...], p: float, seed: int) -> torch.Tensor:
    """The kept-and-rescaled mask a dropout of rate p draws from torch's generator seeded with seed: 0 or 1/(1-p)."""
    torch.manual_seed(seed)
    return F.dropout(torch.ones(shape), p)


def _layer_norm(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor, eps: float = 1e-5) -> torch.Tensor:
    """LayerNorm over the last dimension, written out: standardise each token, then scale and shift."""
    mean = x.mean(-1, keepdim=True)
    var = ((x - mean) ** 2).mean(-1, keepdim=True)  # the biased variance, as the paper's LayerNorm uses
    return (x - mean) / torch.sqrt(var + eps) * weight + bias


def test_feed_forward_dropout_acts_on_the_hidden_layer_in_training():
    torch.manual_seed(0)
    ffn = PositionwiseFeedForward(D, FF, dropout=0.5)
    x = torch.randn(2, 7, D)
    w1, b1, w2, b2 = (t.detach() for t in (ffn.linear1.weight, ffn.linear1.bias, ffn.linear2.weight, ffn.linear2.bias))
    hidden = torch.clamp(x @ w1.T + b1, min=0)  # (B, T, F): max(0, x W1 + b1), Eq. 2
    torch.manual_seed(1)
    out = ffn(x)  # draws its mask of the hidden units as _dropout_mask does with seed 1
    torch.testing.assert_close(out, (hidden * _dropout_mask((2, 7, FF), 0.5, 1)) @ w2.T + b2)
    ffn.eval()
    torch.testing.assert_close(ffn(x), hidden @ w2.T + b2)


@pytest.mark.parametrize("norm_first", [False, True])
def test_sublayer_connection_formula(norm_first):
    """Post-LN LayerNorm(x + drop(f(x))), pre-LN x + drop(f(LayerNorm(x))), with LayerNorm and dropout written
    out by hand and f a fixed linear map; dropout only in training."""
    torch.manual_seed(0)
    wrap = SublayerConnection(D, dropout=0.5, norm_first=norm_first)
    with torch.no_grad():  # a LayerNorm that scales and shifts, so its parameters matter
        wrap.norm.weight.normal_()
        wrap.norm.bias.normal_()
    gamma, beta = wrap.norm.weight.detach().clone(), wrap.norm.bias.detach().clone()
    w = torch.randn(D, D)

    def f(h):
        return h @ w  # (B, T, D)

    x = torch.randn(2, 3, D)
    mask = _dropout_mask((2, 3, D), 0.5, 1)

    def formula(m):
        return x + f(_layer_norm(x, gamma, beta)) * m if norm_first else _layer_norm(x + f(x) * m, gamma, beta)

    torch.manual_seed(1)
    torch.testing.assert_close(wrap(x, f), formula(mask))
    wrap.eval()
    torch.testing.assert_close(wrap(x, f), formula(1.0))
    assert not torch.allclose(formula(mask), formula(1.0))  # the mask did drop something


@pytest.mark.parametrize("norm_first", [False, True])
@pytest.mark.parametrize("seed", [0, 1, 2])
def test_encoder_layer_equals_torch(norm_first, seed):
    torch.manual_seed(seed)
    g = torch.Generator().manual_seed(seed)
    ref = nn.TransformerEncoderLayer(D, H, FF, dropout=0.0, batch_first=True, norm_first=norm_first).eval()
    ours = EncoderLayer.from_torch(ref)
    ids = random_ids([7, 3, 5], 7, g)
    x = torch.randn(3, 7, D, generator=g)
    with torch.no_grad():
        expected = ref(x, src_key_padding_mask=ids == 0)
        got = ours(x, padding_mask(ids))
    torch.testing.assert_close(got, expected, atol=1e-5, rtol=0)


@pytest.mark.parametrize("norm_first", [False, True])
@pytest.mark.parametrize("seed", [0, 1, 2])
def test_decoder_layer_equals_torch(norm_first, seed):
    torch.manual_seed(seed)
    g = torch.Generator().manual_seed(seed)
    ref = nn.TransformerDecoderLayer(D, H, FF, dropout=0.0, batch_first=True, norm_first=norm_first).eval()
    ours = DecoderLayer.from_torch(ref)
    src, tgt = random_ids([6, 2, 4], 6, g), random_ids([5, 5, 3], 5, g)
    memory, y = torch.randn(3, 6, D, generator=g), torch.randn(3, 5, D, generator=g)
    with torch.no_grad():
        expected = ref(y, memory, tgt_mask=~causal_mask(5)[0, 0], tgt_key_padding_mask=tgt == 0,
                       memory_key_padding_mask=src == 0)
        got = ours(y, memory, causal_mask(5) & padding_mask(tgt), padding_mask(src))
    torch.testing.assert_close(got, expected, atol=1e-5, rtol=0)


@pytest.mark.parametrize("norm_first", [False, True])
def test_stacks_equal_torch(norm_first):
    torch.manual_seed(0)
    g = torch.Generator().manual_seed(0)
    enc_layer = nn.TransformerEncoderLayer(D, H, FF, dropout=0.0, batch_first=True, norm_first=norm_first)
    dec_layer = nn.TransformerDecoderLayer(D, H, FF, dropout=0.0, batch_first=True, norm_first=norm_first)
    ref_enc = nn.TransformerEncoder(enc_layer, 2, norm=nn.LayerNorm(D), enable_nested_tensor=False).eval()
    ref_dec = nn.TransformerDecoder(dec_layer, 2, norm=nn.LayerNorm(D)).eval()
    for p in list(ref_enc.parameters()) + list(ref_dec.parameters()):  # make the copied norms non-trivial
        p.data.normal_(0, 0.3, generator=g)
    enc, dec = Encoder.from_torch(ref_enc), Decoder.from_torch(ref_dec)
    assert len(enc.layers) == len(dec.layers) == 2
    src, tgt = random_ids([6, 3], 6, g), random_ids([4, 2], 4, g)
    x, y = torch.randn(2, 6, D, generator=g), torch.randn(2, 4, D, generator=g)
    with torch.no_grad():
        ref_memory = ref_enc(x, src_key_padding_mask=src == 0)
        memory = enc(x, padding_mask(src))
        expected = ref_dec(y, ref_memory, tgt_mask=~causal_mask(4)[0, 0], tgt_key_padding_mask=tgt == 0,
                           memory_key_padding_mask=src == 0)
        got = dec(y, memory, causal_mask(4) & padding_mask(tgt), padding_mask(src))
    torch.testing.assert_close(memory, ref_memory, atol=1e-5, rtol=0)
    torch.testing.assert_close(got, expected, atol=1e-5, rtol=0)


def test_from_torch_refuses_other_variants():
    with pytest.raises(ValueError, match="batch_first"):
        EncoderLayer.from_torch(nn.TransformerEncoderLayer(D, H, FF))
    with pytest.raises(ValueError, match="relu"):
        DecoderLayer.from_torch(nn.TransformerDecoderLayer(D, H, FF, batch_first=True, activation="gelu"))
    with pytest.raises(ValueError, match="bias"):
        EncoderLayer.from_torch(nn.TransformerEncoderLayer(D, H, FF, batch_first=True, bias=False))


def test_layers_share_no_weights_and_final_norm_follows_norm_first():
    enc = Encoder(D, H, FF, n_layers=3)
    pointers = [p.data_ptr() for p in enc.parameters()]
    assert len(set(pointers)) == len(pointers)
    assert not torch.equal(enc.layers[0].ffn.linear1.weight, enc.layers[1].ffn.linear1.weight)
    assert isinstance(Encoder(D, H, FF, 2).norm, nn.Identity)
    assert isinstance(Encoder(D, H, FF, 2, norm_first=True).norm, nn.LayerNorm)
    assert isinstance(Decoder(D, H, FF, 2, final_norm=True).norm, nn.LayerNorm)
    assert isinstance(Decoder(D, H, FF, 2, norm_first=True, final_norm=False).norm, nn.Identity)


@settings(max_examples=25, deadline=None)
@given(short=st.integers(1, 7), extra=st.integers(1, 5), norm_first=st.booleans(), seed=st.integers(0, 1000))
def test_encoder_padding_invariance(short, extra, norm_first, seed):
    """A sentence is encoded the same alone and padded (with garbage) next to a longer one."""
    torch.manual_seed(seed)
    enc = Encoder(D, H, FF, n_layers=2, dropout=0.0, norm_first=norm_first).eval()
    S = short + extra
    x_short, x_long = torch.randn(1, short, D), torch.randn(1, S, D)
    batch = torch.cat([x_long, torch.cat([x_short, 100 * torch.randn(1, extra, D)], dim=1)])  # (2, S, D)
    ids = torch.ones(2, S, dtype=torch.long)
    ids[1, short:] = 0
    with torch.no_grad():
        alone = enc(x_short)
        padded = enc(batch, padding_mask(ids))
    torch.testing.assert_close(padded[1:, :short], alone, atol=1e-5, rtol=0)


@settings(max_examples=25, deadline=None)
@given(T=st.integers(2, 8), position=st.integers(0, 7), norm_first=st.booleans(), seed=st.integers(0, 1000))
def test_decoder_causality(T, position, norm_first, seed):
    """Changing target position p changes no output before p (exactly) and does change position p."""
    position = position % T
    torch.manual_seed(seed)
    dec = Decoder(D, H, FF, n_layers=2, dropout=0.0, norm_first=norm_first).eval()
    memory, y = torch.randn(2, 5, D), torch.randn(2, T, D)
    y2 = y.clone()
    y2[:, position] = torch.randn(D)
    with torch.no_grad():
        a, b = dec(y, memory, causal_mask(T)), dec(y2, memory, causal_mask(T))
    assert torch.equal(a[:, :position], b[:, :position])
    assert (a[:, position] - b[:, position]).abs().max() > 1e-4


@pytest.mark.parametrize("chunks", [[1] * 6, [2, 3, 1], [6]])
def test_decoder_cache_equals_full(chunks):
    """Feeding the target in chunks with the cache reproduces the full masked computation."""
    torch.manual_seed(0)
    dec = Decoder(D, H, FF, n_layers=2, dropout=0.0).eval()
    src = torch.tensor([[5, 6, 7, 8], [5, 6, 0, 0]])
    memory, y = torch.randn(2, 4, D), torch.randn(2, 6, D)
    with torch.no_grad():
        full = dec(y, memory, causal_mask(6), padding_mask(src))
        cache, outs, offset = dec.new_cache(), [], 0
        for n in chunks:
            outs.append(dec(y[:, offset : offset + n], memory, causal_mask(n, offset=offset), padding_mask(src), cache))
            offset += n
    torch.testing.assert_close(torch.cat(outs, dim=1), full, atol=1e-5, rtol=0)
    assert len(cache[0].self_attn) == 6
    assert cache[0].cross_attn.static and cache[0].cross_attn.k.shape == (2, H, 4, D // H)


def test_decoder_cache_wrong_length():
    dec = Decoder(D, H, FF, n_layers=2)
    with pytest.raises(ValueError, match="new_cache"):
        dec(torch.randn(1, 1, D), torch.randn(1, 3, D), cache=[LayerCache()])


def test_layer_cache_reorder():
    torch.manual_seed(0)
    dec = Decoder(D, H, FF, n_layers=1, dropout=0.0).eval()
    memory, y = torch.randn(3, 4, D), torch.randn(3, 2, D)
    cache = dec.new_cache()
    with torch.no_grad():
        dec(y, memory, causal_mask(2), cache=cache)
    k_self, k_cross = cache[0].self_attn.k.clone(), cache[0].cross_attn.k.clone()
    index = torch.tensor([2, 2, 0])
    assert cache[0].reorder(index) is cache[0]
    assert torch.equal(cache[0].self_attn.k, k_self[index])
    assert torch.equal(cache[0].cross_attn.k, k_cross[index])


def test_keep_weights_records_attention():
    torch.manual_seed(0)
    layer = DecoderLayer(D, H, FF, dropout=0.0).eval()
    src = torch.tensor([[5, 6, 0]])
    layer.keep_weights = True
    with torch.no_grad():
        out = layer(torch.randn(1, 4, D), torch.randn(1, 3, D), causal_mask(4), padding_mask(src))
    assert out.shape == (1, 4, D)
    assert layer.cross_attn_weights.shape == (1, H, 4, 3)
    assert layer.cross_attn_weights[..., 2].abs().max() == 0
    torch.testing.assert_close(layer.self_attn_weights.sum(-1), torch.ones(1, H, 4))
    assert layer.self_attn_weights.triu(1).abs().max() == 0


@pytest.mark.parametrize("use_sdpa", [True, False])
@pytest.mark.parametrize("norm_first", [False, True])
def test_decoder_causal_flag_equals_causal_and_padding_mask_at_real_positions(use_sdpa, norm_first):
    """Right-padded targets: tgt_is_causal=True equals causal & padding mask wherever a position is real."""
    torch.manual_seed(0)
    dec = Decoder(D, H, FF, n_layers=2, dropout=0.0, norm_first=norm_first).eval()
    for module in dec.modules():
        if hasattr(module, "use_sdpa"):
            module.use_sdpa = use_sdpa
    g = torch.Generator().manual_seed(0)
    src, tgt = random_ids([4, 2, 3], 4, g), random_ids([6, 3, 1], 6, g)
    memory, y = torch.randn(3, 4, D), torch.randn(3, 6, D)
    real = tgt != 0  # (B, T)
    with torch.no_grad():
        masked = dec(y, memory, causal_mask(6) & padding_mask(tgt), padding_mask(src))
        flagged = dec(y, memory, None, padding_mask(src), tgt_is_causal=True)
        layer = dec.layers[0](y, memory, None, padding_mask(src), tgt_is_causal=True)
        layer_masked = dec.layers[0](y, memory, causal_mask(6) & padding_mask(tgt), padding_mask(src))
    torch.testing.assert_close(flagged[real], masked[real], atol=1e-5, rtol=0)
    torch.testing.assert_close(layer[real], layer_masked[real], atol=1e-5, rtol=0)
    assert not torch.allclose(flagged[~real], masked[~real], atol=1e-5)  # padded rows do differ, unread
