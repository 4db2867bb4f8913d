"""The `cpu` preset's training step on the CPU, eager beside torch.compile, on the preset's real batches.

Both sides take the trainer's own optimiser step (`OptimiserStep`: the loss computation, Adam, gradient clipping;
the schedule is left where it starts, which changes no timing) in the preset's precision (`amp=auto`: bfloat16 autocast where the CPU computes it in hardware,
else float32), on the same Multi30k token batches of the preset's `max_tokens`, from two copies of one
initialised model. The compiled side is what `--set compile=true` trains: one dynamic graph (the preset has no
length buckets). Compile time is the first pass over the batches on the compiled side less the eager side's time
for the same pass (in wall seconds, and in this process's CPU seconds, which leave out the compiler's processes); the late inner-dropout switch changes the rates the graph holds, so it compiles again, and that
is timed too. After warm-up the two sides take the timed passes in alternation (ABBA...), so that load on the
machine hits both alike; the median seconds per pass is reported.

The preset compiles on the CPU only if compiling wins 15% or more of the tokens its hour trains, compile time
included; the last lines say whether it does.

Usage: python benchmarks/train_cpu_compiled.py [--quick] [--batches N] [--repeats N] [--json PATH]
Last line: ratio=<compiled tokens/s / eager tokens/s>, compile time excluded.
"""
import argparse
import copy
import dataclasses
import json
import platform
import statistics
import time
from pathlib import Path

import torch

from transformer_lib.config import TrainConfig
from transformer_lib.distributed import Processes
from transformer_lib.model import Transformer
from transformer_lib.recipe import LabelSmoothingLoss
from transformer_lib.runtime import cpu_flags, resolve_amp
from transformer_lib.tokenizer import multi30k_tokenizer
from transformer_lib.training_step import InnerDropout, OptimiserStep

from preset_batches import real_batches  # benchmarks/, beside this script

WIN_NEEDED = 0.15  # the preset compiles where compiling trains this much more in its budget


def cpu_name() -> str:
    """The CPU's model name, as Linux reports it (else what platform knows)."""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def one_pass(step: OptimiserStep, batches: list) -> float:
    """Seconds for one optimiser step on each batch in turn."""
    start = time.perf_counter()
    for batch in batches:
        step([batch], batch.n_tgt_tokens)
    return time.perf_counter() - start


def cpu_seconds(work) -> tuple[float, float]:
    """Wall and CPU seconds (this process, all its threads) that work() takes."""
    wall, cpu = time.perf_counter(), time.process_time()
    work()
    return time.perf_counter() - wall, time.process_time() - cpu


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="4 batches, 2 timed passes (a few minutes)")
    parser.add_argument("--batches", type=int, default=None, help="distinct batches in a pass (default 12)")
    parser.add_argument("--repeats", type=int, default=None, help="timed passes per side (default 5)")
    parser.add_argument("--json", type=Path, default=None, help="also write the figures to this JSON file")
    args = parser.parse_args()
    n_batches = args.batches or (4 if args.quick else 12)
    repeats = args.repeats or (2 if args.quick else 5)
    if args.json is not None:  # checked before the work
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.touch()

    config = TrainConfig.from_preset("cpu")
    device = torch.device("cpu")
    amp = resolve_amp(config.amp, device)
    precision = "float32" if amp is None else f"{str(amp).removeprefix('torch.')} autocast"
    tokenizer = multi30k_tokenizer(config.vocab_size)
    batches = real_batches(config, tokenizer, 4000, n_batches)
    tokens = sum(b.n_src_tokens + b.n_tgt_tokens for b in batches)  # real tokens in one pass
    shapes = sorted({tuple(b.src.shape) + (b.tgt_in.shape[1],) for b in batches})
    print(f"cpu preset: d_model {config.d_model}, {config.n_encoder_layers}+{config.n_decoder_layers} layers, "
          f"max_tokens {config.max_tokens}, {precision}; torch {torch.__version__}, "
          f"{torch.get_num_threads()} threads")
    print(f"{len(batches)} batches a pass ({len(shapes)} shapes), {tokens:,} real tokens; {repeats} timed passes")

    torch.manual_seed(0)
    criterion = LabelSmoothingLoss(tokenizer.vocab_size, smoothing=config.label_smoothing, reduction="sum")
    procs = Processes(device)
    models = {"eager": Transformer(config.model_config(tokenizer.vocab_size))}
    models["compiled"] = copy.deepcopy(models["eager"])
    dropout = {name: InnerDropout(m, models["eager"].config) for name, m in models.items()}
    steps = {name: OptimiserStep(m, criterion, dataclasses.replace(config, compile=name == "compiled"), procs, amp)
             for name, m in models.items()}
    for name in steps:
        dropout[name].switch(False)  # the first part of the budget: inner dropout off

    # compile time: the compiled side's first pass less the eager side's, in wall and in CPU seconds (the CPU
    # seconds hold on a machine that other work shares)
    first = {name: cpu_seconds(lambda: one_pass(steps[name], batches)) for name in ("eager", "compiled")}
    for d in dropout.values():  # the late switch: rates change inside the graph
        d.switch(True)
    switch = {name: cpu_seconds(lambda: one_pass(steps[name], batches)) for name in ("eager", "compiled")}
    compile_s, compile_cpu_s = (first["compiled"][k] - first["eager"][k] for k in (0, 1))
    recompile_s, recompile_cpu_s = (switch["compiled"][k] - switch["eager"][k] for k in (0, 1))
    print(f"compile: {compile_s:.0f} s ({compile_cpu_s:.0f} CPU s) at the first pass, {recompile_s:.0f} s "
          f"({recompile_cpu_s:.0f} CPU s) again at the dropout switch")

    times: dict[str, list[float]] = {"eager": [], "compiled": []}
    for i in range(repeats):
        for name in (("eager", "compiled") if i % 2 == 0 else ("compiled", "eager")):
            times[name].append(one_pass(steps[name], batches))
    tps = {name: tokens / statistics.median(t) for name, t in times.items()}
    ratio = tps["compiled"] / tps["eager"]
    for name in ("eager", "compiled"):
        print(f"{name:8}  {tps[name]:7.0f} tokens/s  (median of {repeats} passes)")

    budget_s = 60 * config.max_minutes
    overhead = max(compile_s, 0.0) + max(recompile_s, 0.0)
    win = (budget_s - overhead) * tps["compiled"] / (budget_s * tps["eager"]) - 1
    verdict = "compile" if win >= WIN_NEEDED else "stay eager"
    print(f"in the preset's {config.max_minutes:.0f} minutes, compile time included: {win:+.1%} tokens "
          f"(needed {WIN_NEEDED:+.0%}): {verdict}")
    if args.json is not None:
        flags = cpu_flags()
        record = {
            "benchmark": "train_cpu_compiled", "machine": cpu_name(),
            "cpu_bf16": sorted(flags & {"avx512_bf16", "amx_bf16"}), "threads": torch.get_num_threads(),
            "torch": torch.__version__, "python": platform.python_version(), "precision": precision,
            "batches": len(batches), "shapes": len(shapes), "tokens_per_pass": tokens, "repeats": repeats,
            "tokens_per_s": {k: round(v, 1) for k, v in tps.items()}, "compile_s": round(compile_s, 1),
            "compile_cpu_s": round(compile_cpu_s, 1), "recompile_at_switch_s": round(recompile_s, 1),
            "recompile_at_switch_cpu_s": round(recompile_cpu_s, 1), "ratio": round(ratio, 3),
            "win_in_budget": round(win, 3), "verdict": verdict,
        }
        args.json.write_text(json.dumps(record, indent=2) + "\n")
    print(f"ratio={ratio:.2f}")


if __name__ == "__main__":
    main()
