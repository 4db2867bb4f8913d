"""How fast the command line translates test2016 (1,000 German sentences) with beam search, and the same inside Python.

1. `transformer-lib translate --checkpoint RUN --input test2016.de --beam 4` as a new process: the wall-clock
   time a user waits, start-up, model loading and writing included.
2. `Translator.translate` in this process, for a few batch sizes (the command line's default is 128), with the
   translations checked to be the same for every batch size; first at batch 128 with the C library's default
   allocator settings, then after `keep_freed_memory()` (transformer_lib.runtime), which the command line calls; then one
   batch at a time on all threads (workers=1) against one batch per core (the default), alternated.
3. Beam search as the previous release ran it: finished sentences kept in the batch, every cache reordered each step:
   the reference, for the ratio on the last line.

Usage: python benchmarks/translate_speed.py [RUN_DIR] [--beam 4] [--threads N] [--quick]
RUN_DIR defaults to book/runs/cpu (`transformer-lib train --preset cpu --out book/runs/cpu`). --quick translates
the first 100 sentences only, with an untrained model of the cpu preset's shape when RUN_DIR holds no model.
The last line is ratio=<time of the previous release's decoding / time of today's> (above 1: today's is faster).
"""
import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch

from transformer_lib import decoding, translate
from transformer_lib.data import load_multi30k
from transformer_lib.model import Transformer
from transformer_lib.tokenizer import multi30k_tokenizer
from transformer_lib.checkpoints import CHECKPOINT_FORMAT, save_checkpoint
from transformer_lib.config import TrainConfig
from transformer_lib.runtime import keep_freed_memory
from transformer_lib.translate import Translator


def timed_translate(translator: Translator, sentences: list[str], beam: int, batch_size: int) -> tuple[float, list[str]]:
    start = time.perf_counter()
    out = translator.translate(sentences, beam, batch_size)
    return time.perf_counter() - start, out


def greedy_keeping_finished(model, src: torch.Tensor, max_len: int | None = None) -> list[list[int]]:
    """Greedy decoding as it was before finished sentences left the batch: every row runs until the last ends."""
    cfg = model.config
    steps = decoding.output_budget(model, src, max_len)
    with decoding.evaluating(model):
        memory, src_mask = model.encode(src)  # (B, S, D), (B, 1, 1, S)
        cache = model.new_cache()
        ys = src.new_full((src.size(0), 1), cfg.bos_id)  # (B, 1)
        done = torch.zeros(src.size(0), dtype=torch.bool, device=src.device)  # (B,)
        for _ in range(steps):
            log_probs = decoding.next_token_log_probs(model, ys, memory, src_mask, cache)  # (B, V)
            token = log_probs.argmax(dim=-1).masked_fill(done, cfg.pad_id)  # (B,)
            ys = torch.cat([ys, token[:, None]], dim=1)  # (B, t + 1)
            done |= token == cfg.eos_id
            if done.all():
                break
    return [decoding.until_eos(row, cfg.eos_id) for row in ys[:, 1:].tolist()]


def beam_keeping_finished(model, src: torch.Tensor, beam_size: int = 4, alpha: float = 0.6,
                          max_len: int | None = None) -> list[list[int]]:
    """Beam search as it was before complete sentences left the batch (their rows ran on with score -inf)."""
    cfg = model.config
    B, K = src.size(0), beam_size
    steps = decoding.output_budget(model, src, max_len)
    finished = [[] for _ in range(B)]
    with decoding.evaluating(model):
        memory, src_mask = model.encode(src)  # (B, S, D), (B, 1, 1, S)
        memory, src_mask = memory.repeat_interleave(K, dim=0), src_mask.repeat_interleave(K, dim=0)
        cache = model.new_cache()
        ys = src.new_full((B * K, 1), cfg.bos_id)  # (B*K, 1)
        scores = torch.full((B, K), float("-inf"), device=src.device)  # (B, K)
        scores[:, 0] = 0.0
        for t in range(1, steps + 1):
            log_probs = decoding.next_token_log_probs(model, ys, memory, src_mask, cache)  # (B*K, V)
            V = log_probs.size(-1)
            top, flat = (scores[:, :, None] + log_probs.view(B, K, V)).view(B, K * V).topk(2 * K, dim=-1)
            beam, token = flat // V, flat % V  # (B, 2K)
            is_eos = token == cfg.eos_id
            for b, j in (is_eos[:, :K] & (top[:, :K] > float("-inf"))).nonzero().tolist():
                if len(finished[b]) < K:
                    finished[b].append((top[b, j].item() / decoding.length_penalty(t, alpha),
                                        ys[b * K + beam[b, j].item(), 1:].tolist()))
            keep = is_eos.to(torch.int8).argsort(dim=-1, stable=True)[:, :K]  # (B, K)
            rows = (torch.arange(B, device=src.device)[:, None] * K + beam.gather(1, keep)).view(-1)  # (B*K,)
            ys = torch.cat([ys.index_select(0, rows), token.gather(1, keep).view(-1, 1)], dim=1)
            for layer_cache in cache:
                layer_cache.reorder(rows)
            complete = torch.tensor([len(f) == K for f in finished], device=src.device)  # (B,)
            scores = top.gather(1, keep).masked_fill(complete[:, None], float("-inf"))  # (B, K)
            if complete.all():
                break
    for b in range(B):
        if len(finished[b]) < K:
            finished[b] += [(scores[b, k].item() / decoding.length_penalty(steps, alpha), ys[b * K + k, 1:].tolist())
                            for k in range(K) if scores[b, k] > float("-inf")]
    greedy = greedy_keeping_finished(model, src, steps)
    for b, score in enumerate(decoding.sequence_scores(model, src, greedy, alpha, steps).tolist()):
        finished[b].append((score, greedy[b]))
    return [max(f, key=lambda scored: scored[0])[1] for f in finished]


def untrained_run(folder: Path) -> Path:
    """A run folder holding an untrained model of the cpu preset's shape (for --quick without a trained run)."""
    config = TrainConfig.from_preset("cpu")
    tokenizer = multi30k_tokenizer(config.vocab_size)
    torch.manual_seed(0)
    model = Transformer(config.model_config(tokenizer.vocab_size))
    save_checkpoint({"format": CHECKPOINT_FORMAT, "kind": "model", "model": model.state_dict(),
                     "tokenizer": tokenizer.to_dict(), "model_config": model.config.to_dict(),
                     "train_config": config.to_dict(), "step": 0, "epoch": 0, "history": []}, folder / "model.pt")
    print("an untrained model (no trained run given): the times are for outputs of the full length")
    return folder


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("run_dir", type=Path, nargs="?", default=Path("book/runs/cpu"))
    parser.add_argument("--quick", action="store_true", help="100 sentences; an untrained model if none is saved")
    parser.add_argument("--beam", type=int, default=4)
    parser.add_argument("--threads", type=int, default=None)
    args = parser.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    sentences = [de for de, _ in load_multi30k("test2016")][: 100 if args.quick else None]
    if not (args.run_dir / "model.pt").is_file():
        if not args.quick:
            sys.exit(f"no model.pt in {args.run_dir}: train one with transformer-lib train --preset cpu --out "
                     f"{args.run_dir}, or pass --quick")
        args.run_dir = untrained_run(Path(tempfile.mkdtemp()))
    print(f"torch {torch.__version__}, {torch.get_num_threads()} threads, {os.cpu_count()} cores; "
          f"{len(sentences)} sentences, beam {args.beam}")

    with tempfile.TemporaryDirectory() as tmp:
        source = Path(tmp) / "test2016.de"
        source.write_text("\n".join(sentences) + "\n", encoding="utf-8")
        command = [sys.executable, "-m", "transformer_lib", "translate", "--checkpoint", str(args.run_dir),
                   "--input", str(source), "--output", str(Path(tmp) / "out.en"), "--beam", str(args.beam),
                   "--quiet"]
        start = time.perf_counter()
        subprocess.run(command, check=True)
        cli_seconds = time.perf_counter() - start
        cli_out = (Path(tmp) / "out.en").read_text(encoding="utf-8").splitlines()
    print(f"command line: {cli_seconds:.1f} s, {len(sentences) / cli_seconds:.0f} sentences/s")

    translator = Translator.from_checkpoint(args.run_dir, "cpu")
    translator.translate(sentences[:64], args.beam)  # warm-up
    seconds, default_out = timed_translate(translator, sentences, args.beam, 128)
    print(f"Translator.translate, batch 128, the allocator's defaults: {seconds:.1f} s, "
          f"{len(sentences) / seconds:.0f} sentences/s")
    print("keep_freed_memory():", keep_freed_memory())
    outputs = {}
    for batch_size in (64, 128, 256):
        seconds, outputs[batch_size] = timed_translate(translator, sentences, args.beam, batch_size)
        print(f"Translator.translate, batch {batch_size:3}: {seconds:.1f} s, {len(sentences) / seconds:.0f} sentences/s")
    same = all(out == cli_out for out in [default_out, *outputs.values()])
    print("the same translations for every batch size and the command line:", same)
    times = {1: [], None: []}
    for _ in range(1 if args.quick else 3):
        for workers in times:
            start = time.perf_counter()
            same &= translator.translate(sentences, args.beam, 128, workers=workers) == cli_out
            times[workers].append(time.perf_counter() - start)
    one_at_a_time, per_core = (statistics.median(t) for t in times.values())
    print(f"batch 128, one batch at a time on {torch.get_num_threads()} threads: {one_at_a_time:.1f} s; one batch "
          f"per core: {per_core:.1f} s (median of {len(times[1])}); the same translations: {same}")

    fast, _ = timed_translate(translator, sentences, args.beam, 128)
    translate.beam_search, translate.greedy_decode = beam_keeping_finished, greedy_keeping_finished
    try:
        slow, kept_out = timed_translate(translator, sentences, args.beam, 128)
    finally:
        translate.beam_search, translate.greedy_decode = decoding.beam_search, decoding.greedy_decode
    print(f"batch 128, the previous release's decoding: {slow:.1f} s; today's: {fast:.1f} s")
    print("the same translations either way:", kept_out == outputs[128])
    print(f"ratio={slow / fast:.2f}")


if __name__ == "__main__":
    main()
