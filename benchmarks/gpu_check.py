"""One prepared check of the GPU path, in one command: correctness, attention kernels, training speed and MFU, the
trainer's own step over the preset's real batches, and the share of a run's time that validation and checkpoints take.

It needs PyTorch and, from the repository, transformer_lib (found through sys.path, nothing to install) with its
two pure-Python dependencies, einops and tqdm. On a machine without a network, bring their wheels
(`pip download einops tqdm --no-deps -d wheels/`) and pass `--wheels wheels/`: a pure-Python wheel is a zip
archive that Python imports from directly. Parts 1 to 5 read no data: their batches are random token ids of the
Multi30k batches' shape. Part 6 reads Multi30k through transformer_lib.data (--data, else TRANSFORMER_LIB_DATA);
without it, part 6 records why and the others go on.

What it prints (and writes as JSON to --out):
1. the environment: PyTorch, CUDA, the GPU's name and compute capability;
2. correctness: our model against torch.nn.Transformer with the same (copied) weights in float32, and the largest
   difference of our log-probabilities under bfloat16 and float16 autocast from the float32 reference, each
   against its bound;
3. which SDPA kernel our attention runs, with is_causal and with a padding mask;
4. the seconds of one validation, one weights-only snapshot and one full last.pt, and the share of a run of
   --run-minutes they take at its cadence (--eval-minutes, --checkpoint-minutes);
5. the bare step: training tokens/s of the gpu preset's model on one fixed batch of 700 sentences (bf16 eager,
   fp16 with loss scaling, bf16 compiled) and of torch.nn.Transformer of the same shape, each with its MFU: the
   step's FLOPs counted by transformer_lib.records.training_flops from the real (unpadded) tokens, per second,
   over the GPU's published dense 16-bit peak (records.PEAK_FLOPS); tokens/s counts real tokens too, as the
   trainer does;
6. the trainer's step: Trainer.step of the gpu preset over the first epoch's real batches, as a run takes them (a
   new (B, S, T) shape at most steps), then over the same batches again (every shape seen before): tokens/s and MFU
   of each pass, the number of distinct batch shapes, the host's milliseconds per step (the wall time until
   Trainer.step returns, with the step's GPU work queued but not waited for) against the step's (synchronised), and
   the SDPA kernels a training step runs. Beside the bare step's tokens/s it says what a run loses to real batches.
The compiled bare step comes last: its compilation takes the longest.

The JSON is rewritten after each part, so a run cut short (a `timeout`, a lost machine) leaves what it measured.

Usage: python benchmarks/gpu_check.py --out gpu_check.json             (a CUDA GPU; a few minutes on an H100)
       python benchmarks/gpu_check.py --device cpu --quick --out x.json (a small model; seconds, for CI)
The last line is ok=<True if every correctness check passed>.
"""
import argparse
import json
import math
import platform
import statistics
import sys
import tempfile
import time
import warnings
from contextlib import nullcontext
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import nn

warnings.filterwarnings("ignore", message="enable_nested_tensor is True")  # nn.Transformer with norm_first

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

# bounds on the largest difference of log-probabilities from the float32 reference, relative to 1 + |log p|. Both
# models are initialised as ours is (Xavier embeddings, which the generator shares: logits of a random model spread
# by a few tenths, so log p is about -log V everywhere). Autocast rounds a product's inputs to bfloat16's 8
# significant bits (unit roundoff u = 2^-8) or float16's 11 (2^-11); the bound allows 16 u, the rounding of twelve
# layers compounding with room to spare. tests/test_gpu_check.py holds them to what the one H100 run measured at the
# gpu preset's size (results/gpu/h100_2026-11-27/gpu_check.json).
BOUNDS = {"float32": 1e-5, "bfloat16": 16 * 2.0**-8, "float16": 16 * 2.0**-11}


def environment(device: torch.device) -> dict:
    """PyTorch, CUDA and the GPU's name and capability (or the CPU's)."""
    env = {"torch": torch.__version__, "python": platform.python_version(), "device": str(device)}
    if device.type == "cuda":
        env.update(cuda=torch.version.cuda, gpu=torch.cuda.get_device_name(device),
                   capability=".".join(map(str, torch.cuda.get_device_capability(device))))
    else:
        env.update(cpu=platform.processor() or platform.machine(), threads=torch.get_num_threads())
    return env


def reference_pipeline(transformer: nn.Transformer, embed: nn.Embedding, generator: nn.Linear, pe: torch.Tensor,
                       src: torch.Tensor, tgt: torch.Tensor) -> torch.Tensor:
    """log-probabilities (B, T, V) of embedding * sqrt(D) + positions -> torch.nn.Transformer -> generator."""
    d = embed.embedding_dim
    T = tgt.size(1)
    causal = torch.ones(T, T, dtype=torch.bool, device=tgt.device).triu(1)  # (T, T): True = blocked (PyTorch's rule)
    out = transformer(embed(src) * math.sqrt(d) + pe[: src.size(1)], embed(tgt) * math.sqrt(d) + pe[:T],
                      tgt_mask=causal, tgt_is_causal=True, src_key_padding_mask=src == 0,
                      memory_key_padding_mask=src == 0)  # (B, T, D)
    return F.log_softmax(generator(out).float(), dim=-1)  # (B, T, V)


def reference_parts(shape: dict, device: torch.device) -> tuple[nn.Transformer, nn.Embedding, nn.Linear]:
    """torch.nn.Transformer of the shape, with one embedding shared by source, target and generator."""
    transformer = nn.Transformer(shape["d_model"], shape["n_heads"], shape["n_encoder_layers"],
                                 shape["n_decoder_layers"], shape["d_ff"], dropout=shape["dropout"],
                                 batch_first=True, norm_first=shape["norm_first"]).to(device)
    embed = nn.Embedding(shape["vocab_size"], shape["d_model"]).to(device)
    nn.init.xavier_uniform_(embed.weight)  # as our Transformer initialises its (V, D) matrices, not nn.Embedding's N(0, 1)
    generator = nn.Linear(shape["d_model"], shape["vocab_size"]).to(device)
    generator.weight = embed.weight
    return transformer, embed, generator


def random_batch(vocab: int, B: int, S: int, T: int, device: torch.device, seed: int = 0):
    """A Batch of random ids, right-padded to lengths between half and all of S and T."""
    from transformer_lib.recipe import make_batch

    g = torch.Generator().manual_seed(seed)
    src = [torch.randint(4, vocab, (int(torch.randint(S // 2, S, (1,), generator=g)),), generator=g).tolist()
           for _ in range(B)]
    tgt = [torch.randint(4, vocab, (int(torch.randint(T // 2, T, (1,), generator=g)),), generator=g).tolist()
           for _ in range(B)]
    return make_batch(src, tgt).to(device)


def correctness(shape: dict, device: torch.device, B: int = 16, S: int = 20, T: int = 18) -> dict:
    """Largest differences of our log-probabilities from torch.nn.Transformer's with copied weights, on a batch of
    B sentences of up to S source and T target tokens; with the spread of the reference's logits."""
    from transformer_lib.model import Transformer
    from transformer_lib.positional import sinusoidal_encoding

    torch.manual_seed(0)
    transformer, embed, generator = reference_parts({**shape, "dropout": 0.0}, device)
    ours = Transformer.from_torch(transformer, embed, embed, generator).to(device).eval()
    transformer.eval()
    pe = sinusoidal_encoding(512, shape["d_model"]).to(device)
    batch = random_batch(shape["vocab_size"], B, S, T, device, seed=1)
    real = batch.tgt_in != 0  # (B, T): positions that a loss reads
    out = {}
    tf32 = torch.backends.cuda.matmul.allow_tf32
    torch.backends.cuda.matmul.allow_tf32 = False  # the float32 comparison in float32
    with torch.no_grad():
        expected = reference_pipeline(transformer, embed, generator, pe, batch.src, batch.tgt_in)  # (B, T, V)
        out["reference_logit_std"] = (expected[real] - expected[real].mean(-1, keepdim=True)).std().item()
        for dtype in (torch.float32, torch.bfloat16, torch.float16):
            autocast = nullcontext() if dtype == torch.float32 else torch.autocast(device.type, dtype=dtype)
            try:
                with autocast:
                    got = ours(batch.src, batch.tgt_in).float()  # (B, T, V)
            except RuntimeError as err:  # an autocast dtype this device lacks
                out[str(dtype).replace("torch.", "")] = {"error": str(err).splitlines()[0]}
                continue
            name = str(dtype).replace("torch.", "")
            diff = ((got[real] - expected[real]).abs() / (1 + expected[real].abs())).max().item()
            out[name] = {"max_rel_diff": diff, "bound": BOUNDS[name], "ok": diff <= BOUNDS[name],
                         "max_abs_diff": (got[real] - expected[real]).abs().max().item()}
    torch.backends.cuda.matmul.allow_tf32 = tf32
    return out


def sdpa_kernels(shape: dict, device: torch.device, dtype: torch.dtype | None) -> dict:
    """The aten kernel our attention dispatches to, with is_causal=True and with a padding mask."""
    from transformer_lib.attention import MultiHeadAttention, padding_mask

    attn = MultiHeadAttention(shape["d_model"], shape["n_heads"]).to(device).eval()
    x = torch.randn(8, 24, shape["d_model"], device=device)  # (B, T, D)
    ids = torch.randint(4, 100, (8, 24), device=device)
    ids[:, 20:] = 0
    cases = {"is_causal": dict(is_causal=True), "padding mask": dict(mask=padding_mask(ids, 0))}
    found = {}
    for name, kwargs in cases.items():
        with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as prof:
            with torch.no_grad(), torch.autocast(device.type, dtype=dtype) if dtype else nullcontext():
                attn(x, x, **kwargs)
        found[name] = sdpa_names(prof) or ["(no SDPA kernel)"]
    return found


def sync(device: torch.device) -> None:
    """Wait for the device's queued work."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)


# the bare step's modes: (autocast dtype, compiled, whose layers)
MODES = {"ours bf16 eager": (torch.bfloat16, False, "ours"), "ours fp16 + GradScaler": (torch.float16, False, "ours"),
         "nn.Transformer bf16 eager": (torch.bfloat16, False, "torch"),
         "ours bf16 compiled": (torch.bfloat16, True, "ours")}


def throughput(shape: dict, device: torch.device, batch, steps: int, quick: bool, peak: float | None,
               modes: list[str] | None = None, results: dict | None = None, saved=lambda: None) -> dict:
    """Training tokens/s (source + target, real tokens) and MFU (over peak FLOP/s; None: no MFU) of each of modes
    (default: all of MODES) on one fixed batch, the median of `steps` timed steps; each mode's result goes into
    `results` as it comes, and saved() is called after each."""
    from transformer_lib.model import Transformer, TransformerConfig
    from transformer_lib.positional import sinusoidal_encoding
    from transformer_lib.recipe import LabelSmoothingLoss
    from transformer_lib.training_step import LossComputation
    from transformer_lib.records import training_flops

    B = batch.src.size(0)
    tokens = batch.n_src_tokens + batch.n_tgt_tokens  # real tokens, as the trainer counts them
    padded = batch.src.numel() + batch.tgt_in.numel()
    src_lengths = (batch.src != 0).sum(1).tolist()  # (B,): with <eos>
    tgt_lengths = (batch.tgt_out != 0).sum(1).tolist()  # (B,): the decoder's input, <bos> first, is as long
    config = TransformerConfig(**{k: shape[k] for k in ("vocab_size", "d_model", "n_heads", "n_encoder_layers",
                                                        "n_decoder_layers", "d_ff", "dropout", "norm_first")})
    flops = training_flops(config, src_lengths, tgt_lengths)
    results = {} if results is None else results
    for name in MODES if modes is None else modes:
        dtype, compiled, which = MODES[name]
        if compiled and quick:
            results[name] = {"error": "skipped with --quick (Dynamo alone takes half a minute on two cores)"}
            saved()
            continue
        torch.manual_seed(0)
        if which == "ours":
            model = Transformer(config).to(device)
            net = LossComputation(model, LabelSmoothingLoss(shape["vocab_size"], 0, 0.1, reduction="sum"))
            loss_fn = lambda: net(batch)[0]  # noqa: E731
        else:
            transformer, embed, generator = reference_parts(shape, device)
            model = nn.ModuleList([transformer, embed, generator])
            pe = sinusoidal_encoding(512, shape["d_model"]).to(device)

            def loss_fn():
                log_probs = reference_pipeline(transformer, embed, generator, pe, batch.src, batch.tgt_in)
                return F.nll_loss(log_probs.flatten(0, 1), batch.tgt_out.flatten(), ignore_index=0, reduction="sum")
        net_or_fn = torch.compile(loss_fn) if compiled else loss_fn
        optimizer = torch.optim.Adam(model.parameters(), lr=1e-4, fused=device.type == "cuda")
        scaler = torch.amp.GradScaler(device.type, enabled=dtype == torch.float16)
        times = []
        try:
            compile_start = time.perf_counter()
            for k in range(steps + 2):  # two warm-up steps (with compilation)
                sync(device)
                start = time.perf_counter()
                optimizer.zero_grad(set_to_none=True)
                with torch.autocast(device.type, dtype=dtype):
                    loss = net_or_fn()
                scaler.scale(loss / B).backward()
                scaler.step(optimizer)
                scaler.update()
                sync(device)
                times.append(time.perf_counter() - start)
                if k == 1:
                    warm_up = time.perf_counter() - compile_start
        except RuntimeError as err:
            results[name] = {"error": str(err).splitlines()[0]}
            saved()
            continue
        step = statistics.median(times[2:])
        results[name] = {"tokens_per_s": tokens / step, "step_s": step, "warm_up_s": warm_up,
                         "mfu": flops / step / peak if peak else None, "step_flops": flops, "tokens": tokens,
                         "padded_share": 1 - tokens / padded}
        saved()
        del model, optimizer
    return results


def sdpa_names(prof) -> list[str]:
    """The aten SDPA kernels (forward and backward) a profile saw."""
    return sorted({e.name for e in prof.events() if "scaled_dot_product" in e.name and e.name.startswith("aten::_")})


def trainer_steps(config, tokenizer, steps: int | None, data_dir: Path | None = None,
                  peak: float | None = None) -> dict:
    """Trainer.step of `config` (a TrainConfig) over the first `steps` steps (None: all) of its first epoch's real
    batches of Multi30k, twice: as a run first meets them, then the same batches again, every shape seen.

    Each step is timed twice: when Trainer.step returns (the host's part: building the next batch, queuing the
    step's kernels, and what falls due after it, as in a run; on a GPU the kernels may still run) and after waiting
    for the device (the step). The shapes are those of the batches the loss computation received; the SDPA kernels
    are those of one more step, profiled."""
    from transformer_lib.data import directed
    from transformer_lib.data import load_multi30k
    from transformer_lib.distributed import start_processes
    from transformer_lib.recipe import encode_pairs
    from transformer_lib.records import training_flops
    from transformer_lib.trainer import Trainer

    train_pairs = directed(load_multi30k("train", data_dir), config.direction)[: config.train_subset]
    val_pairs = directed(load_multi30k("val", data_dir), config.direction)[:8]  # the trainer wants some; unused here
    data = (*encode_pairs(train_pairs, tokenizer, config.max_sentence_len), *encode_pairs(val_pairs, tokenizer, config.max_sentence_len))
    procs = start_processes(config.device)
    try:
        with tempfile.TemporaryDirectory() as folder:
            run = Trainer(config, Path(folder), tokenizer, procs, data, progress=False)
            run.begin()  # the first epoch's batches, the clock started: ready to step
            device, batches = run.device, run.plan
            n = len(batches) // run.per_step if steps is None else min(steps, len(batches) // run.per_step)
            seen: list[tuple[int, int, int]] = []  # (B, S, T) of each batch the loss computation received
            net = run.update.net

            def recording(batch):
                seen.append((batch.src.size(0), batch.src.size(1), batch.tgt_in.size(1)))
                return net(batch)

            run.update.net = recording

            def rewind() -> None:
                """The first epoch's first step again (a pass over the whole epoch has begun the next one)."""
                run.epoch, run.position, run.plan = 0, 0, batches

            def one_pass() -> dict:
                rewind()
                host, step, tokens = [], [], 0
                for _ in range(n):
                    counted = run.tokens  # real source and target tokens trained on so far
                    sync(device)
                    start = time.perf_counter()
                    run.step()
                    host.append(time.perf_counter() - start)  # the step's work queued, not waited for
                    sync(device)
                    step.append(time.perf_counter() - start)
                    tokens += run.tokens - counted
                return {"tokens_per_s": tokens / sum(step), "step_ms": 1e3 * statistics.median(step),
                        "host_ms": 1e3 * statistics.median(host), "first_step_ms": 1e3 * step[0],
                        "slowest_step_ms": 1e3 * max(step), "seconds": sum(step), "tokens": tokens}

            first = one_pass()
            shapes = list(seen)
            again = one_pass()
            rewind()
            with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as prof:
                run.step()
                sync(device)
            run.flush()  # any file the steps queued is written before the folder goes
            used = [i for idx in batches[: n * run.per_step] for i in idx]
            flops = training_flops(run.model_config, [len(data[0][i]) + 1 for i in used],
                                   [len(data[1][i]) + 1 for i in used])
            precision = "float32" if run.amp is None else str(run.amp).replace("torch.", "")
            for result in (first, again):
                result["mfu"] = flops / result["seconds"] / peak if peak else None
            return {"preset": config.preset, "precision": precision, "max_tokens": config.max_tokens,
                    "pairs": len(data[0]), "steps": n, "steps_per_epoch": len(batches) // run.per_step,
                    "tokens": first["tokens"], "step_flops_total": flops, "distinct_shapes": len(set(shapes)),
                    "shapes": shapes, "first_pass": first, "again": again, "sdpa_kernels": sdpa_names(prof)}
    finally:
        procs.close()


def share_of_run(validation_s: float, snapshot_s: float, last_pt_s: float, minutes: float, eval_minutes: float,
                 checkpoint_minutes: float) -> float:
    """The share of a run of `minutes` that its validation points (a validation and a weights snapshot each
    eval_minutes), its last.pt writes (each checkpoint_minutes) and two more validations (the averaged model's and
    the end's) take."""
    points, saves = minutes / eval_minutes, minutes / checkpoint_minutes
    return (points * (validation_s + snapshot_s) + saves * last_pt_s + 2 * validation_s) / (60 * minutes)


def overhead_share(shape: dict, device: torch.device, B: int, S: int, T: int, val_batches: int,
                   cadence: dict) -> dict:
    """Seconds of one validation, one weights snapshot and one last.pt, and their share of a run of
    cadence["minutes"] with a point every cadence["eval_minutes"] and a last.pt every cadence["checkpoint_minutes"]."""
    from transformer_lib.checkpoints import save_checkpoint
    from transformer_lib.model import Transformer, TransformerConfig
    from transformer_lib.recipe import LabelSmoothingLoss, batch_loss
    from transformer_lib.runtime import resolve_amp

    torch.manual_seed(0)
    config = TransformerConfig(**{k: shape[k] for k in ("vocab_size", "d_model", "n_heads", "n_encoder_layers",
                                                        "n_decoder_layers", "d_ff", "dropout", "norm_first")})
    model = Transformer(config).to(device)
    optimizer = torch.optim.Adam(model.parameters(), fused=device.type == "cuda")
    for p in model.parameters():
        p.grad = torch.zeros_like(p)
    optimizer.step()  # Adam's moments exist, as in a run's last.pt
    criterion = LabelSmoothingLoss(shape["vocab_size"], 0, 0.1, reduction="sum")
    batches = [random_batch(shape["vocab_size"], B, S, T, device, seed=k) for k in range(val_batches)]
    amp = resolve_amp("auto", device)
    model.eval()
    sync(device)
    start = time.perf_counter()
    with torch.no_grad(), torch.autocast(device.type, dtype=amp) if amp else nullcontext():
        sums = torch.stack([torch.stack(batch_loss(model, b, criterion)) for b in batches]).sum(0)
    sums.tolist()
    validation = time.perf_counter() - start
    with tempfile.TemporaryDirectory() as folder:
        start = time.perf_counter()
        save_checkpoint({"model": model.state_dict()}, Path(folder) / "average.pt")
        snapshot = time.perf_counter() - start
        snapshot_size = (Path(folder) / "average.pt").stat().st_size
        start = time.perf_counter()
        save_checkpoint({"model": model.state_dict(), "optimizer": optimizer.state_dict()}, Path(folder) / "last.pt")
        last = time.perf_counter() - start
        size = (Path(folder) / "last.pt").stat().st_size
    return {"validation_s": validation, "snapshot_s": snapshot, "last_pt_s": last, "last_pt_mb": size / 1e6,
            "snapshot_mb": snapshot_size / 1e6, "parameters": sum(p.numel() for p in model.parameters()),
            **cadence, "validation_points": cadence["minutes"] / cadence["eval_minutes"],
            "last_pt_writes": cadence["minutes"] / cadence["checkpoint_minutes"],
            "share_of_run": share_of_run(validation, snapshot, last, **cadence)}


QUICK_PAIRS, QUICK_VOCAB, QUICK_STEPS = 600, 400, 3  # --quick: a tokenizer trained on the first pairs, a few steps


def trainer_setup(device: torch.device, quick: bool, data_dir: Path | None) -> tuple:
    """(config, tokenizer, steps) of part 6: the gpu preset with its 8000-token BPE over the first epoch's steps;
    with --quick the tiny preset over QUICK_PAIRS pairs, with a tokenizer trained on them, for QUICK_STEPS steps."""
    from transformer_lib.config import TrainConfig
    from transformer_lib.data import directed
    from transformer_lib.data import load_multi30k
    from transformer_lib.tokenizer import BPETokenizer, multi30k_tokenizer

    if not quick:
        config = TrainConfig.from_preset("gpu", device=str(device))
        return config, multi30k_tokenizer(config.vocab_size, data_dir), None
    config = TrainConfig.from_preset("tiny", device=str(device), train_subset=QUICK_PAIRS, vocab_size=QUICK_VOCAB)
    pairs = directed(load_multi30k("train", data_dir), config.direction)[:QUICK_PAIRS]
    return config, BPETokenizer.train([s for pair in pairs for s in pair], QUICK_VOCAB), QUICK_STEPS


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu",
                        help="cuda, cuda:N or cpu (default: cuda when available)")
    parser.add_argument("--quick", action="store_true", help="a small model and few steps (for the CPU and CI)")
    parser.add_argument("--out", type=Path, default=None, help="where to write the JSON (default: nowhere)")
    parser.add_argument("--run-minutes", type=float, default=5.5, help="the training run whose overhead share "
                        "part 4 estimates (default: 5.5, the cap of tools/gpu_session.py's training)")
    parser.add_argument("--eval-minutes", type=float, default=1.0, help="its minutes between validation points")
    parser.add_argument("--checkpoint-minutes", type=float, default=2.0, help="its minutes between last.pt writes")
    parser.add_argument("--data", type=Path, default=None,
                        help="the Multi30k files' folder for part 6 (default: TRANSFORMER_LIB_DATA, else the cache)")
    parser.add_argument("--wheels", type=Path, default=None,
                        help="a folder of pure-Python wheels (einops, tqdm) to import from, without installing")
    args = parser.parse_args()
    if args.wheels is not None:
        sys.path[1:1] = [str(w) for w in sorted(args.wheels.glob("*.whl"))]
    device = torch.device(args.device)
    if device.type == "cuda" and not torch.cuda.is_available():
        parser.error(f"--device {args.device}: this PyTorch sees no CUDA device; use --device cpu --quick")
    from transformer_lib.config import PRESETS
    from transformer_lib.records import peak_flops

    gpu = PRESETS["gpu"]
    shape = {k: gpu[k] for k in ("d_model", "n_heads", "n_encoder_layers", "n_decoder_layers", "d_ff", "dropout",
                                 "norm_first")}
    shape["vocab_size"] = 8000
    B, S, T, steps, val_batches = 700, 28, 28, 10, 2  # 20,000 tokens a side: the gpu preset's max_tokens
    if args.quick:
        shape.update(d_model=64, n_heads=2, n_encoder_layers=2, n_decoder_layers=2, d_ff=128, vocab_size=1000)
        B, S, T, steps, val_batches = 16, 12, 12, 2, 2
    start = time.perf_counter()
    report = {"environment": environment(device), "quick": args.quick, "shape": shape,
              "batch": {"sentences": B, "source_tokens": S, "target_tokens": T}}
    cadence = {"minutes": args.run_minutes, "eval_minutes": args.eval_minutes,
               "checkpoint_minutes": args.checkpoint_minutes}

    def save(part: str) -> None:  # after each part: a run cut short leaves what it measured
        report["seconds"] = time.perf_counter() - start
        report["done"] = part
        if args.out is not None:
            args.out.write_text(json.dumps(report, indent=2) + "\n", encoding="utf-8")

    save("environment")
    report["correctness"] = correctness(shape, device)
    save("correctness")
    report["sdpa_kernels"] = {name: sdpa_kernels(shape, device, dtype)
                              for name, dtype in [("float32", None), ("bfloat16", torch.bfloat16)]}
    save("sdpa_kernels")
    report["overhead"] = overhead_share(shape, device, B, S, T, val_batches, cadence)
    ok = all(v.get("ok", False) for k, v in report["correctness"].items()
             if k == "float32" or (isinstance(v, dict) and "error" not in v))
    report["ok"] = ok
    save("overhead")
    report["training"] = {}  # filled mode by mode: a cut run keeps the modes it timed
    batch, peak = random_batch(shape["vocab_size"], B, S, T, device), peak_flops(device)
    eager = [name for name, (_, compiled, _) in MODES.items() if not compiled]
    throughput(shape, device, batch, steps, args.quick, peak, eager, report["training"],
               lambda: save("training (part)"))
    save("training (eager)")
    try:
        report["trainer_step"] = trainer_steps(*trainer_setup(device, args.quick, args.data), data_dir=args.data,
                                               peak=peak)
    except Exception as err:  # no data, or a trainer this check does not know: the other parts stand
        report["trainer_step"] = {"error": f"{type(err).__name__}: {str(err).splitlines()[0] if str(err) else ''}"}
    save("trainer_step")
    compiled = [name for name in MODES if name not in eager]
    throughput(shape, device, batch, steps, args.quick, peak, compiled, report["training"],
               lambda: save("training (part)"))
    save("training")

    env = report["environment"]
    print(f"torch {env['torch']}, {env.get('gpu', env.get('cpu'))}"
          + (f" (capability {env['capability']}, CUDA {env['cuda']})" if "gpu" in env else ""))
    for name, r in report["correctness"].items():
        if not isinstance(r, dict):
            continue
        print(f"  {name:9} log-probabilities vs nn.Transformer in float32: " + (r["error"] if "error" in r else
              f"max |diff| / (1 + |log p|) {r['max_rel_diff']:.1e} (bound {r['bound']:.0e}) "
              f"{'ok' if r['ok'] else 'FAILED'}"))
    for precision, kernels in report["sdpa_kernels"].items():
        print(f"  SDPA in {precision}: " + "; ".join(f"{k}: {', '.join(v)}" for k, v in kernels.items()))
    print(f"  {'training step':28}{'tokens/s':>12}{'MFU':>8}{'warm-up s':>11}   (real tokens, padding left out)")
    for name, r in report["training"].items():
        if "error" in r:
            print(f"  {name:28}{r['error']}")
            continue
        mfu = f"{r['mfu']:.1%}" if r["mfu"] is not None else "-"
        print(f"  {name:28}{r['tokens_per_s']:>12,.0f}{mfu:>8}{r['warm_up_s']:>11.1f}")
    t = report["trainer_step"]
    if "error" in t:
        print(f"  {'Trainer.step':28}{t['error']}")
    else:
        print(f"  Trainer.step, the {t['preset']} preset in {t['precision']}, over {t['steps']} real batches of "
              f"at most {t['max_tokens']:,} tokens a side: {t['distinct_shapes']} distinct (B, S, T) shapes; "
              f"SDPA: {', '.join(t['sdpa_kernels']) or '(no SDPA kernel)'}")
        for label, key in (("first time", "first_pass"), ("again", "again")):
            r = t[key]
            mfu = f"{r['mfu']:.1%}" if r["mfu"] is not None else "-"
            print(f"  {'  ' + label:28}{r['tokens_per_s']:>12,.0f}{mfu:>8}   step {r['step_ms']:.1f} ms, host "
                  f"{r['host_ms']:.1f} ms (medians), first step {r['first_step_ms']:.0f} ms")
        bare = report["training"].get("ours bf16 eager", {})
        if "tokens_per_s" in bare and t["precision"] == "bfloat16":
            print(f"  the trainer's step on real batches / the bare step: "
                  f"ratio={t['first_pass']['tokens_per_s'] / bare['tokens_per_s']:.2f}")
        elif "tokens_per_s" in bare:
            print(f"  (the trainer's step in {t['precision']}, the bare step in bfloat16: no ratio)")
    o = report["overhead"]
    print(f"  validation {o['validation_s']:.2f} s, weights snapshot {o['snapshot_s']:.2f} s, last.pt "
          f"{o['last_pt_s']:.2f} s ({o['last_pt_mb']:.0f} MB): {o['share_of_run']:.1%} of a {o['minutes']:g}-minute "
          f"run at its cadence")
    print(f"{report['seconds']:.0f} s" + (f"; JSON in {args.out}" if args.out else ""))
    print(f"ok={ok}")


if __name__ == "__main__":
    main()
