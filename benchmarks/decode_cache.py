"""Greedy decoding with and without the key/value cache, on the CPU.

A model of the `cpu` preset's size (D 256, 4 heads, 3+3 layers, F 1024, vocabulary 8000) with random
weights decodes exactly 64 tokens per sentence (the generator's bias for <eos> is -inf, so no sentence stops
early), for a batch of 1 and a batch of 32 sources of 20 tokens. Without the cache every step runs the decoder
over the whole prefix; with it, over the newest token only (chapter 12). On a busy machine, --threads 1 gives
steadier numbers. Warm-up first, then the median of repeats, the two
variants interleaved so that both see the same machine load. The last line is
`ratio=<time without cache / time with cache>` for the batch of 1.

For the batch of 1 it also measures the floor of a cached step: multiplying one vector by every weight matrix
the step uses (per decoder layer the self-attention's four projections, the cross-attention's query and output
projections, the two feed-forward matrices, then the generator), nothing else. Each step of greedy decoding, with
or without the cache, must read all of these weights; at batch 1 on a CPU that reading, not the arithmetic, sets
the pace. No cached decoder can beat the floor, so `time without cache / floor` bounds the batch-1 ratio.

    python benchmarks/decode_cache.py [--quick] [--threads N]
"""
import argparse
import statistics
import time

import torch
import torch.nn.functional as F
from torch import nn

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


def step_weights(model: Transformer) -> list[nn.Linear]:
    """The linear layers one cached decoding step runs, in order (cross-attention keys and values are cached)."""
    layers: list[nn.Linear] = []
    for layer in model.decoder.layers:
        attn, cross, ffn = layer.self_attn, layer.cross_attn, layer.ffn
        layers += [attn.q_proj, attn.k_proj, attn.v_proj, attn.out_proj, cross.q_proj, cross.out_proj,
                   ffn.linear1, ffn.linear2]
    return layers + [model.generator]


def floor_seconds(model: Transformer, steps: int, repeats: int) -> float:
    """Median seconds of `steps` rounds of one vector (1, in) times every weight matrix of a cached step."""
    linears = step_weights(model)
    inputs = [torch.randn(1, lin.in_features) for lin in linears]  # (1, in) each
    times = []
    with torch.inference_mode():
        for _ in range(repeats + 1):  # the first round warms up
            start = time.perf_counter()
            for _ in range(steps):
                for lin, x in zip(linears, inputs):
                    F.linear(x, lin.weight, lin.bias)  # (1, out)
            times.append(time.perf_counter() - start)
    return statistics.median(times[1:])


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
    floor = floor_seconds(model, STEPS, repeats=3 if args.quick else 10)
    many = medians(model, src, repeats=1 if args.quick else 3, warmup=0 if args.quick else 1)
    megabytes = sum(lin.weight.numel() + lin.bias.numel() for lin in step_weights(model)) * 4 / 1e6

    print(f"torch {torch.__version__}, {torch.get_num_threads()} threads; greedy decoding of {STEPS} tokens, "
          f"sources of {SOURCE_LEN} tokens, cpu-preset model (D=256, 3+3 layers, V=8000), random weights")
    print(f"cached and uncached decoding give the same tokens: {same}")
    for name, t in (("batch 1", one), ("batch 32", many)):
        print(f"{name}: without cache {t[False] * 1e3:.0f} ms, with cache {t[True] * 1e3:.0f} ms, "
              f"speed-up {t[False] / t[True]:.2f}")
    print(f"batch 1 floor: one vector times the {megabytes:.0f} MB of weights a step reads, {STEPS} times: "
          f"{floor * 1e3:.0f} ms; the cached decoder takes {one[True] / floor:.2f}x the floor, so no cached "
          f"decoder can reach a ratio above {one[False] / floor:.2f} here")
    print(f"ratio={one[False] / one[True]:.2f}")


if __name__ == "__main__":
    main()
