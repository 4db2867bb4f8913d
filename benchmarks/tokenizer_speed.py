"""Speed of the byte-level BPE tokenizer on Multi30k: training the joint vocabulary and encoding the training set.

Targets (issue 2, on a 2-core machine): training the 8,000-token vocabulary on the 58,000 German and English
training sentences in under 60 s, encoding all of them in under 10 s. The reference is the naive trainer that
recounts every pair after every merge; it is far too slow to run to the end, so it runs a few merges and the
script prints its time extrapolated to the full vocabulary.

    python benchmarks/tokenizer_speed.py [--quick] [--vocab-size 8000] [--repeats 3]

The data comes from transformer_lib.data (set TRANSFORMER_LIB_DATA to a local copy to avoid a download).
The last line is `ratio=<training seconds / 60>`: lower is better, below 1 meets the target.
"""
import argparse
import statistics
import time
from collections import Counter

from transformer_lib.data import load_multi30k
from transformer_lib.tokenizer import N_BASE, N_SPECIAL, BPETokenizer, pretokenize

TRAIN_TARGET_S = 60.0
ENCODE_TARGET_S = 10.0


def naive_merges(piece_counts: Counter, n_merges: int) -> list[tuple[int, int]]:
    """The reference: recount every adjacent pair of every distinct piece before each merge."""
    spelled = {tuple(b + N_SPECIAL for b in piece.encode("utf-8")): c for piece, c in piece_counts.items()}
    token_bytes = [b""] * N_SPECIAL + [bytes([b]) for b in range(256)]
    merges = []
    for k in range(n_merges):
        pairs: Counter = Counter()
        for ids, count in spelled.items():
            for pair in zip(ids, ids[1:]):
                pairs[pair] += count
        # the most frequent pair; ties go to the pair whose bytes sort first, as in the fast trainer
        pair = min(pairs, key=lambda p: (-pairs[p], token_bytes[p[0]], token_bytes[p[1]], p))
        merges.append(pair)
        token_bytes.append(token_bytes[pair[0]] + token_bytes[pair[1]])
        new_id, merged = N_BASE + k, {}
        for ids, count in spelled.items():
            out, i = [], 0
            while i < len(ids):
                if ids[i : i + 2] == pair:
                    out.append(new_id)
                    i += 2
                else:
                    out.append(ids[i])
                    i += 1
            merged[tuple(out)] = count
        spelled = merged
    return merges


def timed(fn, repeats: int) -> tuple[float, float, object]:
    """Median wall time and median CPU time of `repeats` calls of fn(), and the last result.

    The CPU time is printed beside the wall time because the machine may be shared: it shows how much of
    the wall time was spent waiting for a core.
    """
    walls, cpus, result = [], [], None
    for _ in range(repeats):
        wall, cpu = time.perf_counter(), time.process_time()
        result = fn()
        walls.append(time.perf_counter() - wall)
        cpus.append(time.process_time() - cpu)
    return statistics.median(walls), statistics.median(cpus), result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="one repeat and a shorter naive reference (< 40 s)")
    parser.add_argument("--vocab-size", type=int, default=8000, help="vocabulary size to train (default 8000)")
    parser.add_argument("--repeats", type=int, default=3, help="timed repeats; the median is reported")
    args = parser.parse_args()
    repeats = 1 if args.quick else args.repeats
    naive_steps = 3 if args.quick else 20

    pairs = load_multi30k("train")
    texts = [de for de, _ in pairs] + [en for _, en in pairs]
    n_merges = args.vocab_size - N_BASE
    print(f"corpus: {len(texts):,} sentences (Multi30k train, German + English), vocabulary {args.vocab_size:,}")

    BPETokenizer.train(texts[:2000], 300)  # warm-up: imports, regex compilation, allocator
    train_s, train_cpu, tokenizer = timed(lambda: BPETokenizer.train(texts, args.vocab_size), repeats)
    # A fresh tokenizer each time, so the per-piece cache starts empty as it would for a new reader.
    encode_s, encode_cpu, ids = timed(lambda: BPETokenizer.from_dict(tokenizer.to_dict()).encode_batch(texts), repeats)
    n_tokens = sum(map(len, ids))

    counts: Counter = Counter()
    for text in texts:
        counts.update(pretokenize(text))
    start = time.perf_counter()
    reference = naive_merges(counts, naive_steps)
    naive_s = (time.perf_counter() - start) / naive_steps * n_merges
    assert reference == tokenizer.merges[:naive_steps], "the naive and the fast trainer disagree"

    print(f"naive BPE (reference): {naive_steps} merges run, about {naive_s:.0f} s for all {n_merges:,} "
          "(extrapolated from the first merges)")
    print(f"train:  {train_s:6.2f} s wall, {train_cpu:6.2f} s CPU  (target < {TRAIN_TARGET_S:.0f} s)  "
          f"median of {repeats}")
    print(f"encode: {encode_s:6.2f} s wall, {encode_cpu:6.2f} s CPU  (target < {ENCODE_TARGET_S:.0f} s)  "
          f"{n_tokens:,} tokens, {n_tokens / encode_s:,.0f} tokens/s")
    print(f"speed-up of training over the naive reference: about {naive_s / train_s:.0f}x")
    print("ratio = train wall seconds / 60 s target; lower is better, below 1 meets the target")
    print(f"ratio={train_s / TRAIN_TARGET_S:.3f}")


if __name__ == "__main__":
    main()
