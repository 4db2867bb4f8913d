"""Training throughput and peak memory of the `cpu` preset, ours beside a plain torch.nn.Transformer.

Both models have the cpu preset's shape and precision (read from PRESETS["cpu"]: d_model 256, 4 heads, 3+3
layers, d_ff 1024, dropout 0.1, the joint 8000-token vocabulary, tied embeddings) and take the same training
step on the same real Multi30k batches (token-count batches of the preset's max_tokens): LabelSmoothingLoss on
the real target positions, Adam with the paper's betas and the Noam schedule, gradient clipping. Throughput
counts real (non-pad) source + target tokens per second; repeats alternate between the two models, after
warm-up, and the median is reported. Peak memory is the process's maximum resident set size
(resource.getrusage) after our model's steps, before the reference model exists. Without --quick it also
times our step in the other precision (float32 or bf16 autocast) and runs `train()` itself for 60 steps,
printing the throughput it logs (batching and logging included).

The machine this runs on may be shared: absolute numbers are noisy, the side-by-side ratio less so.
Last line: ratio=<our tokens/s / reference tokens/s> (1.0 or more: ours is no slower).
"""
import argparse
import json
import math
import resource
import statistics
import tempfile
import time
from pathlib import Path

import torch
from torch import nn

from transformer_lib.positional import sinusoidal_encoding
from transformer_lib.tokenizer import multi30k_tokenizer
from transformer_lib.config import TrainConfig
from transformer_lib.training_run import train
from transformer_lib.recipe import LabelSmoothingLoss, NoamSchedule, batch_loss
from transformer_lib.runtime import cpu_has_native_bf16, resolve_amp
from transformer_lib.model import Transformer

from preset_batches import real_batches  # benchmarks/, beside this script


class Reference(nn.Module):
    """torch.nn.Transformer with tied embeddings scaled by sqrt(D), sinusoidal positions and a log-softmax generator."""

    def __init__(self, vocab_size: int, config: TrainConfig) -> None:
        super().__init__()
        self.d_model = config.d_model
        self.embed = nn.Embedding(vocab_size, config.d_model, padding_idx=0)
        self.register_buffer("pe", sinusoidal_encoding(512, config.d_model))
        self.dropout = nn.Dropout(config.dropout)
        self.transformer = nn.Transformer(
            config.d_model, config.n_heads, config.n_encoder_layers, config.n_decoder_layers, config.d_ff,
            config.dropout, batch_first=True, norm_first=config.norm_first)
        self.out = nn.Linear(config.d_model, vocab_size)
        self.out.weight = self.embed.weight

    def _embed(self, ids: torch.Tensor) -> torch.Tensor:
        return self.dropout(self.embed(ids) * math.sqrt(self.d_model) + self.pe[: ids.shape[1]])  # (B, L, D)

    def loss(self, batch, criterion: LabelSmoothingLoss) -> torch.Tensor:
        """The same summed label-smoothed loss as batch_loss, through nn.Transformer."""
        src_pad, tgt_pad = batch.src == 0, batch.tgt_in == 0  # True = padding (nn.Transformer's convention)
        causal = nn.Transformer.generate_square_subsequent_mask(batch.tgt_in.shape[1], dtype=torch.bool)
        hidden = self.transformer(self._embed(batch.src), self._embed(batch.tgt_in), tgt_mask=causal,
                                  src_key_padding_mask=src_pad, tgt_key_padding_mask=tgt_pad,
                                  memory_key_padding_mask=src_pad, tgt_is_causal=True)  # (B, T, D)
        keep = batch.tgt_out != 0  # (B, T)
        return criterion(self.out(hidden[keep]).log_softmax(-1), batch.tgt_out[keep])


def step_fn(model: nn.Module, loss_of, config: TrainConfig, amp: torch.dtype | None):
    """One optimiser step of `model`, as train() takes it."""
    optimizer = torch.optim.Adam(model.parameters(), lr=1.0, betas=config.betas, eps=config.eps)
    schedule = NoamSchedule(optimizer, config.d_model, config.warmup, config.lr_factor)

    def step(batch) -> None:
        with torch.autocast("cpu", dtype=amp, enabled=amp is not None):
            loss = loss_of(batch)
        optimizer.zero_grad(set_to_none=True)
        (loss / batch.n_tgt_tokens).backward()
        nn.utils.clip_grad_norm_(model.parameters(), config.clip_grad_norm)
        optimizer.step()
        schedule.step()

    return step


def tokens_per_second(step, batches) -> float:
    """Real source + target tokens per second over one pass through `batches`."""
    start = time.perf_counter()
    for batch in batches:
        step(batch)
    return sum(b.n_src_tokens + b.n_tgt_tokens for b in batches) / (time.perf_counter() - start)


def peak_rss_mb() -> float:
    """The process's peak resident memory so far, in MB (ru_maxrss is in kB on Linux)."""
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="fewer batches and repeats (under 40 s)")
    parser.add_argument("--threads", type=int, help="torch.set_num_threads (default: PyTorch's choice)")
    args = parser.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    n_batches, repeats = (2, 2) if args.quick else (8, 5)

    config = TrainConfig.from_preset("cpu")
    amp = resolve_amp(config.amp, torch.device("cpu"))
    precision = "float32" if amp is None else f"{str(amp).replace('torch.', '')} autocast"
    tokenizer = multi30k_tokenizer(config.vocab_size)
    batches = real_batches(config, tokenizer, 3000, n_batches)
    criterion = LabelSmoothingLoss(tokenizer.vocab_size, smoothing=config.label_smoothing, reduction="sum")
    print(f"cpu preset: d_model {config.d_model}, {config.n_heads} heads, {config.n_encoder_layers}+"
          f"{config.n_decoder_layers} layers, d_ff {config.d_ff}, vocabulary {tokenizer.vocab_size}, "
          f"max_tokens {config.max_tokens}, {precision}; {torch.get_num_threads()} threads, torch {torch.__version__}")
    print(f"{len(batches)} batches per repeat, {sum(b.src.shape[0] for b in batches) / len(batches):.0f} "
          f"sentences per batch on average, {repeats} repeats, median reported")

    torch.manual_seed(0)
    ours = Transformer(config.model_config(tokenizer.vocab_size))
    ours_step = step_fn(ours, lambda b: batch_loss(ours, b, criterion)[0], config, amp)
    tokens_per_second(ours_step, batches[:1])  # warm-up
    ours_runs = [tokens_per_second(ours_step, batches)]
    print(f"peak memory (max RSS) after our training steps: {peak_rss_mb():.0f} MB; "
          f"parameters {sum(p.numel() for p in ours.parameters()) / 1e6:.2f} M")

    torch.manual_seed(0)
    ref = Reference(tokenizer.vocab_size, config)
    ref_step = step_fn(ref, lambda b: ref.loss(b, criterion), config, amp)
    tokens_per_second(ref_step, batches[:1])  # warm-up
    ref_runs = []
    for _ in range(repeats):
        ref_runs.append(tokens_per_second(ref_step, batches))
        if len(ours_runs) < repeats:
            ours_runs.append(tokens_per_second(ours_step, batches))
    ours_tps, ref_tps = statistics.median(ours_runs), statistics.median(ref_runs)
    print(f"ours ({precision}):                 {ours_tps:8.0f} tokens/s")
    print(f"torch.nn.Transformer ({precision}): {ref_tps:8.0f} tokens/s")

    if not args.quick:
        other = torch.bfloat16 if amp is None else None
        if other is None or cpu_has_native_bf16():
            other_step = step_fn(ours, lambda b: batch_loss(ours, b, criterion)[0], config, other)
            tokens_per_second(other_step, batches[:1])
            other_tps = statistics.median(tokens_per_second(other_step, batches) for _ in range(3))
            print(f"ours ({'float32' if other is None else 'bf16 autocast'}):               {other_tps:8.0f} tokens/s")
        else:
            print("ours (bf16 autocast): not timed, this CPU has no bfloat16 instructions (emulated in float32 arithmetic)")
        with tempfile.TemporaryDirectory() as tmp:
            run = TrainConfig.from_preset("cpu", max_steps=60, log_every=20, train_subset=6000, average_last=1)
            train(run, Path(tmp) / "run", progress=False, tokenizer=tokenizer)
            records = [json.loads(x) for x in (Path(tmp) / "run" / "metrics.jsonl").read_text().splitlines()]
            logged = [r["tokens_per_s"] for r in records if r["kind"] == "train"][1:]  # the first window warms up
            print(f"train() end to end (cpu preset, steps 21-60): {statistics.median(logged):8.0f} tokens/s")
        print(f"peak memory (max RSS) of the whole benchmark: {peak_rss_mb():.0f} MB")
    print(f"ratio={ours_tps / ref_tps:.2f}")


if __name__ == "__main__":
    main()
