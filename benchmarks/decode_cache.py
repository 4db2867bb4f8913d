"""Greedy decoding with and without the key/value cache, on the CPU.

A model of the `cpu` preset's size (D 256, 4 heads, 3+3 layers, F 1024, vocabulary 8000) with random
weights decodes exactly 64 tokens per sentence (the generator's bias for <eos> is -inf, so no sentence stops
early), for a batch of 1 and a batch of 32 sources of 20 tokens. Without the cache every step runs the decoder
over the whole prefix; with it, over the newest token only (chapter 12). On a busy machine, --threads 1 gives
steadier numbers. Warm-up first, then the median of repeats, the two
variants interleaved so that both see the same machine load. The last line is
`ratio=<time without cache / time with cache>` for the batch of 1.

    python benchmarks/decode_cache.py [--quick] [--threads N]
"""
import argparse
import statistics
import time

import torch

from transformer_lib.decoding import greedy_decode
from transformer_lib.model import Transformer, TransformerConfig

STEPS, SOURCE_LEN = 64, 20


def medians(model: Transformer, src: torch.Tensor, repeats: int, warmup: int) -> dict[bool, float]:
    """Median seconds of greedy decoding src to STEPS tokens, without (False) and with (True) the cache."""
    for _ in range(warmup):
        for use_cache in (False, True):
            greedy_decode(model, src, STEPS, use_cache)
    times: dict[bool, list[float]] = {False: [], True: []}
    for _ in range(repeats):
        for use_cache in (False, True):
            start = time.perf_counter()
            greedy_decode(model, src, STEPS, use_cache)
            times[use_cache].append(time.perf_counter() - start)
    return {use_cache: statistics.median(ts) for use_cache, ts in times.items()}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="fewer repeats (finishes in under 40 s)")
    parser.add_argument("--threads", type=int, default=None, help="torch threads (default: torch's choice)")
    args = parser.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)

    torch.manual_seed(0)
    config = TransformerConfig(vocab_size=8000, d_model=256, n_heads=4, n_encoder_layers=3,
                               n_decoder_layers=3, d_ff=1024)
    model = Transformer(config).eval()
    with torch.no_grad():
        model.generator.bias[config.eos_id] = float("-inf")  # no early stop: every run decodes STEPS tokens
    src = torch.randint(4, config.vocab_size, (32, SOURCE_LEN))  # (32, S) random source ids
    src[:, -1] = config.eos_id

    same = greedy_decode(model, src[:4], 16) == greedy_decode(model, src[:4], 16, use_cache=False)
    one = medians(model, src[:1], repeats=3 if args.quick else 10, warmup=1)
    many = medians(model, src, repeats=1 if args.quick else 3, warmup=0 if args.quick else 1)

    print(f"torch {torch.__version__}, {torch.get_num_threads()} threads; greedy decoding of {STEPS} tokens, "
          f"sources of {SOURCE_LEN} tokens, cpu-preset model (D=256, 3+3 layers, V=8000), random weights")
    print(f"cached and uncached decoding give the same tokens: {same}")
    for name, t in (("batch 1", one), ("batch 32", many)):
        print(f"{name}: without cache {t[False] * 1e3:.0f} ms, with cache {t[True] * 1e3:.0f} ms, "
              f"speed-up {t[False] / t[True]:.2f}")
    print(f"ratio={one[False] / one[True]:.2f}")


if __name__ == "__main__":
    main()
