"""Seed sweeps behind the book's asserted margins: python tools/margins.py [--seeds 10] [--only 11_training ...]

A notebook cell that trains or samples prints digits that differ from one CPU to another (vector width, kernel
path, bfloat16 or not), so the book asserts a property with a margin instead (`assert last_accuracy >= 0.95`).
A margin is only as good as the evidence behind it. This tool re-runs each such computation with its seeds moved
(every `torch.manual_seed(n)` and `torch.Generator().manual_seed(n)`, in the notebook and in the library it calls,
seeds n + k for k = 0, 1, ...), which moves the result at least as much as another CPU's rounding does, under PyTorch's two CPU kernel paths, and, where the code
picks the precision from the CPU (amp="auto"), with bfloat16 autocast forced on as on a CPU with native bfloat16.
It prints, for each property, the worst and the median value seen against the threshold the book asserts, and
writes them to tools/margins.json. A threshold must sit beyond the worst value seen, with room to spare.

Each run executes the notebook's code cells in a fresh Python process, from the top to the cell that computes the
property (a failing assert is recorded, not fatal), with the Colab set-up cell and IPython-only lines left out.
CI does not run this (it takes a while); run it after changing a chapter's training or sampling code.
"""
import argparse
import json
import os
import re
import statistics
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
OTHER_KERNELS = {"ATEN_CPU_CAPABILITY": "default", "MKL_CBWR": "COMPATIBLE"}


@dataclass(frozen=True)
class Property:
    """A value a notebook computes (a Python expression evaluated after cell `until` ran) and its asserted bound."""

    notebook: str
    until: str  # the id of the cell after which `value` can be evaluated
    name: str
    value: str
    op: str  # ">", ">=", "<", "<=": the assertion is `value op threshold`
    threshold: float
    picks_precision: bool = False  # the computation runs with amp="auto": sweep bfloat16 autocast too

    def holds(self, x: float) -> bool:
        """Whether the asserted inequality holds for the value x."""
        return {">": x > self.threshold, ">=": x >= self.threshold, "<": x < self.threshold,
                "<=": x <= self.threshold}[self.op]


PROPERTIES = [
    Property("06_multi_head_attention", "2d83650d", "one head: mean loss of the last 20 steps", "final[1]", ">", 0.4),
    Property("06_multi_head_attention", "2d83650d", "two heads: mean loss of the last 20 steps", "final[2]", "<", 0.05),
    Property("06_multi_head_attention", "2d83650d", "four heads: mean loss of the last 20 steps", "final[4]", "<", 0.25),
    Property("06_multi_head_attention", "90ae5f69", "left neighbours, one head: loss", "left[1]", ">", 0.4),
    Property("06_multi_head_attention", "90ae5f69", "left neighbours, two heads: loss", "left[2]", "<", 0.05),
    Property("11_training", "176c2bb2", "copy task: loss at step 400", "final_loss", "<", 0.2),
    Property("11_training", "176c2bb2", "copy task: nll at step 400", "final_nll", "<", 0.35),
    Property("11_training", "a9478548", "copy task: exact match, last weights", "last_accuracy", ">=", 0.6),
    Property("11_training", "a9478548", "copy task: exact match, averaged weights", "averaged_accuracy", ">=", 0.93),
    Property("12_decoding", "0e9780f9", "toy language: loss at the end", "final_loss", "<", 0.6),
    Property("12_decoding", "a4162328", "toy language: largest error of the learned next-token probabilities",
             "max(abs(first[A] - 0.6), abs(first[B_WORD] - 0.4), *(abs(after_a[SYMBOLS[i]] - 0.25) for i in range(4)))",
             "<", 0.15),
    Property("12_decoding", "a4162328", "toy language: p(c | B)", "after_b[WORDS.index('c')].item()", ">", 0.9),
    Property("12_decoding", "0ba8bf3b", "toy language: p(B c) / p(A a)", "sentence_p['B c'] / sentence_p['A a']", ">", 1.5),
    Property("12_decoding", "fe6b432d", "sampling at temperature 1: % of B c (at least 30)", "t1['B c']", ">=", 30),
    Property("12_decoding", "fe6b432d", "sampling at temperature 1: % of B c (at most 50)", "t1['B c']", "<=", 50),
    Property("12_decoding", "fe6b432d", "sampling: % of B c at 1 minus at 0.5", "t1['B c'] - t05['B c']", ">", 0),
    Property("12_decoding", "fe6b432d", "sampling at temperature 2: % not in the language", "t2['other']", ">", 10),
    Property("eng_fast_beam_search", "a68a08de", "beam above greedy: sentences of 500", "better[True]", ">", 150),
    Property("eng_fast_beam_search", "a68a08de", "beam below greedy: sentences", "worse[True]", "<=", 0),
    Property("15_beyond_the_paper", "9b29101d", "copy: rotary steps / sinusoidal steps to loss 0.1",
             "rotary_steps / sinusoidal_steps", "<=", 0.75),
    Property("15_beyond_the_paper", "9b29101d", "copy: larger final loss of the two", "max(runs[True][1][-1], runs[False][1][-1])",
             "<", 0.25),
    Property("15_beyond_the_paper", "b5333a8a", "reversal steps minus copy steps to loss 0.1",
             "steps_to(reversal_losses) - steps_to(runs[True][1])", ">", 0),
    Property("15b_deep_and_long", "938cf748", "post-LN over pre-LN gradient, the sums of layers 2-12",
             "sum(post[1:]) / sum(pre[1:])", ">", 1.25),
    Property("15b_deep_and_long", "938cf748", "layers 2-12 where post-LN's gradient is the larger",
             "sum(post[i] > pre[i] for i in range(1, 12))", ">=", 8),
    Property("15b_deep_and_long", "938cf748", "pre-LN gradient, layer 12 / layer 1", "pre[11] / pre[0]", "<", 1),
    Property("15b_deep_and_long", "e82da585", "deep pre-LN: loss at step 100", "pre_ln[-1]", "<", 0.05),
    Property("15b_deep_and_long", "e82da585", "deep post-LN, no warm-up: largest |loss - ln 10| in its last 50 steps",
             "max(abs(loss - math.log(10)) for loss in post_ln[50:])", "<", 0.6),
    Property("15b_deep_and_long", "e82da585", "deep post-LN with warm-up minus pre-LN, step 100", "warmed[-1] - pre_ln[-1]",
             ">", 0.05),
    Property("15b_deep_and_long", "e82da585", "deep post-LN with warm-up: ln 10 minus its loss at step 100",
             "math.log(10) - warmed[-1]", ">", 0.05),
    Property("eng_training_runs", "6f515f10", "tiny run: fall of the training loss", "train_losses[0] - train_losses[-1]",
             ">", 1.5),
    Property("eng_training_runs", "6f515f10", "tiny run: fall of the validation loss", "val_losses[0] - val_losses[-1]",
             ">", 0),
]

# Tests whose assertion holds only within a margin: (test node id, the name it records with record_margin, op,
# threshold). A sweep runs the test with its seeds moved, as for the notebooks.
TEST_PROPERTIES = [
    ("tests/test_beyond.py::test_lm_learns_to_copy_a_fixed_offset", "copy LM: loss on the copied digits", "<",
     0.5 * 2.302585092994046),
    *[(f"tests/test_decoding.py::test_sampling_draws_from_the_tempered_top_k_distribution[{t}-{k}]",
       f"sampling, temperature {t}, top_k {k}: total variation from the distribution", "<", 0.05)
      for t, k in (("1.0", "None"), ("0.5", "None"), ("2.0", "None"), ("1.0", "5"), ("0.5", "3"))],
]

# Cells that only draw figures, time code or describe Multi30k: nothing a swept property needs comes from them.
SKIP = {
    "11_training": {"75ace4de", "0dad7292", "1891cb22", "391a8033", "29cde641", "3a388545", "0c8b5b40", "bed0ed98"},
}


def move_seeds(k: int) -> None:
    """From now on in this process, every seed given to torch (globally or to a new Generator) is moved by k."""
    import torch

    if k == 0:
        return
    seed = torch.manual_seed

    class Generator(torch.Generator):
        def manual_seed(self, n: int) -> "Generator":
            return super().manual_seed(n + k)

    torch.manual_seed = lambda n: seed(n + k)
    torch.Generator = Generator


def runnable(source: str) -> str:
    """The cell's Python: IPython magics and shell lines left out."""
    return "\n".join(line for line in source.splitlines() if not line.lstrip().startswith(("%", "!")))


def run_one(notebook: str, k: int, force_bf16: bool, expressions: dict[str, tuple[str, str]]) -> dict:
    """In this process: execute the notebook's code cells with seeds moved by k, up to the last cell needed."""
    import types

    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    plt.show = lambda *args, **kwargs: plt.close("all")
    move_seeds(k)
    sys.modules["myst_nb"] = types.SimpleNamespace(glue=lambda *args, **kwargs: None)
    if force_bf16:  # a CPU with native bfloat16: amp="auto" chooses bfloat16 autocast
        import transformer_lib.runtime as runtime

        runtime.cpu_has_native_bf16 = lambda: True
    nb = json.loads((ROOT / "book" / f"{notebook}.ipynb").read_text())
    cells = [c for c in nb["cells"] if c["cell_type"] == "code"]
    last = max(next(i for i, c in enumerate(cells) if c.get("id") == until) for until, _ in expressions.values())
    os.chdir(ROOT / "book")
    namespace: dict = {"__name__": "__main__", "display": print}
    failed = []
    for cell in cells[: last + 1]:
        source = "".join(cell["source"])
        if source.startswith("# Colab: set up") or cell.get("id") in SKIP.get(notebook, ()):
            continue
        try:
            exec(compile(runnable(source), f"<cell {cell.get('id')}>", "exec"), namespace)
        except Exception as err:  # a failing assert, or a property that cannot even be computed (never reached)
            failed.append(f"{cell.get('id')}: {type(err).__name__} {str(err)[:200]}")
        plt.close("all")
    values = {}
    for name, (_, expression) in expressions.items():
        try:
            values[name] = float(eval(expression, namespace))
        except Exception:  # e.g. a loss that never fell below the level whose step is asked: the property fails
            values[name] = None
    return {"values": values, "failed_asserts": failed}


def sweep(props: list[Property], seeds: int, timeout: int) -> list[dict]:
    """Run every (notebook, seed, kernel path, precision) once, in a fresh process each; collect the values."""
    rows = {p.name: {"property": p, "seen": []} for p in props}
    for notebook in dict.fromkeys(p.notebook for p in props):
        mine = [p for p in props if p.notebook == notebook]
        expressions = {p.name: (p.until, p.value) for p in mine}
        variants = [("default", False), ("other kernels", False)]
        if any(p.picks_precision for p in mine):
            variants.append(("default, bfloat16", True))
        for k in range(seeds):
            for path, bf16 in variants:
                env = dict(os.environ, PYTHONPATH=str(ROOT), OMP_NUM_THREADS="1")
                if path == "other kernels":
                    env.update(OTHER_KERNELS)
                started = time.perf_counter()
                proc = subprocess.run(
                    [sys.executable, __file__, "--run-one", notebook, str(k), str(int(bf16)), json.dumps(expressions)],
                    env=env, capture_output=True, text=True, timeout=timeout)
                seconds = time.perf_counter() - started
                if proc.returncode != 0:
                    raise RuntimeError(f"{notebook} seed+{k} {path}: {proc.stderr[-3000:]}")
                result = json.loads(proc.stdout.strip().splitlines()[-1])
                print(f"{notebook} seed+{k} {path}{' bf16' if bf16 else ''}: {seconds:.0f} s "
                      f"{result['values']} {result['failed_asserts'] or ''}", flush=True)
                for name, value in result["values"].items():
                    rows[name]["seen"].append({"seed_offset": k, "path": path, "bf16": bf16, "value": value})
    return list(rows.values())


def sweep_tests(seeds: int, timeout: int) -> list[dict]:
    """Run each test of TEST_PROPERTIES with seeds moved by 0..seeds-1, on both kernel paths; collect the values."""
    import tempfile

    rows = []
    for node, name, op, threshold in TEST_PROPERTIES:
        prop = Property("tests", node, name, name, op, threshold)
        seen = []
        for k in range(seeds):
            for path in ("default", "other kernels"):
                record = Path(tempfile.mkstemp(suffix=".jsonl")[1])
                env = dict(os.environ, PYTHONPATH=str(ROOT), OMP_NUM_THREADS="1", MARGINS_SEED_OFFSET=str(k),
                           MARGINS_RECORD=str(record))
                if path == "other kernels":
                    env.update(OTHER_KERNELS)
                subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", node], cwd=ROOT,
                               env=env, capture_output=True, text=True, timeout=timeout)
                values = [json.loads(line)["value"] for line in record.read_text().splitlines()
                          if json.loads(line)["name"] == name]
                record.unlink()
                if not values:
                    raise RuntimeError(f"{node} recorded no value named {name!r} (seed+{k}, {path})")
                print(f"{node} seed+{k} {path}: {values[-1]:.4g}", flush=True)
                seen.append({"seed_offset": k, "path": path, "bf16": False, "value": values[-1]})
        rows.append({"property": prop, "seen": seen})
    return rows


def summarise(rows: list[dict]) -> list[dict]:
    """Worst and median value seen per property, and whether every one held."""
    out = []
    for row in rows:
        p, seen = row["property"], row["seen"]
        values = [s["value"] for s in seen if s["value"] is not None]  # None: the run never computed the property
        worst = (min(values) if p.op.startswith(">") else max(values)) if values else None
        out.append({"notebook": p.notebook, "property": p.name, "assertion": f"{p.value} {p.op} {p.threshold}",
                    "runs": len(seen), "seeds": len({s["seed_offset"] for s in seen}),
                    "not_computed": len(seen) - len(values), "worst": worst,
                    "median": statistics.median(values) if values else None, "threshold": p.threshold,
                    "holds": sum(s["value"] is not None and p.holds(s["value"]) for s in seen), "seen": seen})
    return out


def print_table(rows: list[dict]) -> None:
    """The sweep as a markdown table: property, runs, seeds, worst and median value, assertion, runs it held in."""
    print("\n| property | runs (seeds) | worst | median | asserted | held in |\n|---|---|---|---|---|---|")
    for r in rows:
        worst = "never computed" if r["worst"] is None else f"{r['worst']:.4g}"
        median = "-" if r["median"] is None else f"{r['median']:.4g}"
        held = "-" if r["holds"] is None else f"{r['holds']} of {r['runs']}"
        print(f"| {r['notebook']}: {r['property']} | {r['runs']} ({r['seeds']}) | {worst} | {median} | "
              f"`{r['assertion']}` | {held} |")


def main() -> None:
    if sys.argv[1:2] == ["--run-one"]:
        notebook, k, bf16, expressions = sys.argv[2], int(sys.argv[3]), bool(int(sys.argv[4])), json.loads(sys.argv[5])
        print(json.dumps(run_one(notebook, k, bf16, expressions)))
        return
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--seeds", type=int, default=10, help="seed offsets 0..N-1 (default 10)")
    parser.add_argument("--only", nargs="*", help="notebooks to sweep (default: all listed); 'tests' for the tests")
    parser.add_argument("--properties", help="only the properties whose name contains this text")
    parser.add_argument("--timeout", type=int, default=1800, help="seconds per run")
    parser.add_argument("--out", type=Path, default=ROOT / "tools" / "margins.json")
    parser.add_argument("--merge", nargs="+", type=Path, help="combine these outputs of earlier sweeps into --out")
    args = parser.parse_args()
    if args.merge:
        parts = [json.loads(path.read_text()) for path in args.merge]
        by_name = {(r["notebook"], r["property"]): r for part in parts for r in part["properties"]}  # later wins
        rows = list(by_name.values())
        # the thresholds of today's assertions, applied to the values seen (a sweep outlives a threshold's change)
        current = {(p.notebook, p.name): p for p in PROPERTIES}
        current.update({("tests", name): Property("tests", node, name, name, op, threshold)
                        for node, name, op, threshold in TEST_PROPERTIES})
        for r in rows:
            r.pop("all_hold", None)  # an older sweep's verdict under its own thresholds
            prop = current.get((r["notebook"], r["property"]))
            if prop is None:  # a value the book no longer asserts on: kept as evidence of why
                r.update(assertion="no longer asserted", threshold=None, holds=None)
                continue
            if not prop.picks_precision:  # forced bfloat16 changes nothing where the code fixes the precision
                r["seen"] = [x for x in r["seen"] if not x["bf16"]]
                r["runs"] = len(r["seen"])
            r.update(assertion=f"{prop.value} {prop.op} {prop.threshold}", threshold=prop.threshold,
                     holds=sum(s["value"] is not None and prop.holds(s["value"]) for s in r["seen"]))
        commands = [c for part in parts for c in part.get("commands", [part.get("command")]) if c]
        commands = [re.sub(r" --out \S+", "", c) for c in commands]  # where a part was written is no fact of the sweep
        merged = {"commands": commands,
                  "machine": sorted({m for part in parts for m in (part["machine"] if isinstance(part["machine"], list)
                                                                   else [part["machine"]])}),
                  "torch_version": parts[0]["torch_version"], "properties": rows}
        args.out.write_text(json.dumps(merged, indent=1) + "\n")
        print_table(rows)
        return
    props = [p for p in PROPERTIES if (not args.only or p.notebook in args.only)
             and (args.properties is None or args.properties in p.name)]
    rows = sweep(props, args.seeds, args.timeout)
    if not args.only or "tests" in args.only:
        rows += sweep_tests(args.seeds, args.timeout)
    summary = summarise(rows)
    old = json.loads(args.out.read_text()) if args.out.exists() else {"properties": []}
    swept = {r["notebook"] for r in summary}
    kept = [r for r in old["properties"] if r["notebook"] not in swept]
    import platform

    import torch

    record = {"command": "python tools/margins.py " + " ".join(sys.argv[1:]),
              "machine": f"{platform.processor() or platform.machine()}, {os.cpu_count()} cores, "
                         f"kernels {torch.backends.cpu.get_cpu_capability()}",
              "torch_version": torch.__version__, "properties": kept + summary}
    args.out.write_text(json.dumps(record, indent=1) + "\n")
    print_table(summary)


if __name__ == "__main__":
    main()
