"""Decode Multi30k val with the shipped model at beam 4, length penalty alpha 1.0 and 0.6, for the tuning log.

    TRANSFORMER_LIB_DATA=/path/to/multi30k python tools/alpha_pair.py

Writes results/shipped/cpu_packed_5457.float16.alpha1.val.txt and
results/shipped/cpu_packed_5457.float16.alpha0.6.val.txt: the translations of the 1,014 val sentences, one a line
in val's order, by the float16 copy that ships (Translator.pretrained, loaded into float32, on the CPU). Both
decode the same weights, so book/eng_tuning_log.ipynb can pair them with their own paired bootstrap instead of
borrowing the interval of two separately trained models. It takes a few minutes on 2 cores (PyTorch's thread
count: one batch a core).
"""
import argparse
from pathlib import Path

from transformer_lib.data import load_multi30k
from transformer_lib.translate import Translator

ROOT = Path(__file__).resolve().parents[1]
OUT = ROOT / "results" / "shipped"
ALPHAS = {"1": 1.0, "0.6": 0.6}


def path_for(alpha: str) -> Path:
    """Where the translations at this alpha go."""
    return OUT / f"cpu_packed_5457.float16.alpha{alpha}.val.txt"


def main() -> None:
    argparse.ArgumentParser(description=__doc__.splitlines()[0]).parse_args()
    translator = Translator.pretrained("cpu")
    sources = [source for source, _ in load_multi30k("val")]
    for name, alpha in ALPHAS.items():
        lines = translator.translate(sources, beam_size=4, alpha=alpha)
        path_for(name).write_text("".join(f"{line}\n" for line in lines), encoding="utf-8")
        print(f"alpha {alpha}: {len(lines)} lines to {path_for(name).relative_to(ROOT)}")


if __name__ == "__main__":
    main()
