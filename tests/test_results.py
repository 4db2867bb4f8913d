"""The reference runs in results/: every file has the fields chapter 13 reads, and the numbers agree with each other."""
import json
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
FILES = sorted((ROOT / "results").rglob("*.json"))
FIELDS = {"preset", "command", "device", "torch_version", "train_minutes", "steps", "parameters", "decoding", "bleu",
          "signature", "date"}


def _load(name: str) -> dict:
    return json.loads((ROOT / "results" / name).read_text(encoding="utf-8"))


@pytest.mark.parametrize("path", FILES, ids=[p.name for p in FILES])
def test_every_results_file_has_the_fields_of_a_run(path):
    record = json.loads(path.read_text(encoding="utf-8"))
    assert FIELDS <= set(record), FIELDS - set(record)
    for split in ("val", "test2016"):
        assert 0 <= record["bleu"][split]["cased"] <= 100 and 0 <= record["bleu"][split]["lowercase"] <= 100
    assert record["command"] and record["steps"] > 0 and record["train_minutes"] > 0
    assert record["signature"].startswith("nrefs:1|case:mixed|eff:no|tok:13a")


def test_the_cpu_run_has_its_learning_curve_and_the_30_minute_run_and_the_peer_are_there():
    cpu, short, peer = _load("cpu.json"), _load("cpu_30min.json"), _load("peer_nn_transformer.json")
    curve = cpu["learning_curve"]
    minutes = [p["minutes"] for p in curve]
    assert minutes == sorted(minutes) and len(curve) >= 6 and [p["final"] for p in curve] == [False] * (
        len(curve) - 1) + [True]
    assert curve[-1]["cased"] == cpu["bleu"]["val"]["cased"]  # the final point is model.pt, scored the same way
    assert cpu["train_minutes"] == pytest.approx(60, abs=1) and short["train_minutes"] == pytest.approx(30, abs=1)
    assert peer["train_minutes"] == pytest.approx(short["train_minutes"], abs=0.5)  # the peer had the same minutes
    assert cpu["preset"] == short["preset"] == "cpu"
    assert cpu["decoding"] == short["decoding"]  # both decoded as chosen on val
    assert peer["decoding"]["beam_size"] == 1 and "bleu_greedy" in cpu and "bleu_greedy" in short
