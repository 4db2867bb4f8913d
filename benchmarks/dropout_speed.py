"""What dropout inside attention and the feed-forward network costs a training step on the CPU, and which
attention kernel trains fastest without it.

The `cpu` preset's model (D 256, 4 heads, 3+3 layers, F 1024, vocabulary 8000) takes optimisation steps on the first
real batches of Multi30k (batches of the preset's max_tokens, as the trainer cuts them), under bfloat16 autocast
where the processor computes it natively (else float32), in three settings:

1. `everywhere`: dropout 0.1 on sub-layer outputs, embeddings, attention weights and the feed-forward network's hidden
   units (the preset before it set attention_dropout=0, ffn_dropout=0; PyTorch's layers do the same). Attention
   dropout rules out the flash kernel, so attention runs on the math kernel.
2. `residual, flash`: dropout 0.1 on sub-layer outputs and embeddings only (the paper's), PyTorch's default kernel.
3. `residual, math`: the same, with the math kernel, as the trainer runs training steps on the CPU.

The three run in alternation, step by step, each with its own model and Adam, so load on the machine hits them alike;
the median step time of each is reported as tokens (source + target) per second.

Usage: python benchmarks/dropout_speed.py [--steps N] [--threads N] [--quick]
The last line is ratio=<time of `everywhere` / time of `residual, math`> (above 1: residual-only dropout is faster).
"""
import argparse
import statistics
import time
from contextlib import nullcontext

import torch

from transformer_lib.data import load_multi30k
from transformer_lib.model import Transformer
from transformer_lib.recipe import LabelSmoothingLoss, batch_loss, encode_pairs, make_batch, token_batches
from transformer_lib.tokenizer import multi30k_tokenizer
from transformer_lib.config import TrainConfig
from transformer_lib.runtime import autocast, resolve_amp, training_attention

SETTINGS = {  # name: (attention_dropout, ffn_dropout, use the trainer's CPU kernel choice)
    "everywhere": (0.1, 0.1, True),
    "residual, flash": (0.0, 0.0, False),
    "residual, math": (0.0, 0.0, True),
}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=None, help="timed steps per setting (median reported)")
    parser.add_argument("--threads", type=int, default=None, help="CPU threads for torch (default: torch's choice)")
    parser.add_argument("--quick", action="store_true", help="10 timed steps per setting")
    args = parser.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    steps = args.steps or (10 if args.quick else 60)

    device = torch.device("cpu")
    config = TrainConfig.from_preset("cpu", dropout=0.1)
    amp = resolve_amp(config.amp, device)
    tokenizer = multi30k_tokenizer(config.vocab_size)
    src, tgt = encode_pairs(load_multi30k("train"), tokenizer, config.max_sentence_len)
    src_lens, tgt_lens = [len(s) + 1 for s in src], [len(t) + 1 for t in tgt]
    batches = token_batches(src_lens, tgt_lens, config.max_tokens, seed=0, epoch=0)[: steps + 3]
    criterion = LabelSmoothingLoss(tokenizer.vocab_size, tokenizer.pad_id, config.label_smoothing, reduction="sum")
    print(f"torch {torch.__version__}, {torch.get_num_threads()} threads, {amp or torch.float32}; "
          f"batches of {config.max_tokens:,} tokens; {steps} timed steps per setting")

    runs = {}
    for name, (attention_dropout, ffn_dropout, trainer_kernel) in SETTINGS.items():
        torch.manual_seed(0)
        setting = TrainConfig.from_preset("cpu", dropout=0.1, attention_dropout=attention_dropout, ffn_dropout=ffn_dropout)
        model = Transformer(setting.model_config(tokenizer.vocab_size))
        optimizer = torch.optim.Adam(model.parameters(), lr=1e-4, betas=config.betas, eps=config.eps)
        runs[name] = (model.train(), optimizer, trainer_kernel)

    def step(name: str, idx: list[int]) -> float:
        model, optimizer, trainer_kernel = runs[name]
        batch = make_batch([src[i] for i in idx], [tgt[i] for i in idx])
        start = time.perf_counter()
        optimizer.zero_grad(set_to_none=True)
        with autocast(device, amp), training_attention(device) if trainer_kernel else nullcontext():
            loss, _ = batch_loss(model, batch, criterion)
        (loss / batch.n_tgt_tokens).backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), config.clip_grad_norm)
        optimizer.step()
        return time.perf_counter() - start

    for name in runs:  # warm-up
        for idx in batches[:3]:
            step(name, idx)
    times = {name: [] for name in runs}  # seconds per token of each step
    for k, idx in enumerate(batches[3:]):
        order = list(runs) if k % 2 == 0 else list(runs)[::-1]
        for name in order:
            times[name].append(step(name, idx) / sum(src_lens[i] + tgt_lens[i] for i in idx))
    per_token = {name: statistics.median(t) for name, t in times.items()}
    for name, seconds in per_token.items():
        print(f"{name:16} {1 / seconds:8.0f} tokens/s   {per_token['everywhere'] / seconds:.2f}x `everywhere`")
    print(f"ratio={per_token['everywhere'] / per_token['residual, math']:.3f}")


if __name__ == "__main__":
    main()
