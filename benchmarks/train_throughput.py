"""Training and inference throughput of our Transformer vs torch.nn.Transformer, side by side on the CPU.

Same configuration for both (d_model 256, 4 heads, 3+3 layers, d_ff 1024, vocabulary 8000, dropout 0.1, tied
embeddings, float32), the same padded batches of 64 x 24 tokens, AdamW. The reference is the pipeline of
chapter 10 built from PyTorch's parts: nn.Embedding * sqrt(D) + sinusoidal encoding -> nn.Transformer -> Linear ->
log_softmax. After warm-up the two models are timed in alternation (so that load on the machine hits both alike)
step by step, and the median step time of each is reported. Throughput counts target positions (B x T) per second.

Usage: python benchmarks/train_throughput.py [--quick] [--repeats N] [--threads N]
The last line is ratio=<ours / reference> for training.
"""
import argparse
import math
import statistics
import time
import warnings

import torch
import torch.nn.functional as F
from torch import nn

from transformer_lib.attention import causal_mask
from transformer_lib.model import Transformer, TransformerConfig
from transformer_lib.positional import sinusoidal_encoding

V, D, H, N_LAYERS, D_FF, B, L = 8000, 256, 4, 3, 1024, 64, 24


class Reference(nn.Module):
    """embedding * sqrt(D) + sinusoidal PE -> nn.Transformer -> Linear -> log_softmax, tied embeddings."""

    def __init__(self) -> None:
        super().__init__()
        self.embed = nn.Embedding(V, D)
        self.transformer = nn.Transformer(D, H, N_LAYERS, N_LAYERS, D_FF, dropout=0.1, batch_first=True)
        self.generator = nn.Linear(D, V)
        self.generator.weight = self.embed.weight
        self.dropout = nn.Dropout(0.1)
        self.register_buffer("pe", sinusoidal_encoding(64, D))

    def _embed(self, ids: torch.Tensor) -> torch.Tensor:
        return self.dropout(self.embed(ids) * math.sqrt(D) + self.pe[: ids.size(1)])  # (B, L, D)

    def forward(self, src: torch.Tensor, tgt: torch.Tensor) -> torch.Tensor:
        T = tgt.size(1)
        out = self.transformer(
            self._embed(src), self._embed(tgt), tgt_mask=~causal_mask(T)[0, 0], tgt_is_causal=True,
            src_key_padding_mask=src == 0, tgt_key_padding_mask=tgt == 0, memory_key_padding_mask=src == 0)
        return F.log_softmax(self.generator(out), dim=-1)  # (B, T, V)


def batches(n: int, seed: int = 0) -> list[tuple[torch.Tensor, torch.Tensor, torch.Tensor]]:
    """n padded batches (src, tgt_in, tgt_out), each (B, L), lengths between L/2 and L."""
    g = torch.Generator().manual_seed(seed)
    out = []
    for _ in range(n):
        ids = torch.randint(4, V, (3, B, L), generator=g)
        for row in range(B):
            for k in (0, 1):
                ids[k, row, torch.randint(L // 2, L + 1, (1,), generator=g).item():] = 0
        ids[2][ids[1] == 0] = 0  # labels padded where the decoder input is
        out.append((ids[0], ids[1], ids[2]))
    return out


def train_step(model: nn.Module, opt: torch.optim.Optimizer, batch) -> float:
    """Seconds for one optimisation step (forward, loss, backward, AdamW) on one batch."""
    src, tgt_in, tgt_out = batch
    model.train()
    start = time.perf_counter()
    log_probs = model(src, tgt_in)  # (B, T, V)
    loss = F.nll_loss(log_probs.reshape(-1, V), tgt_out.reshape(-1), ignore_index=0)
    opt.zero_grad(set_to_none=True)
    loss.backward()
    opt.step()
    return time.perf_counter() - start


def infer_step(model: nn.Module, batch) -> float:
    """Seconds for one forward pass on one batch (eval mode, no gradients)."""
    src, tgt_in, _ = batch
    model.eval()
    start = time.perf_counter()
    with torch.inference_mode():
        model(src, tgt_in)
    return time.perf_counter() - start


def alternate(step, models: dict, data: list, repeats: int) -> dict[str, float]:
    """Median seconds per step of each model, timing them in alternation (ABBA...) so load on the machine hits both."""
    times = {name: [] for name in models}
    for i in range(repeats):
        names = list(models) if i % 2 == 0 else list(models)[::-1]
        for name in names:
            times[name].append(step(name, data[i % len(data)]))
    return {name: statistics.median(t) for name, t in times.items()}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="fewer repeats, under 40 s on an idle 2-core CPU")
    parser.add_argument("--repeats", type=int, default=None, help="timed steps per model (median reported)")
    parser.add_argument("--threads", type=int, default=None, help="CPU threads for torch (default: torch's choice)")
    args = parser.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    repeats = args.repeats or (4 if args.quick else 15)
    warnings.filterwarnings("ignore", message=".*nested.tensor")

    torch.manual_seed(0)
    config = TransformerConfig(vocab_size=V, d_model=D, n_heads=H, n_encoder_layers=N_LAYERS, n_decoder_layers=N_LAYERS,
                               d_ff=D_FF, dropout=0.1, max_len=64, final_norm=True)  # final norms as nn.Transformer
    models = {"ours": Transformer(config), "nn.Transformer": Reference()}
    optims = {name: torch.optim.AdamW(m.parameters(), lr=1e-4) for name, m in models.items()}
    data = batches(4)
    counts = ", ".join(f"{name} {sum(p.numel() for p in m.parameters()):,}" for name, m in models.items())
    print(f"torch {torch.__version__}, {torch.get_num_threads()} threads; batch {B} x {L}; parameters: {counts}")

    for name, m in models.items():  # warm-up
        train_step(m, optims[name], data[0])
        infer_step(m, data[0])
    train = alternate(lambda name, b: train_step(models[name], optims[name], b), models, data, repeats)
    infer = alternate(lambda name, b: infer_step(models[name], b), models, data, repeats)

    tokens = B * L  # target positions per step
    for label, med in (("training", train), ("inference", infer)):
        print(f"{label:9}  ours {tokens / med['ours']:8.0f} tok/s   nn.Transformer {tokens / med['nn.Transformer']:8.0f} "
              f"tok/s   ours/reference {med['nn.Transformer'] / med['ours']:.3f}")
    print(f"ratio={train['nn.Transformer'] / train['ours']:.3f}")


if __name__ == "__main__":
    main()
