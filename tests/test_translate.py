"""The Translator (chapter 13): one output per input, empty for empty, truncation with a warning, any text;
BLEU as sacreBLEU computes it; unusable checkpoints give CheckpointError."""
import warnings

import pytest
import torch

from transformer_lib.model import Transformer, TransformerConfig
from transformer_lib.tokenizer import BPETokenizer
from transformer_lib.checkpoints import CHECKPOINT_FORMAT, CheckpointError, save_checkpoint
from transformer_lib.config import TrainConfig
from transformer_lib.translate import (
    Translator,
    bleu,
    clean_text,
    evaluate_bleu,
    map_on_cores,
    paired_bootstrap,
)
from transformer_lib.records import evaluate_checkpoint, learning_curve, overrides_of, preset_of

torch.set_num_threads(1)
SENTENCES = ["Ein Hund läuft über die Straße.", "Zwei Männer spielen Fußball.",
             "A dog runs across the street."]


@pytest.fixture(scope="module")
def translator(small_translator) -> Translator:
    return small_translator(SENTENCES)


def checkpoint(translator: Translator, path, **changes) -> None:
    """Save the translator's model in the checkpoint format of the trainer (CHECKPOINT_FORMAT), with some entries changed."""
    obj = {"format": CHECKPOINT_FORMAT, "kind": "model", "model": translator.model.state_dict(),
           "tokenizer": translator.tokenizer.to_dict(), "model_config": translator.model.config.to_dict(),
           "train_config": TrainConfig.from_preset("cpu").to_dict(), "step": 0, "epoch": 0, "history": []}
    save_checkpoint({**obj, **changes}, path)


def test_one_output_per_input_and_empty_for_empty(translator):
    inputs = ["", SENTENCES[0], "   ", "\t", SENTENCES[1], ""]
    out = translator.translate(inputs, beam_size=2, batch_size=2)
    assert len(out) == len(inputs)
    assert [o == "" for o in out][:1] + [o == "" for o in out][2:4] + [out[5] == ""] == [True] * 4
    assert translator.translate([]) == []
    assert translator.translate(["", " "]) == ["", ""]


def test_batching_does_not_change_translations(translator):
    sentences = SENTENCES + ["Hund", "Ein Mann."]
    together = translator.translate(sentences, beam_size=1, batch_size=64)
    alone = [translator.translate([s], beam_size=1)[0] for s in sentences]
    assert together == alone
    assert translator.translate(sentences[::-1], beam_size=1, batch_size=2) == together[::-1]


def test_batches_decoded_at_once_on_several_cores_give_the_same_translations(translator):
    sentences = SENTENCES + ["Hund", "Ein Mann.", "Zwei Hunde spielen im Schnee.", "", "Ein Mann läuft."]
    threads = torch.get_num_threads()
    for beam_size in (1, 3):
        one = translator.translate(sentences, beam_size=beam_size, batch_size=2, workers=1)
        assert translator.translate(sentences, beam_size=beam_size, batch_size=2, workers=3) == one
    assert torch.get_num_threads() == threads  # set back after the workers
    assert not translator.model.training
    translator.model.train()  # a model in training mode is decoded without dropout and given back as it was
    try:
        assert translator.translate(sentences, beam_size=3, batch_size=2, workers=3) == one
        assert translator.model.training
    finally:
        translator.model.eval()
    with pytest.raises(ValueError, match="workers=0"):
        translator.translate(sentences, workers=0)


def test_map_on_cores_keeps_the_order_gives_each_worker_one_core_and_passes_errors_on():
    import threading
    import time

    threads = torch.get_num_threads()
    torch.set_num_threads(2)
    try:
        seen = []

        def work(i: int) -> tuple[int, int, str]:
            time.sleep(0.01 * (5 - i))  # the first items finish last
            torch.ones(64, 64) @ torch.ones(64, 64)
            return i, torch.get_num_threads(), threading.current_thread().name

        for i, n, name in map_on_cores(work, list(range(6)), workers=2):
            seen.append((i, n, name))
        assert [i for i, _, _ in seen] == list(range(6))
        assert {n for _, n, _ in seen} == {1} and len({name for _, _, name in seen}) == 2
        assert torch.get_num_threads() == 2
        assert [n for _, n, _ in map_on_cores(work, [0], workers=2)] == [2]  # one item: no thread of its own

        def fail(i: int) -> int:
            if i == 2:
                raise RuntimeError("item 2 fails")
            return i

        with pytest.raises(RuntimeError, match="item 2 fails"):
            list(map_on_cores(fail, list(range(4)), workers=2))
        assert torch.get_num_threads() == 2

        started = []

        def slow(i: int) -> int:
            started.append(i)
            time.sleep(0.05)
            return i

        results = map_on_cores(slow, list(range(40)), workers=2)
        assert next(results) == 0
        results.close()  # the caller stops (an interrupt, say): the items not yet started never run
        time.sleep(0.1)
        assert len(started) < 10 and torch.get_num_threads() == 2
    finally:
        torch.set_num_threads(threads)


def test_long_input_is_truncated_with_a_warning(translator):
    long = "Ein Hund läuft. " * 30
    assert len(translator.tokenizer.encode(long)) > translator.max_source_tokens
    with pytest.warns(UserWarning, match=r"2 sentence\(s\) longer than 23 tokens"):
        out = translator.translate([long, "Hund", long], beam_size=1)
    assert len(out) == 3
    ids, cut = translator.encode([long])
    assert cut == 1 and len(ids[0]) == translator.model.config.max_len and ids[0][-1] == 2


def test_short_input_gives_no_warning(translator):
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        translator.translate(SENTENCES, beam_size=1)


def test_any_unicode_is_accepted(translator):
    texts = ["😀 日本", "Ein\x00Hund\x1b[31m\u202e", "kaputt \udcff \ud800", "\u2028\ufeff", "é" * 5]
    out = translator.translate(texts, beam_size=2)
    assert len(out) == len(texts) and all(isinstance(o, str) for o in out)
    assert clean_text("a\udcffb\ud800") == "a\ufffdb\ufffd"
    assert clean_text("日本 😀") == "日本 😀"


def test_translate_rejects_a_single_string_and_bad_sizes(translator):
    with pytest.raises(TypeError, match="list of sentences"):
        translator.translate("Ein Hund.")
    with pytest.raises(ValueError, match="beam_size=0"):
        translator.translate(["Ein Hund."], beam_size=0)


def test_bleu_matches_sacrebleu_by_hand():
    scores = bleu(["The cat sat on the mat."], ["The cat sat on a mat."])
    assert scores["cased"] == round(100 * (6 / 7 * 4 / 6 * 2 / 5 * 1 / 4) ** 0.25, 2) == 48.89
    assert "case:mixed" in scores["signature"] and "case:lc" in scores["signature_lowercase"]
    wrong_case = bleu(["the Cat sat on the mat."], ["The cat sat on a mat."])
    assert wrong_case["lowercase"] == 48.89 > wrong_case["cased"]
    assert bleu(["a b c d"], ["a b c d"])["cased"] == 100.0
    with pytest.raises(ValueError, match="2 hypotheses but 1 references"):
        bleu(["a", "b"], ["a"])


def test_evaluate_scores_the_translations(translator):
    from sacrebleu import corpus_bleu

    translations = translator.translate(SENTENCES, beam_size=1)
    # two references are the translations themselves, so the score is well above 0 and tells orders apart
    references = [translations[0], "A dog.", translations[2]]
    scores = evaluate_bleu(translator, list(zip(SENTENCES, references)), beam_size=1)
    assert scores["hypotheses"] == translations
    cased = corpus_bleu(translations, [references]).score  # sacreBLEU itself, on the hypotheses
    lower = corpus_bleu(translations, [references], lowercase=True).score
    assert scores["cased"] == pytest.approx(cased, abs=0.005) and scores["lowercase"] == pytest.approx(lower, abs=0.005)
    assert 0 < scores["cased"] < 100
    assert corpus_bleu(translations[::-1], [references]).score < scores["cased"]


def test_from_checkpoint_round_trip_and_unusable_checkpoints(translator, tmp_path):
    checkpoint(translator, tmp_path / "model.pt")
    loaded = Translator.from_checkpoint(tmp_path, device="cpu")
    assert loaded.translate(SENTENCES, beam_size=2) == translator.translate(SENTENCES, beam_size=2)
    assert preset_of(loaded.info["train_config"]) == "cpu"  # checkpoint() saves the cpu preset's configuration
    with pytest.raises(CheckpointError, match="no checkpoint at"):
        Translator.from_checkpoint(tmp_path / "missing.pt")
    (tmp_path / "cut.pt").write_bytes((tmp_path / "model.pt").read_bytes()[:2000])
    with pytest.raises(CheckpointError, match="truncated or corrupt"):
        Translator.from_checkpoint(tmp_path / "cut.pt")
    wrong = dict(translator.model.config.to_dict(), d_ff=128)
    checkpoint(translator, tmp_path / "wrong.pt", model_config=wrong)
    with pytest.raises(CheckpointError, match="does not hold a usable model"):
        Translator.from_checkpoint(tmp_path / "wrong.pt")


def test_a_run_is_named_by_its_preset_and_the_fields_it_changed():
    assert [preset_of(TrainConfig.from_preset(n).to_dict()) for n in ("tiny", "cpu", "colab", "gpu")] == [
        "tiny", "cpu", "colab", "gpu"]  # colab has the cpu preset's model, and is still named colab
    changed = TrainConfig.from_preset("cpu", max_minutes=30.0, norm_first=True, attention_dropout=0.0).to_dict()
    assert preset_of(changed) == "cpu+overrides"
    assert overrides_of(changed) == ("cpu", {"max_minutes": 30.0, "norm_first": True, "attention_dropout": 0.0})
    # where and how it ran is not the recipe: another device, thread count or log cadence keeps the name
    assert preset_of(TrainConfig.from_preset("gpu", device="cpu", threads=2, log_every=1).to_dict()) == "gpu"
    # a run saved before runs recorded their preset (and before eval_epochs existed, so it had the default None):
    # the colab preset of then, the cpu preset on a 30-minute clock with timed points, is named after the cpu preset
    older = {**TrainConfig.from_preset("cpu").to_dict(), "max_minutes": 30.0, "eval_minutes": 1.0,
             "checkpoint_minutes": 2.0, "betas": [0.9, 0.98]}  # betas as JSON gives them back
    del older["preset"], older["eval_epochs"]
    assert overrides_of(older) == ("cpu", {"max_minutes": 30.0, "eval_minutes": 1.0})


def test_tokenizer_and_model_must_agree(translator):
    with pytest.raises(ValueError, match="do not belong together"):
        Translator(translator.model, BPETokenizer.train(SENTENCES, 290))


def test_evaluate_checkpoint_gives_the_fields_of_a_results_file(translator, tmp_path):
    history = [{"kind": "setup", "device": "cpu", "parameters": 1}, {"kind": "val", "minutes": 1.25},
               {"kind": "overhead", "step": 7, "epochs": 2.5, "tokens": 1234},
               {"kind": "overhead", "step": 7, "epochs": 3.456, "tokens": 2345}]  # a resume logs a second one
    checkpoint(translator, tmp_path / "model.pt", history=history, step=7)
    with pytest.warns(UserWarning, match="truncated"):  # the model has only 24 positions
        results = evaluate_checkpoint(tmp_path, splits=("val",), beam_size=1, device="cpu", command="make it")
    assert set(results) >= {"preset", "command", "device", "torch_version", "train_minutes", "parameters",
                            "bleu", "signature", "date"}
    assert results["preset"] == results["run"] == "cpu" and results["overrides"] == {}
    assert results["command"] == "make it" and results["steps"] == 7
    assert (results["epochs"], results["tokens"]) == (3.46, 2345)  # the data seen by the end, from the last one
    assert results["train_minutes"] == 1.2 and results["device"].startswith("CPU")
    assert results["parameters"] == sum(p.numel() for p in translator.model.parameters())
    assert set(results["bleu"]) == {"val"} and set(results["bleu"]["val"]) == {"cased", "lowercase"}
    assert results["signature"].startswith("nrefs:1|case:mixed")


def test_learning_curve_scores_each_snapshot_then_the_final_model(translator, tmp_path, monkeypatch):
    from transformer_lib import records

    history = [{"kind": "setup", "device": "cpu"}, {"kind": "val", "minutes": 3.04}]
    checkpoint(translator, tmp_path / "model.pt", history=history, step=9)
    final = translator.model.state_dict()
    torch.manual_seed(1)
    other = {k: torch.randn_like(v) if v.is_floating_point() else v for k, v in final.items()}
    for k, (weights, minutes, step) in enumerate([(other, 1.04, 3), (final, 2.0, 6)], start=1):
        save_checkpoint({"format": CHECKPOINT_FORMAT, "kind": "weights", "model": weights, "epoch": 0, "step": step,
                         "minutes": minutes}, tmp_path / f"snapshot{k:03d}.pt")
    seen = []

    def scored(translator, pairs, *args, **kwargs):  # which weights were scored, on which sentences
        seen.append((float(translator.model.generator.weight.detach().sum()), len(pairs)))
        return {"cased": float(len(seen)), "lowercase": -float(len(seen))}

    monkeypatch.setattr(records, "evaluate_bleu", scored)
    curve = learning_curve(tmp_path, device="cpu")
    assert [(p["minutes"], p["step"], p["final"], p["cased"]) for p in curve] == [
        (1.0, 3, False, 1.0), (2.0, 6, False, 2.0), (3.0, 9, True, 3.0)]
    sums = [float(w["generator.weight"].sum()) for w in (other, final, final)]
    assert [s for s, _ in seen] == pytest.approx(sums) and {n for _, n in seen} == {1014}  # all of val


def test_a_corpus_run_is_not_scored_on_multi30k(translator, tmp_path, monkeypatch):
    """evaluate_checkpoint and learning_curve score Multi30k's splits, which a corpus run's recorded de-en does not
    describe: they refuse it before reading any split."""
    from transformer_lib import records

    files = dict(train_src="train.de", train_tgt="train.en", val_src="val.de", val_tgt="val.en")
    checkpoint(translator, tmp_path / "model.pt", train_config=TrainConfig.from_preset("cpu", **files).to_dict())
    monkeypatch.setattr(records, "load_multi30k", lambda *args, **kwargs: pytest.fail("read Multi30k"))
    with pytest.raises(ValueError, match=r"model\.pt was trained on corpus files, not on Multi30k: score it on files of "
                                         r"its own \(evaluate --src --ref\)"):
        evaluate_checkpoint(tmp_path / "model.pt", splits=("val",), device="cpu")
    with pytest.raises(ValueError, match=r"model\.pt was trained on corpus files, not on Multi30k"):
        learning_curve(tmp_path, device="cpu")


def test_the_translator_decodes_on_the_device_of_the_model(translator):
    # Without a device argument the model is not moved: on the "meta" device (weights without storage) a move to
    # the CPU would fail, so the translator must take the device from the parameters.
    meta_model = Transformer(translator.model.config).to("meta")
    on_meta = Translator(meta_model, translator.tokenizer)
    assert on_meta.device == torch.device("meta")
    assert next(on_meta.model.parameters()).device == torch.device("meta")
    assert Translator(translator.model, translator.tokenizer).device == next(translator.model.parameters()).device


def test_an_explicit_device_moves_the_model(translator):
    model = Transformer(translator.model.config)  # on the CPU
    moved = Translator(model, translator.tokenizer, device=torch.device("meta"))  # a real move, with no GPU needed
    assert moved.device == torch.device("meta")
    assert {p.device for p in moved.model.parameters()} == {torch.device("meta")}


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_a_model_on_the_gpu_is_decoded_there(translator):
    """The oracles: the CUDA kernels the profiler sees while it decodes, and the CPU's translations of the same
    weights (float32, TF32 off: a random model's choices are far from ties next to float32's rounding)."""
    model = Transformer(translator.model.config).to("cuda")
    model.load_state_dict(translator.model.state_dict())
    on_gpu = Translator(model, translator.tokenizer)
    sentences = SENTENCES + ["Hund"]
    tf32 = torch.backends.cuda.matmul.allow_tf32
    torch.backends.cuda.matmul.allow_tf32 = False
    try:
        activities = [torch.profiler.ProfilerActivity.CPU, torch.profiler.ProfilerActivity.CUDA]
        with torch.profiler.profile(activities=activities) as prof:
            got = on_gpu.translate(sentences, beam_size=2)
    finally:
        torch.backends.cuda.matmul.allow_tf32 = tf32
    assert any(e.device_type == torch.autograd.DeviceType.CUDA for e in prof.events())  # kernels ran on the GPU
    assert on_gpu.device.type == "cuda" and next(on_gpu.model.parameters()).is_cuda  # and the model stayed there
    assert got == translator.translate(sentences, beam_size=2)  # the CPU's translations of the same weights


def test_paired_bootstrap_scores_as_sacrebleu_and_tells_a_real_difference_from_none():
    references = [f"a dog number {i} runs across the green meadow ." for i in range(60)]
    good = list(references)  # the references themselves: BLEU 100
    poor = [f"the cat number {i} sits ." for i in range(60)]
    from sacrebleu import corpus_bleu  # the oracle for the scores: sacreBLEU's own corpus BLEU

    result = paired_bootstrap(references, poor, {"good": good, "same": list(poor)}, samples=200)
    assert result["good"]["bleu"] == pytest.approx(corpus_bleu(good, [references]).score)
    assert result["good"]["difference"] == pytest.approx(100.0 - corpus_bleu(poor, [references]).score)
    assert result["good"]["p_value"] < 0.01  # better on every resample
    assert result["same"]["difference"] == 0.0 and result["same"]["p_value"] == 1.0  # no difference at all
    assert result == paired_bootstrap(references, poor, {"good": good, "same": list(poor)}, samples=200)  # seeded
