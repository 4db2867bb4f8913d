"""A run that cannot go wrong quietly: a resume that would change the optimisation is refused, non-finite settings
and losses stop the run, and every error raised inside train() reaches the command line as one line, exit 2."""
import math

import pytest
import torch

from transformer_lib.checkpoints import OPTIMISATION_FIELDS, CheckpointError, load_checkpoint, save_checkpoint
from transformer_lib.cli import main
from transformer_lib.config import TrainConfig
from transformer_lib.distributed import start_processes
from transformer_lib.loop import train
from transformer_lib.tokenizer import BPETokenizer
from transformer_lib.trainer import Trainer, TrainingError

SMALL = dict(d_model=32, n_heads=2, n_encoder_layers=1, n_decoder_layers=1, d_ff=64, train_subset=200,
             max_tokens=400, warmup=10, epochs=3, log_every=1, average_last=1, seed=5, device="cpu", amp="off")

# a value other than the tiny preset's for each setting the saved optimiser or schedule state carries
CHANGED = {"lr_factor": 2.0, "warmup": 20, "cooldown": 0.3, "betas": (0.8, 0.98), "eps": 1e-6, "weight_decay": 0.01}


@pytest.fixture(scope="module")
def tokenizer(small_tokenizer):
    return BPETokenizer.load(small_tokenizer)


@pytest.fixture(scope="module")
def run_folder(tmp_path_factory, tokenizer):
    """A run of two steps whose last.pt the resumes below start from."""
    out = tmp_path_factory.mktemp("run")
    train(TrainConfig.from_preset("tiny", **SMALL, max_steps=2), out, progress=False, tokenizer=tokenizer)
    return out


def test_every_optimisation_setting_is_checked():
    assert set(CHANGED) == set(OPTIMISATION_FIELDS)


@pytest.mark.parametrize("name", sorted(CHANGED))
def test_a_resume_refuses_a_changed_optimisation_setting_and_names_it(run_folder, name):
    saved = TrainConfig.from_preset("tiny", **SMALL).to_dict()[name]
    assert saved != CHANGED[name]
    expected = f"{name}: checkpoint has {saved!r}, requested {CHANGED[name]!r}"
    with pytest.raises(CheckpointError, match=expected.replace("(", r"\(").replace(")", r"\)")):
        train(TrainConfig.from_preset("tiny", **{**SMALL, name: CHANGED[name]}, max_steps=3), run_folder,
              resume=True, progress=False)
    assert load_checkpoint(run_folder / "last.pt")["step"] == 2  # refused before any step


def test_without_the_check_the_saved_state_would_win(run_folder):
    """Why the refusal is needed: the saved schedule and optimiser states hold the old values."""
    state = load_checkpoint(run_folder / "last.pt")
    assert state["scheduler"]["cooldown"] == 0.0 and state["scheduler"]["warmup"] == SMALL["warmup"]
    assert tuple(state["optimizer"]["param_groups"][0]["betas"]) == (0.9, 0.98)


def test_a_resume_with_settings_read_at_each_step_changed_goes_on(tmp_path, tokenizer):
    out = tmp_path / "run"
    train(TrainConfig.from_preset("tiny", **SMALL, max_steps=2), out, progress=False, tokenizer=tokenizer)
    result = train(TrainConfig.from_preset("tiny", **SMALL, max_steps=3, clip_grad_norm=0.5, label_smoothing=0.2),
                   out, resume=True, progress=False)
    assert result.history[-1]["step"] == 3


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
        assert [g["fused"] for g in run.optimizer.param_groups] == [False]
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
    original = Trainer.train_step

    def diverging(self, batches):
        sums, n = original(self, batches)
        if self.step == 3:  # the step after the last checkpoint: its loss (and from here the weights) is NaN
            sums[0] = math.nan
            with torch.no_grad():
                next(self.model.parameters()).fill_(math.nan)
        return sums, n

    monkeypatch.setattr(Trainer, "train_step", diverging)
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
