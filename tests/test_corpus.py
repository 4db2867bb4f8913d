"""Training on a corpus of one's own: parallel text files instead of Multi30k, their checks before any work, their
checksums in the run, and a resume on other files refused; through train and through the command line."""
import hashlib
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from transformer_lib.data import DataError
from transformer_lib.checkpoints import CheckpointError, load_checkpoint
from transformer_lib.cli import EXIT_INPUT, main
from transformer_lib.config import TrainConfig
from transformer_lib.corpus import corpus_tokenizer, read_corpus, read_parallel
from transformer_lib.training_run import resumed_config, train

SMALL = dict(d_model=16, n_heads=2, n_encoder_layers=1, n_decoder_layers=1, d_ff=32, dropout=0.1, vocab_size=300,
             max_tokens=300, warmup=5, epochs=1, max_steps=3, log_every=1, average_last=1, seed=0, device="cpu",
             max_minutes=None, amp="off")
ANIMALS = ["Hund", "Katze", "Pferd", "Vogel", "Fisch"]
TIERE = ["dog", "cat", "horse", "bird", "fish"]


def write_corpus(folder: Path, n_train: int = 300, n_val: int = 20) -> dict[str, str]:
    """A toy German-English corpus: n_train and n_val short sentence pairs in four files."""
    folder.mkdir(parents=True, exist_ok=True)
    def lines(n, offset):
        de = [f"Der {ANIMALS[(i + offset) % 5]} sieht {i % 7} Bäume." for i in range(n)]
        en = [f"The {TIERE[(i + offset) % 5]} sees {i % 7} trees." for i in range(n)]
        return de, en
    paths = {}
    for split, n, offset in (("train", n_train, 0), ("val", n_val, 2)):
        de, en = lines(n, offset)
        for side, text in (("src", de), ("tgt", en)):
            path = folder / f"{split}.{side}"
            path.write_text("\n".join(text) + "\n", encoding="utf-8")
            paths[f"{split}_{side}"] = str(path)
    return paths


@pytest.fixture(scope="module")
def corpus(tmp_path_factory) -> dict[str, str]:
    return write_corpus(tmp_path_factory.mktemp("corpus"))


@pytest.fixture(autouse=True)
def _own_cache(tmp_path, monkeypatch):
    monkeypatch.setenv("TRANSFORMER_LIB_CACHE", str(tmp_path / "cache"))


def test_trains_on_the_files_and_records_them(corpus, tmp_path):
    result = train(TrainConfig(**SMALL, **corpus), tmp_path / "run", progress=False)
    setup = result.history[0]
    assert setup["train_pairs"] == 300 and setup["val_pairs"] == 20
    assert set(setup["corpus"]) == {"train_src", "train_tgt", "val_src", "val_tgt"}
    for name, path in corpus.items():
        assert setup["corpus"][name]["path"] == path and len(setup["corpus"][name]["sha256"]) == 64
    assert result.history[-1]["step"] == 3
    for file in ("last.pt", "model.pt"):
        saved = load_checkpoint(tmp_path / "run" / file)["train_config"]
        assert saved["train_src"] == corpus["train_src"]
        assert saved["corpus_sha256"] == {k: v["sha256"] for k, v in setup["corpus"].items()}
    assert "Hund" in result.tokenizer.decode(result.tokenizer.encode("Der Hund"))
    cached = list((tmp_path / "cache" / "tokenizers").glob("corpus-*.json"))
    assert len(cached) == 1  # trained once, cached under the files' checksums
    # a resume on the same files continues; on changed files it is refused
    more = train(TrainConfig(**{**SMALL, "max_steps": 5}, **corpus), tmp_path / "run", resume=True, progress=False)
    assert more.history[-1]["step"] == 5
    changed = write_corpus(tmp_path / "changed", n_train=301)
    with pytest.raises(CheckpointError, match="other corpus files.*train_src: checkpoint has sha256"):
        train(TrainConfig(**{**SMALL, "max_steps": 7}, **changed), tmp_path / "run", resume=True, progress=False)
    with pytest.raises(CheckpointError, match="trained on corpus files, and this resume asks for Multi30k"):
        train(TrainConfig(**{**SMALL, "max_steps": 7}), tmp_path / "run", resume=True, progress=False)


@pytest.mark.parametrize("damage, message", [
    (lambda p: p["train_tgt"].write_text("one\ntwo\n", encoding="utf-8"), r"train\.src has 300 lines but .*train\.tgt has 2"),
    (lambda p: p["val_src"].write_bytes(b""), r"val\.src holds no sentence \(it is empty, or blank lines only\)"),
    (lambda p: p["val_tgt"].write_bytes(b"\n\n"), r"val\.tgt holds no sentence"),
    # as many lines as its partner, so the line counts agree: the case the rule is for
    (lambda p: p["val_tgt"].write_bytes(b"\n" * 20), r"val\.tgt holds no sentence"),
    # two empty files, and two of blank lines only: the counts agree, and the rule names the first
    (lambda p: [p[k].write_bytes(b"") for k in ("train_src", "train_tgt")], r"train\.src holds no sentence"),
    (lambda p: [p[k].write_bytes(b"\n" * 300) for k in ("train_src", "train_tgt")],
     r"train\.src holds no sentence"),
    (lambda p: p["train_src"].write_bytes(b"gut\nauch gut\nnicht \xff gut\n"), r"train\.src: line 3 is not valid UTF-8"),
    (lambda p: p["val_src"].unlink(), r"cannot read .*val\.src"),
    (lambda p: p["train_tgt"].write_bytes("The dog sees trees.\n".encode("utf-16")),
     r"train\.tgt: line 1 is not valid UTF-8 \(byte 0xff\)"),  # a UTF-16 file, refused at its first line
])
def test_bad_files_are_refused_before_training(tmp_path, damage, message):
    paths = write_corpus(tmp_path / "data")
    damage({k: Path(v) for k, v in paths.items()})
    with pytest.raises(DataError, match=message):
        train(TrainConfig(**SMALL, **paths), tmp_path / "run", progress=False)
    assert not (tmp_path / "run").exists()  # nothing was started


def test_read_parallel_lines(tmp_path):
    (tmp_path / "a").write_bytes("\ufeffeins\r\nzwei\n".encode())
    (tmp_path / "b").write_bytes(b"one\ntwo")
    assert read_parallel(tmp_path / "a", tmp_path / "b") == [("eins", "one"), ("zwei", "two")]


def test_a_blank_line_inside_a_file_is_kept_as_a_pair(tmp_path):
    """Every line is a sentence: a blank one gives a pair with an empty side, and the files stay aligned."""
    (tmp_path / "a").write_bytes("Ein Hund.\nEin Vogel.\nZwei Kinder.\n".encode())
    (tmp_path / "b").write_bytes(b"A dog.\n\nTwo children.\n")
    assert read_parallel(tmp_path / "a", tmp_path / "b") == [("Ein Hund.", "A dog."), ("Ein Vogel.", ""),
                                                             ("Zwei Kinder.", "Two children.")]


def test_all_four_files_or_none():
    with pytest.raises(ValueError, match="go together: val_src, val_tgt missing"):
        TrainConfig(train_src="a", train_tgt="b")


def test_direction_only_for_multi30k():
    files = dict(train_src="a", train_tgt="b", val_src="c", val_tgt="d")
    with pytest.raises(ValueError, match="direction='en-de' applies to Multi30k only.*the other way round"):
        TrainConfig(**files, direction="en-de")
    assert TrainConfig(**files).direction == "de-en"
    assert TrainConfig(direction="en-de").direction == "en-de"  # Multi30k turned around, as before
    with pytest.raises(ValueError, match="direction='fr-en' must be one of de-en, en-de"):
        TrainConfig(**files, direction="fr-en")  # unknown, with corpus files too


def test_changed_files_under_saved_checksums_say_what_to_do(tmp_path):
    """A plain resume takes the checkpoint's configuration, corpus_sha256 included."""
    paths = write_corpus(tmp_path / "data", n_train=5, n_val=2)
    sums = read_corpus(TrainConfig(**paths))[2]
    Path(paths["val_tgt"]).write_text("The dog.\nThe cat.\n", encoding="utf-8")
    with pytest.raises(DataError) as err:
        read_corpus(TrainConfig(**paths, corpus_sha256=sums))
    assert str(err.value) == (f"{paths['val_tgt']}: not the files this run trained on (their checksums differ "
                              "from those in its configuration, corpus_sha256); restore those files, or start "
                              "a new run in another folder")


def test_checksums_are_of_the_bytes_read(tmp_path, monkeypatch):
    """Each checksum is the SHA-256 of the bytes decoded, even when the file changes after the read."""
    paths = write_corpus(tmp_path / "data", n_train=5, n_val=2)
    expected = {name: hashlib.sha256(Path(path).read_bytes()).hexdigest() for name, path in paths.items()}
    read_bytes = Path.read_bytes

    def read_then_edit(path):
        data = read_bytes(path)
        if str(path) == paths["val_tgt"]:  # edited between the read and any second look
            path.write_text("The dog.\nThe cat.\n", encoding="utf-8")
        return data

    monkeypatch.setattr(Path, "read_bytes", read_then_edit)
    train_pairs, val_pairs, sums = read_corpus(TrainConfig(**paths))
    assert sums == expected
    assert val_pairs[0][1] == "The horse sees 0 trees." and len(train_pairs) == 5


def test_unreadable_file_under_saved_checksums_says_to_name_the_files(tmp_path):
    paths = write_corpus(tmp_path / "data", n_train=5, n_val=2)
    sums = read_corpus(TrainConfig(**paths))[2]
    Path(paths["train_src"]).unlink()
    with pytest.raises(DataError, match=r"cannot read .*train\.src: .*name them again: --train and --val beside "
                                        r"--resume and the same --out .*passes the checksum check"):
        read_corpus(TrainConfig(**paths, corpus_sha256=sums))
    with pytest.raises(DataError, match=r"cannot read .*train\.src") as fresh:
        read_corpus(TrainConfig(**paths))
    assert "--resume" not in str(fresh.value)  # a new run has nothing to resume


def test_moved_files_resume_when_named_again(corpus, tmp_path):
    folder = tmp_path / "files"
    shutil.copytree(Path(corpus["train_src"]).parent, folder)
    paths = {name: str(folder / Path(path).name) for name, path in corpus.items()}
    train(TrainConfig(**SMALL, **paths), tmp_path / "run", progress=False)
    moved = {name: str(tmp_path / "moved" / Path(path).name) for name, path in paths.items()}
    folder.rename(tmp_path / "moved")
    with pytest.raises(DataError, match="cannot read .*name them again: --train and --val beside --resume"):
        train(None, tmp_path / "run", resume=True, progress=False)
    more = train(resumed_config(tmp_path / "run", **moved, max_steps=5), tmp_path / "run", resume=True,
                 progress=False)
    assert more.history[-1]["step"] == 5
    assert load_checkpoint(tmp_path / "run" / "last.pt")["train_config"]["train_src"] == moved["train_src"]


def test_one_tokenizer_for_both_orders(corpus, tmp_path, monkeypatch):
    """The joint tokenizer does not depend on which file is the source, so both orders share one cache entry."""
    turned = dict(train_src=corpus["train_tgt"], train_tgt=corpus["train_src"], val_src=corpus["val_tgt"],
                  val_tgt=corpus["val_src"])
    made = {}
    for name, paths in (("as they are", corpus), ("turned around", turned)):
        monkeypatch.setenv("TRANSFORMER_LIB_CACHE", str(tmp_path / name))  # each trains its own
        pairs, _, sums = read_corpus(TrainConfig(**paths))
        made[name] = corpus_tokenizer(pairs, 300, sums)
    assert made["as they are"].to_dict() == made["turned around"].to_dict()
    monkeypatch.setenv("TRANSFORMER_LIB_CACHE", str(tmp_path / "both"))
    for paths in (corpus, turned):
        pairs, _, sums = read_corpus(TrainConfig(**paths))
        assert corpus_tokenizer(pairs, 300, sums).to_dict() == made["as they are"].to_dict()
    assert len(list((tmp_path / "both" / "tokenizers").iterdir())) == 1  # one file for both orders


def test_a_copied_corpus_reuses_the_cache_entry_and_an_edited_file_adds_a_second(corpus, tmp_path):
    """The cache's key is of the training files' content, not of their paths."""
    cached = lambda: sorted(p.name for p in (tmp_path / "cache" / "tokenizers").iterdir())
    pairs, _, sums = read_corpus(TrainConfig(**corpus))
    first = corpus_tokenizer(pairs, 300, sums).to_dict()
    assert len(cached()) == 1
    shutil.copytree(Path(corpus["train_src"]).parent, tmp_path / "copy")
    copied = {name: str(tmp_path / "copy" / Path(path).name) for name, path in corpus.items()}
    pairs, _, sums = read_corpus(TrainConfig(**copied))
    assert corpus_tokenizer(pairs, 300, sums).to_dict() == first and len(cached()) == 1
    with open(copied["train_tgt"], "ab") as f:  # one pair more in the copy
        f.write(b"The dog sees 8 trees.\n")
    with open(copied["train_src"], "ab") as f:
        f.write("Der Hund sieht 8 Bäume.\n".encode())
    pairs, _, sums = read_corpus(TrainConfig(**copied))
    corpus_tokenizer(pairs, 300, sums)
    assert len(cached()) == 2


def test_command_line(corpus, tmp_path):
    env = dict(os.environ, OMP_NUM_THREADS="1", COLUMNS="100", TRANSFORMER_LIB_CACHE=str(tmp_path / "cache"))
    small = [f"{k}={v}" for k, v in SMALL.items() if k not in ("device",)]
    base = [sys.executable, "-m", "transformer_lib", "train", "--preset", "tiny", "--device", "cpu", "--quiet",
            "--out", str(tmp_path / "run")] + [a for s in small for a in ("--set", s)]
    files = ["--train", corpus["train_src"], corpus["train_tgt"], "--val", corpus["val_src"], corpus["val_tgt"]]
    done = subprocess.run(base + files, capture_output=True, text=True, env=env, timeout=300)
    assert done.returncode == 0, done.stderr
    setup = json.loads((tmp_path / "run" / "metrics.jsonl").read_text().splitlines()[0])
    assert setup["corpus"]["val_tgt"]["path"] == corpus["val_tgt"]
    half = subprocess.run(base + files[:3], capture_output=True, text=True, env=env, timeout=300)
    assert half.returncode == 2 and "--train and --val go together" in half.stderr
    other = write_corpus(tmp_path / "other", n_val=21)
    files[4:6] = [str(tmp_path / "other" / "val.src"), str(tmp_path / "other" / "val.tgt")]
    refused = subprocess.run(base + files + ["--resume", "--set", "max_steps=6"], capture_output=True, text=True,
                             env=env, timeout=300)
    assert refused.returncode == 2 and "other corpus files (val_src" in refused.stderr, refused.stderr
    assert "Traceback" not in refused.stderr
    bad = write_corpus(tmp_path / "bad")
    Path(bad["train_tgt"]).write_bytes(b"")
    empty = subprocess.run([*base[:-2 * len(small)], "--out", str(tmp_path / "run2"), "--train", bad["train_src"],
                            bad["train_tgt"], "--val", bad["val_src"], bad["val_tgt"]], capture_output=True,
                           text=True, env=env, timeout=300)
    assert empty.returncode == 1 and "train.tgt holds no sentence" in empty.stderr and "Traceback" not in empty.stderr
    help_text = subprocess.run([sys.executable, "-m", "transformer_lib", "train", "--help"], capture_output=True,
                               text=True, env=env).stdout
    assert "--train SRC TGT" in help_text and "--val SRC TGT" in help_text


def test_a_plain_resume_on_changed_or_moved_files_exits_1(tmp_path, capsys):
    """`train --resume --out RUN` takes the run's files and checksums: read_corpus refuses other files (DataError,
    exit code 1), and for files it cannot read it says to name them again beside --resume and the same --out."""
    paths = write_corpus(tmp_path / "data", n_train=30, n_val=4)
    small = [a for k, v in SMALL.items() if k != "device" for a in ("--set", f"{k}={v}")]
    run = str(tmp_path / "run")
    files = ["--train", paths["train_src"], paths["train_tgt"], "--val", paths["val_src"], paths["val_tgt"]]
    assert main(["train", "--preset", "tiny", "--device", "cpu", "--quiet", "--out", run, *small, *files]) == 0
    capsys.readouterr()
    Path(paths["train_tgt"]).write_bytes(Path(paths["train_tgt"]).read_bytes().replace(b"dog", b"hound"))
    assert main(["train", "--resume", "--out", run, "--quiet"]) == EXIT_INPUT
    err = capsys.readouterr().err
    assert f"error: {paths['train_tgt']}: not the files this run trained on" in err and "Traceback" not in err
    Path(paths["train_tgt"]).unlink()
    assert main(["train", "--resume", "--out", run, "--quiet"]) == EXIT_INPUT
    assert "beside --resume and the same --out" in capsys.readouterr().err
