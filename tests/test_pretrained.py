"""The book's model ships inside the package (book/eng_book_model.ipynb): its files are the ones its card names, it
loads from a plain install, it translates as well as its card recorded, and damage is refused with a clear error."""
import json
import os
import shutil
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest
import torch

from transformer_lib import Translator
from transformer_lib.checkpoints import CheckpointError
from transformer_lib.data import load_multi30k
from transformer_lib.files import sha256_file
from transformer_lib.pretrained import CARD, CARD_MARKDOWN, TOKENIZER, WEIGHTS, load_pretrained, model_card, shipped_dir
from transformer_lib.translate import bleu

ROOT = Path(__file__).resolve().parents[1]
FOLDER = ROOT / "transformer_lib" / "pretrained"
CARD_DATA = json.loads((FOLDER / CARD).read_text(encoding="utf-8"))
# The check's margin, in BLEU points: greedy decoding of the same weights under another CPU's rounding changes a few
# words of a few of the sentences. Both kernel paths of the test suite gave the card's figure exactly.
MARGIN = 1.0


@pytest.fixture(scope="module")
def translator() -> Translator:
    return Translator.pretrained("cpu")


def test_the_package_loads_its_own_folder():
    assert shipped_dir().resolve() == FOLDER.resolve()


def test_the_shipped_files_are_the_ones_the_card_names_and_fit_the_repository():
    names = sorted(p.name for p in FOLDER.iterdir() if not p.name.startswith("."))
    assert names == sorted([CARD, CARD_MARKDOWN, TOKENIZER, WEIGHTS])
    for name, f in CARD_DATA["files"].items():
        assert (FOLDER / name).stat().st_size == f["bytes"]
        assert sha256_file(FOLDER / name) == f["sha256"]
    assert sum(p.stat().st_size for p in FOLDER.iterdir()) <= 16_000_000


def test_the_weights_are_float16_with_the_tied_table_stored_once():
    saved = torch.load(FOLDER / WEIGHTS, map_location="cpu", weights_only=True)
    tensors = saved["model"]
    assert {t.dtype for t in tensors.values() if t.is_floating_point()} == {torch.float16}
    unique = {t.untyped_storage().data_ptr(): t.numel() for t in tensors.values()}
    assert sum(unique.values()) == CARD_DATA["parameters"]  # every parameter once: the shared table is not copied
    assert (FOLDER / WEIGHTS).stat().st_size < 2 * CARD_DATA["parameters"] + 200_000


def test_the_markdown_card_is_written_from_the_card():
    assert (FOLDER / CARD_MARKDOWN).read_text(encoding="utf-8") == model_card(CARD_DATA)


def test_the_card_describes_the_model_that_loads(translator):
    """card.json's sizes are those of the model built from model.pt's own config, and of tokenizer.json."""
    assert translator.model.config.to_dict() == CARD_DATA["model_config"]
    assert sum(p.numel() for p in translator.model.parameters()) == CARD_DATA["parameters"]
    assert translator.tokenizer.vocab_size == CARD_DATA["model_config"]["vocab_size"]


def test_the_model_computes_in_float32_with_the_float16_values(translator):
    saved = torch.load(FOLDER / WEIGHTS, map_location="cpu", weights_only=True)["model"]
    state = translator.model.state_dict()
    assert all(state[name].dtype == torch.float32 for name in saved if saved[name].is_floating_point())
    assert all(torch.equal(state[name], saved[name].float()) for name in saved)


def test_the_shipped_model_translates_as_well_as_its_card_recorded(translator):
    check = CARD_DATA["check"]
    pairs = load_multi30k(check["split"])[: check["sentences"]]
    hypotheses = translator.translate([de for de, _ in pairs], beam_size=check["beam_size"])
    score = bleu(hypotheses, [en for _, en in pairs])["cased"]
    assert score >= check["cased"] - MARGIN, (score, check)


def test_a_damaged_missing_or_absent_file_is_refused_with_what_to_do(tmp_path):
    folder = tmp_path / "pretrained"
    shutil.copytree(FOLDER, folder)
    data = bytearray((folder / WEIGHTS).read_bytes())
    data[len(data) // 3] ^= 0x01
    (folder / WEIGHTS).write_bytes(bytes(data))
    with pytest.raises(CheckpointError, match="is damaged.*reinstall"):
        load_pretrained("cpu", folder)
    shutil.copy(FOLDER / WEIGHTS, folder / WEIGHTS)
    (folder / TOKENIZER).unlink()
    with pytest.raises(CheckpointError, match="tokenizer.json is missing"):
        load_pretrained("cpu", folder)
    with pytest.raises(CheckpointError, match="no model card"):
        load_pretrained("cpu", tmp_path / "nothing")


def test_the_command_line_translates_with_no_checkpoint_and_no_training(tmp_path):
    env = {k: v for k, v in os.environ.items() if k != "TRANSFORMER_LIB_CHECKPOINT"}
    done = subprocess.run([sys.executable, "-m", "transformer_lib", "translate"], cwd=tmp_path, env=env,
                          input="Ein Hund läuft über eine Wiese.\n".encode(), capture_output=True, timeout=300)
    assert done.returncode == 0, done.stderr.decode()
    assert "dog" in done.stdout.decode().lower()
    assert not list(tmp_path.iterdir())  # nothing trained, nothing written


def test_the_package_data_declares_every_file_the_model_needs():
    """What `pip install git+<repository>` puts beside the code: the files that pyproject.toml's package-data
    patterns match in the package's folder (setuptools globs them from there), without building a wheel."""
    setuptools = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))["tool"]["setuptools"]
    assert "transformer_lib*" in setuptools["packages"]["find"]["include"]
    package = ROOT / "transformer_lib"
    declared = {path.relative_to(package).as_posix() for pattern in setuptools["package-data"]["transformer_lib"]
                for path in package.glob(pattern) if path.is_file()}
    needed = {f"{FOLDER.name}/{name}" for name in (CARD, CARD_MARKDOWN, TOKENIZER, WEIGHTS)}
    assert needed <= declared, needed - declared


def test_the_card_carries_the_record_of_its_run():
    """The run behind the shipped model is recorded in results/shipped/ (tools/record_run.py), and the card copies it."""
    records = [json.loads(p.read_text(encoding="utf-8")) for p in sorted((ROOT / "results" / "shipped").glob("*.json"))]
    record = next(r for r in records if r["command"] == CARD_DATA["trained"]["command"])
    assert all(CARD_DATA["trained"][k] == record[k] for k in CARD_DATA["trained"])
    assert CARD_DATA["parameters"] == record["parameters"] and CARD_DATA["decoding"] == record["decoding"]


def test_the_run_of_the_shipped_model_keeps_its_log_and_translations():
    """Chapter 13 draws the shipped model's loss curves from its run's metrics.jsonl and the paired bootstraps of
    later runs read its translations: both sit beside its record in results/shipped/, and they are of that run."""
    shipped = ROOT / "results" / "shipped"
    path = next(p for p in sorted(shipped.glob("*.json"))
                if json.loads(p.read_text(encoding="utf-8"))["command"] == CARD_DATA["trained"]["command"])
    log = [json.loads(line) for line in path.with_suffix(".metrics.jsonl").read_text(encoding="utf-8").splitlines()]
    assert max(r["step"] for r in log if "step" in r) == CARD_DATA["trained"]["steps"]
    for split, sentences in (("val", 1014), ("test2016", 1000)):
        lines = (shipped / f"{path.stem}.{split}.txt").read_text(encoding="utf-8").splitlines()
        assert len(lines) == sentences and all(line.strip() for line in lines)
