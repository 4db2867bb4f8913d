"""benchmarks/gpu_check.py, the prepared check of the GPU path, runs on the CPU too (--quick), so CI keeps it working;
each number it reports is held to an oracle it does not compute itself: a hand count, torch's own count of FLOPs,
the batches that token_batches makes, a formula for the spread of a fresh model's logits, or the one H100 run."""
import importlib.util
import json
import math
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

ROOT = Path(__file__).resolve().parents[1]
CPU = torch.device("cpu")
H100 = ROOT / "results" / "gpu" / "h100_2026-11-27" / "gpu_check.json"


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


def test_the_quick_check_runs_every_part_on_the_cpu(quick_report):
    report = quick_report
    assert report["environment"]["torch"] == torch.__version__ and report["done"] == "training"
    assert report["correctness"]["float32"]["ok"]
    # autocast really computed in bfloat16: its difference from float32 is the format's, far above float32's own
    assert report["correctness"]["bfloat16"]["max_rel_diff"] > 10 * report["correctness"]["float32"]["max_rel_diff"]
    assert set(report["sdpa_kernels"]["float32"]) == {"is_causal", "padding mask"}
    assert "error" not in report["trainer_step"], report["trainer_step"]
    assert report["trainer_step"]["preset"] == "tiny" and report["trainer_step"]["precision"] == "float32"


def test_the_reference_logits_spread_as_xavier_weights_predict(quick_report):
    """The oracle: a fresh model's last LayerNorm gives unit-variance features h (D of them), and the generator shares
    the Xavier-uniform embedding E (V, D), whose entries have variance 2 / (V + D); so a logit h . E_v spreads with
    standard deviation sqrt(2 D / (V + D)). Both the CPU's quick shape and the H100's gpu preset must match it, or
    the reference is not initialised as ours is."""
    for report in (quick_report, json.loads(H100.read_text(encoding="utf-8"))):
        D, V = report["shape"]["d_model"], report["shape"]["vocab_size"]
        assert report["correctness"]["reference_logit_std"] == pytest.approx(math.sqrt(2 * D / (V + D)), rel=0.05)


def test_the_bounds_hold_what_the_h100_measured_at_the_gpu_presets_size():
    """The bounds stand for a GPU: the one H100 run measured the gpu preset's model (D 512, 6 + 6 layers) in each
    autocast dtype; each difference must sit within its bound, with room to spare (a factor of 4 at least)."""
    bounds, measured = _gpu_check().BOUNDS, json.loads(H100.read_text(encoding="utf-8"))
    assert measured["shape"]["d_model"] == 512 and measured["shape"]["n_encoder_layers"] == 6
    for name, bound in bounds.items():
        assert measured["correctness"][name]["max_rel_diff"] <= bound / 4, (name, measured["correctness"][name])


def test_the_bare_step_counts_real_tokens_and_the_flops_torch_counts():
    """Real tokens by hand: sources of 3 and 5 ids and targets of 4 and 2, each one token longer (<eos>, <bos>), are
    4 + 6 + 5 + 3 = 18 of 2 x 6 + 2 x 5 = 22 padded positions. The FLOPs of a batch without padding: what
    torch.utils.flop_counter counts in a forward and backward pass of the same model."""
    from torch.nn.attention import SDPBackend, sdpa_kernel
    from torch.utils.flop_counter import FlopCounterMode

    from transformer_lib.training_step import LossComputation
    from transformer_lib.model import Transformer, TransformerConfig
    from transformer_lib.recipe import LabelSmoothingLoss, make_batch

    gpu_check = _gpu_check()
    shape = {"vocab_size": 50, "d_model": 16, "n_heads": 2, "n_encoder_layers": 2, "n_decoder_layers": 1, "d_ff": 24,
             "dropout": 0.0, "norm_first": True}
    padded = make_batch([[5] * 3, [6] * 5], [[7] * 4, [8] * 2])
    r = gpu_check.throughput(shape, CPU, padded, 1, True, None, ["ours bf16 eager"])["ours bf16 eager"]
    assert r["tokens"] == 18 and r["padded_share"] == pytest.approx(1 - 18 / 22) and r["mfu"] is None

    full = make_batch([[5] * 6] * 3, [[7] * 4] * 3)  # (B, S) = (3, 7), (B, T) = (3, 5): no padding
    model = Transformer(TransformerConfig(**shape))
    net = LossComputation(model, LabelSmoothingLoss(shape["vocab_size"], 0, 0.1, reduction="sum"))
    with sdpa_kernel([SDPBackend.MATH]), FlopCounterMode(display=False) as counter:
        net(full)[0].backward()
    peak = 1e12  # a made-up peak: the CPU has none
    r = gpu_check.throughput(shape, CPU, full, 1, True, peak, ["ours bf16 eager"])["ours bf16 eager"]
    assert r["step_flops"] == counter.get_total_flops()
    assert r["mfu"] == pytest.approx(counter.get_total_flops() / r["step_s"] / peak)


def test_the_trainer_step_meets_the_batches_token_batches_makes(small_tokenizer):
    """The oracle: the first epoch's batches as token_batches makes them from the encoded pairs' lengths (each
    sentence one token longer: <eos> on the source, <bos> on the target), counted here; the trainer's step on the
    CPU runs SDPA's math kernel (runtime.training_attention), not the flash kernel the bare part sees."""
    from transformer_lib.config import TrainConfig
    from transformer_lib.data import load_multi30k
    from transformer_lib.recipe import token_batches
    from transformer_lib.tokenizer import BPETokenizer

    tokenizer = BPETokenizer.load(small_tokenizer)
    config = TrainConfig.from_preset("tiny", device="cpu", train_subset=300)
    result = _gpu_check().trainer_steps(config, tokenizer, 3)
    lengths = [(len(tokenizer.encode(de)), len(tokenizer.encode(en))) for de, en in load_multi30k("train")[:300]]
    kept = [(s + 1, t + 1) for s, t in lengths if max(s, t) <= config.max_sentence_len]  # max_sentence_len: longer pairs are left out
    assert 0 < len(kept) < 300  # this small tokenizer leaves some pairs too long: the rule is exercised
    src, tgt = [s for s, _ in kept], [t for _, t in kept]
    batches = token_batches(src, tgt, config.max_tokens, seed=config.seed, epoch=0)[:3]
    shapes = [[len(b), max(src[i] for i in b), max(tgt[i] for i in b)] for b in batches]
    assert [list(s) for s in result["shapes"]] == shapes
    assert result["distinct_shapes"] == len({tuple(s) for s in shapes})
    assert result["tokens"] == sum(src[i] + tgt[i] for b in batches for i in b) == result["again"]["tokens"]
    assert result["steps"] == 3 and result["pairs"] == len(kept)
    assert any("attention_math" in k for k in result["sdpa_kernels"]), result["sdpa_kernels"]
    assert not any("flash" in k for k in result["sdpa_kernels"]), result["sdpa_kernels"]


def test_share_of_run_by_hand():
    """A 10-minute run with a point each minute and last.pt every 2 minutes: 10 points of (3 s validation + 1 s
    snapshot), 5 last.pt of 2 s, and 2 more validations = 40 + 10 + 6 = 56 s of 600."""
    share = _gpu_check().share_of_run(3.0, 1.0, 2.0, minutes=10, eval_minutes=1, checkpoint_minutes=2)
    assert share == pytest.approx(56 / 600)


def test_the_json_is_written_after_each_part(tmp_path, monkeypatch):
    gpu_check = _gpu_check()

    def broken(*args, **kwargs):
        raise KeyboardInterrupt("the command's time ran out")

    monkeypatch.setattr(gpu_check, "correctness", lambda shape, device: {"float32": {"ok": True}})
    monkeypatch.setattr(gpu_check, "sdpa_kernels", lambda shape, device, dtype: {"is_causal": ["(stub)"]})
    monkeypatch.setattr(gpu_check, "overhead_share", broken)
    out = tmp_path / "check.json"
    monkeypatch.setattr(sys, "argv", ["gpu_check.py", "--device", "cpu", "--quick", "--out", str(out)])
    with pytest.raises(KeyboardInterrupt):
        gpu_check.main()
    report = json.loads(out.read_text(encoding="utf-8"))
    assert report["done"] == "sdpa_kernels" and report["correctness"] == {"float32": {"ok": True}}
    assert "overhead" not in report and "training" not in report
