"""Training runs under each precision, compile, resume with other settings, a time budget, and signals."""
import functools
import json
import math
import os
import shutil
import signal
import subprocess
import sys
import textwrap
import time
from dataclasses import replace
from pathlib import Path

import pytest
import torch

from transformer_lib import runtime, trainer, training_step
from transformer_lib.model import Transformer
from transformer_lib.data import load_multi30k
from transformer_lib.tokenizer import BPETokenizer
from transformer_lib.checkpoints import CheckpointError, load_checkpoint
from transformer_lib.config import TrainConfig
from transformer_lib.training_run import train
from transformer_lib.runtime import UnsupportedSetting, amp_for_capability, check_runtime, resolve_amp
from transformer_lib.clock import RunClock
from transformer_lib.trainer import Trainer

ROOT = Path(__file__).resolve().parents[1]
SMALL = dict(d_model=32, n_heads=2, n_encoder_layers=1, n_decoder_layers=1, d_ff=64, dropout=0.1, train_subset=200,
             max_tokens=400, warmup=10, epochs=3, log_every=1, average_last=1, seed=5, device="cpu", amp="off")


@pytest.fixture(scope="module")
def tokenizer():
    pairs = load_multi30k("train")[:200]
    return BPETokenizer.train([s for pair in pairs for s in pair], vocab_size=350)


def _weights(path: Path) -> dict[str, torch.Tensor]:
    return load_checkpoint(path)["model"]


def _same(a: dict, b: dict) -> bool:
    return a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


def test_auto_amp_on_the_cpu_is_bf16_only_with_bf16_instructions(monkeypatch):
    cpu = torch.device("cpu")
    monkeypatch.setattr(runtime, "cpu_has_native_bf16", lambda: True)
    assert resolve_amp("auto", cpu) == torch.bfloat16
    monkeypatch.setattr(runtime, "cpu_has_native_bf16", lambda: False)
    assert resolve_amp("auto", cpu) is None  # no bfloat16 instructions: float32, not emulation
    assert resolve_amp("bf16", cpu) == torch.bfloat16  # asked for by name, it is what it says
    monkeypatch.setattr(runtime, "cpu_has_native_bf16", lambda: True)
    assert resolve_amp(TrainConfig.from_preset("tiny").amp, cpu) is None  # the book's stored outputs: float32 anywhere
    assert resolve_amp(TrainConfig.from_preset("cpu").amp, cpu) == torch.bfloat16  # the hour: bfloat16 where it is fast


def test_auto_amp_from_the_device_capability():
    assert amp_for_capability(None) is None  # the CPU: float32
    assert amp_for_capability((7, 5)) == torch.float16  # T4: no native bfloat16, so float16 with a GradScaler
    assert amp_for_capability((7, 0)) == torch.float16  # V100
    assert amp_for_capability((8, 0)) == torch.bfloat16  # A100
    assert amp_for_capability((8, 9)) == torch.bfloat16
    assert amp_for_capability((9, 0)) == torch.bfloat16  # H100


def test_snapshots_are_kept_every_snapshot_minutes(tmp_path, tokenizer, monkeypatch):
    runs, init = [], Trainer.__init__  # the run whose steps the clock below counts

    def keep(self, *args, **kwargs):
        init(self, *args, **kwargs)
        runs.append(self)

    monkeypatch.setattr(Trainer, "__init__", keep)
    monkeypatch.setattr(RunClock, "minutes", lambda self: runs[-1].global_step / 2)  # half a minute per step
    train(TrainConfig.from_preset("tiny", **SMALL, max_steps=7, snapshot_minutes=1.0), tmp_path, progress=False,
          tokenizer=tokenizer)
    found = sorted(tmp_path.glob("snapshot*.pt"))
    assert [p.name for p in found] == ["snapshot001.pt", "snapshot002.pt", "snapshot003.pt"]
    snapshots = [load_checkpoint(p) for p in found]
    assert [(s["kind"], s["step"], s["minutes"]) for s in snapshots] == [("weights", 2, 1.0), ("weights", 4, 2.0),
                                                                        ("weights", 6, 3.0)]
    assert not _same(snapshots[0]["model"], snapshots[2]["model"])  # the weights of their own step
    with pytest.raises(ValueError, match="snapshot_minutes"):
        TrainConfig(snapshot_minutes=0)


@pytest.fixture(scope="module")
def float32_losses(tmp_path_factory, tokenizer) -> torch.Tensor:
    """The training losses of 8 float32 steps of SMALL."""
    result = train(TrainConfig.from_preset("tiny", **SMALL, max_steps=8), tmp_path_factory.mktemp("float32"),
                   progress=False, tokenizer=tokenizer)
    return torch.tensor([r["loss"] for r in result.history if r["kind"] == "train"])


@pytest.mark.parametrize("amp", ["bf16", "fp16"])  # float32 ("off"): test_training.py and the signal test below
def test_each_precision_trains_and_resumes_to_identical_weights(tmp_path, tokenizer, amp, float32_losses):
    try:
        check_runtime(torch.device("cpu"), amp)
    except UnsupportedSetting as err:
        pytest.skip(f"this PyTorch cannot run it on the CPU: {err}")
    linear_dtypes = set()  # the dtype of every nn.Linear's output during the run: autocast's work
    hook = torch.nn.modules.module.register_module_forward_hook(
        lambda module, args, out: linear_dtypes.add(out.dtype) if isinstance(module, torch.nn.Linear) else None)
    try:
        full = train(TrainConfig.from_preset("tiny", **{**SMALL, "amp": amp}, max_steps=8), tmp_path / "full",
                     progress=False, tokenizer=tokenizer)
    finally:
        hook.remove()
    reduced = {"bf16": torch.bfloat16, "fp16": torch.float16}[amp]
    assert reduced in linear_dtypes, linear_dtypes  # the matrix products ran in the reduced precision
    losses = torch.tensor([r["loss"] for r in full.history if r["kind"] == "train"])
    assert len(losses) == 8 and torch.isfinite(losses).all()
    # against float32 from the same seed: close (the same model learns), but not equal (the rounding is coarser)
    apart = (losses - float32_losses).abs() / float32_losses
    assert 1e-5 < apart.max() < 0.05, apart  # float32 twice gives identical losses: 0 apart
    scaler = load_checkpoint(tmp_path / "full" / "last.pt")["scaler"]
    assert bool(scaler) == (amp == "fp16")  # only float16 needs loss scaling
    train(TrainConfig.from_preset("tiny", **{**SMALL, "amp": amp}, max_steps=5), tmp_path / "cut", progress=False,
          tokenizer=tokenizer)
    train(TrainConfig.from_preset("tiny", **{**SMALL, "amp": amp}, max_steps=8), tmp_path / "cut", resume=True,
          progress=False)
    assert _same(_weights(tmp_path / "full" / "last.pt"), _weights(tmp_path / "cut" / "last.pt"))


def test_resume_with_another_precision(tmp_path, tokenizer):
    for first, then in [("bf16", "fp16"), ("fp16", "off")]:  # fp16 after bf16 once failed: "source state dict is empty"
        for amp in (first, then):
            try:
                check_runtime(torch.device("cpu"), amp)
            except UnsupportedSetting as err:
                pytest.skip(f"this PyTorch cannot run it on the CPU: {err}")
        out = tmp_path / f"{first}-{then}"
        train(TrainConfig.from_preset("tiny", **{**SMALL, "amp": first}, max_steps=3), out, progress=False,
              tokenizer=tokenizer)
        result = train(TrainConfig.from_preset("tiny", **{**SMALL, "amp": then}, max_steps=6), out, resume=True,
                       progress=False)
        assert result.history[-1]["step"] == 6 and load_checkpoint(out / "last.pt")["step"] == 6


def test_resume_refuses_settings_that_change_the_data(tmp_path, tokenizer):
    out = tmp_path / "run"
    train(TrainConfig.from_preset("tiny", **SMALL, max_steps=2), out, progress=False, tokenizer=tokenizer)
    for change, message in [({"max_tokens": 800}, "max_tokens: checkpoint has 400, requested 800"),
                            ({"seed": 6}, "seed: checkpoint has 5, requested 6"),
                            ({"accum_steps": 2}, "micro-batches per step")]:
        with pytest.raises(CheckpointError, match=message):
            train(TrainConfig.from_preset("tiny", **{**SMALL, **change}), out, resume=True, progress=False)
    # the budget, the length of the run and the precision may change
    train(TrainConfig.from_preset("tiny", **SMALL, max_steps=4, max_minutes=30.0), out, resume=True,
          progress=False)


def test_time_budget_continues_across_resumes(tmp_path, tokenizer):
    out = tmp_path / "run"
    config = dict(SMALL, cooldown=0.5, max_minutes=1000.0)
    train(TrainConfig.from_preset("tiny", **config, max_steps=4), out, progress=False, tokenizer=tokenizer)
    first = load_checkpoint(out / "last.pt")
    assert first["elapsed"] > 0
    train(TrainConfig.from_preset("tiny", **config, max_steps=8), out, resume=True, progress=False)
    second = load_checkpoint(out / "last.pt")
    assert second["elapsed"] > first["elapsed"]  # the clock went on from where it stopped
    minutes = [r["minutes"] for r in second["history"] if r["kind"] == "train"]
    assert minutes == sorted(minutes) and minutes[4] >= first["elapsed"] / 60


def test_compile_trains_a_few_steps(tmp_path, tokenizer, monkeypatch):
    try:
        check_runtime(torch.device("cpu"), "off", compile=True)
    except UnsupportedSetting as err:
        pytest.skip(str(err))
    # Dynamo traces the loss module (with dynamic shapes) as in a real run; the "eager" backend runs the traced
    # graphs as they are, skipping Inductor's kernel generation, which takes minutes on a CPU.
    monkeypatch.setattr(torch, "compile", functools.partial(torch.compile, backend="eager"))
    eager = train(TrainConfig.from_preset("tiny", **{**SMALL, "dropout": 0.0}, max_steps=3), tmp_path / "eager",
                  progress=False, tokenizer=tokenizer)
    compiled = train(TrainConfig.from_preset("tiny", **{**SMALL, "dropout": 0.0}, max_steps=3, compile=True),
                     tmp_path / "compiled", progress=False, tokenizer=tokenizer)
    a = torch.tensor([r["loss"] for r in eager.history if r["kind"] == "train"])
    b = torch.tensor([r["loss"] for r in compiled.history if r["kind"] == "train"])
    assert len(b) == 3 and torch.allclose(a, b, atol=1e-4), (a, b)


SCRIPT = textwrap.dedent(
    """
    import json, sys
    import torch
    torch.set_num_threads(1)
    from transformer_lib.tokenizer import BPETokenizer
    from transformer_lib.config import TrainConfig
    from transformer_lib.training_run import train
    try:
        train(TrainConfig.from_preset("tiny", **json.loads(sys.argv[4])), sys.argv[1], resume=sys.argv[2] == "resume",
              progress=False, tokenizer=BPETokenizer.load(sys.argv[3]))
    except KeyboardInterrupt:
        sys.exit(130)
    """
)


def test_a_signal_saves_mid_epoch_and_the_run_resumes_at_the_same_batch(tmp_path, tokenizer):
    """SIGTERM, as a job scheduler or torchrun sends it (Ctrl-C's SIGINT takes the same path)."""
    settings = dict(SMALL, epochs=2, checkpoint_minutes=None)
    path = tmp_path / "tokenizer.json"
    tokenizer.save(path)
    train(TrainConfig.from_preset("tiny", **settings), tmp_path / "full", progress=False, tokenizer=tokenizer)
    env = dict(os.environ, PYTHONPATH=str(ROOT))

    def run(mode: str) -> subprocess.Popen:
        return subprocess.Popen([sys.executable, "-c", SCRIPT, str(tmp_path / "cut"), mode, str(path),
                                 json.dumps(settings)], env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE)

    victim, metrics, deadline = run("new"), tmp_path / "cut" / "metrics.jsonl", time.time() + 120
    while not metrics.exists() or metrics.read_text().count('"train"') < 3:
        assert victim.poll() is None, victim.communicate()[1].decode()[-2000:]
        assert time.time() < deadline
        time.sleep(0.002)
    victim.send_signal(signal.SIGTERM)
    _, err = victim.communicate(timeout=60)
    assert victim.returncode == 130, err.decode()[-2000:]
    saved = load_checkpoint(tmp_path / "cut" / "last.pt")
    assert saved["epoch"] == 0 and 3 <= saved["position"] < 10  # in the middle of the first epoch
    resumed = run("resume")
    _, err = resumed.communicate(timeout=120)
    assert resumed.returncode == 0, err.decode()[-2000:]
    assert _same(_weights(tmp_path / "full" / "last.pt"), _weights(tmp_path / "cut" / "last.pt"))
    losses = [[(r["step"], r["loss"]) for r in load_checkpoint(tmp_path / run_name / "last.pt")["history"]
               if r["kind"] == "train"] for run_name in ("full", "cut")]
    assert losses[0] == losses[1]


def test_max_sentence_len_past_the_model_positions_is_refused_when_configured():
    with pytest.raises(ValueError, match="max_sentence_len=600: the model has 512 positions .* at most 511"):
        TrainConfig.from_preset("tiny", max_sentence_len=600)
    TrainConfig.from_preset("tiny", max_sentence_len=511)


def test_pairs_left_out_are_counted_and_long_validation_pairs_never_reach_the_model(tmp_path, capsys):
    """A validation sentence longer than the model's positions once failed after a whole epoch."""
    files = {}
    pairs = [(f"ein hund {k}", f"a dog {k}") for k in range(40)]
    for name, lines in [("train.de", [s for s, _ in pairs] + ["sehr " * 30]), ("train.en", [t for _, t in pairs] + ["very"]),
                        ("val.de", ["ein hund", "hund " * 600]), ("val.en", ["a dog", "dog"])]:
        files[name] = tmp_path / name
        files[name].write_text("\n".join(lines) + "\n", encoding="utf-8")
    config = TrainConfig.from_preset("tiny", **{**SMALL, "train_subset": None, "max_sentence_len": 20, "max_steps": 2,
                                                "vocab_size": 300},
                                     train_src=files["train.de"], train_tgt=files["train.en"],
                                     val_src=files["val.de"], val_tgt=files["val.en"])
    result = train(config, tmp_path / "run", progress=True)
    setup = result.history[0]
    assert (setup["train_pairs"], setup["dropped"], setup["val_pairs"], setup["val_dropped"]) == (40, 1, 1, 1)
    assert "left out: 1 training pair(s) with a side over max_sentence_len=20 tokens, 1 validation pair(s)" \
        in capsys.readouterr().out  # tqdm.write's line
    assert any(r["kind"] == "val" for r in result.history)


def test_old_snapshots_go_only_after_the_new_last_pt(tmp_path, tokenizer, monkeypatch):
    events = []
    save = trainer.save_checkpoint
    for module in (trainer,):  # the trainer writes last.pt and the weights kept for averaging
        monkeypatch.setattr(module, "save_checkpoint", lambda obj, path: (events.append(("save", Path(path).name)),
                                                                          save(obj, path))[1])
    unlink = Path.unlink
    monkeypatch.setattr(Path, "unlink", lambda self, *a, **k: (  # a write's own temporary file is no old snapshot
        self.name.endswith(".part") or events.append(("delete", self.name)), unlink(self, *a, **k))[1])
    train(TrainConfig.from_preset("tiny", **{**SMALL, "average_last": 2, "epochs": 4}), tmp_path, progress=False,
          tokenizer=tokenizer)
    kept = [name for kind, name in events if kind == "save" and name.startswith("average")]  # one per epoch
    deleted = [k for k, e in enumerate(events) if e == ("delete", kept[0])]
    assert deleted, events
    assert events[deleted[0] - 1] == ("save", "last.pt") and ("save", kept[2]) in events[:deleted[0]]
    assert sorted(p.name for p in tmp_path.glob("average*.pt")) == kept[2:]


def test_validation_points_by_steps_with_last_pt_on_its_own_cadence(tmp_path, tokenizer, monkeypatch):
    saved = []
    save = trainer.save_checkpoint
    for module in (trainer,):  # the trainer writes last.pt and the weights kept for averaging
        monkeypatch.setattr(module, "save_checkpoint", lambda obj, path: (saved.append((Path(path).name, obj["step"])),
                                                                          save(obj, path))[1])
    config = TrainConfig.from_preset("tiny", **{**SMALL, "average_last": 2, "epochs": 2}, eval_every=3,
                                     checkpoint_every=4, checkpoint_minutes=None)
    result = train(config, tmp_path, progress=False, tokenizer=tokenizer)
    steps = result.history[-1]["step"]
    assert steps > 8 and not config.points_by_epoch
    vals = [r["step"] for r in result.history if r["kind"] == "val"]
    assert vals == sorted({*range(3, steps + 1, 3), steps})  # and where the run stopped
    # not at epoch ends; and at the end once more, for the epoch that ended there (a last.pt of the run's last
    # step written before its epoch's end holds the old epoch)
    assert [k for name, k in saved if name == "last.pt"] == [*range(4, steps + 1, 4), steps]
    assert load_checkpoint(tmp_path / "last.pt")["epoch"] == config.epochs
    assert [k for name, k in saved if name.startswith("average")] == list(range(3, steps + 1, 3))  # weights only
    assert all(load_checkpoint(tmp_path / name)["kind"] == "weights" for name in os.listdir(tmp_path)
               if name.startswith("average"))


def test_timed_points_resume_to_the_same_averaged_model(tmp_path, tokenizer):
    config = dict(**{**SMALL, "average_last": 3, "epochs": 5}, eval_every=2, checkpoint_every=3)
    train(TrainConfig.from_preset("tiny", **config, max_steps=9), tmp_path / "full", progress=False,
          tokenizer=tokenizer)
    train(TrainConfig.from_preset("tiny", **config, max_steps=5), tmp_path / "cut", progress=False,
          tokenizer=tokenizer)
    shutil.copy(tmp_path / "cut" / "average0000004.pt", tmp_path / "cut" / "average0000007.pt")  # a killed run's
    train(TrainConfig.from_preset("tiny", **config, max_steps=9), tmp_path / "cut", resume=True, progress=False)
    full, cut = load_checkpoint(tmp_path / "full" / "model.pt"), load_checkpoint(tmp_path / "cut" / "model.pt")
    assert full["averaged"] == cut["averaged"] and _same(full["model"], cut["model"])


def test_the_share_of_time_outside_training_steps_is_logged_and_printed(tmp_path, tokenizer, capsys, monkeypatch):
    """The oracle is time the test itself adds: each validation sleeps 0.5 s more, which the record must count as
    validation time, while the whole run cannot last longer than the test's own clock says."""
    pause, calls = 0.5, []
    original = trainer.validation_loss

    def slow_validation(*args, **kwargs):
        calls.append(1)
        time.sleep(pause)
        return original(*args, **kwargs)

    monkeypatch.setattr(trainer, "validation_loss", slow_validation)
    started = time.perf_counter()
    result = train(TrainConfig.from_preset("tiny", **SMALL, max_steps=4), tmp_path, progress=True,
                   tokenizer=tokenizer)
    wall = time.perf_counter() - started
    overhead = result.history[-1]
    assert overhead["kind"] == "overhead" and calls
    assert pause * len(calls) <= overhead["validation"] <= overhead["share"] * overhead["seconds"]
    assert overhead["seconds"] <= wall and overhead["saving"] > 0
    assert "time outside training steps: " in capsys.readouterr().out
    assert load_checkpoint(tmp_path / "model.pt")["history"][-1] == overhead  # tools/record_run.py reads it there


def test_the_throughput_leaves_out_the_time_of_validation_points(tmp_path, tokenizer, monkeypatch):
    """The oracle is time the test adds: each validation sleeps 1 s, some fifty steps of this model; a record's
    tokens/s right after a point must stay of the order of the others' instead of falling fifty-fold."""
    original = trainer.validation_loss
    monkeypatch.setattr(trainer, "validation_loss", lambda *a, **k: (time.sleep(1.0), original(*a, **k))[1])
    result = train(TrainConfig.from_preset("tiny", **SMALL, eval_every=3, max_steps=12), tmp_path,
                   progress=False, tokenizer=tokenizer)
    train_records = {r["step"]: r["tokens_per_s"] for r in result.history if r["kind"] == "train"}
    after_point = [train_records[s + 1] for s in (3, 6, 9)]
    others = [v for s, v in train_records.items() if s - 1 not in (3, 6, 9) and s > 1]  # step 1 starts it all
    assert min(after_point) > 0.2 * sorted(others)[len(others) // 2], (after_point, others)


def test_a_run_that_ends_on_its_points_last_pt_writes_it_once_there(tmp_path, tokenizer, monkeypatch):
    """Points by epoch: the last epoch's end validates and writes last.pt; the end of the run adds no second write
    of the same step, and last.pt holds that step's validation."""
    saved = []
    save = trainer.save_checkpoint
    monkeypatch.setattr(trainer, "save_checkpoint",
                        lambda obj, path: (saved.append((Path(path).name, obj["step"])), save(obj, path))[1])
    config = TrainConfig.from_preset("tiny", **{**SMALL, "epochs": 2})
    result = train(config, tmp_path, progress=False, tokenizer=tokenizer)
    steps = result.history[-1]["step"]
    assert config.points_by_epoch
    assert [k for name, k in saved if name == "last.pt"].count(steps) == 1
    last = load_checkpoint(tmp_path / "last.pt")
    assert last["step"] == steps and any(r["kind"] == "val" and r["step"] == steps for r in last["history"])


def test_float16_loss_scaling_skips_a_step_whose_gradients_overflow(tmp_path, tokenizer, monkeypatch):
    """The T4's path on the CPU: float16 autocast with a GradScaler; an inf loss leaves the weights alone and
    halves the scale, and the run goes on."""
    try:
        check_runtime(torch.device("cpu"), "fp16")
    except UnsupportedSetting as err:
        pytest.skip(f"this PyTorch cannot run it on the CPU: {err}")
    forward = training_step.LossComputation.forward
    calls = []

    def overflow_first(self, batch):
        loss, nll = forward(self, batch)
        calls.append(1)
        return (loss * float("inf"), nll) if len(calls) == 1 else (loss, nll)

    monkeypatch.setattr(training_step.LossComputation, "forward", overflow_first)
    config = TrainConfig.from_preset("tiny", **{**SMALL, "amp": "fp16"}, max_steps=1)
    train(config, tmp_path / "one", progress=False, tokenizer=tokenizer)
    state = load_checkpoint(tmp_path / "one" / "last.pt")
    torch.manual_seed(config.seed)
    initial = Transformer(config.model_config(tokenizer.vocab_size)).state_dict()
    assert _same(state["model"], initial)  # the step was skipped
    assert state["scaler"]["scale"] == 2.0**15  # 2^16 halved
    calls.clear()
    result = train(replace(config, max_steps=3), tmp_path / "three", progress=False, tokenizer=tokenizer)
    assert all(math.isfinite(r["loss"]) for r in result.history if r["kind"] == "train" and r["step"] > 1)
    assert not _same(load_checkpoint(tmp_path / "three" / "last.pt")["model"], initial)


@pytest.mark.parametrize("average_wins", [True, False])
def test_finish_keeps_the_average_only_when_it_validates_better(tmp_path, tokenizer, monkeypatch, average_wins):
    losses = iter([3.0, 2.0, 1.0 if average_wins else 2.5])  # the points at steps 2 and 4, then the average
    monkeypatch.setattr(Trainer, "validate", lambda self: dict.fromkeys(("loss", "nll", "ppl"), next(losses)))
    train(TrainConfig.from_preset("tiny", **{**SMALL, "average_last": 2}, eval_every=2, max_steps=4), tmp_path,
          progress=False, tokenizer=tokenizer)
    model = load_checkpoint(tmp_path / "model.pt")
    kept = [_weights(tmp_path / f"average{k:07d}.pt") for k in (2, 4)]
    if average_wins:
        assert model["averaged"] == 2 and _same(model["model"], trainer.average_weights(kept))
    else:
        assert model["averaged"] == 1 and _same(model["model"], _weights(tmp_path / "last.pt"))



def test_chapter_11s_one_screen_loop_takes_the_steps_of_train(tmp_path, tokenizer, book_definition):
    """Chapter 11 shows the recipe as one short loop and claims the trainer takes the same steps: same seed, same
    batches, same loss, clipping and schedule. A change to the trainer that breaks the claim fails here."""
    from torch import nn

    from transformer_lib import LabelSmoothingLoss, NoamSchedule, Transformer
    from transformer_lib.recipe import batch_loss, encode_pairs, make_batch, noam_rate, token_batches
    from transformer_lib.tokenizer import PAD_ID, BPETokenizer

    train_loop = book_definition(
        "11_training.ipynb", "train_loop", torch=torch, nn=nn, TrainConfig=TrainConfig, BPETokenizer=BPETokenizer,
        encode_pairs=encode_pairs, load_multi30k=load_multi30k, Transformer=Transformer, noam_rate=noam_rate,
        NoamSchedule=NoamSchedule, LabelSmoothingLoss=LabelSmoothingLoss, PAD_ID=PAD_ID, token_batches=token_batches,
        make_batch=make_batch, batch_loss=batch_loss)
    config = TrainConfig.from_preset("tiny", **SMALL, max_steps=6)  # dropout 0.1: the masks must line up too
    ours = train_loop(config, tokenizer, 6)
    result = train(config, tmp_path, progress=False, tokenizer=tokenizer)
    theirs = [r["loss"] for r in result.history if r["kind"] == "train"]
    assert len(ours) == 6 and ours == pytest.approx(theirs, rel=1e-6, abs=0)


def test_a_budget_in_epochs_places_the_points_and_ends_the_cooldown_at_the_end_of_the_data(tmp_path, tokenizer):
    from transformer_lib.recipe import encode_pairs, token_batches

    config = TrainConfig.from_preset("tiny", **{**SMALL, "epochs": 2}, max_minutes=60.0, cooldown=0.5,
                                     eval_epochs=0.5, checkpoint_minutes=None)
    result = train(config, tmp_path, progress=False, tokenizer=tokenizer)
    src, tgt = encode_pairs(load_multi30k("train")[:200], tokenizer, config.max_sentence_len)
    src_lens, tgt_lens = [len(s) + 1 for s in src], [len(t) + 1 for t in tgt]
    per_epoch = len(token_batches(src_lens, tgt_lens, config.max_tokens, seed=config.seed))
    # the epochs bind (the minutes are a cap far away): 2 epochs of steps, every micro-batch seen twice
    assert result.history[-1]["step"] == 2 * per_epoch
    end = next(r for r in reversed(result.history) if r["kind"] == "overhead")
    assert end["epochs"] == 2.0 and end["tokens"] == 2 * (sum(src_lens) + sum(tgt_lens))
    # a validation point at the first step that completes each half epoch
    vals = [r["step"] for r in result.history if r["kind"] == "val"]
    assert vals == [math.ceil(k * per_epoch / 2) for k in (1, 2, 3, 4)]
    # the cooldown ends where the data does: the rate set after the last step is 0, and it was falling before
    rates = [r["lr"] for r in result.history if r["kind"] == "train"]  # log_every=1: the rate after each step
    assert len(rates) == 2 * per_epoch and rates[-1] == 0.0 and 0 < rates[-2] < rates[len(rates) // 2]
    assert load_checkpoint(tmp_path / "last.pt")["optimizer"]["param_groups"][0]["lr"] == 0.0
