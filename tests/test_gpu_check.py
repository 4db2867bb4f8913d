"""benchmarks/gpu_check.py, the prepared check of the GPU path, runs on the CPU too (--quick), so CI keeps it working;
its bounds are tested at the gpu preset's real size, and each number it reports against an oracle of its own."""
import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

ROOT = Path(__file__).resolve().parents[1]
CPU = torch.device("cpu")


def _gpu_check():
    spec = importlib.util.spec_from_file_location("gpu_check", ROOT / "benchmarks" / "gpu_check.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="module")
def quick_report(tmp_path_factory):
    folder = tmp_path_factory.mktemp("gpu_check")
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}  # it finds transformer_lib by itself
    done = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "gpu_check.py"), "--device", "cpu", "--quick",
                           "--out", str(folder / "check.json")], capture_output=True, text=True, cwd=folder,
                          env={**env, "OMP_NUM_THREADS": "1"}, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout.strip().splitlines()[-1] == "ok=True", done.stdout
    return json.loads((folder / "check.json").read_text(encoding="utf-8"))


def test_gpu_check_runs_on_the_cpu_quickly(quick_report):
    report = quick_report
    assert report["environment"]["torch"] == torch.__version__ and report["correctness"]["float32"]["ok"]
    assert report["done"] == "training"  # every part ran
    assert set(report["sdpa_kernels"]["float32"]) == {"is_causal", "padding mask"}
    eager = report["training"]["ours bf16 eager"]
    assert eager["tokens_per_s"] > 0 and eager["mfu"] is None  # no published peak for a CPU
    assert report["training"]["nn.Transformer bf16 eager"]["tokens_per_s"] > 0


def test_tokens_per_second_count_the_real_tokens(quick_report):
    """The oracle: the ids of the check's own random batch that are not padding, counted here."""
    gpu_check = _gpu_check()
    batch = gpu_check.random_batch(quick_report["shape"]["vocab_size"], 16, 12, 12, CPU)
    real = int((batch.src != 0).sum() + (batch.tgt_out != 0).sum())
    padded = batch.src.numel() + batch.tgt_in.numel()
    eager = quick_report["training"]["ours bf16 eager"]
    assert eager["tokens_per_s"] * eager["step_s"] == pytest.approx(real, rel=1e-9)
    assert eager["padded_share"] == pytest.approx(1 - real / padded, rel=1e-9) and 0.1 < eager["padded_share"] < 0.5


def test_checkpoint_sizes_match_the_parameters(quick_report):
    """The oracle for the overhead part's files: float32 weights are 4 bytes a parameter; last.pt adds Adam's two
    moments (12 bytes); names and pickling add a little, under 10% for even this small model."""
    o = quick_report["overhead"]
    n = o["parameters"]
    assert 1.0 <= o["snapshot_mb"] * 1e6 / (4 * n) < 1.1
    assert 1.0 <= o["last_pt_mb"] * 1e6 / (12 * n) < 1.1
    assert o["validation_s"] > 0 and o["snapshot_s"] > 0 and o["last_pt_s"] > 0


def test_share_of_run_by_hand():
    """A 10-minute run with a point each minute and last.pt every 2 minutes: 10 points of (3 s validation + 1 s
    snapshot), 5 last.pt of 2 s, and 2 more validations = 40 + 10 + 6 = 56 s of 600."""
    share = _gpu_check().share_of_run(3.0, 1.0, 2.0, minutes=10, eval_minutes=1, checkpoint_minutes=2)
    assert share == pytest.approx(56 / 600)


def test_the_json_is_written_after_each_part(tmp_path, monkeypatch):
    gpu_check = _gpu_check()

    def broken(*args, **kwargs):
        raise KeyboardInterrupt("the command's time ran out")

    monkeypatch.setattr(gpu_check, "overhead_share", broken)
    out = tmp_path / "check.json"
    monkeypatch.setattr(sys, "argv", ["gpu_check.py", "--device", "cpu", "--quick", "--out", str(out)])
    with pytest.raises(KeyboardInterrupt):
        gpu_check.main()
    report = json.loads(out.read_text(encoding="utf-8"))
    assert report["done"] == "sdpa_kernels" and report["correctness"]["float32"]["ok"]
    assert "overhead" not in report and "training" not in report


def test_bounds_hold_at_the_gpu_presets_size_on_the_cpu():
    """The gpu preset's model (D 512, 6 + 6 layers, 8000 tokens) in bfloat16 and float16 autocast on the CPU against
    its float32 reference; the reference's logits spread as a freshly initialised model of ours does."""
    from transformer_lib.config import TrainConfig
    from transformer_lib.model import Transformer

    gpu_check = _gpu_check()
    config = TrainConfig.from_preset("gpu").model_config(vocab_size=8000)
    shape = {k: getattr(config, k) for k in ("d_model", "n_heads", "n_encoder_layers", "n_decoder_layers", "d_ff",
                                             "dropout", "norm_first", "vocab_size")}
    assert shape["d_model"] == 512 and shape["n_encoder_layers"] == 6  # the real size, not --quick's
    result = gpu_check.correctness(shape, CPU, B=4, S=12, T=11)
    for name in ("float32", "bfloat16", "float16"):
        if "error" not in result[name] or name == "float32":
            assert result[name]["ok"], (name, result[name])
    if "error" not in result["bfloat16"]:  # autocast really computed in bfloat16
        assert result["bfloat16"]["max_rel_diff"] > 10 * result["float32"]["max_rel_diff"]
    torch.manual_seed(0)
    ours = Transformer(config).eval()
    ids = torch.randint(4, 8000, (4, 12))
    with torch.no_grad():
        logits = ours.generator.logits(ours.decode(ids, *ours.encode(ids)))  # (B, T, V)
    spread = (logits - logits.mean(-1, keepdim=True)).std().item()
    assert 0.5 < result["reference_logit_std"] / spread < 2, (result["reference_logit_std"], spread)
