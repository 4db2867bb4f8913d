"""Looking inside a trained translator (chapter 14): the three kinds of attention maps, switching heads off,
nearest tokens in the embedding, and the error finders. Expected values come from hand computations or from
PyTorch's own modules, never from the functions under test."""
import math

import pytest
import torch
import torch.nn.functional as F

from transformer_lib.analysis import (
    alignment,
    attention_maps,
    attention_modules,
    cross_attention,
    nearest_tokens,
    split_words,
    unsupported_words,
    without_head,
    word_start_labels,
)
from transformer_lib.model import Transformer, TransformerConfig
from transformer_lib.translate import Translator

torch.set_num_threads(1)
SENTENCES = ["Ein Hund läuft über die Straße.", "Zwei Männer spielen Fußball.",
             "A dog runs across the street."]


@pytest.fixture(scope="module")
def translator(small_translator) -> Translator:
    return small_translator(SENTENCES, n_decoder_layers=3)


def test_attention_maps_have_every_kind_and_are_softmax_rows(translator):
    model = translator.model
    src = torch.tensor([translator.encode([SENTENCES[0]])[0][0]])  # (1, S)
    tgt = torch.tensor([[1, 40, 41, 42]])  # (1, T)
    maps = attention_maps(model, src, tgt)
    S, T = src.size(1), tgt.size(1)
    assert maps["encoder"].shape == (2, 2, S, S)
    assert maps["decoder"].shape == (3, 2, T, T)
    assert maps["cross"].shape == (3, 2, T, S)
    for weights in maps.values():
        torch.testing.assert_close(weights.sum(-1), torch.ones(weights.shape[:-1]))
    assert (maps["decoder"].triu(diagonal=1) == 0).all()  # no step reads a later one
    torch.testing.assert_close(cross_attention(model, src, tgt), maps["cross"])
    layers = [*model.encoder.layers, *model.decoder.layers]
    assert not any(layer.keep_weights for layer in layers)  # switched back off
    assert all(layer.self_attn_weights is None for layer in layers)


def test_the_first_encoder_map_is_softmax_of_its_scaled_scores(translator):
    """Recompute layer 1's encoder self-attention by hand from its projections (Eq. 1 of the paper)."""
    model = translator.model.eval()
    src = torch.tensor([translator.encode([SENTENCES[1]])[0][0]])  # (1, S)
    tgt = torch.tensor([[1, 40]])  # (1, T)
    seen = {}
    layer = model.encoder.layers[0]

    def keep_input(module: torch.nn.Module, args: tuple, out: tuple) -> None:
        seen["x"] = args[0]

    handle = layer.self_attn.register_forward_hook(keep_input)
    try:
        maps = attention_maps(model, src, tgt)
    finally:
        handle.remove()
    attn, x = layer.self_attn, seen["x"]  # x: (1, S, D), the input the attention read
    d_head = attn.d_head
    with torch.inference_mode():
        q = attn.q_proj(x).view(1, -1, attn.n_heads, d_head).transpose(1, 2)  # (1, H, S, Dh)
        k = attn.k_proj(x).view(1, -1, attn.n_heads, d_head).transpose(1, 2)  # (1, H, S, Dh)
        expected = (q @ k.transpose(-1, -2) / math.sqrt(d_head)).softmax(-1)[0]  # (H, S, S)
    torch.testing.assert_close(maps["encoder"][0], expected)


def test_alignment_translates_and_returns_one_kind_or_all(translator):
    src_tokens, out_tokens, cross = alignment(translator, SENTENCES[1], beam_size=2)
    assert cross.shape[2:] == (len(out_tokens), len(src_tokens))
    _, _, every = alignment(translator, SENTENCES[1], beam_size=2, kind="all")
    assert set(every) == {"encoder", "decoder", "cross"}
    torch.testing.assert_close(every["cross"], cross)


def test_a_silenced_head_equals_zeroed_columns_of_the_output_projection(translator):
    torch.manual_seed(1)
    model = translator.model.eval()
    for kind, modules in attention_modules(model).items():
        attention = modules[-1]
        x, memory = torch.randn(2, 4, 32), torch.randn(2, 6, 32)  # (B, T, D), (B, S, D)
        with torch.no_grad():
            before = attention(x, memory)[0]  # (B, T, D)
            for head in range(attention.n_heads):
                columns = slice(head * attention.d_head, (head + 1) * attention.d_head)
                w = attention.out_proj.weight.clone()
                w[:, columns] = 0.0
                # independent: the heads' concatenated outputs times W^O with the head's columns zeroed
                captured = {}
                hook = attention.out_proj.register_forward_pre_hook(lambda m, a: captured.update(h=a[0]))
                attention(x, memory)
                hook.remove()
                expected = F.linear(captured["h"], w, attention.out_proj.bias)  # (B, T, D)
                with without_head(attention, head):
                    torch.testing.assert_close(attention(x, memory)[0], expected)
            torch.testing.assert_close(attention(x, memory)[0], before)  # the hook is gone after the block
    assert len(attention_modules(model)["cross"]) == 3


def test_all_heads_silenced_leaves_only_the_output_bias(translator):
    attention = attention_modules(translator.model)["encoder"][0]
    x = torch.randn(1, 5, 32)  # (B, T, D)
    with torch.no_grad(), without_head(attention, 0), without_head(attention, 1):
        out = attention(x, x)[0]  # (B, T, D)
    torch.testing.assert_close(out, attention.out_proj.bias.detach().expand(1, 5, 32))


def test_without_head_refuses_a_head_that_does_not_exist(translator):
    attention = attention_modules(translator.model)["cross"][0]
    with pytest.raises(ValueError, match="heads 0 to 1"):
        with without_head(attention, 2):
            pass


def test_nearest_tokens_ranks_by_cosine(translator):
    tok = translator.tokenizer
    model = Transformer(TransformerConfig(vocab_size=tok.vocab_size, d_model=4, n_heads=1, n_encoder_layers=1,
                                          n_decoder_layers=1, d_ff=8, max_len=16))
    whole = [w for w in " ".join(SENTENCES).replace(".", "").split() if len(tok.encode(" " + w)) == 1]
    first, second, third = whole[:3]  # three words the tokenizer keeps whole
    hund, dog, street = (tok.encode(" " + w)[0] for w in (first, second, third))
    assert len({hund, dog, street}) == 3
    with torch.no_grad():
        table = model.src_embed.embedding.weight
        table.copy_(torch.tensor([0.0, 0.0, 1.0, 0.0]).expand_as(table))  # every row points along axis 2
        table[hund] = torch.tensor([1.0, 0.0, 0.0, 0.0])
        table[dog] = torch.tensor([2.0, 0.1, 0.0, 0.0])  # nearly parallel to the first: cosine 0.9988
        table[street] = torch.tensor([1.0, 1.0, 0.0, 0.0])  # 45 degrees: cosine 0.7071
    near = nearest_tokens(model, tok, first, k=2)
    assert [t for t, _ in near] == [second, third]
    assert near[0][1] == pytest.approx(2 / math.sqrt(4.01), abs=0.01)
    assert near[1][1] == pytest.approx(1 / math.sqrt(2), abs=0.01)
    with pytest.raises(ValueError, match="not one"):
        nearest_tokens(model, tok, "Zwischenstaatlicheverkehrsmittel")


def test_word_start_labels_mark_the_pieces_that_start_a_word():
    assert word_start_labels(["Ein", " Hund", " Schne", "em", "obil", "en", ".", "<eos>"]) == [
        "▁Ein", "▁Hund", "▁Schne", "em", "obil", "en", ".", "<eos>"]
    assert word_start_labels(["<bos>", " a"]) == ["<bos>", "▁a"]
    assert word_start_labels([]) == []


def test_split_words_finds_the_words_cut_into_many_pieces(translator):
    tok = translator.tokenizer
    sentence = "Ein Hund rennt auf die Wiese. Zwischenstaatlicheverkehrsmittel!"
    found = dict(split_words(tok, sentence, min_pieces=3))
    assert "Zwischenstaatlicheverkehrsmittel" in found  # far longer than anything the tokenizer merged
    for word in ["Ein", "Hund", "rennt", "auf", "die", "Wiese", "Zwischenstaatlicheverkehrsmittel"]:
        pieces = tok.tokens(" " + word)
        assert "".join(pieces) == " " + word
        assert (word in found) == (len(pieces) >= 3)
        assert word not in found or found[word] == pieces
    assert split_words(tok, "", min_pieces=1) == []
    assert [w for w, _ in split_words(tok, "Hund, Katze!", min_pieces=1)] == ["Hund", "Katze"]


def test_unsupported_words_are_in_neither_source_nor_reference():
    assert unsupported_words("A man in a red hat sings.", "Ein Mann mit rotem Hut.", "A man in a red hat.") == [
        "sings"]
    assert unsupported_words("Anna und Bob", "Anna und Bob", "") == []  # copied from the source: supported
    assert unsupported_words("A DOG", "", "a dog") == []  # case does not matter
    assert unsupported_words("", "x", "y") == []
