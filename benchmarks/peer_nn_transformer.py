"""The peer: the translator a reader would write from PyTorch's own parts, trained for the same minutes as ours.

What it is: the encoder-decoder of PyTorch's translation tutorial. Separate source and target embeddings scaled
by sqrt(D) plus a sinusoidal encoding, `torch.nn.Transformer` (post-LN, batch_first), a `nn.Linear` generator.
It has the shape of our `cpu` preset (d_model 256, 4 heads, 3+3 layers, d_ff 1024) and the nn.Transformer
default dropout of 0.1. It uses the same Multi30k data and the same joint BPE tokenizer as ours (`--vocab-size`,
default the cpu preset's).

The recipe is the standard one:
- shuffled batches of 128 sentences;
- float32;
- `nn.CrossEntropyLoss(label_smoothing=0.1)` over the real target positions;
- Adam (betas 0.9/0.98, eps 1e-9) with linear warm-up to 5e-4 over 500 steps, then inverse-square-root decay;
- the last weights;
- greedy decoding, the decoder re-run on the whole prefix at each step.

The clock counts training steps only, as ours does (tokenizer, data and scoring are outside it). At the end it
translates val and test2016 and scores them with sacreBLEU (cased and lower-cased, the same `bleu` as chapter 13).
It writes the fields of results/*.json.

Usage: python benchmarks/peer_nn_transformer.py [--minutes 30] [--out results/peer_nn_transformer.json]
The last line is bleu_test2016=<cased score>.
"""
import argparse
import warnings
import json
import math
import os
import platform
import random
import sys
import time
from datetime import date
from pathlib import Path

import torch
from torch import nn

from transformer_lib.data import load_multi30k
from transformer_lib.tokenizer import BOS_ID, EOS_ID, PAD_ID, multi30k_tokenizer
from transformer_lib.config import PRESETS
from transformer_lib.translate import bleu

warnings.filterwarnings("ignore", message="The PyTorch API of nested tensors")  # nn.Transformer in eval

BATCH_SENTENCES, PEAK_LR, WARMUP, LABEL_SMOOTHING = 128, 5e-4, 500, 0.1


class Seq2SeqTransformer(nn.Module):
    """Embeddings * sqrt(D) + sinusoidal positions -> nn.Transformer -> Linear, as PyTorch's tutorial builds it."""

    def __init__(self, vocab_size: int, d_model: int, n_heads: int, n_layers: int, d_ff: int, dropout: float,
                 max_len: int = 512) -> None:
        super().__init__()
        self.d_model = d_model
        self.src_embed = nn.Embedding(vocab_size, d_model)
        self.tgt_embed = nn.Embedding(vocab_size, d_model)
        position = torch.arange(max_len).unsqueeze(1)  # (L, 1)
        rate = torch.exp(torch.arange(0, d_model, 2) * (-math.log(10000.0) / d_model))  # (D/2,)
        pe = torch.zeros(max_len, d_model)  # (L, D)
        pe[:, 0::2], pe[:, 1::2] = torch.sin(position * rate), torch.cos(position * rate)
        self.register_buffer("pe", pe)
        self.dropout = nn.Dropout(dropout)
        self.transformer = nn.Transformer(d_model, n_heads, n_layers, n_layers, d_ff, dropout, batch_first=True)
        self.generator = nn.Linear(d_model, vocab_size)

    def embed(self, table: nn.Embedding, ids: torch.Tensor) -> torch.Tensor:
        return self.dropout(table(ids) * math.sqrt(self.d_model) + self.pe[: ids.shape[1]])  # (B, L, D)

    def encode(self, src: torch.Tensor) -> torch.Tensor:
        return self.transformer.encoder(self.embed(self.src_embed, src), src_key_padding_mask=src == PAD_ID)

    def decode(self, tgt: torch.Tensor, memory: torch.Tensor, src_pad: torch.Tensor) -> torch.Tensor:
        causal = nn.Transformer.generate_square_subsequent_mask(tgt.shape[1], dtype=torch.bool)  # (T, T)
        hidden = self.transformer.decoder(self.embed(self.tgt_embed, tgt), memory, tgt_mask=causal,
                                          tgt_key_padding_mask=tgt == PAD_ID, memory_key_padding_mask=src_pad,
                                          tgt_is_causal=True)  # (B, T, D)
        return self.generator(hidden)  # (B, T, V)

    def forward(self, src: torch.Tensor, tgt_in: torch.Tensor) -> torch.Tensor:
        return self.decode(tgt_in, self.encode(src), src == PAD_ID)  # (B, T, V)


def pad(seqs: list[list[int]]) -> torch.Tensor:
    """Right-padded (B, L) id tensor."""
    out = torch.full((len(seqs), max(map(len, seqs))), PAD_ID, dtype=torch.long)
    for k, s in enumerate(seqs):
        out[k, : len(s)] = torch.tensor(s)
    return out


def rate(step: int) -> float:
    """Linear warm-up to PEAK_LR, then inverse-square-root decay."""
    step = max(step, 1)
    return PEAK_LR * min(step / WARMUP, math.sqrt(WARMUP / step))


@torch.no_grad()
def greedy(model: Seq2SeqTransformer, sources: list[list[int]], batch_size: int = 128) -> list[list[int]]:
    """Greedy translations (ids without specials) of id sequences, the decoder re-run on the whole prefix."""
    model.eval()
    outputs: list[list[int]] = []
    for start in range(0, len(sources), batch_size):
        src = pad([s + [EOS_ID] for s in sources[start: start + batch_size]])  # (B, S)
        memory, src_pad = model.encode(src), src == PAD_ID  # (B, S, D), (B, S)
        ys = torch.full((src.shape[0], 1), BOS_ID, dtype=torch.long)  # (B, 1)
        done = torch.zeros(src.shape[0], dtype=torch.bool)  # (B,)
        for _ in range(src.shape[1] + 50):
            next_id = model.decode(ys, memory, src_pad)[:, -1].argmax(-1)  # (B,)
            next_id = next_id.masked_fill(done, PAD_ID)
            ys = torch.cat([ys, next_id[:, None]], dim=1)  # (B, t + 1)
            done |= next_id == EOS_ID
            if done.all():
                break
        for row in ys[:, 1:].tolist():
            outputs.append([i for i in row[: row.index(EOS_ID)] if i != PAD_ID] if EOS_ID in row else row)
    return outputs


def main() -> None:
    cpu = PRESETS["cpu"]
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--minutes", type=float, default=30.0, help="training minutes (the clock of train())")
    parser.add_argument("--vocab-size", type=int, default=cpu.get("vocab_size", 8000))
    parser.add_argument("--train-subset", type=int, default=None, help="train on the first N pairs (smoke tests)")
    parser.add_argument("--eval-subset", type=int, default=None, help="score the first N pairs of each split")
    parser.add_argument("--threads", type=int, default=None)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--data-dir", default=None)
    parser.add_argument("--out", default=None, help="write the results JSON here")
    parser.add_argument("--quick", action="store_true", help="a smoke run: half a minute, 2000 pairs, 100 scored")
    args = parser.parse_args()
    if args.quick:
        args.minutes, args.train_subset, args.eval_subset = 0.5, args.train_subset or 2000, args.eval_subset or 100
    if args.threads:
        torch.set_num_threads(args.threads)
    torch.manual_seed(args.seed)
    random.seed(args.seed)

    tokenizer = multi30k_tokenizer(args.vocab_size, args.data_dir)
    pairs = load_multi30k("train", args.data_dir)[: args.train_subset]
    src_ids, tgt_ids = tokenizer.encode_batch([d for d, _ in pairs]), tokenizer.encode_batch([e for _, e in pairs])
    model = Seq2SeqTransformer(tokenizer.vocab_size, cpu["d_model"], cpu["n_heads"], cpu["n_encoder_layers"],
                               cpu["d_ff"], dropout=0.1)
    optimizer = torch.optim.Adam(model.parameters(), lr=PEAK_LR, betas=(0.9, 0.98), eps=1e-9)
    schedule = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda step: rate(step + 1) / PEAK_LR)
    criterion = nn.CrossEntropyLoss(ignore_index=PAD_ID, label_smoothing=LABEL_SMOOTHING)
    n_params = sum(p.numel() for p in model.parameters())
    print(f"{n_params / 1e6:.1f}M parameters; {len(pairs)} pairs; {args.minutes} minutes on "
          f"{torch.get_num_threads()} threads", flush=True)

    step, epoch, real, padded, loss_sum, elapsed = 0, 0, 0, 0, 0.0, 0.0
    model.train()
    while elapsed < 60 * args.minutes:
        order = list(range(len(pairs)))
        random.shuffle(order)
        epoch += 1
        for start in range(0, len(order), BATCH_SENTENCES):
            t0 = time.perf_counter()
            idx = order[start: start + BATCH_SENTENCES]
            src = pad([src_ids[i] + [EOS_ID] for i in idx])  # (B, S)
            tgt_in = pad([[BOS_ID] + tgt_ids[i] for i in idx])  # (B, T)
            tgt_out = pad([tgt_ids[i] + [EOS_ID] for i in idx])  # (B, T)
            logits = model(src, tgt_in)  # (B, T, V)
            loss = criterion(logits.reshape(-1, logits.shape[-1]), tgt_out.reshape(-1))
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            optimizer.step()
            schedule.step()
            step += 1
            real += int((src != PAD_ID).sum() + (tgt_out != PAD_ID).sum())
            padded += src.numel() + tgt_out.numel()
            loss_sum += loss.item()
            elapsed += time.perf_counter() - t0
            if step % 50 == 0:
                print(f"epoch {epoch} step {step}: loss {loss_sum / 50:.3f}, {real / elapsed:.0f} real tokens/s, "
                      f"{elapsed / 60:.1f} min", flush=True)
                loss_sum = 0.0
            if elapsed >= 60 * args.minutes:
                break

    scores = {}
    for split in ("val", "test2016"):
        test_pairs = load_multi30k(split, args.data_dir)[: args.eval_subset]
        hyps = greedy(model, tokenizer.encode_batch([d for d, _ in test_pairs]))
        scores[split] = bleu([tokenizer.decode(h) for h in hyps], [e for _, e in test_pairs])
        print(f"{split}: BLEU {scores[split]['cased']} cased, {scores[split]['lowercase']} lower-cased", flush=True)
    result = {
        "preset": "peer: torch.nn.Transformer",
        "command": "python benchmarks/peer_nn_transformer.py " + " ".join(sys.argv[1:]),
        "device": f"CPU, {os.cpu_count()} cores ({platform.machine()})",
        "torch_version": torch.__version__,
        "precision": "float32",
        "train_minutes": round(elapsed / 60, 1),
        "steps": step,
        "epochs": round(epoch - 1 + (start + len(idx)) / len(order), 2),
        "parameters": n_params,
        "tokens_per_s": round(real / elapsed),
        "padding": round(1 - real / padded, 3),
        "decoding": {"beam_size": 1, "alpha": None},
        "bleu": {split: {"cased": s["cased"], "lowercase": s["lowercase"]} for split, s in scores.items()},
        "signature": scores["val"]["signature"],
        "date": date.today().isoformat(),
        "recipe": {"batch": f"{BATCH_SENTENCES} shuffled sentences", "precision": "float32",
                   "optimizer": "Adam (0.9, 0.98), eps 1e-9", "schedule": f"linear warm-up to {PEAK_LR} over "
                   f"{WARMUP} steps, then 1/sqrt(step)", "label_smoothing": LABEL_SMOOTHING, "dropout": 0.1,
                   "embeddings": "separate source, target and output", "weights": "the last",
                   "vocab_size": tokenizer.vocab_size},
    }
    if args.out:
        Path(args.out).write_text(json.dumps(result, indent=2) + "\n", encoding="utf-8")
    print(f"bleu_test2016={scores['test2016']['cased']}")


if __name__ == "__main__":
    main()
