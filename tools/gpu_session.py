"""A lent GPU as prepared commands: train, score and record the `gpu` translator in one (A), check the GPU path and run
the unit tests under that machine's PyTorch in another (B), or train several configurations side by side on the one
GPU and score each (sweep). Each writes what it has into OUT as it goes.

The lease: about 15 minutes of machine time in all, its start included (a minute or two), at most 10 minutes a
command, no network, PyTorch preinstalled (with einops, sacrebleu, tqdm, numpy, pytest), nothing installed from
here, a copy of the working tree only, and at most 8 files back a command (a 193 MB model cannot come back, so a
model is trained and scored in the same command). Before the lease, here: `make gpu-data` copies the Multi30k files
into data/multi30k, a folder inside the tree that git ignores, which travels with the tree when the lease is told to
carry `data`. Everything runs with PYTHONPATH at the repository, nothing installed.

Usage:  python tools/gpu_session.py A OUT      (one command of at most 9.5 minutes: timeout_s 580)
        python tools/gpu_session.py B OUT [--budget-s S]   (one command of about 4 minutes, at once after A)
        python tools/gpu_session.py sweep OUT [--configs FILE] [--runs-at-once K]   (instead of A: at most 9.5 min)
        python tools/gpu_session.py all OUT --dry-run     (A and B on the CPU with a tiny budget, under a minute)
        python tools/gpu_session.py sweep OUT --dry-run   (two tiny runs side by side on the CPU, under a minute: CI)

Phase A, at most 570 s, the one that matters most (never drop it). One H100 ran it (results/gpu/h100_2026-11-27):
  preflight     6 s  Python, torch, CUDA's start; device, versions, data verified -> OUT/preflight.json
  training    181 s  the gpu preset's budget in data (30 epochs: 870 steps, 2.6 training minutes on the H100),
                     capped at 5.5 minutes by the trainer's clock, which starts at its first step (TRAIN_SET); of its
                     173 s in the trainer, 31 s were outside training steps (start-up before the clock 12 s: data,
                     the 8000-token BPE, encoding, the model; first step 7 s; validation 3 s; saving 8 s; averaging 1 s)
  scoring      19 s  val and test2016, beam 4 and greedy, cased and lower-cased, with tools/record_run.py (model.pt,
                     or last.pt if the run was cut) -> OUT/gpu.json with device, versions, epochs, tokens/s,
                     real-token MFU, the share of time outside training steps, and the validation-loss curve
  margin      364 s  of 570 s. A hard deadline guards scoring: the training command gets 570 - 120 s - the
                     preflight's seconds; past it, SIGTERM makes the trainer write last.pt and stop, and last.pt is
                     scored.
Phase B, 240 s by default (--budget-s: what the lease has left), dropped first: the translator's results need none of it.
  gpu_check  <=160 s benchmarks/gpu_check.py under a timeout (101 s on the H100, before its part 6, the trainer's own
                     step over the real batches, about 20 s more); its JSON is rewritten after each part and each
                     training mode, the compiled one last -> OUT/gpu_check.json
  unit tests <=90 s  pytest tests -x -q with 8 xdist workers under a timeout -> OUT/pytest.log; skipped when less
                     than 30 s is left
  Within B, drop the unit tests first, then the GPU check.
The lease: a machine's start (1 to 2 minutes) + A (3.5 minutes on the H100, 9.5 at most) + B (4 minutes) fits the 15:
call B at once after A, with --budget-s set from the time left (status's budget_left_s minus 30 s), and skip it
under 90 s.

The sweep, at most 570 s, instead of phase A: the configurations of --configs (tools/sweep_configs.json: a preset,
and for each run a name, its overrides and why it is there) are checked first, all of them, against TrainConfig
(an unknown field or a value out of range refuses the file in one line, exit 2, before any work). Then the preflight,
the tokenizers the runs need (built once, not by K processes at once), and K runs at a time (--runs-at-once, default
all), each a `transformer_lib train` process with threads=2 (starts STAGGER_S apart when they compile), capped by the
trainer's clock so that its training ends by 570 - 120 s, the budget in data (the preset's epochs) still the first
limit where it fits. As each run ends it is scored with tools/record_run.py, beam 4 (and greedy), on val and
test2016, while the others train. A run that fails is recorded as failed with the last line of its log; the others
go on. OUT/sweep.json is rewritten at each change: {"device", "torch_version", "preset", "runs": [{"name", "why",
"overrides", "status", "steps", "epochs", "tokens_per_s", "train_minutes", "val_loss", "bleu", "bleu_greedy", ...}]}.
Files back: A writes preflight.json, train.log, metrics.jsonl, gpu.json, session_A.json; B writes gpu_check.json,
gpu_check.log, pytest.log, session_B.json; the sweep writes preflight.json, session_sweep.json, sweep.json,
sweep.log (each run's last log lines) and metrics_NAME.jsonl of as many runs as the 8 files leave room for (4).
"""
import argparse
import importlib.util
import json
import os
import platform
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
DATA = ROOT / "data" / "multi30k"  # filled by `make gpu-data`; git ignores data/ (--data: another folder)
SWEEP_CONFIGS = ROOT / "tools" / "sweep_configs.json"

COMMAND_S = 570  # one command: 9.5 minutes
TRAIN_MINUTES = 5.5
SCORE_RESERVE_S = 120  # scoring and recording, kept free whatever start-up took
# the gpu preset as it is, a budget in data (its epochs, validation every eval_epochs), with the command's cap on the
# trainer's minutes (from its first step): on an H100 the epochs run out first (30 epochs in 2.6 minutes,
# results/gpu/h100_2026-11-27), on a slower GPU the cap does and the cooldown follows it
TRAIN_SET = {"max_steps": "none", "max_minutes": TRAIN_MINUTES, "log_every": 10}
GPU_CHECK_S = 160
PYTEST_S = 90
PHASE_B_S = 240  # phase B's default budget (--budget-s): what the lease has left after phase A and the machine's start
# the dry run: the tiny preset, a few steps on the CPU, a few sentences scored, gpu_check --quick, two unit tests
DRY_SET = {"epochs": 1, "max_steps": 4, "max_minutes": 1.0, "train_subset": 200, "vocab_size": 400, "device": "cpu",
           "amp": "off", "average_last": 1, "log_every": 2, "threads": 1}
DRY_TESTS = ["tests/test_gpu_check.py::test_share_of_run_by_hand",
             "tests/test_runtime_checks.py::test_supported_settings_pass"]
DRY_BUDGET_S = 240  # a dry run's whole command: a guard, on a CPU that may be busy (under a minute on an idle one)

# the sweep: what each run's command sets (max_minutes, the cap, is added run by run to fit the command)
SWEEP_SET = {"max_steps": "none", "log_every": 10, "threads": 2}
SESSION_FIELDS = ("preset", "device", "threads", "max_minutes", "max_steps", "log_every")  # the session's, not a run's
STARTUP_S = 45  # a trainer's start before its clock (12 s alone on the H100) and its end (validation, model.pt)
MIN_TRAIN_S = 90  # a run starts only while this much of the training window is left
STAGGER_S = 30  # between the starts of runs that compile: Dynamo takes the CPU for half a minute
TERM_GRACE_S = 45  # after SIGTERM, the time a trainer has to write last.pt
FILES_BACK = 8  # what a command of the lease returns
SWEEP_FILES = ("preflight.json", "session_sweep.json", "sweep.json", "sweep.log")  # the rest: metrics_NAME.jsonl
# the dry sweep: two tiny runs that differ in one lever
DRY_SWEEP = [{"name": "dropout0.1", "overrides": {"dropout": 0.1}, "why": "the tiny preset's dropout"},
             {"name": "dropout0.3", "overrides": {"dropout": 0.3}, "why": "one lever changed, to see it reach the run"}]


def needs_nbformat() -> list[Path]:
    """The test files that need nbformat, directly or through a module of tools/."""
    names = re.compile(r"^\s*(?:import|from)\s+(\w+)", re.M)

    def imported(path: Path) -> set[str]:
        return set(names.findall(path.read_text(encoding="utf-8")))

    readers, tools = {"nbformat", "nbclient"}, {t.stem: imported(t) for t in (ROOT / "tools").glob("*.py")}
    while True:  # a module of tools/ that imports one that needs it needs it too
        more = {name for name, names in tools.items() if names & readers} - readers
        if not more:
            break
        readers |= more
    return [t for t in sorted((ROOT / "tests").glob("test_*.py")) if imported(t) & readers]


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
            grace_s: float = TERM_GRACE_S) -> int:
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


def as_text(value: Any) -> str:
    """A JSON value as `--set key=value` writes it: true/false, none, comma-separated numbers for a tuple."""
    if isinstance(value, bool):
        return str(value).lower()
    if value is None:
        return "none"
    if isinstance(value, (list, tuple)):
        return ",".join(str(v) for v in value)
    return str(value)


def train_command(preset: str, settings: dict[str, Any], run_dir: Path) -> list[str]:
    """The `transformer_lib train` command of a preset with settings (--set key=value each), into run_dir."""
    command = [sys.executable, "-m", "transformer_lib", "train", "--preset", preset, "--out", str(run_dir), "--quiet"]
    for key, value in settings.items():
        command += ["--set", f"{key}={as_text(value)}"]
    return command


def shown_command(preset: str, settings: dict[str, Any]) -> str:
    """The command as a results/ record names it."""
    return f"transformer-lib train --preset {preset}" + "".join(f" --set {k}={as_text(v)}" for k, v in settings.items())


def score_command(run_dir: Path, record: Path, shown: str, model: str, notes: str, dry_run: bool) -> list[str]:
    """tools/record_run.py on run_dir/model: beam 4 and greedy on val and test2016 (8 pairs each in a dry run)."""
    command = [sys.executable, "tools/record_run.py", str(run_dir), str(record), "--command", shown, "--beam", "4",
               "--model", model, "--notes", notes]
    return command + (["--limit", "8"] if dry_run else [])


def overhead_of(metrics: Path) -> dict | None:
    """The trainer's last "overhead" record in metrics.jsonl: its seconds outside training steps, by part."""
    if not metrics.exists():
        return None
    records = [json.loads(line) for line in metrics.read_text(encoding="utf-8").splitlines() if line.strip()]
    return next((r for r in reversed(records) if r.get("kind") == "overhead"), None)


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
    budget = DRY_BUDGET_S if s.dry_run else COMMAND_S
    deadline = budget - SCORE_RESERVE_S * (not s.dry_run) - s.elapsed()  # the training command's hard limit
    s.run("train", train_command(preset, overrides, run_dir), s.out / "train.log", timeout=deadline)
    if (run_dir / "metrics.jsonl").exists():
        shutil.copy(run_dir / "metrics.jsonl", s.out / "metrics.jsonl")
    overhead = overhead_of(run_dir / "metrics.jsonl")
    if overhead is not None:  # the trainer's own start-up (before its clock), validation, saving, averaging
        s.record("trainer_overhead", overhead["seconds"] * overhead["share"],
                 **{k: round(v, 1) for k, v in overhead.items() if k not in ("kind", "step", "seconds", "share")})
    model = checkpoint_to_score(run_dir, s.score)  # a run cut short: score what exists
    if model is None:
        s.record("score", 0.0, error=f"no {'model.pt or last.pt' if s.score == 'auto' else s.score}: nothing to score")
        raise SystemExit(1)
    notes = (f"tools/gpu_session.py phase A{' --dry-run' if s.dry_run else ''}: trained, scored and recorded in "
             f"one command of {COMMAND_S} s")
    s.run("score", score_command(run_dir, s.out / "gpu.json", shown_command(preset, overrides), model, notes,
                                 s.dry_run), s.out / "train.log")
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
        if importlib.util.find_spec("nbformat") is None:  # the book's page tests read notebooks with it
            tests += [f"--ignore={t}" for t in needs_nbformat()]
        try:
            import xdist  # noqa: F401

            tests += ["-n", "8"]
        except ImportError:
            pass
    s.env.update(TRANSFORMER_LIB_PRESET="tiny", OMP_NUM_THREADS="1")
    s.run("unit_tests", tests, s.out / "pytest.log", timeout=min(PYTEST_S, left), grace_s=5)


class SweepError(ValueError):
    """A configurations file the sweep refuses, before any work."""


def check_runs(runs: Any, preset: str, extra: dict[str, Any], where: str) -> list[dict]:
    """Each run ({"name", "overrides", "why"}) checked as TrainConfig checks a command's --set, over preset with the
    extra settings on top: SweepError, naming the run and the field, for the first that is wrong."""
    from transformer_lib.config import TrainConfig, parse_overrides

    if not isinstance(runs, list) or not runs:
        raise SweepError(f"{where}: expected a list of runs, each {{\"name\", \"overrides\", \"why\"}}")
    checked, names = [], set()
    for k, run in enumerate(runs, 1):
        name = run.get("name") if isinstance(run, dict) else None
        at = f"{where}: run {k}" + (f" ({name})" if isinstance(name, str) else "")
        odd = sorted(set(run) - {"name", "overrides", "why"}) if isinstance(run, dict) else [type(run).__name__]
        if odd:
            raise SweepError(f"{at}: unknown key(s) {', '.join(odd)}; a run has name, overrides and why")
        if not isinstance(name, str) or not re.fullmatch(r"[A-Za-z0-9._+-]+", name) or name in names:
            raise SweepError(f"{at}: name must be unique, of letters, digits and ._+- (it names files)")
        if not isinstance(run.get("why"), str) or not run["why"].strip():
            raise SweepError(f"{at}: why is missing: say what the run is there to find out")
        overrides = run.get("overrides", {})
        if not isinstance(overrides, dict):
            raise SweepError(f"{at}: overrides must be an object of TrainConfig fields")
        theirs = sorted(set(overrides) & set(SESSION_FIELDS))
        if theirs:
            raise SweepError(f"{at}: {', '.join(theirs)}: the session sets it (the file's preset; each run's device, "
                             "threads and clock, to fit the command)")
        try:
            settings = parse_overrides([f"{key}={as_text(value)}" for key, value in {**overrides, **extra}.items()])
            config = TrainConfig.from_preset(preset, **settings)
        except ValueError as err:
            raise SweepError(f"{at}: {str(err).splitlines()[0].split('; the settings are')[0]}") from None
        names.add(name)
        checked.append({"name": name, "why": run["why"], "overrides": overrides, "compiles": config.compile,
                        "vocab_size": config.vocab_size, "cap_minutes": config.max_minutes})
    return checked


def read_configs(path: Path, preset: str | None = None, extra: dict[str, Any] | None = None) -> tuple[str, list[dict]]:
    """(preset, checked runs) of a configurations file ({"preset", "runs": [{"name", "overrides", "why"}, ...]});
    preset replaces the file's (the dry run's "tiny"), extra settings go on top of each run's (DRY_SET, SWEEP_SET)."""
    sys.path.insert(0, str(ROOT))
    from transformer_lib.config import PRESETS

    shown = path.resolve().relative_to(ROOT) if path.resolve().is_relative_to(ROOT) else path
    try:
        spec = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as err:
        raise SweepError(f"{shown}: {err}") from None
    if not isinstance(spec, dict) or set(spec) - {"about", "preset", "runs"}:
        odd = sorted(set(spec) - {"about", "preset", "runs"}) if isinstance(spec, dict) else [type(spec).__name__]
        raise SweepError(f"{shown}: unknown key(s) {', '.join(odd)}; the file has about, preset and runs")
    preset = preset or spec.get("preset")
    if preset not in PRESETS:
        raise SweepError(f"{shown}: preset={preset!r} must be one of {', '.join(PRESETS)}")
    return preset, check_runs(spec.get("runs"), preset, extra or {}, str(shown))


def last_line(log: Path) -> str:
    """The last line of a log that says something (a traceback's last line names the error)."""
    if not log.exists():
        return ""
    lines = [line.strip() for line in log.read_text(encoding="utf-8", errors="replace").splitlines() if line.strip()]
    return lines[-1][:300] if lines else ""


def summary_of(record: dict) -> dict:
    """What sweep.json keeps of a run's results record (tools/record_run.py), with its last validation loss."""
    keep = ("steps", "epochs", "tokens_per_s", "train_minutes", "bleu", "bleu_greedy", "mfu", "checkpoint", "overhead",
            "config", "val_loss_curve", "limit")
    curve = record.get("val_loss_curve") or []
    return {**{k: record[k] for k in keep if k in record}, "val_loss": curve[-1][1] if curve else None}


def side_by_side(s: Session, header: dict, runs: list[dict], runs_at_once: int, train_end_s: float, end_s: float,
                 train: Callable[[dict, Path, float], list[str]], score: Callable[[dict, Path, str], list[str]],
                 min_train_s: float = MIN_TRAIN_S, poll_s: float = 0.5) -> dict:
    """Train runs_at_once runs at a time, each scored as it ends while the others train, until all have ended.

    train(run, run_dir, seconds) is a run's training command, with `seconds` of the training window left; past
    train_end_s (session seconds) it gets SIGTERM and writes last.pt, which is scored. score(run, run_dir, model) is
    the command that writes run_dir/record.json; past end_s it is killed. A run that fails is recorded with the last
    line of its log. OUT/sweep.json is rewritten at each change; each run's log goes to WORK/NAME.log, its last
    lines to OUT/sweep.log, and its metrics.jsonl to OUT/metrics_NAME.jsonl while the FILES_BACK leave room.
    """
    report = {**header, "runs": [{"name": r["name"], "why": r["why"], "overrides": r["overrides"],
                                  "status": "waiting"} for r in runs]}
    entries = [{"run": r, "public": p, "process": None, "since": 0.0, "cut_at": None}
               for r, p in zip(runs, report["runs"], strict=True)]
    room = FILES_BACK - len(SWEEP_FILES)

    def save() -> None:
        report["elapsed_s"] = round(s.elapsed(), 1)
        (s.out / "sweep.json").write_text(json.dumps(report, indent=2) + "\n", encoding="utf-8")

    def start(e: dict, status: str, command: list[str]) -> None:
        with (s.work / f"{e['run']['name']}.log").open("a", encoding="utf-8") as f:
            f.write(f"$ {' '.join(command)}\n")
            f.flush()
            e["process"] = subprocess.Popen(command, cwd=ROOT, env=s.env, stdout=f, stderr=subprocess.STDOUT)
        e["since"], e["public"]["status"] = s.elapsed(), status
        print(f"[{s.elapsed():6.1f} s] {e['run']['name']}: {status}", flush=True)
        save()

    def finish(e: dict, status: str, **facts) -> None:
        name = e["run"]["name"]
        log, run_dir = s.work / f"{name}.log", s.work / name
        e["public"].update(status=status, **facts)
        if status == "failed":
            e["public"]["last_log_line"] = last_line(log)
        if (run_dir / "metrics.jsonl").exists() and entries.index(e) < room:
            shutil.copy(run_dir / "metrics.jsonl", s.out / f"metrics_{name}.jsonl")
        tail = log.read_text(encoding="utf-8", errors="replace").splitlines()[-25:] if log.exists() else []
        with (s.out / "sweep.log").open("a", encoding="utf-8") as f:
            f.write(f"== {name}: {status} at {s.elapsed():.0f} s\n" + "".join(f"{line}\n" for line in tail))
        print(f"[{s.elapsed():6.1f} s] {name}: {status}" + (f" ({facts})" if status != "done" else ""), flush=True)
        save()

    next_start = 0.0
    while any(e["public"]["status"] in ("waiting", "training", "scoring") for e in entries):
        now = s.elapsed()
        for e in entries:
            status, process, run_dir = e["public"]["status"], e["process"], s.work / e["run"]["name"]
            if status == "training" and process.poll() is None:
                if now > train_end_s and e["cut_at"] is None:
                    process.send_signal(signal.SIGTERM)  # the trainer writes last.pt and stops
                    e["cut_at"] = now
                elif e["cut_at"] is not None and now > e["cut_at"] + TERM_GRACE_S:
                    process.kill()
            elif status == "training":
                cut = e["cut_at"] is not None
                e["public"].update(train_s=round(now - e["since"], 1), returncode=process.returncode,
                                   cut_at_deadline=cut)
                model = checkpoint_to_score(run_dir)
                if (process.returncode != 0 and not cut) or model is None:
                    finish(e, "failed")
                else:
                    e["public"]["model"] = model
                    start(e, "scoring", score(e["run"], run_dir, model))
            elif status == "scoring" and process.poll() is None:
                if now > end_s and e.get("killed") is None:
                    process.kill()
                    e["killed"] = now
            elif status == "scoring":
                record = run_dir / "record.json"
                e["public"]["score_s"] = round(now - e["since"], 1)
                if process.returncode == 0 and record.exists():
                    finish(e, "done", **summary_of(json.loads(record.read_text(encoding="utf-8"))))
                elif e.get("killed") is not None:
                    finish(e, "failed", reason=f"scoring killed at the command's deadline ({end_s:.0f} s)")
                else:
                    finish(e, "failed")
        for e in entries:
            training = sum(x["public"]["status"] == "training" for x in entries)
            if e["public"]["status"] != "waiting" or training >= runs_at_once or s.elapsed() < next_start:
                continue
            left = train_end_s - s.elapsed()
            if left < min_train_s:
                finish(e, "skipped", reason=f"{left:.0f} s of the training window left, under {min_train_s:.0f} s")
                continue
            run_dir = s.work / e["run"]["name"]
            if run_dir.exists():
                shutil.rmtree(run_dir)
            start(e, "training", train(e["run"], run_dir, left))
            next_start = s.elapsed() + (STAGGER_S if e["run"].get("compiles") else 0)
        time.sleep(poll_s)
    save()
    return report


def sweep(s: Session, configs: Path, runs_at_once: int | None, named: bool) -> dict:
    """The runs of `configs` trained side by side on the one GPU and scored, in one command -> OUT/sweep.json.
    The dry run trains DRY_SWEEP (or, when a file is named, its runs) on the tiny preset with DRY_SET, on the CPU."""
    preset, runs = read_configs(configs, extra=SWEEP_SET)  # checked even when the dry run trains DRY_SWEEP
    extra = DRY_SET if s.dry_run else SWEEP_SET
    if s.dry_run:
        preset, runs = read_configs(configs, "tiny", extra) if named else ("tiny", check_runs(DRY_SWEEP, "tiny", extra,
                                                                                                 "DRY_SWEEP"))
    facts = preflight(s)
    from transformer_lib.tokenizer import multi30k_tokenizer

    os.environ["TRANSFORMER_LIB_CACHE"] = s.env["TRANSFORMER_LIB_CACHE"]  # where the runs will look for them
    for vocab in sorted({run["vocab_size"] for run in runs}):  # built once here, not by each process at once
        start = time.perf_counter()
        multi30k_tokenizer(vocab, s.data)
        s.record(f"tokenizer {vocab}", time.perf_counter() - start)
    budget, startup_s = (DRY_BUDGET_S, 10) if s.dry_run else (COMMAND_S, STARTUP_S)
    shown = configs.resolve().relative_to(ROOT) if configs.resolve().is_relative_to(ROOT) else configs.name
    header = {"device": facts.get("gpu", "cpu"), "torch_version": facts["torch"], "preset": preset,
              "configs": "DRY_SWEEP" if s.dry_run and not named else str(shown),
              "runs_at_once": runs_at_once or len(runs), "dry_run": s.dry_run, "settings": extra,
              "max_minutes": f"each run's: the training window it has left at its start, less {startup_s} s"}

    def train(run: dict, run_dir: Path, seconds: float) -> list[str]:
        cap = max(0.1, (seconds - startup_s) / 60)
        cap = min(cap, run["cap_minutes"]) if run["cap_minutes"] is not None else cap
        return train_command(preset, {**run["overrides"], **extra, "max_minutes": round(cap, 2)}, run_dir)

    def score(run: dict, run_dir: Path, model: str) -> list[str]:
        notes = f"tools/gpu_session.py sweep{' --dry-run' if s.dry_run else ''}: {run['name']}, one of {len(runs)} runs"
        return score_command(run_dir, run_dir / "record.json", shown_command(preset, {**run["overrides"], **extra}),
                             model, notes, s.dry_run)

    reserve = 60 if s.dry_run else SCORE_RESERVE_S
    return side_by_side(s, header, runs, runs_at_once or len(runs), budget - reserve, budget - 10, train, score,
                        min_train_s=10 if s.dry_run else MIN_TRAIN_S)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("phase", choices=["A", "B", "all", "sweep"])
    parser.add_argument("out", type=Path, help="the output folder ($OUT on the GPU machine)")
    parser.add_argument("--dry-run", action="store_true", help="a tiny budget on the CPU (CI)")
    parser.add_argument("--data", type=Path, default=DATA,
                        help="the folder of the Multi30k files (default: data/multi30k, which `make gpu-data` fills)")
    parser.add_argument("--budget-s", type=float, default=PHASE_B_S,
                        help=f"phase B's seconds (default {PHASE_B_S}): the GPU check gets up to {GPU_CHECK_S}, "
                             f"the unit tests up to {PYTEST_S} of what is left, or are skipped under 30")
    parser.add_argument("--score", choices=["auto", "model.pt", "last.pt"], default="auto",
                        help="the checkpoint to score (auto: model.pt, else last.pt of a run cut short)")
    parser.add_argument("--configs", type=Path, default=None,
                        help="sweep: the configurations file (default tools/sweep_configs.json; the dry run trains "
                             "two tiny runs unless one is named)")
    parser.add_argument("--runs-at-once", type=int, default=None, help="sweep: runs trained at a time (default: all)")
    parser.add_argument("--work", type=Path, default=None,
                        help="where the run folders and the tokenizer cache go (default: a new temporary folder; "
                             "never inside OUT, whose files come back)")
    args = parser.parse_args(argv)
    if args.runs_at_once is not None and args.runs_at_once < 1:
        parser.exit(2, f"{parser.prog}: error: --runs-at-once={args.runs_at_once} must be at least 1\n")
    if args.phase == "sweep":  # a bad configurations file is refused before any work
        try:
            read_configs(args.configs or SWEEP_CONFIGS, extra=SWEEP_SET)
            if args.dry_run and args.configs is not None:
                read_configs(args.configs, "tiny", DRY_SET)
        except SweepError as err:
            parser.exit(2, f"{parser.prog}: error: {err}\n")
    args.out.mkdir(parents=True, exist_ok=True)
    work = args.work or Path(tempfile.mkdtemp(prefix="gpu_session_"))
    work.mkdir(parents=True, exist_ok=True)
    session = lambda phase: Session(phase, args.out, args.dry_run, work, args.data.resolve(), args.score)  # noqa: E731
    if args.phase == "sweep":
        sweep(session("sweep"), args.configs or SWEEP_CONFIGS, args.runs_at_once, args.configs is not None)
    if args.phase in ("A", "all"):
        phase_a(session("A"))
    if args.phase in ("B", "all"):
        phase_b(session("B"), args.budget_s)


if __name__ == "__main__":
    main()
