"""tools/gpu_session.py, the GPU lease as two prepared commands, dry-run on the CPU with a tiny budget: every phase
runs and writes its files, a run cut short is scored from last.pt, and tools/record_run.py imports the repository's
own package, installed or not."""
import json
import os
import subprocess
import sys
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tools"))

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


def test_the_session_dry_run_on_the_cpu(tmp_path):
    from transformer_lib.data import multi30k_dir

    data = multi30k_dir()  # the verified Multi30k files (a fresh clone downloads them once, as the other tests do)
    out = tmp_path / "out"
    done = subprocess.run([sys.executable, str(ROOT / "tools" / "gpu_session.py"), "all", str(out), "--dry-run",
                           "--data", str(data), "--work", str(tmp_path / "work"), "--score", "last.pt"],
                          capture_output=True, text=True, cwd=tmp_path, env=_clean_env(), timeout=300)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    files = {p.name for p in out.iterdir()}
    assert files == {"preflight.json", "train.log", "metrics.jsonl", "gpu.json", "session_A.json", "gpu_check.json",
                     "gpu_check.log", "pytest.log", "session_B.json"}
    assert len(files - {"gpu_check.json", "gpu_check.log", "pytest.log", "session_B.json"}) <= 8  # what comes back
    preflight = json.loads((out / "preflight.json").read_text(encoding="utf-8"))
    assert preflight["torch"] == torch.__version__ and preflight["data"].endswith(": verified")
    # phase A: trained and scored from last.pt (the fallback of a run cut short), on both splits, beam and greedy
    record = json.loads((out / "gpu.json").read_text(encoding="utf-8"))
    assert record["checkpoint"].startswith("last.pt (the run stopped before its end")
    for key in ("bleu", "bleu_greedy"):
        assert set(record[key]) == {"val", "test2016"}
        assert all(set(v) == {"cased", "lowercase"} for v in record[key].values())
    assert record["steps"] == 4 and record["epochs"] > 0 and record["limit"]
    assert record["mfu"] is None and record["flops_per_token"] > 0  # a CPU has no published peak
    assert record["val_loss_curve"]
    metrics = [json.loads(line) for line in (out / "metrics.jsonl").read_text(encoding="utf-8").splitlines()]
    assert sum(r["kind"] == "train" for r in metrics) == 2  # log_every=2 over 4 steps
    overhead = next(r for r in metrics if r["kind"] == "overhead")  # the run itself ended: it logged its share
    assert 0 < overhead["share"] <= 1
    session = json.loads((out / "session_A.json").read_text(encoding="utf-8"))
    assert [session["steps"][k]["returncode"] for k in ("train", "score")] == [0, 0]
    # phase B: the check ran every part; the two unit tests passed under the session's interpreter
    assert json.loads((out / "gpu_check.json").read_text(encoding="utf-8"))["done"] == "training"
    assert "2 passed" in (out / "pytest.log").read_text(encoding="utf-8")
