"""What the CPU benchmarks share: a preset's real Multi30k training batches, as its trainer builds them."""
from transformer_lib.config import TrainConfig
from transformer_lib.data import load_multi30k
from transformer_lib.recipe import Batch, encode_pairs, make_batch, token_batches
from transformer_lib.tokenizer import BPETokenizer


def real_batches(config: TrainConfig, tokenizer: BPETokenizer, n_pairs: int, n_batches: int) -> list[Batch]:
    """The first n_batches token batches (config.max_tokens each, shuffled with seed 0) of the first n_pairs
    training pairs."""
    src, tgt = encode_pairs(load_multi30k("train")[:n_pairs], tokenizer, config.max_sentence_len)
    index = token_batches([len(s) + 1 for s in src], [len(t) + 1 for t in tgt], config.max_tokens, seed=0)
    return [make_batch([src[i] for i in b], [tgt[i] for i in b]) for b in index[:n_batches]]
