"""benchmarks/gpu_check.py, the prepared check of the GPU path, runs on the CPU too (--quick), so CI keeps it working."""
import json
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def test_gpu_check_runs_on_the_cpu_quickly(tmp_path):
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}  # it finds transformer_lib by itself
    done = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "gpu_check.py"), "--device", "cpu", "--quick",
                           "--out", str(tmp_path / "check.json")], capture_output=True, text=True, cwd=tmp_path,
                          env={**env, "OMP_NUM_THREADS": "1"}, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout.strip().splitlines()[-1] == "ok=True", done.stdout
    report = json.loads((tmp_path / "check.json").read_text(encoding="utf-8"))
    assert report["environment"]["torch"] and report["correctness"]["float32"]["ok"]
    assert set(report["sdpa_kernels"]["float32"]) == {"is_causal", "padding mask"}
    eager = report["training"]["ours bf16 eager"]
    assert eager["tokens_per_s"] > 0 and eager["mfu"] is None  # no published peak for a CPU
    assert report["training"]["nn.Transformer bf16 eager"]["tokens_per_s"] > 0
    assert 0 < report["overhead"]["share_of_gpu_preset"] < 1
