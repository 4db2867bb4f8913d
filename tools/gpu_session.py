"""A lent GPU as two prepared commands: train, score and record the `gpu` translator in one, check the GPU path and
run the unit tests under that machine's PyTorch in the other. Each writes what it has into OUT as it goes.

The lease: about 15 minutes of machine time in all, its start included (a minute or two), at most 10 minutes a
command, no network, PyTorch preinstalled (with einops, sacrebleu, tqdm, numpy, pytest), nothing installed from
here, a copy of the working tree only, and a few small files back (a 193 MB model cannot come back, so a model is
trained and scored in the same command). Before the lease, here: `make gpu-data` copies the Multi30k files into
data/multi30k, a folder inside the tree that git ignores, which travels with the tree when the lease is told to
carry `data`. Everything runs with PYTHONPATH at the repository, nothing installed.

Usage:  python tools/gpu_session.py A OUT      (one command of at most 9.5 minutes: timeout_s 580)
        python tools/gpu_session.py B OUT [--budget-s S]   (one command of about 4 minutes, at once after A)
        python tools/gpu_session.py all OUT --dry-run   (both on the CPU with a tiny budget, under a minute: CI)

Phase A, at most 570 s, the one that matters most (never drop it). Estimated on an H100/H200 from the dry run's
measurements and the recorded gpu runs; no lease has run it yet:
  preflight   ~15 s  Python, torch, CUDA's start; device, versions, data verified -> OUT/preflight.json
                     (dry run: 3.5 s)
  start-up    ~30 s  the trainer's process and its start-up before its clock starts: data, the 8000-token BPE
                     (8 s to train on a 2-core CPU), encoding, the model on the GPU (dry run: 4.5 s for the process
                     and 6.7 s of start-up with a 400-token BPE)
  training  ≤330 s   the gpu preset's budget in data (30 epochs; about 3.5 minutes on an H200 by the recorded run),
                     capped at 5.5 minutes by the trainer's clock, which starts at its first step (TRAIN_SET)
  finishing  ~15 s   the end's validation, the average of the last 5 points, model.pt and last.pt (dry run: 2 s)
  scoring    ~90 s   val and test2016, beam 4 and greedy, cased and lower-cased, with tools/record_run.py (model.pt,
                     or last.pt if the run was cut) -> OUT/gpu.json with device, versions, epochs, tokens/s,
                     real-token MFU, the share of time outside training steps, and the validation-loss curve (the
                     learning curve by minutes) (dry run, 8 sentences a split: 9.3 s)
  margin     ~90 s   of 570 s. A hard deadline guards scoring: the training command gets 570 - 120 s - the
                     preflight's seconds (about 435 s against the ~375 s it needs); past it, SIGTERM makes the trainer
                     write last.pt and stop, and last.pt is scored.
Phase B, 240 s by default (--budget-s: what the lease has left), dropped first: the translator's results need none of it.
  gpu_check  <=120 s benchmarks/gpu_check.py under a timeout; its JSON is rewritten after each part and each
                     training mode, the compiled one last -> OUT/gpu_check.json (dry run, --quick: 10.7 s)
  unit tests <=90 s  pytest tests -x -q with 8 xdist workers under a timeout -> OUT/pytest.log; skipped when less
                     than 30 s is left (dry run, two tests: 9.1 s)
  Within B, drop the unit tests first, then the GPU check.
The lease: a machine's start (1 to 2 minutes) + A (~8 to 9.5 minutes) + B (4 minutes) is 13 to 15.5 minutes of the
15: call B at once after A, with --budget-s set from the time left (status's budget_left_s minus 30 s), and skip it
under 90 s.

Files back (at most 8 a command): A writes preflight.json, train.log, metrics.jsonl, gpu.json, session_A.json;
B writes gpu_check.json, gpu_check.log, pytest.log, session_B.json.
"""
import argparse
import json
import os
import platform
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
DATA = ROOT / "data" / "multi30k"  # filled by `make gpu-data`; git ignores data/ (--data: another folder)

COMMAND_S = 570  # one command: 9.5 minutes
TRAIN_MINUTES = 5.5
SCORE_RESERVE_S = 120  # scoring and recording, kept free whatever start-up took
# the gpu preset as it is, a budget in data (its epochs, validation every eval_epochs), with the command's cap on the
# trainer's minutes (from its first step): on an H100 or H200 the epochs run out first (the recorded pre-norm run
# saw 31 epochs in 3.5 minutes), on a slower GPU the cap does and the cooldown follows it
TRAIN_SET = {"max_steps": "none", "max_minutes": TRAIN_MINUTES, "log_every": 10}
GPU_CHECK_S = 120
PYTEST_S = 90
PHASE_B_S = 240  # phase B's default budget (--budget-s): what the lease has left after phase A and the machine's start
# the dry run: the tiny preset, a few steps on the CPU, a few sentences scored, gpu_check --quick, two unit tests
DRY_SET = {"epochs": 1, "max_steps": 4, "max_minutes": 1.0, "train_subset": 200, "vocab_size": 400, "device": "cpu",
           "amp": "off", "average_last": 1, "log_every": 2, "threads": 1}
DRY_TESTS = ["tests/test_gpu_check.py::test_share_of_run_by_hand",
             "tests/test_runtime_checks.py::test_supported_settings_pass"]


class Session:
    """The clock, the environment and the log of one phase; writes OUT/session_<phase>.json after each step."""

    def __init__(self, phase: str, out: Path, dry_run: bool, work: Path, data: Path, score: str = "auto"):
        self.phase, self.out, self.dry_run, self.work, self.data, self.score = phase, out, dry_run, work, data, score
        self.start = time.perf_counter()
        self.steps: dict[str, dict] = {}
        self.env = {**os.environ, "PYTHONPATH": str(ROOT), "TRANSFORMER_LIB_DATA": str(data),
                    "TRANSFORMER_LIB_CACHE": str(work / "cache"), "PYTHONUNBUFFERED": "1"}
        self.env.pop("TRANSFORMER_LIB_CHECKPOINT", None)

    def elapsed(self) -> float:
        return time.perf_counter() - self.start

    def record(self, name: str, seconds: float, **facts) -> None:
        self.steps[name] = {"seconds": round(seconds, 1), **facts}
        summary = {"phase": self.phase, "dry_run": self.dry_run, "elapsed_s": round(self.elapsed(), 1),
                   "steps": self.steps}
        (self.out / f"session_{self.phase}.json").write_text(json.dumps(summary, indent=2) + "\n", encoding="utf-8")
        print(f"[{self.elapsed():6.1f} s] {name}: {seconds:.1f} s {facts if facts else ''}", flush=True)

    def run(self, name: str, command: list[str], log: Path, timeout: float | None = None,
            grace_s: float = 45) -> int:
        """Run command with its output in log; past timeout, SIGTERM (the trainer writes last.pt), then SIGKILL."""
        start = time.perf_counter()
        with log.open("a", encoding="utf-8") as f:
            f.write(f"$ {' '.join(command)}\n")
            f.flush()
            process = subprocess.Popen(command, cwd=ROOT, env=self.env, stdout=f, stderr=subprocess.STDOUT)
            cut = False
            try:
                code = process.wait(timeout=timeout)
            except subprocess.TimeoutExpired:
                cut = True
                process.send_signal(signal.SIGTERM)
                try:
                    code = process.wait(timeout=grace_s)
                except subprocess.TimeoutExpired:
                    process.kill()
                    code = process.wait()
        self.record(name, time.perf_counter() - start, returncode=code, cut_at_deadline=cut)
        return code


def checkpoint_to_score(run_dir: Path, choice: str = "auto") -> str | None:
    """model.pt of a finished run; last.pt of a run cut short (what exists is scored); None when neither exists.
    choice "model.pt" or "last.pt" asks for one (the dry run scores last.pt, to exercise the fallback)."""
    if choice != "auto":
        return choice if (run_dir / choice).exists() else None
    return next((name for name in ("model.pt", "last.pt") if (run_dir / name).exists()), None)


def preflight(s: Session) -> dict:
    """The device, the versions, the data (verified against its checksums): OUT/preflight.json."""
    start = time.perf_counter()
    sys.path.insert(0, str(ROOT))
    import torch

    from transformer_lib.data import DataError, multi30k_dir

    facts = {"python": platform.python_version(), "torch": torch.__version__, "cuda": torch.version.cuda,
             "cuda_available": torch.cuda.is_available(), "cpus": os.cpu_count(), "dry_run": s.dry_run}
    if torch.cuda.is_available():
        facts.update(gpu=torch.cuda.get_device_name(0),
                     capability=".".join(map(str, torch.cuda.get_device_capability(0))),
                     gpu_memory_gib=round(torch.cuda.get_device_properties(0).total_memory / 2**30, 1))
    for module in ("einops", "sacrebleu", "tqdm", "numpy", "pytest", "xdist"):
        try:
            facts[module] = getattr(__import__(module), "__version__", "present")
        except ImportError:
            facts[module] = None
    try:
        multi30k_dir(s.data, download=False)
        facts["data"] = f"{s.data.relative_to(ROOT) if s.data.is_relative_to(ROOT) else s.data}: verified"
    except DataError as err:
        facts["data"] = f"missing: {err}"
    (s.out / "preflight.json").write_text(json.dumps(facts, indent=2) + "\n", encoding="utf-8")
    s.record("preflight", time.perf_counter() - start, data=facts["data"])
    if not facts["data"].endswith(": verified"):
        raise SystemExit(f"no data: run `make gpu-data` here and carry `data` to the GPU machine ({facts['data']})")
    if not s.dry_run and not facts["cuda_available"]:
        raise SystemExit("no CUDA device: use --dry-run on a CPU")
    return facts


def phase_a(s: Session) -> None:
    """Preflight, training sized to fit, then scoring and recording, in one command."""
    preflight(s)
    run_dir = s.work / "run"
    if run_dir.exists():
        shutil.rmtree(run_dir)
    preset, overrides = ("tiny", DRY_SET) if s.dry_run else ("gpu", TRAIN_SET)
    train = [sys.executable, "-m", "transformer_lib", "train", "--preset", preset, "--out", str(run_dir), "--quiet"]
    for key, value in overrides.items():
        train += ["--set", f"{key}={value}"]
    budget = 120 if s.dry_run else COMMAND_S
    deadline = budget - SCORE_RESERVE_S * (not s.dry_run) - s.elapsed()  # the training command's hard limit
    s.run("train", train, s.out / "train.log", timeout=deadline)
    if (run_dir / "metrics.jsonl").exists():
        shutil.copy(run_dir / "metrics.jsonl", s.out / "metrics.jsonl")
        records = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text(encoding="utf-8").splitlines()]
        overhead = next((r for r in reversed(records) if r.get("kind") == "overhead"), None)
        if overhead is not None:  # the trainer's own start-up (before its clock), validation, saving, averaging
            s.record("trainer_overhead", overhead["seconds"] * overhead["share"],
                     **{k: round(v, 1) for k, v in overhead.items() if k not in ("kind", "step", "seconds", "share")})
    model = checkpoint_to_score(run_dir, s.score)  # a run cut short: score what exists
    if model is None:
        s.record("score", 0.0, error=f"no {'model.pt or last.pt' if s.score == 'auto' else s.score}: nothing to score")
        raise SystemExit(1)
    shown = "transformer-lib train --preset " + preset + "".join(f" --set {k}={v}" for k, v in overrides.items())
    record = [sys.executable, "tools/record_run.py", str(run_dir), str(s.out / "gpu.json"), "--command", shown,
              "--beam", "4", "--model", model, "--notes",
              f"tools/gpu_session.py phase A{' --dry-run' if s.dry_run else ''}: trained, scored and recorded in "
              f"one command of {COMMAND_S} s"]
    if s.dry_run:
        record += ["--limit", "8"]
    s.run("score", record, s.out / "train.log")
    if (s.out / "gpu.json").exists():
        result = json.loads((s.out / "gpu.json").read_text(encoding="utf-8"))
        s.record("result", 0.0, model=model, bleu=result.get("bleu"), mfu=result.get("mfu"),
                 tokens_per_s=result.get("tokens_per_s"), margin_s=round(COMMAND_S - s.elapsed(), 1))


def phase_b(s: Session, budget_s: float = PHASE_B_S) -> None:
    """The GPU check and the unit tests under this machine's PyTorch, each capped to fit budget_s: the unit tests
    go first when the budget is short (they run only with 30 s or more left after the check)."""
    check = [sys.executable, "benchmarks/gpu_check.py", "--out", str(s.out / "gpu_check.json"),
             "--run-minutes", str(TRAIN_MINUTES)]
    if s.dry_run:
        check += ["--device", "cpu", "--quick"]
    s.run("gpu_check", check, s.out / "gpu_check.log", timeout=max(10, min(GPU_CHECK_S, budget_s - 60)), grace_s=5)
    left = budget_s - s.elapsed() - 10
    if left < 30:
        s.record("unit_tests", 0.0, skipped=f"{left:.0f} s left of the phase's {budget_s:.0f} s")
        return
    tests = [sys.executable, "-m", "pytest", "-x", "-q", "-p", "no:cacheprovider"]
    if s.dry_run:
        tests += DRY_TESTS
    else:
        tests += ["tests"]
        try:
            import xdist  # noqa: F401

            tests += ["-n", "8"]
        except ImportError:
            pass
    s.env.update(TRANSFORMER_LIB_PRESET="tiny", OMP_NUM_THREADS="1")
    s.run("unit_tests", tests, s.out / "pytest.log", timeout=min(PYTEST_S, left), grace_s=5)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("phase", choices=["A", "B", "all"])
    parser.add_argument("out", type=Path, help="the output folder ($OUT on the GPU machine)")
    parser.add_argument("--dry-run", action="store_true", help="a tiny budget on the CPU (CI)")
    parser.add_argument("--data", type=Path, default=DATA,
                        help="the folder of the Multi30k files (default: data/multi30k, which `make gpu-data` fills)")
    parser.add_argument("--budget-s", type=float, default=PHASE_B_S,
                        help=f"phase B's seconds (default {PHASE_B_S}): the GPU check gets up to {GPU_CHECK_S}, "
                             f"the unit tests up to {PYTEST_S} of what is left, or are skipped under 30")
    parser.add_argument("--score", choices=["auto", "model.pt", "last.pt"], default="auto",
                        help="the checkpoint to score (auto: model.pt, else last.pt of a run cut short)")
    parser.add_argument("--work", type=Path, default=None,
                        help="where the run folder and the tokenizer cache go (default: a new temporary folder; "
                             "never inside OUT, whose files come back)")
    args = parser.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    work = args.work or Path(tempfile.mkdtemp(prefix="gpu_session_"))
    work.mkdir(parents=True, exist_ok=True)
    session = lambda phase: Session(phase, args.out, args.dry_run, work, args.data.resolve(), args.score)  # noqa: E731
    if args.phase in ("A", "all"):
        phase_a(session("A"))
    if args.phase in ("B", "all"):
        phase_b(session("B"), args.budget_s)


if __name__ == "__main__":
    main()
