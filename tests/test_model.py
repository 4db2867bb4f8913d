"""transformer_lib.model: the whole Transformer equals a pipeline around torch.nn.Transformer, and behaves."""
import math
from functools import cache

import pytest
import torch
import torch.nn.functional as F
from hypothesis import given, settings
from hypothesis import strategies as st
from torch import nn

from transformer_lib.attention import MultiHeadAttention, causal_mask, padding_mask
from transformer_lib.model import Transformer, TransformerConfig, parameter_counts
from transformer_lib.positional import sinusoidal_encoding

V, D, H, FF = 50, 16, 4, 32

# Tiny tensors: one thread is faster, and `pytest -n 2` already runs a worker per core.
torch.set_num_threads(1)

# PyTorch warns about the nested-tensor fast path of its encoder in evaluation mode; irrelevant here.
pytestmark = pytest.mark.filterwarnings("ignore:.*nested.tensor:UserWarning")


def small_config(**overrides) -> TransformerConfig:
    fields = dict(vocab_size=V, d_model=D, n_heads=H, n_encoder_layers=2, n_decoder_layers=2, d_ff=FF, dropout=0.0,
                  max_len=64)
    return TransformerConfig(**{**fields, **overrides})


@cache
def eval_model(norm_first: bool = False, seed: int = 0) -> Transformer:
    """A small model in eval mode, built once per argument set (hypothesis calls the tests many times)."""
    torch.manual_seed(seed)
    return Transformer(small_config(norm_first=norm_first)).eval()


def padded_batch(generator: torch.Generator, src_lengths, tgt_lengths, S: int, T: int):
    """Random ids (pad 0, real ids from 3) with the given lengths, right-padded."""
    src = torch.randint(3, V, (len(src_lengths), S), generator=generator)
    tgt = torch.randint(3, V, (len(tgt_lengths), T), generator=generator)
    for row, n in enumerate(src_lengths):
        src[row, n:] = 0
    for row, n in enumerate(tgt_lengths):
        tgt[row, n:] = 0
    return src, tgt


class ReferencePipeline(nn.Module):
    """embedding * sqrt(D) + sinusoidal PE -> nn.Transformer (PyTorch masks) -> Linear -> log_softmax."""

    def __init__(self, norm_first: bool, tied: bool):
        super().__init__()
        self.src_embed, self.tgt_embed = nn.Embedding(V, D), nn.Embedding(V, D)
        self.transformer = nn.Transformer(D, H, 2, 2, FF, dropout=0.0, batch_first=True, norm_first=norm_first)
        self.generator = nn.Linear(D, V)
        if tied:
            self.tgt_embed.weight = self.src_embed.weight
            self.generator.weight = self.src_embed.weight
        self.register_buffer("pe", sinusoidal_encoding(64, D))

    def forward(self, src: torch.Tensor, tgt: torch.Tensor) -> torch.Tensor:
        def embed(e: nn.Embedding, ids: torch.Tensor) -> torch.Tensor:
            return e(ids) * math.sqrt(D) + self.pe[: ids.size(1)]

        out = self.transformer(
            embed(self.src_embed, src), embed(self.tgt_embed, tgt), tgt_mask=~causal_mask(tgt.size(1))[0, 0],
            tgt_is_causal=True, src_key_padding_mask=src == 0, tgt_key_padding_mask=tgt == 0,
            memory_key_padding_mask=src == 0)
        return F.log_softmax(self.generator(out), dim=-1)


@pytest.mark.parametrize("norm_first", [False, True])
@pytest.mark.parametrize("tied", [False, True])
@pytest.mark.parametrize("seed", [0, 1])
def test_from_torch_equals_reference(norm_first, tied, seed):
    torch.manual_seed(seed)
    g = torch.Generator().manual_seed(seed)
    ref = ReferencePipeline(norm_first, tied).eval()
    ours = Transformer.from_torch(ref.transformer, ref.src_embed, ref.tgt_embed, ref.generator, max_len=64).eval()
    assert ours.config.norm_first is norm_first and ours.config.final_norm is True
    assert ours.config.tie_embeddings is tied
    src, tgt = padded_batch(g, [9, 4, 1, 7], [6, 6, 2, 4], S=9, T=6)
    real = tgt != 0  # (B, T): ours masks the target causally only, so padded positions differ and are never read
    with torch.no_grad():
        expected, got = ref(src, tgt), ours(src, tgt)
    torch.testing.assert_close(got[real], expected[real], atol=1e-5, rtol=0)


def test_from_torch_needs_matching_final_norms():
    ref = ReferencePipeline(False, False)
    ref.transformer.decoder.norm = None
    with pytest.raises(ValueError, match="final norm"):
        Transformer.from_torch(ref.transformer, ref.src_embed, ref.tgt_embed, ref.generator)


def test_tied_weights_are_one_parameter():
    model = Transformer(small_config())
    shared = model.src_embed.embedding.weight
    assert model.generator.weight is shared
    assert model.tgt_embed.embedding.weight is shared
    assert sum(1 for p in model.parameters() if p is shared) == 1
    untied = Transformer(small_config(tie_embeddings=False))
    assert untied.generator.weight is not untied.src_embed.embedding.weight
    assert untied.tgt_embed.embedding.weight is not untied.src_embed.embedding.weight
    counts = sum(p.numel() for p in untied.parameters()) - sum(p.numel() for p in model.parameters())
    assert counts == 2 * V * D


def test_tied_weights_get_gradients_from_all_three_uses():
    torch.manual_seed(0)
    model = Transformer(small_config())
    src, tgt = torch.tensor([[3, 4, 5]]), torch.tensor([[1, 6, 7]])
    model(src, tgt)[0, -1, 8].backward()
    grad = model.src_embed.embedding.weight.grad
    for token in (3, 6, 8):  # a source token, a target token, an output token
        assert grad[token].abs().sum() > 0


def test_xavier_initialisation():
    torch.manual_seed(0)
    model = Transformer(small_config(d_model=64, d_ff=256))
    w = model.encoder.layers[0].ffn.linear1.weight  # (256, 64)
    bound = math.sqrt(6 / (64 + 256))
    assert w.abs().max() <= bound
    assert abs(w.std().item() - bound / math.sqrt(3)) < 0.005
    assert torch.equal(model.encoder.layers[0].sublayers[0].norm.weight, torch.ones(64))


def test_packed_attention_init_draws_as_nn_multihead_attention_does():
    D, H = 64, 4
    torch.manual_seed(0)
    reference = nn.MultiheadAttention(D, H)  # PyTorch's own initialisation: the oracle
    model = Transformer(small_config(d_model=D, d_ff=256, attention_init="packed"))
    plain = Transformer(small_config(d_model=D, d_ff=256))
    ref_bound = reference.in_proj_weight.abs().max().item()
    for attention in (model.encoder.layers[0].self_attn, model.decoder.layers[1].cross_attn):
        qkv = torch.cat([p.weight for p in (attention.q_proj, attention.k_proj, attention.v_proj)])  # (3D, D)
        assert qkv.abs().max().item() <= math.sqrt(6 / (4 * D))  # Xavier's bound for a (3D, D) matrix
        assert abs(qkv.abs().max().item() - ref_bound) < 0.01  # both reach close to the same bound
        assert abs(qkv.std().item() - reference.in_proj_weight.std().item()) < 0.005
        for proj in (attention.q_proj, attention.k_proj, attention.v_proj, attention.out_proj):
            assert torch.count_nonzero(proj.bias) == 0
    assert torch.count_nonzero(reference.in_proj_bias) == torch.count_nonzero(reference.out_proj.bias) == 0
    # the default draws each (D, D) matrix alone: a bound sqrt(3/2) times larger, and nonzero biases
    q = plain.encoder.layers[0].self_attn.q_proj
    assert q.weight.abs().max().item() > 1.1 * math.sqrt(6 / (4 * D))
    assert torch.count_nonzero(q.bias) > 0


def test_base_model_parameter_count():
    with torch.device("meta"):
        base = Transformer(TransformerConfig.base())
    counts = parameter_counts(base)
    total = sum(p.numel() for p in base.parameters())
    assert sum(counts.values()) == total == 63_119_496
    assert abs(total - 65e6) / 65e6 < 0.05  # Table 3: 65M
    assert counts["embeddings"] == 37000 * 512
    assert counts["attention"] == 18 * (4 * 512 * 512 + 4 * 512)
    assert counts["feed-forward"] == 12 * (2 * 512 * 2048 + 2048 + 512)
    assert counts["layer norm"] == (6 * 2 + 6 * 3) * 2 * 512
    assert counts["generator"] == 37000
    assert base.config.final_norm is False


@pytest.mark.parametrize(
    "overrides, field",
    [
        (dict(vocab_size=0), "vocab_size"),
        (dict(d_model=30, n_heads=4), "d_model"),
        (dict(d_model=15, n_heads=3), "d_model"),
        (dict(n_heads=0), "n_heads"),
        (dict(n_encoder_layers=0), "n_encoder_layers"),
        (dict(n_decoder_layers=2.5), "n_decoder_layers"),
        (dict(d_ff=-1), "d_ff"),
        (dict(dropout=1.0), "dropout"),
        (dict(dropout=-0.1), "dropout"),
        (dict(attention_dropout=1.0), "attention_dropout"),
        (dict(ffn_dropout=-0.5), "ffn_dropout"),
        (dict(max_len=0), "max_len"),
        (dict(norm_first="yes"), "norm_first"),
        (dict(tie_embeddings=1), "tie_embeddings"),
        (dict(attention_init="kaiming"), "attention_init"),
        (dict(pad_id=V), "pad_id"),
        (dict(bos_id=-1), "bos_id"),
        (dict(eos_id=0), "pad_id, bos_id and eos_id"),
    ],
)
def test_config_validation_names_the_field(overrides, field):
    with pytest.raises(ValueError, match=field):
        small_config(**overrides)


def test_config_dict_round_trip_and_presets():
    config = small_config(norm_first=True)
    assert config.final_norm is True  # follows norm_first when not given
    assert TransformerConfig.from_dict(config.to_dict()) == config
    with pytest.raises(ValueError, match="colour"):
        TransformerConfig.from_dict({**config.to_dict(), "colour": "blue"})
    base = TransformerConfig.base()
    assert (base.vocab_size, base.d_model, base.n_heads, base.n_encoder_layers, base.n_decoder_layers, base.d_ff,
            base.dropout, base.norm_first, base.final_norm) == (37000, 512, 8, 6, 6, 2048, 0.1, False, False)
    assert small_config(norm_first=True, final_norm=False).final_norm is False


def test_forward_returns_log_probabilities():
    torch.manual_seed(0)
    model = Transformer(small_config()).eval()
    src, tgt = padded_batch(torch.Generator().manual_seed(0), [5, 3], [4, 2], S=5, T=4)
    with torch.no_grad():
        log_probs = model(src, tgt)
    assert log_probs.shape == (2, 4, V)
    torch.testing.assert_close(log_probs.exp().sum(-1), torch.ones(2, 4))


@settings(max_examples=15, deadline=None)
@given(src_len=st.integers(1, 6), tgt_len=st.integers(1, 6), extra=st.integers(1, 4), seed=st.integers(0, 1000),
       norm_first=st.booleans())
def test_padding_invariance(src_len, tgt_len, extra, seed, norm_first):
    """Padding source and target (in a batch with a longer pair) never changes the real positions' outputs."""
    model = eval_model(norm_first)
    g = torch.Generator().manual_seed(seed)
    src, tgt = padded_batch(g, [src_len], [tgt_len], S=src_len, T=tgt_len)
    long_src, long_tgt = padded_batch(g, [src_len + extra], [tgt_len + extra], S=src_len + extra, T=tgt_len + extra)
    batch_src = torch.cat([long_src, F.pad(src, (0, extra))])
    batch_tgt = torch.cat([long_tgt, F.pad(tgt, (0, extra))])
    with torch.no_grad():
        alone = model(src, tgt)
        padded = model(batch_src, batch_tgt)[1:, :tgt_len]
    torch.testing.assert_close(padded, alone, atol=1e-5, rtol=0)


@pytest.mark.parametrize("norm_first", [False, True])
@pytest.mark.parametrize("use_sdpa", [True, False])
def test_causal_flag_equals_the_causal_and_padding_mask_at_real_positions(norm_first, use_sdpa):
    """decode's causal flag gives the outputs of the full (B, 1, T, T) causal & padding mask at real positions."""
    model = eval_model(norm_first)
    src, tgt = padded_batch(torch.Generator().manual_seed(3), [6, 3, 5, 2], [7, 4, 6, 1], S=6, T=7)
    real = tgt != 0  # (B, T)
    try:
        for module in model.modules():
            if hasattr(module, "use_sdpa"):
                module.use_sdpa = use_sdpa
        with torch.no_grad():
            memory, src_mask = model.encode(src)
            flagged = model.decode(tgt, memory, src_mask)  # (B, T, D)
            y = model.positional(model.tgt_embed(tgt))  # (B, T, D)
            masked = model.decoder(y, memory, causal_mask(7) & padding_mask(tgt), src_mask)  # (B, T, D)
    finally:
        for module in model.modules():
            if hasattr(module, "use_sdpa"):
                module.use_sdpa = True
    torch.testing.assert_close(flagged[real], masked[real], atol=1e-5, rtol=0)


@settings(max_examples=15, deadline=None)
@given(T=st.integers(2, 8), position=st.integers(0, 7), seed=st.integers(0, 1000))
def test_causality(T, position, seed):
    """Changing target token p never changes the log-probabilities at positions before p."""
    position %= T
    model = eval_model()
    src, tgt = padded_batch(torch.Generator().manual_seed(seed), [5], [T], S=5, T=T)
    changed = tgt.clone()
    changed[0, position] = 3 + (tgt[0, position] - 3 + 1) % (V - 3)
    with torch.no_grad():
        a, b = model(src, tgt), model(src, changed)
    assert torch.equal(a[:, :position], b[:, :position])
    assert (a[:, position] - b[:, position]).abs().max() > 1e-5


@pytest.mark.parametrize("norm_first", [False, True])
@pytest.mark.parametrize("chunks", [[1] * 7, [3, 1, 2, 1], [7]])
@pytest.mark.parametrize("tgt_lengths", [[7, 7, 7], [7, 4, 2]])
def test_cached_decoding_equals_full(norm_first, chunks, tgt_lengths):
    torch.manual_seed(0)
    model = Transformer(small_config(norm_first=norm_first)).eval()
    src, tgt = padded_batch(torch.Generator().manual_seed(0), [6, 3, 5], tgt_lengths, S=6, T=7)
    with torch.no_grad():
        memory, src_mask = model.encode(src)
        full = model.generator(model.decode(tgt, memory, src_mask))
        cache, outs, offset = model.new_cache(), [], 0
        for n in chunks:
            outs.append(model.generator(model.decode(tgt[:, offset : offset + n], memory, src_mask, cache, offset)))
            offset += n
    torch.testing.assert_close(torch.cat(outs, dim=1), full, atol=1e-5, rtol=0)
    assert len(model.new_cache()) == 2


def test_cache_reorder_follows_the_batch():
    """Reordering the cache (as beam search does) equals decoding the reordered batch from scratch."""
    torch.manual_seed(0)
    model = Transformer(small_config()).eval()
    src, tgt = padded_batch(torch.Generator().manual_seed(1), [6, 3, 5], [4, 4, 4], S=6, T=4)
    index = torch.tensor([2, 0, 0])
    with torch.no_grad():
        memory, src_mask = model.encode(src)
        cache = model.new_cache()
        model.decode(tgt[:, :3], memory, src_mask, cache, 0)
        for layer_cache in cache:
            layer_cache.reorder(index)
        step = model.decode(tgt[index, 3:], memory[index], src_mask[index], cache, 3)
        full = model.decode(tgt[index], memory[index], src_mask[index])[:, 3:]
    torch.testing.assert_close(step, full, atol=1e-5, rtol=0)


def test_decode_checks_offset():
    model = Transformer(small_config()).eval()
    memory, src_mask = model.encode(torch.tensor([[3, 4]]))
    with pytest.raises(ValueError, match="cache"):
        model.decode(torch.tensor([[1]]), memory, src_mask, offset=2)
    cache = model.new_cache()
    model.decode(torch.tensor([[1, 5]]), memory, src_mask, cache, 0)
    with pytest.raises(ValueError, match="holds 2"):
        model.decode(torch.tensor([[6]]), memory, src_mask, cache, 1)
    with pytest.raises(ValueError, match="max_len"):
        model.decode(torch.ones(1, 65, dtype=torch.long), memory, src_mask)


def test_dropout_only_in_training():
    torch.manual_seed(0)
    model = Transformer(small_config(dropout=0.3))
    src, tgt = torch.tensor([[3, 4, 5]]), torch.tensor([[1, 6, 7]])
    model.train()
    assert not torch.equal(model(src, tgt), model(src, tgt))
    model.eval()
    assert torch.equal(model(src, tgt), model(src, tgt))


def dropout_rates(model: Transformer) -> dict[str, set[float]]:
    """The dropout rates of a model by where they act: residual (and embeddings), attention weights, FFN hidden units."""
    rates: dict[str, set[float]] = {"residual": set(), "attention": set(), "ffn": set()}
    for name, module in model.named_modules():
        if isinstance(module, MultiHeadAttention):
            rates["attention"].add(module.dropout)
        elif isinstance(module, nn.Dropout):
            rates["ffn" if name.endswith("ffn.dropout") else "residual"].add(module.p)
    return rates


def test_attention_and_ffn_dropout_default_to_dropout_and_can_be_set_apart():
    same = Transformer(small_config(dropout=0.2))
    assert same.config.attention_dropout == same.config.ffn_dropout == 0.2
    assert dropout_rates(same) == {"residual": {0.2}, "attention": {0.2}, "ffn": {0.2}}
    apart = Transformer(small_config(dropout=0.2, attention_dropout=0.0, ffn_dropout=0.05))
    assert dropout_rates(apart) == {"residual": {0.2}, "attention": {0.0}, "ffn": {0.05}}
    # a checkpoint written before the two fields existed still loads, with the rates it was trained with
    old = {k: v for k, v in same.config.to_dict().items() if k not in ("attention_dropout", "ffn_dropout")}
    assert TransformerConfig.from_dict(old) == same.config
    assert TransformerConfig.from_dict(apart.config.to_dict()) == apart.config


def test_residual_dropout_alone_is_random_in_training_only():
    torch.manual_seed(0)
    model = Transformer(small_config(dropout=0.3, attention_dropout=0.0, ffn_dropout=0.0))
    src, tgt = torch.tensor([[3, 4, 5]]), torch.tensor([[1, 6, 7]])
    model.train()
    assert not torch.equal(model(src, tgt), model(src, tgt))
    model.eval()
    assert torch.equal(model(src, tgt), model(src, tgt))
