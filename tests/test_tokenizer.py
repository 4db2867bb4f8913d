"""transformer_lib.tokenizer: exact round trips, fixed special ids, known merges, save/load, the Multi30k cache."""
import json
import os
from collections import Counter

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from transformer_lib.model import TransformerConfig
from transformer_lib.tokenizer import (
    BOS_ID,
    EOS_ID,
    N_BASE,
    PAD_ID,
    UNK_ID,
    BPETokenizer,
    learn_merges,
    merge_ids,
    multi30k_tokenizer,
    pretokenize,
)

TOY = [
    "low low low low low",
    "lower lower",
    "newest newest newest newest newest newest",
    "widest widest widest",
]
CORPUS = [
    "Ein Hund läuft im Schnee.",
    "A dog runs in the snow.",
    "Zwei Männer spielen Fußball auf einer Wiese.",
    "Two men play soccer on a meadow.",
    "Ein kleines Mädchen klettert in ein Spielhaus aus Holz.",
    "A little girl climbing into a wooden playhouse.",
] * 3


@pytest.fixture(scope="module")
def small() -> BPETokenizer:
    return BPETokenizer.train(CORPUS, vocab_size=N_BASE + 60)


EDGE_CASES = [
    "",
    " ",
    "a",
    "  two  spaces  ",
    "\n\t\r\n",
    "\x00\x01\x1b[0m\x7f",
    "😀🐕‍🦺👍🏽",
    "Привет, мир! 你好，世界 مرحبا",
    "e\u0301 combining, \u2028 line separator, \ufeff BOM, \U0010ffff",
    "under_score __init__ 3.14 1,000",
    "<pad><bos><eos><unk>",
]


@pytest.mark.parametrize("text", EDGE_CASES)
def test_round_trip_edge_cases(small, text):
    ids = small.encode(text)
    assert small.decode(ids) == text
    assert UNK_ID not in ids


@settings(max_examples=200, deadline=None)
@given(st.text())
def test_round_trip_any_unicode(small, text):
    assert "".join(pretokenize(text)) == text
    assert small.decode(small.encode(text)) == text


@settings(max_examples=50, deadline=None)
@given(st.lists(st.text(alphabet=st.characters(codec="utf-8"), max_size=30), min_size=1, max_size=8),
       st.text(max_size=40))
def test_round_trip_with_tokenizer_trained_on_random_text(corpus, text):
    tokenizer = BPETokenizer.train(corpus, vocab_size=N_BASE + 30)
    assert tokenizer.decode(tokenizer.encode(text)) == text
    for line in corpus:
        assert tokenizer.decode(tokenizer.encode(line)) == line


def test_special_ids_are_fixed(small):
    """<pad>, <bos>, <eos>, <unk> are ids 0..3 and byte b is id 4 + b, as encode and decode use them."""
    assert small.encode("", bos=True, eos=True) == [1, 2]
    assert [small.id_to_token(i) for i in range(4)] == ["<pad>", "<bos>", "<eos>", "<unk>"]
    assert small.decode([0, 1, 2, 3]) == ""  # all four are special
    bytes_only = BPETokenizer([])
    assert bytes_only.vocab_size == 260
    assert bytes_only.encode("A\x00é") == [4 + 0x41, 4, 4 + 0xC3, 4 + 0xA9]
    assert bytes_only.decode([4 + 0x41, 4]) == "A\x00"
    # the model's default special ids are the tokenizer's
    config = TransformerConfig(vocab_size=small.vocab_size)
    assert [config.pad_id, config.bos_id, config.eos_id] == [small.pad_id, *small.encode("", bos=True, eos=True)]


def test_special_token_text_is_not_a_special_token(small):
    assert not {PAD_ID, BOS_ID, EOS_ID, UNK_ID} & set(small.encode("<pad> <bos> <eos> <unk>"))


def test_encode_adds_bos_and_eos(small):
    plain = small.encode("Ein Hund.")
    assert small.encode("Ein Hund.", bos=True) == [BOS_ID] + plain
    assert small.encode("Ein Hund.", eos=True) == plain + [EOS_ID]
    assert small.encode("Ein Hund.", bos=True, eos=True) == [BOS_ID] + plain + [EOS_ID]
    assert small.encode("", bos=True, eos=True) == [BOS_ID, EOS_ID]


def test_decode_skips_special_tokens(small):
    ids = [BOS_ID] + small.encode("A dog.") + [EOS_ID, PAD_ID, PAD_ID, UNK_ID]
    assert small.decode(ids) == "A dog."


def test_decode_of_broken_utf8_uses_replacement_character(small):
    euro = small.encode("€")  # three bytes
    assert small.decode(euro[:1]) == "\ufffd"


def test_decode_rejects_ids_outside_vocabulary(small):
    with pytest.raises(ValueError, match="outside the vocabulary"):
        small.decode([small.vocab_size])
    with pytest.raises(ValueError, match="outside the vocabulary"):
        small.decode([-1])


def test_empty_string(small):
    assert small.encode("") == []
    assert small.decode([]) == ""
    assert small.tokens("") == []


def test_toy_corpus_known_merges():
    tokenizer = BPETokenizer.train(TOY, vocab_size=N_BASE + 10)
    learned = [tokenizer.id_to_token(i) for i in range(N_BASE, tokenizer.vocab_size)]
    assert learned == ["es", "est", "lo", "low", "ew", "ewest", "newest", " low", " newest", "dest"]
    assert tokenizer.tokens(" lowest") == [" low", "est"]
    e, s, t = (b + 4 for b in b"est")
    assert tokenizer.merges[:2] == [(e, s), (N_BASE, t)]


def test_encode_fuses_the_earliest_learned_pair_first():
    a, b, c = (x + 4 for x in b"abc")
    tokenizer = BPETokenizer([(b, c), (a, b)])  # "bc" was learned before "ab"
    assert tokenizer.encode("abc") == [a, N_BASE]  # not [N_BASE + 1, c]
    assert tokenizer.tokens("abc abcab") == ["a", "bc", " ", "a", "bc", "ab"]


def apply_merges_in_order(tokenizer: BPETokenizer, text: str) -> list[int]:
    """Reference encoder: in each piece, apply merge 0 everywhere, then merge 1, and so on."""
    out = []
    for piece in pretokenize(text):
        ids = [b + 4 for b in piece.encode()]
        for k, pair in enumerate(tokenizer.merges):
            ids = merge_ids(ids, pair, N_BASE + k)
        out += ids
    return out


@settings(max_examples=100, deadline=None)
@given(st.lists(st.text(alphabet="abc ", min_size=3, max_size=14), min_size=2, max_size=10),
       st.text(alphabet="abc ", min_size=5, max_size=30))
def test_encode_equals_applying_the_merges_in_order(corpus, text):
    """Three letters make overlapping merges ("ab" and "bc") common, where the order of fusing matters."""
    tokenizer = BPETokenizer.train(corpus, vocab_size=N_BASE + 25)
    assert tokenizer.encode(text) == apply_merges_in_order(tokenizer, text)


def naive_merges(counts: Counter, n_merges: int) -> list[tuple[int, int]]:
    """Reference trainer: recount all pairs before every merge; ties go to the pair whose bytes sort first."""
    spelled = {tuple(b + 4 for b in piece.encode()): c for piece, c in counts.items()}
    token_bytes = [b""] * 4 + [bytes([b]) for b in range(256)]
    merges = []
    for k in range(n_merges):
        pairs = Counter()
        for ids, c in spelled.items():
            for pair in zip(ids, ids[1:]):
                pairs[pair] += c
        if not pairs:
            break
        pair = min(pairs, key=lambda p: (-pairs[p], token_bytes[p[0]], token_bytes[p[1]], p))
        merges.append(pair)
        token_bytes.append(token_bytes[pair[0]] + token_bytes[pair[1]])
        spelled = {tuple(merge_ids(ids, pair, N_BASE + k)): c for ids, c in spelled.items()}
    return merges


def test_fast_trainer_equals_naive_recount():
    """The incremental trainer makes the same choices as recounting all pairs before every merge."""
    counts = Counter(p for text in CORPUS * 2 + TOY for p in pretokenize(text))
    assert learn_merges(counts, 80) == naive_merges(counts, 80)


@settings(max_examples=60, deadline=None)
@given(st.lists(st.text(alphabet="aab c€ä", max_size=14), max_size=10))
def test_fast_trainer_equals_naive_on_random_corpora(texts):
    """Small alphabets make repeated letters (overlapping pairs like "aaa") and ties between counts."""
    counts = Counter(p for text in texts for p in pretokenize(text))
    assert learn_merges(counts, 40) == naive_merges(counts, 40)


def test_merge_ids():
    assert merge_ids([5, 6, 5, 6], (5, 6), 9) == [9, 9]
    assert merge_ids([5, 5, 5], (5, 5), 9) == [9, 5]
    assert merge_ids([], (5, 6), 9) == []


def test_training_is_deterministic_and_order_free():
    a = BPETokenizer.train(CORPUS, vocab_size=N_BASE + 50)
    b = BPETokenizer.train(list(reversed(CORPUS)), vocab_size=N_BASE + 50)
    assert a.merges == b.merges


def test_vocab_size_is_a_maximum(small):
    assert small.vocab_size == N_BASE + 60 == len(small)
    tiny = BPETokenizer.train(["ab"], vocab_size=N_BASE + 100)
    assert tiny.vocab_size == N_BASE + 1  # only one pair to merge


@pytest.mark.parametrize("vocab_size", [0, 100, N_BASE - 1])
def test_too_small_vocab_size_raises(vocab_size):
    with pytest.raises(ValueError, match="at least 260"):
        BPETokenizer.train(CORPUS, vocab_size=vocab_size)


def test_save_load_round_trip(small, tmp_path):
    path = small.save(tmp_path / "sub" / "tok.json")
    loaded = BPETokenizer.load(path)
    texts = CORPUS + EDGE_CASES
    assert loaded.encode_batch(texts) == small.encode_batch(texts)
    assert loaded.to_dict() == small.to_dict()
    assert BPETokenizer.from_dict(json.loads(json.dumps(small.to_dict()))).merges == small.merges
    assert [p.name for p in path.parent.iterdir()] == ["tok.json"]  # no temporary file left behind


def test_from_dict_rejects_foreign_data(small):
    with pytest.raises(ValueError, match="not a"):
        BPETokenizer.from_dict({"merges": []})
    broken = small.to_dict() | {"merges": [[4, 99999]]}
    with pytest.raises(ValueError, match="not yet defined"):
        BPETokenizer.from_dict(broken)


def test_id_to_token_is_readable(small):
    euro_bytes = [b + 4 for b in "€".encode()]
    assert small.id_to_token(euro_bytes[0]) == "<0xE2>"
    assert small.id_to_token(ord("a") + 4) == "a"
    with pytest.raises(ValueError):
        small.id_to_token(small.vocab_size)


REAL_DATA = os.environ.get("TRANSFORMER_LIB_DATA")


@pytest.mark.skipif(not REAL_DATA, reason="TRANSFORMER_LIB_DATA is not set")
def test_multi30k_tokenizer_is_cached(tmp_path, monkeypatch):
    monkeypatch.setenv("TRANSFORMER_LIB_CACHE", str(tmp_path))
    first = multi30k_tokenizer(vocab_size=N_BASE + 40)
    files = list((tmp_path / "tokenizers").iterdir())
    assert [f.name for f in files] == [f"multi30k-bpe{N_BASE + 40}-v1.json"]
    second = multi30k_tokenizer(vocab_size=N_BASE + 40)
    assert second.to_dict() == first.to_dict()
    files[0].write_text("{ damaged")  # a broken cache file is rebuilt, not trusted
    assert multi30k_tokenizer(vocab_size=N_BASE + 40).to_dict() == first.to_dict()
    german = "Zwei junge weiße Männer sind im Freien in der Nähe vieler Büsche."
    assert first.decode(first.encode(german)) == german
