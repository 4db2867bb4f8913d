"""Write the results/*.json record of a finished training run: BLEU (beam and greedy) on val and test2016, the facts of
the run, its validation-loss trail and, with --curve, val BLEU of every snapshot it kept (the learning curve).

Usage:
  python tools/record_run.py RUN_DIR results/NAME.json --command "transformer-lib train ..." [--beam 4]
      [--alpha 1.0] [--curve] [--notes "..."]

A run that only informs a choice (an ablation) is scored on val alone, so test2016 is measured once per final run:
  python tools/record_run.py RUN_DIR results/ablations/NAME.json --splits val --command "..." [--curve]

With --hypotheses the translations (beam search) of each split go beside the record, one sentence a line, as
NAME.SPLIT.txt, so that a later run can be compared with this one by paired bootstrap resampling (transformer_lib.translate.paired_bootstrap).

A run stopped before its end has no model.pt: --model last.pt scores its last checkpoint instead.

A dry run scores the first N pairs of each split only (--limit N); its BLEU is no result.

It needs no install: it imports transformer_lib from the repository it lives in, as benchmarks/gpu_check.py does.

Choose --beam and --alpha on val first (--val-only prints val BLEU for each pair of a grid and writes nothing):
  python tools/record_run.py RUN_DIR --val-only --beam 4 6 --alpha 0.6 1.0
"""
import argparse
import json
import platform
import statistics
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))  # the repository's transformer_lib, installed or not

import torch  # noqa: E402

from transformer_lib import records  # noqa: E402
from transformer_lib.config import TrainConfig  # noqa: E402
from transformer_lib.data import directed, load_multi30k  # noqa: E402
from transformer_lib.recipe import encode_pairs, token_batches  # noqa: E402
from transformer_lib.tokenizer import BPETokenizer  # noqa: E402
from transformer_lib.clock import OVERHEAD_PARTS  # noqa: E402
from transformer_lib.records import evaluate_checkpoint, learning_curve, peak_flops, training_flops  # noqa: E402
from transformer_lib.translate import Translator, evaluate_bleu  # noqa: E402

CONFIG_FIELDS = ("d_model", "n_heads", "n_encoder_layers", "n_decoder_layers", "norm_first", "d_ff", "dropout", "attention_dropout",
                 "ffn_dropout", "inner_dropout_from", "vocab_size", "max_tokens", "lr_factor", "warmup", "cooldown",
                 "label_smoothing", "average_last", "amp", "max_minutes")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("run_dir", type=Path)
    parser.add_argument("out", type=Path, nargs="?")
    parser.add_argument("--command", default=None, help="the command that trained the run")
    parser.add_argument("--beam", type=int, nargs="+", default=[4])
    parser.add_argument("--alpha", type=float, nargs="+", default=[1.0])
    parser.add_argument("--curve", action="store_true", help="score every snapshotNNN.pt on val")
    parser.add_argument("--val-only", action="store_true", help="print val BLEU for each --beam x --alpha")
    parser.add_argument("--splits", nargs="+", default=["val", "test2016"], help="the splits to score")
    parser.add_argument("--notes", default=None)
    parser.add_argument("--hypotheses", action="store_true", help="write each split's translations beside OUT")
    parser.add_argument("--model", default="model.pt", help="the checkpoint to score (last.pt: a stopped run)")
    parser.add_argument("--limit", type=int, default=None, help="score the first N pairs of each split (a dry run)")
    args = parser.parse_args()

    if args.val_only:
        translator = Translator.from_checkpoint(args.run_dir / args.model)
        pairs = records.multi30k_pairs_for(translator, "val", name=args.run_dir / args.model,  # not a corpus run
                                           limit=args.limit)
        for beam in args.beam:
            for alpha in args.alpha:
                s = evaluate_bleu(translator, pairs, beam, alpha=alpha)
                print(f"val beam {beam} alpha {alpha}: {s['cased']} cased, {s['lowercase']} lower-cased", flush=True)
        return
    if args.out is None or len(args.beam) != 1 or len(args.alpha) != 1:
        parser.error("give OUT and one --beam and --alpha (or --val-only)")
    beam, alpha = args.beam[0], args.alpha[0]
    record = evaluate_checkpoint(args.run_dir / args.model, args.splits, beam_size=beam, alpha=alpha,
                                 command=args.command, keep_hypotheses=args.hypotheses, limit=args.limit)
    for split, lines in record.pop("hypotheses", {}).items():  # beside the record, for paired_bootstrap later
        args.out.with_name(f"{args.out.stem}.{split}.txt").write_text("\n".join(lines) + "\n", encoding="utf-8")
    greedy = evaluate_checkpoint(args.run_dir / args.model, args.splits, beam_size=1, limit=args.limit)
    record["bleu_greedy"] = greedy["bleu"]
    translator = Translator.from_checkpoint(args.run_dir / args.model)
    state = translator.info
    history, config = state.get("history", []), state.get("train_config", {})
    record["config"] = {k: config.get(k) for k in CONFIG_FIELDS}
    setup = next((r for r in history if r.get("kind") == "setup"), {})
    amp = setup.get("amp")  # the autocast dtype amp="auto" chose on the machine; "None": none, float32
    record["precision"] = "float32" if amp == "None" else amp
    speeds = [r["tokens_per_s"] for r in history if r.get("kind") == "train"][1:]  # the first window warms up
    record["tokens_per_s"] = round(statistics.median(speeds)) if speeds else None
    record["python_version"] = platform.python_version()
    record.update(_utilisation(state, translator.tokenizer, setup, record["tokens_per_s"]))
    if args.limit is not None:
        record["limit"] = f"the first {args.limit} pairs of each split (a dry run: no result)"
    record["val_loss_curve"] = [[round(r["minutes"], 2), round(r["val_loss"], 4)] for r in history
                                if r.get("kind") == "val"]
    overheads = [r for r in history if r.get("kind") == "overhead"]  # one per start of the run (resumes too)
    if overheads:
        seconds = sum(r["seconds"] for r in overheads)
        record["overhead"] = {"share": round(sum(r["share"] * r["seconds"] for r in overheads) / seconds, 4),
                              "seconds": round(seconds, 1),
                              **{k: round(sum(r[k] for r in overheads), 1) for k in OVERHEAD_PARTS}}
    averaged = next((r for r in history if r.get("kind") == "averaged"), None)
    record["checkpoint"] = ("model.pt (the last weights)" if averaged is None or not averaged["kept"] else
                            f"model.pt (the average of the last {averaged['checkpoints']} epoch snapshots)")
    if args.model != "model.pt":
        record["checkpoint"] = f"{args.model} (the run stopped before its end, at step {record['steps']})"
    if args.curve:
        record["learning_curve"] = learning_curve(args.run_dir, "val", beam, alpha, limit=args.limit)
    if args.notes:
        record["notes"] = args.notes
    args.out.write_text(json.dumps(record, indent=2) + "\n", encoding="utf-8")
    print(json.dumps({k: record[k] for k in ("steps", "train_minutes", "bleu", "bleu_greedy", "tokens_per_s")}))


def _utilisation(state: dict, tok: BPETokenizer, setup: dict, tokens_per_s: float | None) -> dict:
    """The epochs the run trained (its steps over the steps of an epoch), its FLOPs per real token
    (records.training_flops over its training pairs: padding left out) and its MFU on this machine's GPU (None on a
    CPU or an unlisted GPU), from the median tokens/s of its training windows."""
    config = TrainConfig.from_dict(state["train_config"])
    pairs = directed(load_multi30k("train"), config.direction)[: config.train_subset]
    src, tgt = encode_pairs(pairs, tok, config.max_sentence_len)
    src_lengths, tgt_lengths = [len(s) + 1 for s in src], [len(t) + 1 for t in tgt]  # <eos>; <bos>, as the trainer
    per_token = training_flops(config.model_config(tok.vocab_size), src_lengths, tgt_lengths) / (
        sum(src_lengths) + sum(tgt_lengths))
    per_step = config.accum_steps * setup.get("processes", 1)
    steps_per_epoch = len(token_batches(src_lengths, tgt_lengths, config.max_tokens, seed=config.seed)) // per_step
    device = setup.get("device", "cpu")
    peak = peak_flops(torch.device(device)) if device.startswith("cuda") and torch.cuda.is_available() else None
    return {"epochs": round(state.get("step", 0) / steps_per_epoch, 2), "flops_per_token": round(per_token),
            "peak_flops": peak,
            "mfu": round(tokens_per_s * per_token / peak, 4) if peak and tokens_per_s else None}


if __name__ == "__main__":
    main()
