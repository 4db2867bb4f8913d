"""The decoder-only translator against the encoder-decoder: the same data, recipe, trainer, budget and size.

`DecoderOnlyTranslator` (book/15c_decoder_only_translator.ipynb) answers the trainer's calls as our `Transformer`
does, so `train(..., model_factory=DecoderOnlyTranslator)` trains it unchanged: the same token batches in the same
order, the Noam schedule with its cooldown, label smoothing, clipping, the inner dropout that starts halfway, the
averaging of the last snapshots.

Usage (the two runs of the page, started together so that they share the machine alike; a budget in steps,
which the machine's load cannot change):
  python benchmarks/decoder_only_same_recipe.py train --model encoder-decoder --out runs/ed --steps 1000 --threads 1
  python benchmarks/decoder_only_same_recipe.py train --model decoder-only --out runs/do --steps 1000 --threads 1
then each one scored, timed and recorded (the translations go beside the record, for paired bootstrap):
  python benchmarks/decoder_only_same_recipe.py record runs/do results/decoder_only/decoder_only.json --command "..."
Add --quick to train for a smoke run (6 steps on 2,000 pairs), and --limit N to record for a dry run. Alone,
`--quick` (as `make bench` runs it) trains both for 6 steps in a temporary folder and prints the ratio of their
training speeds (decoder-only over encoder-decoder, tokens/s), a smoke run whose figure is no result.
"""
import argparse
import json
import tempfile
import platform
import statistics
import sys
import time
from datetime import date
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))  # the repository's transformer_lib, installed or not

import torch  # noqa: E402

from transformer_lib.analysis import cross_attention  # noqa: E402
from transformer_lib.checkpoints import load_checkpoint, save_checkpoint  # noqa: E402
from transformer_lib.config import TrainConfig  # noqa: E402
from transformer_lib.data import directed  # noqa: E402
from transformer_lib.data import load_multi30k  # noqa: E402
from transformer_lib.decoder_only import DecoderOnlyTranslator, prefix_attention, translate_sentences  # noqa: E402
from transformer_lib.training_run import train  # noqa: E402
from transformer_lib.model import Transformer, TransformerConfig  # noqa: E402
from transformer_lib.tokenizer import BPETokenizer  # noqa: E402
from transformer_lib.records import device_description, overrides_of  # noqa: E402
from transformer_lib.translate import Translator, bleu  # noqa: E402

MODELS = {"encoder-decoder": Transformer, "decoder-only": DecoderOnlyTranslator}
FIGURE_SENTENCES = (0, 1, 2, 3)  # test2016 pairs whose attention the record keeps (mean over heads, each layer)
SHARE_SENTENCES = 200  # test2016 pairs over which the decoder-only model's attention on German is averaged


def load_run(path: Path) -> tuple[torch.nn.Module, BPETokenizer, dict]:
    """(model in eval mode, tokenizer, checkpoint) of a run folder's model.pt, whichever model it trained."""
    ckpt = load_checkpoint(path / "model.pt" if path.is_dir() else path)
    model_class = MODELS[ckpt.get("model_kind", "encoder-decoder")]
    model = model_class(TransformerConfig.from_dict(ckpt["model_config"]))
    model.load_state_dict(ckpt["model"])
    return model.eval(), BPETokenizer.from_dict(ckpt["tokenizer"]), ckpt


def translate(model: torch.nn.Module, tokenizer: BPETokenizer, sentences: list[str], beam_size: int) -> list[str]:
    """Both models decoded alike: batches of 128 by length, beam 4 with alpha 1.0 (or greedy), one worker."""
    if isinstance(model, DecoderOnlyTranslator):
        return translate_sentences(model, tokenizer, sentences, beam_size, alpha=1.0, batch_size=128)
    return Translator(model, tokenizer).translate(sentences, beam_size, batch_size=128, alpha=1.0, workers=1)


def attention_rows(model: torch.nn.Module, tokenizer: BPETokenizer, pair: tuple[str, str]) -> torch.Tensor:
    """Where each position of the reference English (teacher-forced) looks in the German: (L, H, T, S)."""
    c = model.config
    src = torch.tensor([tokenizer.encode(pair[0]) + [c.eos_id]])  # (1, S)
    tgt = torch.tensor([[c.bos_id] + tokenizer.encode(pair[1])])  # (1, T)
    if isinstance(model, DecoderOnlyTranslator):
        return prefix_attention(model, src, tgt)  # (L, H, T, S): a share of one softmax over both languages
    return cross_attention(model, src, tgt)  # (L, H, T, S): a softmax over the German alone


def checkpoint_kind(history: list[dict]) -> str:
    """Which weights model.pt holds: the average of the last snapshots, or the last weights when the average
    validated worse (the trainer keeps whichever is better)."""
    averaged = next((r for r in history if r.get("kind") == "averaged"), None)
    if averaged is None or not averaged["kept"]:
        return "model.pt (the last weights" + ("; the average of the last snapshots validated worse)"
                                               if averaged else ")")
    return f"model.pt (the average of the last {averaged['checkpoints']} snapshots)"


def cmd_train(args: argparse.Namespace) -> None:
    budget = {"max_minutes": args.minutes, "max_steps": None} if args.minutes else {"max_minutes": None,
                                                                                    "max_steps": args.steps}
    overrides = {"attention_init": "packed", **budget, "threads": args.threads}
    if args.quick:
        overrides.update(max_steps=6, train_subset=2000, log_every=2)
    config = TrainConfig.from_preset(args.preset, **overrides)
    result = train(config, args.out, model_factory=MODELS[args.model])
    for name in ("model.pt", "last.pt"):  # say which model the weights belong to
        path = args.out / name
        if path.exists():
            ckpt = load_checkpoint(path)
            ckpt["model_kind"] = args.model
            save_checkpoint(ckpt, path)
    params = sum(p.numel() for p in result.model.parameters())
    print(f"model={args.model} steps={result.history[-1].get('step')} parameters={params}")


def cmd_record(args: argparse.Namespace) -> None:
    torch.set_num_threads(args.threads)
    model, tokenizer, ckpt = load_run(args.run_dir)
    history, config = ckpt.get("history", []), ckpt.get("train_config", {})
    kind = ckpt.get("model_kind", "encoder-decoder")
    preset, overrides = overrides_of(config)
    record: dict = {"model": kind, "preset": preset, "overrides": overrides, "command": args.command,
                    "layers": getattr(model, "n_layers", None)}
    splits = {s: directed(load_multi30k(s), config.get("direction", "de-en")) for s in ("val", "test2016")}
    if args.limit:
        splits = {s: pairs[: args.limit] for s, pairs in splits.items()}
    record["bleu"], record["bleu_greedy"], record["translate_seconds"] = {}, {}, {}
    for split, pairs in splits.items():
        sources, refs = [s for s, _ in pairs], [t for _, t in pairs]
        for beam, key in ((4, "bleu"), (1, "bleu_greedy")):
            start = time.perf_counter()
            hyps = translate(model, tokenizer, sources, beam)
            seconds = time.perf_counter() - start
            score = bleu(hyps, refs)
            record[key][split] = {"cased": score["cased"], "lowercase": score["lowercase"]}
            record["signature"] = score["signature"]
            record["translate_seconds"][f"{split}, {'beam 4' if beam > 1 else 'greedy'}"] = round(seconds, 1)
            if beam > 1:
                args.out.with_name(f"{args.out.stem}.{split}.txt").write_text("\n".join(hyps) + "\n",
                                                                              encoding="utf-8")
            print(split, key, record[key][split], f"{seconds:.1f} s", flush=True)
    setup = next((r for r in history if r.get("kind") == "setup"), {})
    end = next((r for r in reversed(history) if r.get("kind") == "overhead"), {})
    speeds = [r["tokens_per_s"] for r in history if r.get("kind") == "train"][1:]  # the first window warms up
    amp = setup.get("amp")
    record.update({
        "device": device_description(setup.get("device", "unknown")),
        "cpu_threads": config.get("threads"),
        "torch_version": torch.__version__, "python_version": platform.python_version(),
        "precision": "float32" if amp == "None" else amp,
        "steps": ckpt.get("step"), "epochs": round(end["epochs"], 2) if end.get("epochs") is not None else None,
        "tokens": end.get("tokens"),
        "train_minutes": round(max((r.get("minutes", 0.0) for r in history), default=0.0), 1),
        "tokens_per_s": round(statistics.median(speeds)) if speeds else None,
        "parameters": sum(p.numel() for p in model.parameters()),
        "decoding": {"beam_size": 4, "alpha": 1.0, "batch_size": 128, "workers": 1, "threads": args.threads},
        "date": date.today().isoformat(),
        "checkpoint": checkpoint_kind(history),
        "val_loss_curve": [[r["step"], round(r["val_loss"], 4)] for r in history if r.get("kind") == "val"],
        "train_loss_curve": [[r["step"], round(r["loss"], 4)] for r in history
                             if r.get("kind") == "train" and "loss" in r],
    })
    test = splits["test2016"]
    record["attention"] = {str(i): [[[round(w, 3) for w in row] for row in layer]
                                    for layer in attention_rows(model, tokenizer, test[i]).mean(dim=1).tolist()]
                           for i in FIGURE_SENTENCES if i < len(test)}
    if kind == "decoder-only":  # the share of each English position's attention that lands on the German
        shares = torch.stack([attention_rows(model, tokenizer, pair).sum(dim=-1).mean(dim=(1, 2))
                              for pair in test[:SHARE_SENTENCES]])  # (N, L)
        record["german_share_by_layer"] = [round(s, 3) for s in shares.mean(dim=0).tolist()]
        record["german_share_sentences"] = len(shares)
    if args.limit:
        record["limit"] = f"the first {args.limit} pairs of each split (a dry run: no result)"
    args.out.write_text(json.dumps(record, indent=1) + "\n", encoding="utf-8")


def quick() -> None:
    """Both models trained for 6 steps of the tiny preset in a temporary folder: the ratio of their speeds."""
    speeds = {}
    with tempfile.TemporaryDirectory() as tmp:
        for model in MODELS:
            out = Path(tmp) / model
            cmd_train(argparse.Namespace(model=model, out=out, preset="tiny", steps=6, minutes=None, threads=None,
                                         quick=True))
            history = load_checkpoint(out / "model.pt")["history"]
            speeds[model] = statistics.median(r["tokens_per_s"] for r in history if r.get("kind") == "train")
    print(f"ratio={speeds['decoder-only'] / speeds['encoder-decoder']:.2f} (decoder-only over encoder-decoder "
          "training tokens/s, a smoke run)")


def main() -> None:
    if sys.argv[1:] == ["--quick"]:
        quick()
        return
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="cmd", required=True)
    t = sub.add_parser("train")
    t.add_argument("--model", choices=sorted(MODELS), required=True)
    t.add_argument("--out", type=Path, required=True)
    t.add_argument("--preset", default="cpu")
    t.add_argument("--steps", type=int, default=1000)
    t.add_argument("--minutes", type=float, default=None, help="a budget in minutes instead of steps")
    t.add_argument("--threads", type=int, default=None)
    t.add_argument("--quick", action="store_true", help="a smoke run: 6 steps on 2,000 pairs")
    r = sub.add_parser("record")
    r.add_argument("run_dir", type=Path)
    r.add_argument("out", type=Path)
    r.add_argument("--command", default=None)
    r.add_argument("--threads", type=int, default=1)
    r.add_argument("--limit", type=int, default=None, help="score the first N pairs of each split (a dry run)")
    args = parser.parse_args()
    cmd_train(args) if args.cmd == "train" else cmd_record(args)


if __name__ == "__main__":
    main()
