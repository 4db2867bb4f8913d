"""Make the book's model: write a finished run as the shipped files of transformer_lib/pretrained, score the float16
copy as it ships, and write its model card (card.json, MODEL_CARD.md).

Usage:
  python tools/ship_model.py RUN_DIR RECORD [--out transformer_lib/pretrained] [--check 200]

RECORD is the results/*.json that tools/record_run.py wrote for the run (the float32 scores and the facts of the run).
The card keeps both: the scores of the run as trained, and those of the float16 copy, beam and greedy, on val and
test2016; and the greedy BLEU of the first --check validation sentences, the figure that tests/test_pretrained.py
checks on every machine. It needs no install, as tools/record_run.py.
"""
import argparse
import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))  # the repository's transformer_lib, installed or not

import torch  # noqa: E402

from transformer_lib.checkpoints import load_model  # noqa: E402
from transformer_lib.data import load_multi30k  # noqa: E402
from transformer_lib.files import atomic_write  # noqa: E402
from transformer_lib.pretrained import CARD, CARD_MARKDOWN, PRETRAINED_FORMAT, load_pretrained, model_card, write_pretrained  # noqa: E402
from transformer_lib.translate import evaluate_bleu  # noqa: E402

RUN_FIELDS = ("command", "run", "overrides", "device", "torch_version", "precision", "date", "steps", "epochs",
              "tokens", "train_minutes", "tokens_per_s", "bleu", "bleu_greedy")


def write_text(path: Path, text: str) -> None:
    """Write a shipped text file whole or not at all (appendix D): a failure keeps the file it replaces."""
    with atomic_write(path, "w") as f:
        f.write(text)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("run_dir", type=Path)
    parser.add_argument("record", type=Path)
    parser.add_argument("--out", type=Path, default=ROOT / "transformer_lib" / "pretrained")
    parser.add_argument("--check", type=int, default=200, help="validation sentences of the test's check")
    parser.add_argument("--limit", type=int, default=None, help="score the first N pairs of each split (a dry run)")
    args = parser.parse_args()
    record = json.loads(args.record.read_text(encoding="utf-8"))
    model, tokenizer, info = load_model(args.run_dir / "model.pt")
    setup = next(r for r in info["history"] if r.get("kind") == "setup")
    files = write_pretrained(model, tokenizer, args.out)
    decoding = record["decoding"]
    card = {"format": PRETRAINED_FORMAT, "model_config": model.config.to_dict(),
            "parameters": sum(p.numel() for p in model.parameters()), "train_pairs": setup["train_pairs"],
            "decoding": decoding,
            "signature": record["signature"], "trained": {k: record.get(k) for k in RUN_FIELDS}, "files": files}
    write_text(args.out / CARD, json.dumps(card, indent=1) + "\n")  # load_pretrained reads it

    translator = load_pretrained("cpu", args.out)
    shipped = {"bleu": {}, "bleu_greedy": {}, "scored_with": f"PyTorch {torch.__version__}"}
    for split in record["bleu"]:
        pairs = load_multi30k(split)[: args.limit]
        for key, beam, alpha in (("bleu", decoding["beam_size"], decoding["alpha"]), ("bleu_greedy", 1, 1.0)):
            s = evaluate_bleu(translator, pairs, beam, alpha=alpha)
            shipped[key][split] = {"cased": s["cased"], "lowercase": s["lowercase"]}
            print(split, key, shipped[key][split], flush=True)
    check = load_multi30k("val")[: args.check]
    card["shipped"] = shipped
    card["check"] = {"split": "val", "sentences": len(check), "beam_size": 1,
                     "cased": evaluate_bleu(translator, check, 1)["cased"]}
    if args.limit is not None:
        card["limit"] = f"the first {args.limit} pairs of each split (a dry run: no result)"
    write_text(args.out / CARD, json.dumps(card, indent=1) + "\n")
    write_text(args.out / CARD_MARKDOWN, model_card(card))
    print(json.dumps({"files": files, "check": card["check"]}, indent=1))


if __name__ == "__main__":
    main()
