"""tools/gpu_session.py, the GPU lease as prepared commands: the sweep dry-runs on the CPU (two tiny runs side by side,
each trained and scored), its scheduler is held to what stand-in processes record of themselves (runs at a time, a
failed run, a run cut at the deadline, the files that come back), a bad configurations file is refused before any
work, and tools/record_run.py imports the repository's own package, installed or not."""
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tools"))

import gpu_session  # noqa: E402
from gpu_session import checkpoint_to_score  # noqa: E402


def _clean_env(**extra: str) -> dict[str, str]:
    """The environment without PYTHONPATH or the library's variables: nothing points at this repository."""
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH" and not k.startswith("TRANSFORMER_LIB_")}
    return {**env, "OMP_NUM_THREADS": "1", **extra}


def test_record_run_imports_the_repositorys_package_without_an_install(tmp_path):
    """The oracle: the file Python imported transformer_lib from, from another folder and with no PYTHONPATH."""
    code = ("import runpy, sys\n"
            "sys.argv = ['record_run.py', '--help']\n"
            "try:\n"
            f"    runpy.run_path({str(ROOT / 'tools' / 'record_run.py')!r}, run_name='__main__')\n"
            "except SystemExit:\n"
            "    pass\n"
            "import transformer_lib\n"
            "print(transformer_lib.__file__)")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=tmp_path,
                          env=_clean_env(), timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    assert "usage: record_run.py" in done.stdout
    assert Path(done.stdout.strip().splitlines()[-1]) == ROOT / "transformer_lib" / "__init__.py"


def test_the_checkpoint_to_score(tmp_path):
    assert checkpoint_to_score(tmp_path) is None
    (tmp_path / "last.pt").write_bytes(b"")
    assert checkpoint_to_score(tmp_path) == "last.pt"  # a run cut short
    (tmp_path / "model.pt").write_bytes(b"")
    assert checkpoint_to_score(tmp_path) == "model.pt"
    assert checkpoint_to_score(tmp_path, "last.pt") == "last.pt"


def test_the_sweep_dry_run_trains_two_runs_side_by_side_and_scores_each(tmp_path):
    """The oracles: this interpreter's torch, the trainer's own metrics file (its steps, its last validation loss)
    and the configuration the trained checkpoint carries (each run's override reached its trainer)."""
    from transformer_lib.data import multi30k_dir

    out = tmp_path / "out"
    done = subprocess.run([sys.executable, str(ROOT / "tools" / "gpu_session.py"), "sweep", str(out), "--dry-run",
                           "--data", str(multi30k_dir()), "--work", str(tmp_path / "work")],
                          capture_output=True, text=True, cwd=tmp_path, env=_clean_env(), timeout=300)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    sweep = json.loads((out / "sweep.json").read_text(encoding="utf-8"))
    assert (sweep["device"], sweep["torch_version"], sweep["preset"]) == ("cpu", torch.__version__, "tiny")
    assert [r["name"] for r in sweep["runs"]] == [r["name"] for r in gpu_session.DRY_SWEEP]
    for run, asked in zip(sweep["runs"], gpu_session.DRY_SWEEP, strict=True):
        assert run["status"] == "done", run
        assert run["config"]["dropout"] == asked["overrides"]["dropout"]  # read back from the trained model
        metrics = [json.loads(line) for line in
                   (out / f"metrics_{run['name']}.jsonl").read_text(encoding="utf-8").splitlines()]
        assert run["steps"] == max(r.get("step", 0) for r in metrics) == gpu_session.DRY_SET["max_steps"]
        assert run["val_loss"] == pytest.approx([r for r in metrics if r["kind"] == "val"][-1]["val_loss"], abs=1e-4)
        assert set(run["bleu"]) == {"val", "test2016"}


def _stand_in(kind: str, sleep_s: float = 0.2) -> str:
    """A stand-in process's code: it notes its own start and end times in run_dir/times.json, then behaves as
    `kind` says: "ok" writes model.pt and metrics.jsonl, "bad" fails as a trainer does, "slow" runs until SIGTERM
    and then writes last.pt, as the trainer does; "score" writes run_dir/record.json."""
    return f"""
import json, signal, sys, time
from pathlib import Path
run_dir = Path(sys.argv[1]); run_dir.mkdir(parents=True, exist_ok=True)
start = time.time()
def note():
    (run_dir / "times.json").write_text(json.dumps([start, time.time()]))
kind = {kind!r}
if kind == "score":
    (run_dir / "record.json").write_text(json.dumps({{"steps": 7, "bleu": {{"val": {{"cased": 1.0}}}},
                                                      "val_loss_curve": [[0.1, 2.5]]}}))
elif kind == "bad":
    print("training preset 'gpu'")
    print("TrainingError: no training pair is left")
    sys.exit(1)
elif kind == "slow":
    def stop(signum, frame):
        (run_dir / "last.pt").write_bytes(b"")
        note()
        sys.exit(0)
    signal.signal(signal.SIGTERM, stop)
    time.sleep(60)
else:
    time.sleep({sleep_s})
    (run_dir / "model.pt").write_bytes(b"")
    (run_dir / "metrics.jsonl").write_text("{{}}\\n")
    note()
"""


def _side_by_side(tmp_path, kinds: dict[str, str], runs_at_once: int, train_end_s: float, sleep_s: float = 0.2) -> dict:
    out, work = tmp_path / "out", tmp_path / "work"
    out.mkdir()
    work.mkdir()
    s = gpu_session.Session("sweep", out, False, work, tmp_path)
    runs = [{"name": name, "why": "a stand-in", "overrides": {}} for name in kinds]
    train = lambda run, run_dir, seconds: [sys.executable, "-c", _stand_in(kinds[run["name"]], sleep_s),  # noqa: E731
                                           str(run_dir)]
    score = lambda run, run_dir, model: [sys.executable, "-c", _stand_in("score"), str(run_dir)]  # noqa: E731
    return gpu_session.side_by_side(s, {"device": "stand-ins"}, runs, runs_at_once, train_end_s, train_end_s + 60,
                                    train, score, min_train_s=0, poll_s=0.05)


def test_a_failed_run_is_recorded_with_its_last_line_and_a_run_at_the_deadline_is_scored(tmp_path):
    start = time.perf_counter()
    report = _side_by_side(tmp_path, {"ok": "ok", "bad": "bad", "slow": "slow"}, runs_at_once=3, train_end_s=3)
    runs = {r["name"]: r for r in report["runs"]}
    assert runs["bad"]["status"] == "failed" and runs["bad"]["returncode"] == 1
    assert runs["bad"]["last_log_line"] == "TrainingError: no training pair is left"
    assert runs["ok"]["status"] == "done" and runs["ok"]["steps"] == 7 and runs["ok"]["val_loss"] == 2.5
    assert runs["slow"]["status"] == "done" and runs["slow"]["cut_at_deadline"] and runs["slow"]["model"] == "last.pt"
    assert time.perf_counter() - start < 30  # the slow one was stopped, not waited for
    assert json.loads((tmp_path / "out" / "sweep.json").read_text(encoding="utf-8")) == report


def test_the_sweep_runs_k_at_a_time_and_keeps_8_files_back(tmp_path):
    """The oracle for K: the start and end times each stand-in noted itself; six runs would leave ten files
    (four of the session's and six metrics files), of which 8 may come back."""
    kinds = {f"run{k}": "ok" for k in range(6)}
    report = _side_by_side(tmp_path, kinds, runs_at_once=2, train_end_s=120, sleep_s=1.0)
    assert [r["status"] for r in report["runs"]] == ["done"] * 6
    times = [json.loads((tmp_path / "work" / name / "times.json").read_text()) for name in kinds]
    at_once = max(sum(a <= t < b for a, b in times) for t, _ in times)
    assert at_once == 2
    back = {p.name for p in (tmp_path / "out").iterdir()} | set(gpu_session.SWEEP_FILES)
    assert len(back) == gpu_session.FILES_BACK
    assert {f"metrics_run{k}.jsonl" for k in range(4)} <= back


@pytest.mark.parametrize("overrides, named", [({"wamup": 300}, "wamup"), ({"dropout": 1.5}, "dropout"),
                                              ({"warmup": 0}, "warmup"), ({"max_minutes": 3}, "max_minutes")])
def test_a_bad_configurations_file_is_refused_in_one_line_before_any_work(tmp_path, capsys, overrides, named):
    configs = tmp_path / "configs.json"
    runs = [{"name": "fine", "overrides": {}, "why": "a baseline"},
            {"name": "odd", "overrides": overrides, "why": "a typo"}]
    configs.write_text(json.dumps({"preset": "gpu", "runs": runs}))
    with pytest.raises(SystemExit) as stopped:
        gpu_session.main(["sweep", str(tmp_path / "out"), "--configs", str(configs)])
    assert stopped.value.code == 2
    message = capsys.readouterr().err.strip()
    assert len(message.splitlines()) == 1 and named in message and "run 2 (odd)" in message, message
    assert not (tmp_path / "out").exists()  # nothing was started


def test_the_shipped_configurations_pass_the_checks_and_each_changes_the_preset():
    """3 or 4 runs, each one changing the gpu preset somewhere (a run that changes nothing wastes a slot), each saying
    why, all of them with their metrics back."""
    from transformer_lib.config import TrainConfig

    preset, runs = gpu_session.read_configs(gpu_session.SWEEP_CONFIGS, extra=gpu_session.SWEEP_SET)
    assert preset == "gpu" and 3 <= len(runs) <= gpu_session.FILES_BACK - len(gpu_session.SWEEP_FILES)
    base = TrainConfig.from_preset("gpu").to_dict()
    for run in runs:
        assert any(base[k] != v for k, v in run["overrides"].items()), run["name"]
        assert len(run["why"]) > 100, run["name"]


def test_a_machine_without_nbformat_leaves_out_only_the_tests_that_read_notebooks():
    """The recorded H100 session stopped at collection: test_book.py needs nbformat through tools/install_cell.py."""
    left_out = {path.name for path in gpu_session.needs_nbformat()}
    # through tools/install_cell.py; directly; through tools/colab_figures.py, then install_cell.py
    assert {"test_book.py", "test_execute_tool.py", "test_layout.py"} <= left_out
    assert not {"test_model.py", "test_training.py", "test_gpu_session.py"} & left_out
