"""A lent GPU as two prepared commands: train, score and record the `gpu` translator in one, check the GPU path and
run the unit tests under that machine's PyTorch in the other. Each writes what it has into OUT as it goes.

The lease: about 15 minutes of machine time in all, its start included (a minute or two), at most 10 minutes a
command, no network, PyTorch preinstalled (with einops, sacrebleu, tqdm, numpy, pytest), nothing installed from
here, a copy of the working tree only, and a few small files back (a 193 MB model cannot come back, so a model is
trained and scored in the same command). Before the lease, here: `make gpu-data` copies the Multi30k files into
data/multi30k, a folder inside the tree that git ignores, which travels with the tree when the lease is told to
carry `data`. Everything runs with PYTHONPATH at the repository, nothing installed.

Usage:  python tools/gpu_session.py A OUT      (one command of at most 9.5 minutes)
        python tools/gpu_session.py B OUT      (one command of about 4 minutes)
        python tools/gpu_session.py all OUT --dry-run   (both on the CPU with a tiny budget, in about a minute: CI)

Phase A, about 9.5 minutes, the one that matters most (never drop it):
  preflight   ~15 s  device, versions, data present and verified -> OUT/preflight.json
  start-up    ~30 s  the trainer's own: data, the BPE tokenizer (about 8 s to train), the model, CUDA
  training   360 s   the gpu preset with its budget stated here (TRAIN_SET): 6 minutes of steps, by the trainer's
                     clock, which starts at its first step; a hard deadline (SIGTERM, then last.pt) guards scoring
  finishing  ~20 s   the end's validation, the average of the last 5 points, model.pt
  scoring    ~90 s   val and test2016, beam 4 and greedy, cased and lower-cased, with tools/record_run.py (model.pt,
                     or last.pt if the run was cut) -> OUT/gpu.json with device, versions, epochs, tokens/s,
                     real-token MFU, the share of time outside training steps, and the validation-loss curve
  margin     ~55 s   what is left of 570 s; the deadline leaves SCORE_RESERVE_S for scoring however long start-up took
Phase B, about 4 minutes, dropped first (nothing in it is needed for the translator's results):
  gpu_check  <=150 s benchmarks/gpu_check.py under `timeout` (its JSON is rewritten after each part) -> OUT/gpu_check.json
  unit tests <=90 s  pytest tests -x -q with 8 xdist workers under `timeout` -> OUT/pytest.log
  If the lease is short, drop the unit tests first, then the GPU check.

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
TRAIN_MINUTES = 6.0
SCORE_RESERVE_S = 150  # scoring and recording, kept free whatever start-up took
# the gpu preset with its budget stated in full: the trainer's minutes (from its first step) are the binding limit
TRAIN_SET = {"epochs": 1000, "max_steps": "none", "max_minutes": TRAIN_MINUTES, "eval_minutes": 1.0,
             "checkpoint_minutes": 2.0, "average_last": 5, "snapshot_minutes": "none", "log_every": 10}
GPU_CHECK_S = 150
PYTEST_S = 90
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


def phase_b(s: Session) -> None:
    """The GPU check and the unit tests under this machine's PyTorch, each capped."""
    check = [sys.executable, "benchmarks/gpu_check.py", "--out", str(s.out / "gpu_check.json"),
             "--run-minutes", str(TRAIN_MINUTES)]
    if s.dry_run:
        check += ["--device", "cpu", "--quick"]
    s.run("gpu_check", check, s.out / "gpu_check.log", timeout=GPU_CHECK_S, grace_s=5)
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
    s.run("unit_tests", tests, s.out / "pytest.log", timeout=PYTEST_S, grace_s=5)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("phase", choices=["A", "B", "all"])
    parser.add_argument("out", type=Path, help="the output folder ($OUT on the GPU machine)")
    parser.add_argument("--dry-run", action="store_true", help="a tiny budget on the CPU (CI)")
    parser.add_argument("--data", type=Path, default=DATA,
                        help="the folder of the Multi30k files (default: data/multi30k, which `make gpu-data` fills)")
    parser.add_argument("--score", choices=["auto", "model.pt", "last.pt"], default="auto",
                        help="the checkpoint to score (auto: model.pt, else last.pt of a run cut short)")
    parser.add_argument("--work", type=Path, default=None,
                        help="where the run folder and the tokenizer cache go (default: a new temporary folder; "
                             "never inside OUT, whose files come back)")
    args = parser.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    work = args.work or Path(tempfile.mkdtemp(prefix="gpu_session_"))
    work.mkdir(parents=True, exist_ok=True)
    for phase, body in (("A", phase_a), ("B", phase_b)):
        if args.phase in (phase, "all"):
            body(Session(phase, args.out, args.dry_run, work, args.data.resolve(), args.score))


if __name__ == "__main__":
    main()
