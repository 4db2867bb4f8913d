"""transformer_lib.decoder_only: the decoder-only translator's joined sequence, its mask, its loss, its cache, its size,
and benchmarks/decoder_only_same_recipe.py, which trains it with the book's trainer and records it."""
import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from transformer_lib.config import TrainConfig
from transformer_lib.data import load_multi30k
from transformer_lib.decoder_only import (
    DecoderOnlyTranslator,
    _Prefixes,
    beam_translate,
    greedy_translate,
    matching_depth,
    prefix_attention,
    translate_sentences,
)
from transformer_lib.training_run import train
from transformer_lib.model import Transformer, TransformerConfig
from transformer_lib.recipe import LabelSmoothingLoss, batch_loss, make_batch
from transformer_lib.tokenizer import BPETokenizer
from transformer_lib.translate import bleu

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "benchmarks"))

V, PAD, BOS, EOS = 40, 0, 1, 2
SRC = [[5, 6, 7, 8, 9], [10, 11], [12, 13, 14]]
TGT = [[15, 16, 17], [18, 19, 20, 21, 22, 23], [24]]


def small(**changes) -> DecoderOnlyTranslator:
    """A 3-layer model with weights spread wide enough that its outputs differ from token to token."""
    torch.manual_seed(0)
    config = TransformerConfig(vocab_size=V, d_model=32, n_heads=4, n_encoder_layers=1, n_decoder_layers=1,
                               d_ff=64, **changes)
    model = DecoderOnlyTranslator(config, n_layers=3).eval()
    with torch.no_grad():
        for p in model.parameters():
            p.add_(0.2 * torch.randn_like(p))
    return model


def test_the_depth_matches_the_encoder_decoders_parameters_within_five_percent():
    config = TrainConfig.from_preset("cpu").model_config(8000)
    D, F = config.d_model, config.d_ff
    attention, ffn, norm = 4 * (D * D + D), 2 * D * F + F + D, 2 * D  # counted by hand, not by the code
    encoder_layer, decoder_layer = attention + ffn + 2 * norm, 2 * attention + ffn + 3 * norm
    assert matching_depth(config) == round((3 * encoder_layer + 3 * decoder_layer) / encoder_layer) == 7
    ours = sum(p.numel() for p in DecoderOnlyTranslator(config).parameters())
    theirs = sum(p.numel() for p in Transformer(config).parameters())
    assert ours == 8000 * D + 8000 + 7 * encoder_layer  # one table for both languages and the output
    assert abs(ours / theirs - 1) < 0.05


def test_the_joined_sequence_is_each_pair_one_after_the_other_with_the_padding_last():
    model, batch = small(), make_batch(SRC, TGT)
    seq, start = model.joined(batch.src, batch.tgt_in)
    for row, (s, t) in enumerate(zip(SRC, TGT)):
        expected = [BOS, *s, EOS, *t]  # built by hand: <bos> German <eos> English
        assert seq[row, : len(expected)].tolist() == expected
        assert set(seq[row, len(expected) :].tolist()) <= {PAD}
        assert start[row].item() == len(s) + 1 and seq[row, start[row]].item() == EOS


@pytest.mark.parametrize("norm_first", [False, True])
def test_no_position_sees_a_later_one_german_or_english(norm_first):
    """The mask chosen here is causal over the whole sequence: the German positions, too, see only earlier German
    (a prefix-LM would let them see all of it). Changing token j changes no output before j, and does change j's."""
    model = small(norm_first=norm_first).double()
    ids = torch.tensor([[BOS, 5, 6, 7, 8, EOS, 15, 16, 17, 18]])
    positions = torch.arange(ids.size(1))
    base = model.stack(ids, positions)  # (1, T, D)
    for j in range(1, ids.size(1)):
        changed = ids.clone()
        changed[0, j] = 30 + j % 5
        out = model.stack(changed, positions)
        assert torch.equal(out[0, :j], base[0, :j]), j
        assert not torch.allclose(out[0, j], base[0, j]), j


def test_the_attention_weights_are_zero_above_the_diagonal():
    model, batch = small(), make_batch(SRC, TGT)
    for layer in model.layers:
        layer.keep_weights = True
    seq, _ = model.joined(batch.src[:1], batch.tgt_in[:1])
    model.stack(seq, torch.arange(seq.size(1)))
    for layer in model.layers:
        w = layer.self_attn_weights  # (1, H, L, L)
        assert torch.all(w.triu(diagonal=1) == 0) and torch.allclose(w.sum(-1), torch.ones(()))
        layer.keep_weights = False


def test_the_loss_is_the_english_tokens_alone_and_padding_changes_nothing():
    """batch_loss's nll equals -log p of each English label (and <eos>), read from one unpadded sequence per pair:
    the German tokens are context, never predicted, and a row's neighbours in the batch do not change its loss."""
    model = small().double()
    criterion = LabelSmoothingLoss(V, PAD, 0.1, reduction="sum")
    _, nll = batch_loss(model, make_batch(SRC, TGT), criterion)
    expected = 0.0
    for s, t in zip(SRC, TGT):
        seq = torch.tensor([[BOS, *s, EOS, *t]])  # (1, L), no padding
        log_probs = model.generator(model.stack(seq, torch.arange(seq.size(1))))[0]  # (L, V)
        labels = [*t, EOS]  # predicted from the separator and each English token
        first = len(s) + 1  # the separator
        expected -= sum(log_probs[first + k, label].item() for k, label in enumerate(labels))
    # the generator's log-softmax is float32 even for a float64 model: 9 terms of relative error 6e-8 each
    assert nll.item() == pytest.approx(expected, rel=1e-6)


def test_decode_refuses_a_cache():
    model, batch = small(), make_batch(SRC, TGT)
    with pytest.raises(ValueError, match="greedy_translate and beam_translate keep the cache"):
        model.decode(batch.tgt_in, batch.src, None, cache=model.new_cache())


def test_the_cache_gives_the_log_probabilities_of_recomputation():
    """In float64, step by step, with rows reordered and repeated as beam search does."""
    model, src = small().double(), make_batch(SRC, TGT).src
    cached, full = _Prefixes(model, src, use_cache=True), _Prefixes(model, src, use_cache=False)
    torch.testing.assert_close(cached.log_probs, full.log_probs, rtol=0, atol=1e-10)
    for rows, tokens in [([0, 1, 2], [20, 21, 22]), ([2, 2, 0, 1], [23, 24, 25, 26]), ([3, 0], [27, 28])]:
        rows, tokens = torch.tensor(rows), torch.tensor(tokens)
        cached.extend(rows, tokens)
        full.extend(rows, tokens)
        torch.testing.assert_close(cached.log_probs, full.log_probs, rtol=0, atol=1e-10)


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_greedy_and_beam_decode_the_same_with_and_without_the_cache(seed):
    """In float64: the two computations round differently, and in float32 a near-tie could go either way."""
    model, src = small().double(), make_batch(SRC, TGT).src
    with torch.no_grad():
        for p in model.parameters():
            p.add_(0.1 * torch.randn(p.shape, generator=torch.Generator().manual_seed(seed)))
    greedy = greedy_translate(model, src, max_len=10)
    assert greedy == greedy_translate(model, src, max_len=10, use_cache=False)
    assert beam_translate(model, src, 3, max_len=10) == beam_translate(model, src, 3, max_len=10, use_cache=False)
    assert beam_translate(model, src, 1, max_len=10) == greedy  # one beam is the greedy search
    assert all(len(y) <= 10 and PAD not in y and BOS not in y for y in greedy)


def test_prefix_attention_reads_the_german_rows_of_the_english_positions():
    model, batch = small(), make_batch(SRC, TGT)
    src, tgt = batch.src[:1], batch.tgt_in[:1, :4]  # (1, 6), (1, 4): the first pair, without padding
    weights = prefix_attention(model, src, tgt)
    assert weights.shape == (3, 4, 4, 6)
    assert torch.all(weights.sum(-1) <= 1 + 1e-6) and torch.all(weights >= 0)
    # the separator's row (the first English prediction) sees the whole German prefix and <bos>, so its
    # weights on German are one minus its weight on <bos>
    for layer in model.layers:
        layer.keep_weights = True
    seq, _ = model.joined(src, tgt)
    model.stack(seq, torch.arange(seq.size(1)))
    on_bos = torch.stack([layer.self_attn_weights[0, :, 6, 0] for layer in model.layers])  # (L, H)
    for layer in model.layers:
        layer.keep_weights = False
    torch.testing.assert_close(weights[:, :, 0].sum(-1), 1 - on_bos)
    with pytest.raises(ValueError, match="one sentence"):
        prefix_attention(model, batch.src, batch.tgt_in)


def test_translate_sentences_keeps_empty_lines_and_refuses_a_bare_string(small_tokenizer):
    tokenizer = BPETokenizer.load(small_tokenizer)
    config = TransformerConfig(vocab_size=tokenizer.vocab_size, d_model=16, n_heads=2, n_encoder_layers=1,
                               n_decoder_layers=1, d_ff=32, max_len=64)
    model = DecoderOnlyTranslator(config).eval()
    out = translate_sentences(model, tokenizer, ["Ein Hund.", "", "  "], beam_size=2)
    alone = translate_sentences(model, tokenizer, ["Ein Hund."], beam_size=2)[0]
    assert out == [alone, "", ""]  # empty lines stay in place, empty, and change no other translation
    with pytest.raises(TypeError, match="list of sentences"):
        translate_sentences(model, tokenizer, "Ein Hund.")
    with pytest.raises(ValueError, match="positions"):
        translate_sentences(model, tokenizer, ["Hund " * 80], beam_size=1)


def test_the_books_trainer_trains_it_from_its_factory(tmp_path, small_tokenizer):
    tokenizer = BPETokenizer.load(small_tokenizer)
    config = TrainConfig.from_preset("tiny", d_model=32, n_heads=2, n_encoder_layers=1, n_decoder_layers=1,
                                     d_ff=64, train_subset=200, max_tokens=400, warmup=10, max_steps=4,
                                     max_minutes=None, log_every=1, average_last=1, device="cpu", amp="off")
    result = train(config, tmp_path / "run", progress=False, tokenizer=tokenizer, model_factory=DecoderOnlyTranslator)
    assert isinstance(result.model, DecoderOnlyTranslator) and result.model.n_layers == 3
    losses = [r["loss"] for r in result.history if r["kind"] == "train"]
    assert len(losses) == 4 and losses[-1] < losses[0]


def test_the_benchmark_trains_and_records_the_decoder_only_model(tmp_path):
    """The encoder-decoder's side of the script is the library's Translator, tested with chapter 13."""
    script = ROOT / "benchmarks" / "decoder_only_same_recipe.py"
    run, record = tmp_path / "run", tmp_path / "decoder_only.json"
    subprocess.run([sys.executable, str(script), "train", "--model", "decoder-only", "--out", str(run), "--quick",
                    "--preset", "tiny", "--threads", "1"], check=True, capture_output=True)
    subprocess.run([sys.executable, str(script), "record", str(run), str(record), "--limit", "3"], check=True,
                   capture_output=True)
    r = json.loads(record.read_text())
    assert r["model"] == "decoder-only" and r["steps"] == 6 and "dry run" in r["limit"]
    assert set(r["bleu"]) == set(r["bleu_greedy"]) == {"val", "test2016"}
    hyps = record.with_name("decoder_only.test2016.txt").read_text(encoding="utf-8").splitlines()
    refs = [en for _, en in load_multi30k("test2016")[:3]]
    assert bleu(hyps, refs)["cased"] == r["bleu"]["test2016"]["cased"]  # the file holds what the record scored
    assert len(r["german_share_by_layer"]) == r["layers"] and all(0 <= s <= 1 for s in r["german_share_by_layer"])
    assert r["checkpoint"].startswith("model.pt")
