"""A run that cannot go wrong quietly: a resume that would change the optimisation is refused, non-finite settings
and losses stop the run, and every error raised inside train() reaches the command line as one line, exit 2."""
import math

import pytest
import torch

from transformer_lib.checkpoints import CheckpointError, load_checkpoint, save_checkpoint
from transformer_lib.cli import main
from transformer_lib.config import TrainConfig
from transformer_lib.distributed import start_processes
from transformer_lib.training_run import resumed_config, train
from transformer_lib.tokenizer import BPETokenizer
from transformer_lib.trainer import Trainer
from transformer_lib.training_step import OptimiserStep, TrainingError

SMALL = dict(d_model=32, n_heads=2, n_encoder_layers=1, n_decoder_layers=1, d_ff=64, train_subset=200,
             max_tokens=400, warmup=10, epochs=3, log_every=1, average_last=1, seed=5, device="cpu", amp="off")

@pytest.fixture(scope="module")
def tokenizer(small_tokenizer):
    return BPETokenizer.load(small_tokenizer)


@pytest.fixture(scope="module")
def run_folder(tmp_path_factory, tokenizer):
    """A run of two steps whose last.pt the resumes below start from."""
    out = tmp_path_factory.mktemp("run")
    train(TrainConfig.from_preset("tiny", **SMALL, max_steps=2), out, progress=False, tokenizer=tokenizer)
    return out


# a value other than SMALL's for each setting that makes a run another experiment: the model, the data and its order,
# the loss, the schedule and the optimiser; written out here, not read from the library's own lists
EXPERIMENT = {"d_model": 64, "n_heads": 4, "dropout": 0.2, "train_subset": 150, "max_tokens": 500, "seed": 6,
              "max_sentence_len": 50, "label_smoothing": 0.0, "inner_dropout_from": 0.5, "lr_factor": 2.0,
              "warmup": 20, "cooldown": 0.3, "betas": (0.8, 0.98), "eps": 1e-6, "weight_decay": 0.01}


@pytest.mark.parametrize("name", sorted(EXPERIMENT))
def test_a_resume_refuses_a_change_that_makes_another_experiment_and_names_it(run_folder, name):
    assert TrainConfig.from_preset("tiny", **SMALL).to_dict()[name] != EXPERIMENT[name]
    with pytest.raises(CheckpointError, match=f"{name}: checkpoint has .*start a new run in another folder"):
        train(TrainConfig.from_preset("tiny", **{**SMALL, name: EXPERIMENT[name]}, max_steps=3), run_folder,
              resume=True, progress=False)
    assert load_checkpoint(run_folder / "last.pt")["step"] == 2  # refused before any step


def test_a_resume_continues_with_the_runs_own_settings(tmp_path, capsys):
    """Started with --set label_smoothing=0.0 --set clip_grad_norm=0.1 and resumed with --resume alone: the run goes
    on with 0.0 and 0.1, the preset's 0.1 and 1.0 nowhere."""
    out = tmp_path / "run"
    run = ["train", "--preset", "tiny", "--out", str(out), "--quiet", "--set", "train_subset=200",
           "--set", "vocab_size=300", "--set", "label_smoothing=0.0", "--set", "clip_grad_norm=0.1"]
    assert main([*run, "--set", "max_steps=2"]) == 0
    seen = []
    original = Trainer.__init__

    def spy(self, config, *args, **kwargs):
        seen.append((config.label_smoothing, config.clip_grad_norm))
        original(self, config, *args, **kwargs)

    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(Trainer, "__init__", spy)
        assert main(["train", "--preset", "tiny", "--out", str(out), "--quiet", "--resume", "--set",
                     "max_steps=3"]) == 0
    assert seen == [(0.0, 0.1)]
    saved = load_checkpoint(out / "last.pt")
    assert saved["step"] == 3
    assert (saved["train_config"]["label_smoothing"], saved["train_config"]["clip_grad_norm"]) == (0.0, 0.1)
    assert "resuming with max_steps: 2 -> 3" in capsys.readouterr().out


def test_a_resume_that_states_a_setting_again_changes_it_and_prints_the_change(tmp_path, tokenizer, capsys):
    out = tmp_path / "run"
    train(TrainConfig.from_preset("tiny", **SMALL, max_steps=2), out, progress=False, tokenizer=tokenizer)
    capsys.readouterr()
    train(resumed_config(out, max_steps=3, clip_grad_norm=0.5), out, resume=True, progress=False)
    printed = capsys.readouterr().out.splitlines()
    assert sorted(printed) == ["resuming with clip_grad_norm: 1.0 -> 0.5", "resuming with max_steps: 2 -> 3"]
    assert load_checkpoint(out / "last.pt")["train_config"]["clip_grad_norm"] == 0.5


def test_the_command_line_refuses_a_changed_experiment_in_one_line(run_folder, tmp_path, capsys):
    import shutil

    out = tmp_path / "copy"
    shutil.copytree(run_folder, out)
    code = main(["train", "--out", str(out), "--quiet", "--resume", "--set", "label_smoothing=0.2"])
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2 and err[-1].startswith("error:"), err
    assert "label_smoothing: checkpoint has 0.1, requested 0.2" in err[-1]
    assert "start a new run in another folder" in err[-1]


def test_a_checkpoint_written_before_a_setting_existed_resumes_with_its_default(tmp_path, tokenizer):
    out = tmp_path / "run"
    train(TrainConfig.from_preset("tiny", **SMALL, max_steps=2), out, progress=False, tokenizer=tokenizer)
    state = load_checkpoint(out / "last.pt")
    del state["train_config"]["cooldown"]  # as a release before the cooldown wrote it
    save_checkpoint(state, out / "last.pt")
    assert train(TrainConfig.from_preset("tiny", **SMALL, max_steps=3), out, resume=True,
                 progress=False).history[-1]["step"] == 3


def test_fused_adam_follows_the_machine_a_run_resumes_on(run_folder, tokenizer):
    """A checkpoint written on a GPU (fused Adam) resumed on the CPU runs as the CPU's trainer was built."""
    state = load_checkpoint(run_folder / "last.pt")
    for group in state["optimizer"]["param_groups"]:
        group["fused"] = True  # as a run on CUDA saves it
    config = TrainConfig.from_preset("tiny", **SMALL)
    pairs = [([5, 6, 7], [8, 9])] * 4
    data = ([p[0] for p in pairs], [p[1] for p in pairs], [pairs[0][0]], [pairs[0][1]])
    procs = start_processes("cpu")
    try:
        run = Trainer(config, run_folder, tokenizer, procs, data, progress=False)
        run.restore(state)
        assert [g["fused"] for g in run.update.optimizer.param_groups] == [False]
    finally:
        procs.close()


@pytest.mark.parametrize("setting", ["vocab_size=40", "clip_grad_norm=nan", "max_minutes=nan", "eval_epochs=nan", "lr_factor=inf",
                                     "label_smoothing=nan", "betas=0.9,nan", "cooldown=nan", "eps=-inf"])
def test_non_finite_settings_are_refused_in_one_line(tmp_path, capsys, setting):
    code = main(["train", "--preset", "tiny", "--set", setting, "--out", str(tmp_path / "run"), "--quiet"])
    err = capsys.readouterr().err.strip()
    assert code == 2
    assert err.count("\n") == 0 and err.startswith("error: --set: " + setting.split("=")[0]), err
    assert not (tmp_path / "run").exists()


def test_a_loss_that_stops_being_finite_stops_the_run_and_keeps_the_last_good_checkpoint(tmp_path, tokenizer,
                                                                                          monkeypatch):
    original, steps = OptimiserStep.__call__, []

    def diverging(self, micro_batches, n_tgt):
        sums = original(self, micro_batches, n_tgt)
        steps.append(1)
        if len(steps) == 3:  # the step after the last checkpoint: its loss (and from here the weights) is NaN
            sums[0] = math.nan
            with torch.no_grad():
                next(self.model.parameters()).fill_(math.nan)
        return sums

    monkeypatch.setattr(OptimiserStep, "__call__", diverging)
    config = TrainConfig.from_preset("tiny", **SMALL, max_steps=6, checkpoint_every=2)
    with pytest.raises(TrainingError, match="the training loss is nan by step 3"):
        train(config, tmp_path, progress=False, tokenizer=tokenizer)
    state = load_checkpoint(tmp_path / "last.pt")
    assert state["step"] == 2
    assert all(torch.isfinite(t).all() for t in state["model"].values())
    assert not (tmp_path / "model.pt").exists()


def _cli_train(tmp_path, capsys, *args: str) -> tuple[int, str]:
    code = main(["train", "--preset", "tiny", "--out", str(tmp_path / "run"), "--quiet",
                 "--set", "train_subset=200", "--set", "vocab_size=300", *args])
    return code, capsys.readouterr().err.strip().splitlines()[-1]


def test_no_training_pair_left_is_one_line_exit_2(tmp_path, capsys):
    code, last = _cli_train(tmp_path, capsys, "--set", "max_sentence_len=2")
    assert code == 2 and last.startswith("error: no training pair is left"), last


def test_an_epoch_shorter_than_a_step_is_one_line_exit_2(tmp_path, capsys):
    code, last = _cli_train(tmp_path, capsys, "--set", "accum_steps=1000")
    assert code == 2 and "fewer than the 1000 micro-batches of one step" in last and last.startswith("error:"), last


def test_no_validation_pair_that_fits_is_one_line_exit_2(tmp_path, capsys):
    files = {}
    for name, lines in {"train.de": ["ein hund", "eine katze"] * 20, "train.en": ["a dog", "a cat"] * 20,
                        "val.de": [" ".join(["hund"] * 600)], "val.en": ["a dog"]}.items():
        files[name] = tmp_path / name
        files[name].write_text("\n".join(lines) + "\n", encoding="utf-8")
    code = main(["train", "--preset", "tiny", "--out", str(tmp_path / "run"), "--quiet", "--set", "vocab_size=300",
                 "--train", str(files["train.de"]), str(files["train.en"]),
                 "--val", str(files["val.de"]), str(files["val.en"])])
    last = capsys.readouterr().err.strip().splitlines()[-1]
    assert code == 2 and last.startswith("error: no validation pair fits the model's 512 positions"), last


def test_the_old_name_of_max_sentence_len_still_works_with_a_warning(tmp_path):
    """max_len, the data filter's name before it was renamed (it read like TransformerConfig's positions): typed by a
    user it warns and sets max_sentence_len; saved in a checkpoint or a results record it is read quietly."""
    import warnings

    from transformer_lib.config import parse_overrides
    from transformer_lib.records import overrides_of

    for make in (lambda: TrainConfig(max_len=37), lambda: TrainConfig.from_preset("tiny", max_len=37),
                 lambda: TrainConfig.from_preset("tiny", **parse_overrides(["max_len=37"]))):
        with pytest.warns(FutureWarning, match="max_sentence_len"):
            assert make().max_sentence_len == 37
    config = TrainConfig.from_preset("tiny")
    with pytest.warns(FutureWarning, match="TrainConfig.max_len is now TrainConfig.max_sentence_len"):
        assert config.max_len == 100
    with pytest.raises(ValueError, match="max_len is the old name of max_sentence_len"):
        TrainConfig(max_len=37, max_sentence_len=38)
    older = {k: v for k, v in config.to_dict().items() if k != "max_sentence_len"} | {"max_len": 37}
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # a stored dict of an older version loads without a warning
        assert TrainConfig.from_dict(older).max_sentence_len == 37
        assert overrides_of(older) == ("tiny", {"max_sentence_len": 37})
    assert "max_len" not in config.to_dict()


def test_a_resume_reads_a_checkpoint_saved_under_the_old_field_name(tmp_path, run_folder):
    """A last.pt written before max_len was renamed resumes as before: its data order is the same run's."""
    import shutil

    out = tmp_path / "old"
    shutil.copytree(run_folder, out)
    state = load_checkpoint(out / "last.pt")
    state["train_config"]["max_len"] = state["train_config"].pop("max_sentence_len")
    save_checkpoint(state, out / "last.pt")
    train(TrainConfig.from_preset("tiny", **SMALL, max_steps=3), out, resume=True, progress=False)
    assert load_checkpoint(out / "last.pt")["step"] == 3


def test_train_gives_the_process_its_thread_count_and_tf32_back(tmp_path, tokenizer):
    """The run's threads (and on CUDA, TF32) are the run's only: after train returns, or raises, they are as before."""
    threads, tf32 = torch.get_num_threads(), torch.backends.cuda.matmul.allow_tf32
    try:
        torch.set_num_threads(1)
        torch.backends.cuda.matmul.allow_tf32 = False
        train(TrainConfig.from_preset("tiny", **SMALL, max_steps=1, threads=2), tmp_path / "a", progress=False,
              tokenizer=tokenizer)
        assert torch.get_num_threads() == 1 and torch.backends.cuda.matmul.allow_tf32 is False
        with pytest.raises(TrainingError, match="no training pair is left"):
            train(TrainConfig.from_preset("tiny", **SMALL, max_steps=1, threads=2, max_sentence_len=2),
                  tmp_path / "b", progress=False, tokenizer=tokenizer)
        assert torch.get_num_threads() == 1
    finally:
        torch.set_num_threads(threads)
        torch.backends.cuda.matmul.allow_tf32 = tf32


# ---------------------------------------------------------------- failures stop the run when they happen


def test_the_divergence_advice_is_one_a_resume_accepts(tmp_path, tokenizer, monkeypatch):
    """The message of a diverged run says how to go on; the resume it advises is accepted and trains on."""
    import re

    original, steps = OptimiserStep.__call__, []

    def diverging(self, micro_batches, n_tgt):
        sums = original(self, micro_batches, n_tgt)
        steps.append(1)
        if len(steps) == 3:
            sums[0] = math.nan
        return sums

    out = tmp_path / "run"
    with monkeypatch.context() as mp:
        mp.setattr(OptimiserStep, "__call__", diverging)
        with pytest.raises(TrainingError) as caught:
            train(TrainConfig.from_preset("tiny", **SMALL, max_steps=6, checkpoint_every=2), out, progress=False,
                  tokenizer=tokenizer)
    advice = re.findall(r"--set (\w+)=(\S+?)\)", str(caught.value))
    assert advice, str(caught.value)
    name, value = advice[0]
    train(resumed_config(out, max_steps=4, **{name: float(value)}), out, resume=True, progress=False)
    assert load_checkpoint(out / "last.pt")["step"] == 4


def test_a_checkpoint_write_that_fails_stops_the_run_within_a_step(tmp_path, tokenizer, monkeypatch):
    """A run whose first last.pt cannot be written (a full disk) stops at once, not after the rest of its budget."""
    import errno

    import transformer_lib.trainer as trainer

    def full_disk(obj, path):
        raise OSError(errno.ENOSPC, "No space left on device", str(path))

    steps = []
    original = OptimiserStep.__call__

    def counted(self, micro_batches, n_tgt):
        steps.append(len(steps) + 1)  # a new run: the optimiser steps are the run's steps
        return original(self, micro_batches, n_tgt)

    monkeypatch.setattr(trainer, "save_checkpoint", full_disk)
    monkeypatch.setattr(OptimiserStep, "__call__", counted)
    with pytest.raises(OSError, match="No space left on device"):
        train(TrainConfig.from_preset("tiny", **SMALL, max_steps=30, checkpoint_every=2), tmp_path, progress=False,
              tokenizer=tokenizer)
    assert steps[-1] <= 4, steps  # the write queued after step 2 failed: the run stops by the step after it


def test_a_write_that_fails_during_a_run_is_one_line_on_the_command_line(tmp_path, capsys, monkeypatch):
    import errno

    import transformer_lib.trainer as trainer

    def full_disk(obj, path):
        raise OSError(errno.ENOSPC, "No space left on device", str(path))

    monkeypatch.setattr(trainer, "save_checkpoint", full_disk)
    code, last = _cli_train(tmp_path, capsys, "--set", "max_steps=6", "--set", "checkpoint_every=2")
    assert code == 1 and last == f"error: cannot write {tmp_path / 'run' / 'last.pt'}: No space left on device"


def test_an_unwritable_out_is_one_line_before_any_work(tmp_path, capsys, monkeypatch):
    import transformer_lib.training_run as training_run

    (tmp_path / "file").write_text("a file, where --out wants a folder")
    monkeypatch.setattr(training_run, "load_multi30k", lambda *a, **k: pytest.fail("the data was read"))
    code = main(["train", "--preset", "tiny", "--out", str(tmp_path / "file" / "run"), "--quiet"])
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 1 and err[-1].startswith(f"error: cannot write {tmp_path / 'file' / 'run'}: "), err


def test_load_checkpoint_says_corrupt_only_for_a_file_that_does_not_unpickle(run_folder, tmp_path, monkeypatch):
    cut = tmp_path / "cut.pt"
    for size in (300, 3000, 5000):  # cut in different places, the unpickler fails in different ways
        cut.write_bytes((run_folder / "last.pt").read_bytes()[:size])
        with pytest.raises(CheckpointError) as caught:
            load_checkpoint(cut)
        assert "is truncated or corrupt" in str(caught.value) and "delete" not in str(caught.value)

    def denied(*args, **kwargs):
        raise PermissionError(13, "Permission denied")

    monkeypatch.setattr(torch, "load", denied)
    with pytest.raises(CheckpointError) as caught:
        load_checkpoint(run_folder / "last.pt")  # a sound file this process may not read
    assert "corrupt" not in str(caught.value) and "delete" not in str(caught.value)
    assert "Permission denied" in str(caught.value)


@pytest.mark.parametrize("kind", ["float32", "float16", "float64"])
def test_non_finite_numbers_of_any_type_are_refused(kind):
    import numpy as np

    for value in (np.dtype(kind).type("nan"), np.dtype(kind).type("inf")):
        with pytest.raises(ValueError, match="lr_factor=.* must be a finite number"):
            TrainConfig(lr_factor=value)
    with pytest.raises(ValueError, match="clip_grad_norm=.* must be a finite number"):
        TrainConfig(clip_grad_norm=torch.tensor(float("nan")))


def _float16_that_always_overflows(monkeypatch):
    """The trainer as on a T4 (float16 autocast, so a loss scaler), with a loss that is never finite."""
    import transformer_lib.trainer as trainer
    import transformer_lib.training_step as training_step

    monkeypatch.setattr(trainer, "resolve_amp", lambda amp, device: torch.float16)
    original = training_step.LossComputation.forward
    monkeypatch.setattr(training_step.LossComputation, "forward",
                        lambda self, batch: tuple(x * math.inf for x in original(self, batch)))


def test_a_float16_run_whose_loss_stays_non_finite_stops(tmp_path, tokenizer, monkeypatch):
    _float16_that_always_overflows(monkeypatch)
    with pytest.raises(TrainingError, match="float16 run diverged by step 3"):  # three windows of one step
        train(TrainConfig.from_preset("tiny", **SMALL, max_steps=30), tmp_path, progress=False, tokenizer=tokenizer)
    assert not (tmp_path / "model.pt").exists()


def test_a_float16_run_whose_loss_scale_collapses_stops(tmp_path, tokenizer, monkeypatch):
    _float16_that_always_overflows(monkeypatch)
    # one window of 20 steps: the scale halved 20 times from 2**16 is below 1 at the first record
    with pytest.raises(TrainingError, match=r"float16 run diverged by step 20 \(loss .*, loss scale 0.0625\)"):
        train(TrainConfig.from_preset("tiny", **{**SMALL, "log_every": 20}, max_steps=60), tmp_path,
              progress=False, tokenizer=tokenizer)


def test_the_trainer_scales_the_loss_on_a_t4(tmp_path, tokenizer, monkeypatch):
    """amp="auto" on a T4 (capability 7.5) is float16, and the trainer then turns its loss scaler on."""
    import transformer_lib.trainer as trainer
    from transformer_lib.runtime import amp_for_capability

    monkeypatch.setattr(trainer, "resolve_amp", lambda amp, device: amp_for_capability((7, 5)))
    pairs = [([5, 6, 7], [8, 9])] * 4
    data = ([p[0] for p in pairs], [p[1] for p in pairs], [pairs[0][0]], [pairs[0][1]])
    run = Trainer(TrainConfig.from_preset("tiny", **SMALL), tmp_path, tokenizer, start_processes("cpu"), data,
                  progress=False)
    assert run.amp == torch.float16 and run.update.scaler.is_enabled()


# ---------------------------------------------------------------- nothing stale, a finished run left alone


def test_a_resume_of_a_finished_run_says_so_and_changes_no_file(tmp_path, tokenizer, capsys):
    out = tmp_path / "run"
    config = TrainConfig.from_preset("tiny", **{**SMALL, "average_last": 2, "eval_every": 1}, max_steps=3)
    train(config, out, progress=False, tokenizer=tokenizer)
    for kept in out.glob("average*.pt"):
        kept.unlink()  # a folder copied without the averaging snapshots
    before = {p.name: (p.read_bytes(), p.stat().st_mtime_ns) for p in out.iterdir()}
    capsys.readouterr()
    result = train(config, out, resume=True, progress=False)
    assert "holds a finished run (3 steps, model.pt): nothing to train, and no file changed" in capsys.readouterr().out
    assert {p.name: (p.read_bytes(), p.stat().st_mtime_ns) for p in out.iterdir()} == before
    final = load_checkpoint(out / "model.pt")
    assert all(torch.equal(result.model.state_dict()[k], final["model"][k]) for k in final["model"])


def test_a_resume_removes_the_learning_curve_snapshots_taken_after_its_checkpoint(tmp_path, tokenizer):
    out = tmp_path / "run"
    train(TrainConfig.from_preset("tiny", **SMALL, max_steps=2), out, progress=False, tokenizer=tokenizer)
    weights = {"format": load_checkpoint(out / "last.pt")["format"], "kind": "weights", "model": {}}
    save_checkpoint(weights, out / "snapshot005.pt")  # minute 5: after the seconds last.pt was written at
    train(resumed_config(out, max_steps=3, snapshot_minutes=1.0), out, resume=True, progress=False)
    assert not (out / "snapshot005.pt").exists()


def test_metrics_are_rewritten_atomically(tmp_path, monkeypatch):
    import json

    from transformer_lib import records

    path = tmp_path / "metrics.jsonl"
    records.write_metrics(path, [{"step": 1}, {"step": 2}], mode="w")
    calls = []

    def failing(obj):
        calls.append(obj)
        if len(calls) == 2:
            raise OSError(28, "No space left on device")
        return json.dumps(obj)

    monkeypatch.setattr(records.json, "dumps", failing)
    with pytest.raises(OSError):
        records.write_metrics(path, [{"step": 1}, {"step": 2}, {"step": 3}], mode="w")
    assert path.read_text().splitlines() == ['{"step": 1}', '{"step": 2}']  # the old log, whole
    assert [p.name for p in tmp_path.iterdir()] == ["metrics.jsonl"]


def test_only_the_writing_process_copies_the_state_to_the_cpu(tmp_path, tokenizer, monkeypatch):
    from transformer_lib import checkpoints
    from transformer_lib.distributed import Processes

    pairs = [([5, 6, 7], [8, 9])] * 4
    data = ([p[0] for p in pairs], [p[1] for p in pairs], [pairs[0][0]], [pairs[0][1]])
    copies = []
    original = checkpoints.cpu_copy  # last_checkpoint copies the state
    monkeypatch.setattr(checkpoints, "cpu_copy", lambda obj: copies.append(1) or original(obj))
    rank1 = Trainer(TrainConfig.from_preset("tiny", **SMALL), tmp_path, tokenizer,
                    Processes(torch.device("cpu"), rank=1), data, progress=False)
    assert rank1.state() is None and copies == []
    rank0 = Trainer(TrainConfig.from_preset("tiny", **SMALL), tmp_path, tokenizer, Processes(torch.device("cpu")),
                    data, progress=False)
    assert set(rank0.state()) >= {"model", "optimizer"} and copies
