"""Multi-head attention: the fast path (F.scaled_dot_product_attention) vs the explicit path, on the CPU.

Self-attention over a batch of 32 sequences of 64 tokens, d_model 512, 8 heads, with a padding mask;
forward and backward. Warm-up first, then the median of repeats, the two paths interleaved so both see
the same machine load. The whole module is timed (its four projections cost the same in both paths), and
the attention core alone (Eq. 1 on (B, H, T, Dh) tensors) beside it. The library's fast path is also timed
inside `rows_have_keys()`, the block a training step enters, where it skips the rule for rows with no key
(`mask.any`, `|` and a `masked_fill` of the output), in the module and in the core; those lines give the ratio
outside / inside. The last line is `ratio=<explicit time / fast time>` for the whole module: above 1 means the
fast path is faster.

    python benchmarks/attention_speed.py [--quick] [--threads N]
"""
import argparse
import statistics
import time

import torch

from transformer_lib.attention import (
    MultiHeadAttention,
    _fused_attention,
    padding_mask,
    rows_have_keys,
    scaled_dot_product_attention,
)

B, T, D, H = 32, 64, 512, 8


def seconds(forward) -> float:
    """Seconds for one forward and backward pass of `forward()`."""
    start = time.perf_counter()
    forward().sum().backward()
    return time.perf_counter() - start


def promised(attend, *args) -> torch.Tensor:
    """attend(*args) inside rows_have_keys(): every row of the mask has a key."""
    with rows_have_keys():
        return attend(*args)


def medians(candidates: dict, repeats: int, warmup: int) -> dict[str, float]:
    """Median seconds of each candidate, timed in turn so that load on the machine hits all alike."""
    for _ in range(warmup):
        for forward in candidates.values():
            seconds(forward)
    times = {name: [] for name in candidates}
    for _ in range(repeats):
        for name, forward in candidates.items():
            times[name].append(seconds(forward))
    return {name: statistics.median(ts) for name, ts in times.items()}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="fewer repeats (finishes in well under 40 s)")
    parser.add_argument("--repeats", type=int, default=None, help="timed repeats (default 30, quick 3)")
    parser.add_argument("--threads", type=int, default=None, help="torch threads (default: torch's choice)")
    args = parser.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    repeats = args.repeats or (3 if args.quick else 30)
    warmup = 1 if args.quick else 5

    torch.manual_seed(0)
    fast = MultiHeadAttention(D, H, use_sdpa=True)
    explicit = MultiHeadAttention(D, H, use_sdpa=False)
    explicit.load_state_dict(fast.state_dict())
    x = torch.randn(B, T, D, requires_grad=True)  # (B, T, D)
    lengths = torch.randint(T // 2, T + 1, (B,))  # (B,)
    ids = (torch.arange(T)[None, :] < lengths[:, None]).long()  # (B, T): 1 = token, 0 = padding
    mask = padding_mask(ids)  # (B, 1, 1, T)

    with torch.no_grad():
        diff = (fast(x, x, mask)[0] - explicit(x, x, mask)[0]).abs().max().item()
        same = torch.equal(promised(fast, x, x, mask)[0], fast(x, x, mask)[0])
    module = medians(
        {
            "fast": lambda: fast(x, x, mask)[0],
            "explicit": lambda: explicit(x, x, mask)[0],
            "fast, rows_have_keys": lambda: promised(fast, x, x, mask)[0],
        },
        repeats,
        warmup,
    )
    q, k, v = (torch.randn(B, H, T, D // H, requires_grad=True) for _ in range(3))  # (B, H, T, Dh)
    core = medians(
        {
            "fast": lambda: torch.nn.functional.scaled_dot_product_attention(q, k, v, attn_mask=mask),
            "explicit": lambda: scaled_dot_product_attention(q, k, v, mask)[0],
            "library, zeros rule": lambda: _fused_attention(q, k, v, mask),
            "library, rows_have_keys": lambda: promised(_fused_attention, q, k, v, mask),
        },
        repeats,
        warmup,
    )

    threads = torch.get_num_threads()
    print(f"torch {torch.__version__}, {threads} threads; B={B} T={T} D={D} H={H}, forward+backward")
    print(f"max |fast - explicit| = {diff:.2e}")
    print(f"attention core only: fast {core['fast'] * 1e3:.1f} ms, explicit {core['explicit'] * 1e3:.1f} ms, "
          f"ratio {core['explicit'] / core['fast']:.2f}")
    rule, promise = core["library, zeros rule"], core["library, rows_have_keys"]
    print(f"attention core, the library's fast path: with the zeros rule {rule * 1e3:.1f} ms, "
          f"inside rows_have_keys() {promise * 1e3:.1f} ms, ratio outside / inside {rule / promise:.2f}")
    print(f"MultiHeadAttention, fast path (F.scaled_dot_product_attention): "
          f"{module['fast'] * 1e3:.1f} ms (median of {repeats})")
    print(f"MultiHeadAttention, explicit path (softmax written out):        "
          f"{module['explicit'] * 1e3:.1f} ms (median of {repeats})")
    inside = module["fast, rows_have_keys"]
    print(f"MultiHeadAttention, fast path inside rows_have_keys():         {inside * 1e3:.1f} ms "
          f"(median of {repeats}), outputs equal to outside: {same}, ratio outside / inside "
          f"{module['fast'] / inside:.2f}")
    print(f"ratio={module['explicit'] / module['fast']:.2f}")


if __name__ == "__main__":
    main()
