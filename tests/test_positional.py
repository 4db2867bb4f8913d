"""transformer_lib.positional: the sinusoidal and learned position encodings of chapter 4."""
import math

import pytest
import torch
import torch.nn.functional as F
from hypothesis import given, settings
from hypothesis import strategies as st

from transformer_lib.positional import (
    LearnedPositionalEncoding,
    SinusoidalPositionalEncoding,
    sinusoidal_encoding,
)


@pytest.mark.parametrize("pos", [0, 1, 7, 100, 511])
@pytest.mark.parametrize("d_model", [2, 8, 512])
def test_values_equal_the_formula(pos, d_model):
    pe = sinusoidal_encoding(512, d_model)  # (L, D)
    for i in {0, min(1, d_model // 2 - 1), d_model // 4, d_model // 2 - 1}:
        angle = pos / 10000 ** (2 * i / d_model)
        assert pe[pos, 2 * i].item() == pytest.approx(math.sin(angle), abs=1e-6)
        assert pe[pos, 2 * i + 1].item() == pytest.approx(math.cos(angle), abs=1e-6)


def test_shape_dtype_and_odd_width():
    pe = sinusoidal_encoding(30, 16)
    assert pe.shape == (30, 16) and pe.dtype == torch.float32
    with pytest.raises(ValueError, match="even"):
        sinusoidal_encoding(30, 15)
    with pytest.raises(ValueError, match="max_len"):
        sinusoidal_encoding(0, 16)


@pytest.mark.parametrize("k", [1, 3, 17, 100])
def test_offset_is_a_fixed_rotation(k):
    """PE[p + k] = M(k) PE[p] for every p, with M(k) block-diagonal 2x2 rotations independent of p."""
    L, D = 300, 64
    pe = sinusoidal_encoding(L, D).double()  # (L, D)
    freqs = 10000.0 ** (-torch.arange(0, D, 2, dtype=torch.float64) / D)  # (D/2,)
    c, s = torch.cos(freqs * k), torch.sin(freqs * k)
    blocks = [torch.tensor([[ci, si], [-si, ci]], dtype=torch.float64) for ci, si in zip(c.tolist(), s.tolist())]
    M = torch.block_diag(*blocks)  # (D, D)
    error = (pe[: L - k] @ M.T - pe[k:]).abs().max().item()
    assert error < 1e-6
    # The dot product of two encodings depends on the offset only.
    dots = (pe[: L - k] * pe[k:]).sum(dim=-1)  # (L - k,)
    assert torch.allclose(dots, torch.cos(freqs * k).sum().expand_as(dots), atol=1e-5)


@pytest.mark.parametrize("cls", [SinusoidalPositionalEncoding, LearnedPositionalEncoding])
@settings(max_examples=50, deadline=None)
@given(offset=st.integers(0, 20), T=st.integers(1, 12), seed=st.integers(0, 2**16))
def test_offset_equals_slicing_the_full_sequence(cls, offset, T, seed):
    torch.manual_seed(seed)
    encoding = cls(8, max_len=32)
    x = torch.randn(2, offset + T, 8)  # (B, offset + T, D)
    full = encoding(x)  # (B, offset + T, D)
    part = encoding(x[:, offset:], offset=offset)  # (B, T, D)
    torch.testing.assert_close(part, full[:, offset:], rtol=0, atol=0)


def test_sinusoidal_adds_the_table():
    x = torch.randn(3, 10, 16)
    out = SinusoidalPositionalEncoding(16, max_len=50)(x, offset=4)
    torch.testing.assert_close(out, x + sinusoidal_encoding(50, 16)[4:14])


@pytest.mark.parametrize("cls", [SinusoidalPositionalEncoding, LearnedPositionalEncoding])
def test_too_long_raises_naming_the_lengths(cls):
    encoding = cls(8, max_len=10)
    encoding(torch.zeros(1, 10, 8))  # exactly max_len is fine
    encoding(torch.zeros(1, 1, 8), offset=9)
    with pytest.raises(ValueError, match=r"length 11 at offset 0 needs 11 positions, but max_len=10"):
        encoding(torch.zeros(1, 11, 8))
    with pytest.raises(ValueError, match=r"length 3 at offset 8 needs 11 positions, but max_len=10"):
        encoding(torch.zeros(1, 3, 8), offset=8)
    with pytest.raises(ValueError, match="offset must be >= 0"):
        encoding(torch.zeros(1, 3, 8), offset=-1)
    with pytest.raises(ValueError, match="width 6"):
        encoding(torch.zeros(1, 3, 6))


def test_pe_is_a_buffer_that_moves_with_to():
    encoding = SinusoidalPositionalEncoding(16, max_len=20)
    assert list(encoding.parameters()) == []
    assert [name for name, _ in encoding.named_buffers()] == ["pe"]
    assert "pe" not in encoding.state_dict()  # a fixed function of the sizes: not saved
    encoding.to(torch.float64)
    assert encoding.pe.dtype == torch.float64
    encoding.to("meta")
    assert encoding.pe.device.type == "meta"


def test_learned_parameter_count_and_gradient():
    encoding = LearnedPositionalEncoding(32, max_len=100)
    assert sum(p.numel() for p in encoding.parameters()) == 100 * 32
    encoding(torch.zeros(2, 5, 32), offset=3).sum().backward()
    grad = encoding.embedding.weight.grad  # (L, D)
    used = grad.abs().sum(dim=-1) > 0  # (L,)
    assert used.nonzero().flatten().tolist() == [3, 4, 5, 6, 7]


@pytest.mark.parametrize("cls", [SinusoidalPositionalEncoding, LearnedPositionalEncoding])
def test_dropout_only_in_training(cls):
    """Dropout is applied to the sum of the input and the encoding (Sec 5.4), in training only."""
    torch.manual_seed(0)
    encoding = cls(16, max_len=20, dropout=0.5)
    x = torch.randn(4, 20, 16)
    table = encoding.pe if cls is SinusoidalPositionalEncoding else encoding.embedding.weight  # (L, D)
    torch.manual_seed(1)
    out = encoding(x)
    torch.manual_seed(1)
    torch.testing.assert_close(out, F.dropout(x + table, 0.5))
    encoding.eval()
    torch.testing.assert_close(encoding(x), x + table, atol=0, rtol=0)
