"""The command line (appendix B), run as a user runs it, in subprocesses: translation from arguments and
standard input with lines kept aligned, invalid UTF-8, overlong input, unusable checkpoints and bad options give
a message and an exit code, never a traceback; --help of every command."""
import os
import subprocess
import sys
import warnings
from pathlib import Path

import pytest
import torch

from transformer_lib.cli import EXIT_INPUT, EXIT_OK, EXIT_USAGE, main
from transformer_lib.model import Transformer, TransformerConfig
from transformer_lib.tokenizer import BPETokenizer
from transformer_lib.checkpoints import CHECKPOINT_FORMAT, save_checkpoint
from transformer_lib.config import TrainConfig
from transformer_lib.translate import Translator

SENTENCES = ["Ein Hund läuft über die Straße.", "A dog runs across the street."]


@pytest.fixture(scope="module")
def workdir(tmp_path_factory) -> Path:
    """A folder with model.pt: a small random model and a tokenizer trained on two sentences."""
    folder = tmp_path_factory.mktemp("cli")
    tokenizer = BPETokenizer.train(SENTENCES, 300)
    torch.manual_seed(0)
    model = Transformer(TransformerConfig(vocab_size=tokenizer.vocab_size, d_model=16, n_heads=2,
                                          n_encoder_layers=1, n_decoder_layers=1, d_ff=32, max_len=24))
    save_checkpoint({"format": CHECKPOINT_FORMAT, "kind": "model", "model": model.state_dict(),
                     "tokenizer": tokenizer.to_dict(), "model_config": model.config.to_dict(),
                     "train_config": TrainConfig.from_preset("tiny").to_dict(), "step": 0, "epoch": 0,
                     "history": []}, folder / "model.pt")
    return folder


def run(args: list[str], cwd: Path, stdin: bytes = b"") -> subprocess.CompletedProcess:
    """`python -m transformer_lib ARGS` in cwd, with one torch thread (the models are tiny)."""
    env = dict(os.environ, OMP_NUM_THREADS="1", COLUMNS="100")
    env.pop("TRANSFORMER_LIB_CHECKPOINT", None)
    done = subprocess.run([sys.executable, "-m", "transformer_lib", *args], input=stdin, capture_output=True,
                          cwd=cwd, env=env, timeout=120)
    assert b"Traceback" not in done.stderr, done.stderr.decode()
    return done


def translations(workdir: Path, sentences: list[str], beam_size: int) -> list[str]:
    """What the Translator of workdir/model.pt gives, one line each, as the command line should print them."""
    translator = Translator.from_checkpoint(workdir / "model.pt", device="cpu")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # the truncation warning; the tests read the command's own
        return [" ".join(t.splitlines()) for t in translator.translate(sentences, beam_size=beam_size)]


def test_translate_arguments_and_truncate_overlong_ones_with_a_warning(workdir):
    sentences = ["Ein Hund.", "Ein Hund läuft. " * 20, "Zwei Männer 😀"]
    done = run(["translate", "-c", "model.pt", "--beam", "2", *sentences], workdir)
    assert done.returncode == EXIT_OK
    # in order, with beam 2 (greedy decoding gives other outputs for the first two)
    assert done.stdout.decode("utf-8").split("\n") == [*translations(workdir, sentences, 2), ""]
    assert "warning: 1 sentence(s) longer than 23 tokens, the most the model has" in done.stderr.decode()


def test_stdin_keeps_empty_lines_in_place_and_replaces_invalid_utf8(workdir):
    text = b"Ein Hund.\n\nEin \xff\xfe Hund\r\n\n\xe6\x97\xa5\xe6\x9c\xac \x00 \x1b[0m\nletzte Zeile ohne Ende"
    done = run(["translate", "-c", "model.pt", "--beam", "1"], workdir, stdin=text)
    assert done.returncode == EXIT_OK
    lines = done.stdout.decode("utf-8").split("\n")
    assert lines[-1] == "" and len(lines) - 1 == 6  # one output line per input line
    assert lines[1] == "" and lines[3] == ""
    sentences = ["Ein Hund.", "", "Ein \ufffd\ufffd Hund", "", "日本 \x00 \x1b[0m", "letzte Zeile ohne Ende"]
    assert lines[:-1] == translations(workdir, sentences, 1)
    assert "warning: standard input: 1 line(s) are not valid UTF-8 (line 3)" in done.stderr.decode()


def test_input_and_output_files_with_a_progress_bar(workdir):
    (workdir / "in.de").write_text("Ein Hund.\n\nZwei Männer.\n", encoding="utf-8")
    done = run(["translate", "-c", "model.pt", "--beam", "1", "-i", "in.de", "-o", "out.en"], workdir)
    assert done.returncode == EXIT_OK and done.stdout == b""
    assert "translating" in done.stderr.decode()  # tqdm's bar, on standard error
    out = (workdir / "out.en").read_text(encoding="utf-8").split("\n")
    assert len(out) == 4 and out[1] == "" and out[3] == ""


def test_unusable_checkpoints_exit_2_with_a_message(workdir, capsys, monkeypatch):
    done = run(["translate", "-c", "missing/model.pt", "Hallo"], workdir)
    assert done.returncode == EXIT_USAGE
    assert done.stderr.decode().startswith("error: no checkpoint at missing/model.pt")
    (workdir / "cut.pt").write_bytes((workdir / "model.pt").read_bytes()[:3000])
    done = run(["translate", "-c", "cut.pt", "Hallo"], workdir)
    assert done.returncode == EXIT_USAGE and "cut.pt is truncated or corrupt" in done.stderr.decode()


def test_evaluate_on_files(workdir, capsys, monkeypatch):
    (workdir / "src.de").write_text("Ein Hund.\nZwei Männer.\n", encoding="utf-8")
    (workdir / "ref.en").write_text("A dog.\nTwo men.\n", encoding="utf-8")
    (workdir / "short.en").write_text("A dog.\n", encoding="utf-8")
    done = run(["evaluate", "-c", "model.pt", "--beam", "1", "--src", "src.de", "--ref", "ref.en"], workdir)
    assert done.returncode == EXIT_OK
    assert "BLEU (cased, detokenized) = " in done.stdout.decode() and "case:mixed" in done.stdout.decode()
    monkeypatch.chdir(workdir)
    assert main(["evaluate", "-c", "model.pt", "--src", "src.de", "--ref", "short.en"]) == EXIT_INPUT
    assert "src.de has 2 lines but short.en has 1" in capsys.readouterr().err
    assert main(["evaluate", "-c", "model.pt", "--src", "nothing.de", "--ref", "ref.en"]) == EXIT_INPUT
    assert "cannot read nothing.de" in capsys.readouterr().err


def test_evaluate_refuses_a_corpus_run_without_src_and_ref(workdir, capsys, monkeypatch):
    """A corpus run records direction de-en, which says nothing of its languages: a Multi30k split would score it on
    other text, so evaluate asks for --src and --ref, before it reads any Multi30k file."""
    from transformer_lib import records
    from transformer_lib.checkpoints import load_checkpoint

    files = dict(train_src="train.de", train_tgt="train.en", val_src="val.de", val_tgt="val.en")
    state = load_checkpoint(workdir / "model.pt")
    save_checkpoint({**state, "train_config": TrainConfig.from_preset("tiny", **files).to_dict()},
                    workdir / "corpus.pt")
    monkeypatch.chdir(workdir)
    monkeypatch.setattr(records, "load_multi30k", lambda *args, **kwargs: pytest.fail("read Multi30k"))
    for split in ([], ["--split", "val"]):
        assert main(["evaluate", "-c", "corpus.pt", "--device", "cpu", *split]) == EXIT_USAGE
        assert capsys.readouterr().err.strip().splitlines() == [
            "error: corpus.pt was trained on corpus files, not on Multi30k: score it on files of its own "
            "(evaluate --src --ref)"]
    (workdir / "test.de").write_bytes("Ein Hund.\n".encode())
    (workdir / "test.en").write_bytes(b"A dog.\n")
    args = ["evaluate", "-c", "corpus.pt", "--device", "cpu", "--beam", "1", "--quiet", "--src", "test.de", "--ref",
            "test.en"]
    assert main(args) == EXIT_OK
    assert "test.de against test.en, 1 sentences" in capsys.readouterr().out


def test_bad_options_exit_2_without_work(workdir, capsys):
    bad_set = ["train", "--preset", "tiny", "--set", "max_minutes=soon", "--out", str(workdir / "r")]
    assert main(bad_set) == EXIT_USAGE
    assert "--set: max_minutes='soon': expected float" in capsys.readouterr().err
    assert main(["train", "--set", "no_such_field=1"]) == EXIT_USAGE
    (workdir / "run").mkdir()
    (workdir / "run" / "last.pt").write_bytes(b"")
    assert main(["train", "--preset", "tiny", "--out", str(workdir / "run")]) == EXIT_USAGE
    assert "add --resume" in capsys.readouterr().err
    assert main(["translate", "-c", str(workdir / "model.pt"), "--beam", "0", "x"]) == EXIT_USAGE
    with pytest.raises(SystemExit) as exit_info:
        main(["translate", "--beam", "four"])
    assert exit_info.value.code == EXIT_USAGE


@pytest.mark.parametrize("command", ["train", "evaluate", "translate"])
def test_help_of_each_command(command, capsys):
    with pytest.raises(SystemExit) as exit_info:
        main([command, "--help"])
    assert exit_info.value.code == 0
    text = capsys.readouterr().out
    assert text.startswith(f"usage: transformer-lib {command}")
    options = {"train": ["--preset", "--resume", "--set", "--device"],
               "evaluate": ["--split", "--src", "--ref", "--beam"],
               "translate": ["--checkpoint", "--beam", "--batch-size", "--max-len"]}[command]
    assert all(option in text for option in options)


def test_module_and_console_script_print_the_same_help(workdir):
    by_module = run(["--help"], workdir)
    script = Path(sys.executable).with_name("transformer-lib")
    env = dict(os.environ, COLUMNS="100")
    by_script = subprocess.run([str(script), "--help"], capture_output=True, env=env)
    assert by_module.returncode == by_script.returncode == 0
    assert by_module.stdout == by_script.stdout and b"Exit codes" in by_module.stdout


def test_train_device_option(tmp_path, capsys):
    assert main(["train", "--preset", "tiny", "--device", "foo", "--out", str(tmp_path / "r")]) == EXIT_USAGE
    err = capsys.readouterr().err.strip().splitlines()
    assert err == ["error: --device foo: not a device; use auto, cpu, cuda, cuda:N or mps"], err
    assert not (tmp_path / "r").exists()
    if not torch.cuda.is_available():
        assert main(["train", "--preset", "tiny", "--device", "cuda", "--out", str(tmp_path / "r"), "--quiet"]) \
            == EXIT_USAGE
        assert capsys.readouterr().err.strip().splitlines()[-1].startswith("error: --device: device=cuda: this "
                                                                           "PyTorch sees no CUDA device")


def test_train_reports_the_validation_loss_of_the_model_it_kept(tmp_path, capsys, monkeypatch):
    """A rejected average is logged, but the loss printed is that of the last weights, which model.pt holds."""
    from transformer_lib import training_run
    from transformer_lib.training_run import TrainResult

    def fake_train(config, out, **kwargs):
        history = [{"kind": "val", "step": 10, "val_loss": 1.25, "minutes": 1.0},
                   {"kind": "averaged", "step": 10, "val_loss": 1.5, "kept": False},
                   {"kind": "overhead", "step": 10, "seconds": 80.0, "share": 0.025}]
        if config.average_last == 2:  # here the average validated better and was kept
            history[1].update(val_loss=1.125, kept=True)
        return TrainResult(None, None, history, out)

    monkeypatch.setattr(training_run, "train", fake_train)  # the command line imports it when it trains
    for average_last, loss in ((5, "1.250"), (2, "1.125")):
        args = ["train", "--preset", "tiny", "--set", f"average_last={average_last}", "--out",
                str(tmp_path / f"r{average_last}"), "--quiet"]
        assert main(args) == EXIT_OK
        assert f"validation loss {loss}, 2.5% of the time outside training steps;" in capsys.readouterr().out


def test_the_command_line_starts_without_the_bleu_library():
    # a user who only translates waits for no import of sacrebleu; `evaluate` imports it when it scores
    code = "import sys, transformer_lib.cli; print('sacrebleu' in sys.modules)"
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert done.stdout.strip() == "False", done.stdout + done.stderr


@pytest.mark.parametrize("command", [["translate", "-c", "model.pt", "Hallo"],
                                     ["evaluate", "-c", "model.pt", "--src", "src.de", "--ref", "src.de"]])
def test_an_unwritable_output_is_refused_before_any_translating(workdir, capsys, monkeypatch, command):
    (workdir / "src.de").write_text("Ein Hund.\n", encoding="utf-8")
    monkeypatch.chdir(workdir)
    monkeypatch.setattr(Translator, "translate", lambda *args, **kwargs: pytest.fail("translated first"))
    for target, reason in [("no/such/folder/out.txt", "the folder no/such/folder does not exist"),
                           (".", "not a writable file")]:
        assert main([*command, "--device", "cpu", "-o", target]) == EXIT_USAGE
        assert capsys.readouterr().err.strip().splitlines() == [f"error: cannot write {target}: {reason}"]


def test_resume_with_nothing_to_resume_says_so(tmp_path, capsys, monkeypatch):
    monkeypatch.setattr("transformer_lib.training_run.train", lambda *args, **kwargs: pytest.skip("reached train"))
    with pytest.raises(pytest.skip.Exception):
        main(["train", "--preset", "tiny", "--resume", "--out", str(tmp_path / "empty"), "--quiet"])
    err = capsys.readouterr().err
    assert f"--resume: {tmp_path / 'empty'} holds no last.pt to resume, so this starts a new run there" in err


def test_translate_prints_into_a_text_stream_without_bytes_underneath(workdir, monkeypatch):
    """A notebook's sys.stdout takes text and has no .buffer: the translations reach it all the same."""
    import io

    out = io.StringIO()  # text only: no .buffer underneath
    monkeypatch.setattr(sys, "stdout", out)
    assert main(["translate", "-c", str(workdir / "model.pt"), "--beam", "2", "--quiet", *SENTENCES]) == EXIT_OK
    assert out.getvalue().split("\n") == [*translations(workdir, SENTENCES, 2), ""]


def test_a_failed_worker_exits_1_which_the_help_lists_as_the_environment(tmp_path, capsys, monkeypatch):
    """A worker of torchrun that failed (out of memory, say) is no fault of the input: code 1 says "or environment"."""
    from transformer_lib.distributed import ProcessFailure

    def failed(*args, **kwargs):
        raise ProcessFailure("rank 0: lost another process of the run (rank 1 exited)")

    monkeypatch.setattr("transformer_lib.training_run.train", failed)
    assert main(["train", "--preset", "tiny", "--out", str(tmp_path / "r"), "--quiet"]) == EXIT_INPUT
    assert "error: rank 0: lost another process of the run" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        main(["--help"])
    text = " ".join(capsys.readouterr().out.split())
    assert f"{EXIT_INPUT} unusable input or environment (files, data, a failed worker)" in text
