"""Tests for training (recipe, config, runtime, checkpoints, trainer, loop): the loss, the schedule, batching, configuration, checkpoints, kill and resume."""
import json
import math
import os
import platform
import signal
import subprocess
import sys
import textwrap
import time
from contextlib import nullcontext
from dataclasses import replace
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
from hypothesis import given, settings
from hypothesis import strategies as st

from transformer_lib import load_model
from transformer_lib.model import Transformer, TransformerConfig
from transformer_lib.recipe import batch_loss
from transformer_lib.tokenizer import BPETokenizer
from transformer_lib.checkpoints import CheckpointError, check_model_config, load_checkpoint, save_checkpoint
from transformer_lib.config import PRESETS, TrainConfig, parse_overrides
from transformer_lib.training_run import train
from transformer_lib.recipe import LabelSmoothingLoss, NoamSchedule, average_weights, cooldown_factor, make_batch, noam_rate, pad_ids, token_batches
from transformer_lib.runtime import training_attention
from transformer_lib.trainer import validation_loss

ROOT = Path(__file__).resolve().parents[1]


# ---------------------------------------------------------------- label smoothing


def direct_kl(log_probs: torch.Tensor, labels: torch.Tensor, eps: float, pad: int = 0) -> torch.Tensor:
    """KL(q || p) summed, with the smoothed distribution q written out entry by entry."""
    n, v = log_probs.shape
    total = torch.zeros((), dtype=torch.float64)
    for i in range(n):
        y = int(labels[i])
        if y == pad:
            continue
        for c in range(v):
            q = 0.0 if c == pad else (1 - eps) if c == y else eps / (v - 2)
            if q > 0:
                total += q * (math.log(q) - float(log_probs[i, c]))
    return total


@pytest.mark.parametrize("eps", [0.0, 0.1, 0.45])
@pytest.mark.parametrize("pad", [0, 3])
def test_label_smoothing_equals_direct_computation(eps, pad):
    g = torch.Generator().manual_seed(1)
    log_probs = (3 * torch.randn(9, 7, generator=g)).log_softmax(-1)
    labels = torch.randint(0, 7, (9,), generator=g)
    labels[[1, 4]] = pad
    crit = LabelSmoothingLoss(7, pad_id=pad, smoothing=eps, reduction="sum")
    assert crit(log_probs, labels).item() == pytest.approx(direct_kl(log_probs, labels, eps, pad).item(), abs=1e-5)
    n_real = int((labels != pad).sum())
    mean = LabelSmoothingLoss(7, pad_id=pad, smoothing=eps)(log_probs, labels)
    assert mean.item() == pytest.approx(crit(log_probs, labels).item() / n_real, rel=1e-6)


def test_label_smoothing_works_on_batched_shapes_and_ignores_padding():
    g = torch.Generator().manual_seed(2)
    log_probs = torch.randn(3, 5, 11, generator=g).log_softmax(-1)  # (B, T, V)
    labels = torch.randint(1, 11, (3, 5), generator=g)
    labels[0, 3:] = 0
    labels[2, 1:] = 0
    crit = LabelSmoothingLoss(11, smoothing=0.1, reduction="sum")
    flat = crit(log_probs.reshape(-1, 11), labels.reshape(-1))
    assert torch.allclose(crit(log_probs, labels), flat)
    changed = log_probs.clone()
    changed[labels == 0] = torch.randn(int((labels == 0).sum()), 11, generator=g).log_softmax(-1)
    assert torch.equal(crit(changed, labels), crit(log_probs, labels))
    # gradients never flow into padded positions
    lp = log_probs.clone().requires_grad_()
    crit(lp, labels).backward()
    assert lp.grad[labels == 0].abs().max() == 0
    assert lp.grad[labels != 0].abs().max() > 0


def test_label_smoothing_is_zero_at_the_smoothed_target_and_differs_from_torch_smoothing():
    v, eps = 6, 0.1
    q = torch.full((1, v), eps / (v - 2))
    q[0, 2] = 1 - eps
    q[0, 0] = 1e-30  # <pad> gets (almost) nothing
    crit = LabelSmoothingLoss(v, smoothing=eps, reduction="sum")
    assert crit(q.log(), torch.tensor([2])).item() == pytest.approx(0.0, abs=1e-6)
    # PyTorch's label_smoothing spreads eps over all V classes, <pad> included: a model that rightly gives <pad>
    # no probability is penalised there, and not by our loss
    g = torch.Generator().manual_seed(3)
    logits = torch.randn(4, v, generator=g)
    logits[:, 0] = -20.0
    log_probs = logits.log_softmax(-1)
    labels = torch.tensor([1, 2, 3, 4])
    ours = LabelSmoothingLoss(v, smoothing=eps)(log_probs, labels)
    constant = (1 - eps) * math.log(1 - eps) + eps * math.log(eps / (v - 2))
    torch_ce = F.cross_entropy(log_probs, labels, label_smoothing=eps)
    assert torch_ce.item() - (ours - constant).item() > 0.2


def test_label_smoothing_rejects_bad_arguments():
    with pytest.raises(ValueError, match="smoothing"):
        LabelSmoothingLoss(10, smoothing=1.0)
    with pytest.raises(ValueError, match="reduction"):
        LabelSmoothingLoss(10, reduction="none")


# ---------------------------------------------------------------- schedule


# Eq. 3 worked out by hand for the base model (D = 512, 4000 warm-up steps): the peak, at step == warmup, is
# 512^-0.5 * 4000^-0.5 = 1 / sqrt(2,048,000); the warm-up is linear in the step, so step 1 gets 1/4000 of it and
# step 2000 half of it; after the peak the rate falls as step^-0.5, so 4 x 4000 steps halve it again.
PEAK_512_4000 = 6.987712429686843e-4  # 1 / sqrt(2048000)
PAPER_RATES = [(1, PEAK_512_4000 / 4000), (2000, PEAK_512_4000 / 2), (4000, PEAK_512_4000),
               (16000, PEAK_512_4000 / 2), (100000, PEAK_512_4000 / 5)]


@pytest.mark.parametrize("step, rate", PAPER_RATES)
def test_schedule_gives_the_papers_rates_worked_out_by_hand(step, rate):
    assert noam_rate(step, 512, 4000) == pytest.approx(rate, rel=1e-12)
    assert noam_rate(step, 512, 4000, factor=2.0) == pytest.approx(2 * rate, rel=1e-12)
    # D = 256 and 2000 warm-up steps: the peak is 1 / sqrt(256 * 2000) = 1.3975e-3, at step 2000
    assert noam_rate(2000, 256, 2000) == pytest.approx(1.3975424859373686e-3, rel=1e-12)
    assert noam_rate(8000, 256, 2000) == pytest.approx(1.3975424859373686e-3 / 2, rel=1e-12)


def test_the_schedule_peaks_at_the_end_of_the_warm_up_and_the_optimiser_receives_it():
    d_model, warmup = 64, 50
    rates = [noam_rate(step, d_model, warmup) for step in range(1, 4 * warmup)]
    assert max(range(len(rates)), key=rates.__getitem__) + 1 == warmup
    assert rates[warmup - 1] == pytest.approx((d_model * warmup) ** -0.5, rel=1e-12)
    assert all(a < b for a, b in zip(rates[: warmup - 1], rates[1:warmup]))  # rising during the warm-up
    assert all(a > b for a, b in zip(rates[warmup - 1 :], rates[warmup:]))  # falling after it
    param = torch.nn.Parameter(torch.zeros(1))
    opt = torch.optim.Adam([param], lr=123.0)
    sched = NoamSchedule(opt, d_model, warmup, 0.5)
    seen = []
    for _ in range(4 * warmup - 1):
        seen.append(opt.param_groups[0]["lr"])
        opt.step()
        sched.step()
    assert seen == pytest.approx([0.5 * r for r in rates], rel=1e-12)  # the rate of step k at step k, from 1
    with pytest.raises(ValueError):
        noam_rate(0, d_model, warmup)


def test_cooldown_brings_the_rate_linearly_to_zero():
    assert [cooldown_factor(p, 0.4) for p in (0.0, 0.6, 0.8, 0.9, 1.0, 1.2)] == pytest.approx([1, 1, 0.5, 0.25, 0, 0])
    assert cooldown_factor(0.99, 0.0) == 1.0  # no cooldown: Eq. 3 unchanged
    param = torch.nn.Parameter(torch.zeros(1))
    opt = torch.optim.Adam([param], lr=1.0)
    sched = NoamSchedule(opt, 256, 100, 0.5, cooldown=0.5)
    budget = 400
    # worked out by hand: 0.5 / sqrt(256) = 1/32 times min(step**-0.5, step / 100**1.5), times the cooldown's
    # factor once half the budget is spent before the step: (1 - spent) / 0.5
    expected = {1: 1 / 32 * 1 / 1000, 100: 1 / 32 * 0.1, 201: 1 / 32 / 201 ** 0.5,  # warm-up, peak, no cooldown yet
                301: 1 / 32 / 301 ** 0.5 * 0.5, 400: 1 / 32 / 20 * (1 / 400) / 0.5}  # 3/4 spent, then 399/400
    seen = {}
    for step in range(1, budget + 1):
        seen[step] = opt.param_groups[0]["lr"]
        sched.progress = step / budget
        opt.step()
        sched.step()
    assert {step: seen[step] for step in expected} == pytest.approx(expected, rel=1e-12)
    assert opt.param_groups[0]["lr"] == 0.0
    for bad in (-0.1, 1.5):
        with pytest.raises(ValueError, match="cooldown"):
            NoamSchedule(opt, 256, 100, cooldown=bad)
        with pytest.raises(ValueError, match="cooldown"):
            TrainConfig(cooldown=bad)


# ---------------------------------------------------------------- batching


@settings(max_examples=50, deadline=None)
@given(
    lengths=st.lists(st.tuples(st.integers(1, 60), st.integers(1, 60)), min_size=1, max_size=300),
    max_tokens=st.integers(1, 500),
    seed=st.one_of(st.none(), st.integers(0, 10**6)),
    epoch=st.integers(0, 50),
    pool_size=st.integers(1, 400),
)
def test_batching_covers_every_sentence_exactly_once(lengths, max_tokens, seed, epoch, pool_size):
    src, tgt = [s for s, _ in lengths], [t for _, t in lengths]
    batches = token_batches(src, tgt, max_tokens, seed=seed, epoch=epoch, pool_size=pool_size)
    assert sorted(i for b in batches for i in b) == list(range(len(lengths)))
    for b in batches:
        assert b
        if len(b) > 1:  # a single over-long pair may exceed the budget on its own
            assert len(b) * max(max(src[i] for i in b), max(tgt[i] for i in b)) <= max_tokens
    assert batches == token_batches(src, tgt, max_tokens, seed=seed, epoch=epoch, pool_size=pool_size)


def test_batching_shuffles_by_epoch_and_reduces_padding():
    g = torch.Generator().manual_seed(0)
    src = torch.randint(2, 40, (2000,), generator=g).tolist()
    shifts = torch.randint(-3, 4, (2000,), generator=g).tolist()
    tgt = [max(2, s + d) for s, d in zip(src, shifts, strict=True)]
    a = token_batches(src, tgt, 800, seed=0, epoch=0)
    assert a != token_batches(src, tgt, 800, seed=0, epoch=1)
    assert a != token_batches(src, tgt, 800, seed=1, epoch=0)

    def longest(batches):
        return [max(max(src[i], tgt[i]) for i in b) for b in batches]

    assert sorted(longest(a)) != longest(a) != sorted(longest(a), reverse=True)  # batches come in random order
    assert longest(token_batches(src, tgt, 800)) == sorted(longest(a))  # seed=None: by length, no shuffling
    from transformer_lib.recipe import padding_fraction

    random_batches = [list(range(i, min(i + 30, 2000))) for i in range(0, 2000, 30)]
    assert padding_fraction(a, src, tgt) < 0.1 < padding_fraction(random_batches, src, tgt)


def test_make_batch_shifts_targets():
    b = make_batch([[5, 6, 7], [8]], [[9, 10], [11, 12, 13]])
    assert b.src.tolist() == [[5, 6, 7, 2], [8, 2, 0, 0]]
    assert b.tgt_in.tolist() == [[1, 9, 10, 0], [1, 11, 12, 13]]
    assert b.tgt_out.tolist() == [[9, 10, 2, 0], [11, 12, 13, 2]]
    assert (b.n_src_tokens, b.n_tgt_tokens) == (6, 7)


# ---------------------------------------------------------------- configuration


def _parameters(config: TrainConfig, vocab_size: int = 8000) -> int:
    with torch.device("meta"):  # weights without storage: counting them costs nothing
        return sum(p.numel() for p in Transformer(config.model_config(vocab_size)).parameters())


def test_presets_make_valid_models_of_growing_size_and_gpu_is_the_papers_base_model():
    tiny, cpu, gpu = (TrainConfig.from_preset(name) for name in ("tiny", "cpu", "gpu"))
    assert _parameters(tiny) < _parameters(cpu) < _parameters(gpu)  # TransformerConfig checks more than TrainConfig
    # the base model of the paper's Table 3: D = 512, 8 heads, 6 + 6 layers, F = 2048, dropout 0.1
    assert (gpu.d_model, gpu.n_heads, gpu.n_encoder_layers, gpu.n_decoder_layers, gpu.d_ff, gpu.dropout) == (
        512, 8, 6, 6, 2048, 0.1)
    # Table 3's count for a 37,000-token shared vocabulary (65M), with our tied embeddings and final norms
    assert _parameters(gpu, 37000) == pytest.approx(65e6, rel=0.05)
    assert tiny.amp == "off"  # the book's stored outputs are float32 on every CPU
    assert TrainConfig.from_preset("tiny", d_model=128) == replace(tiny, d_model=128)  # an override wins
    assert TrainConfig.from_preset("cpu", preset="gpu").preset == "cpu"  # the run remembers its preset
    with pytest.raises(ValueError, match="unknown preset 'huge'"):
        TrainConfig.from_preset("huge")
    with pytest.raises(ValueError, match="d_modle"):
        TrainConfig.from_preset("cpu", d_modle=3)


def test_overrides_from_the_command_line():
    values = parse_overrides(["d_model=128", "dropout=0.2", "norm_first=true", "max_steps=none", "betas=0.9,0.99",
                              "amp=off", "max-minutes=5"])
    assert values == {"d_model": 128, "dropout": 0.2, "norm_first": True, "max_steps": None, "betas": (0.9, 0.99),
                      "amp": "off", "max_minutes": 5.0}
    config = TrainConfig.from_preset("tiny", **values)
    assert config == replace(TrainConfig.from_preset("tiny"), d_model=128, dropout=0.2, norm_first=True, max_steps=None,
                             betas=(0.9, 0.99), amp="off", max_minutes=5.0)
    assert TrainConfig.from_dict(json.loads(json.dumps(config.to_dict()))) == config
    for bad, match in [("warmup=soon", "warmup"), ("colour=blue", "colour"), ("d_model", "key=value"),
                       ("norm_first=maybe", "norm_first"), ("corpus_sha256=", "train fills it in"),
                       ("corpus_sha256=none", "train fills it in")]:
        with pytest.raises(ValueError, match=match):
            parse_overrides([bad])
    with pytest.raises(ValueError, match="n_heads"):
        TrainConfig(d_model=100, n_heads=3)
    apart = TrainConfig.from_preset("tiny", **parse_overrides(["attention_dropout=0", "ffn_dropout=none"]))
    model_config = apart.model_config(100)
    assert (model_config.dropout, model_config.attention_dropout, model_config.ffn_dropout) == (0.1, 0.0, 0.1)
    with pytest.raises(ValueError, match="attention_dropout"):
        TrainConfig(attention_dropout=1.5)


def test_the_field_groups_make_the_fields_in_their_order_and_a_stored_configuration_loads():
    from dataclasses import fields

    from transformer_lib import config as module

    groups = [module.ModelSettings, module._LateDropout, module._Data, module._Optimisation, module._Length,
              module._Machinery, module._Cadence]
    names = [f.name for f in fields(TrainConfig)]
    assert names == [f.name for group in groups for f in fields(group)]
    assert len(names) == len(set(names))  # no field in two groups
    # the order checkpoints, records and --set's list show: the model, then late dropout, ..., the cadence
    assert names[names.index("attention_init") + 1:][:3] == ["inner_dropout_from", "vocab_size", "direction"]
    assert names[-1] == "snapshot_minutes" and names.index("lr_factor") < names.index("epochs") < names.index("seed")
    for name in PRESETS:
        config = TrainConfig.from_preset(name)
        stored = json.loads(json.dumps(config.to_dict()))  # as a checkpoint or a record keeps it
        assert list(stored) == names and TrainConfig.from_dict(stored) == config


_CORPUS = {"train_src": "train.de", "train_tgt": "train.en", "val_src": "val.de", "val_tgt": "val.en"}


@pytest.mark.parametrize("values, match", [
    ({"max_tokens": 2000.5}, r"max_tokens=2000\.5 must be an integer"),
    ({"epochs": 2.7}, r"epochs=2\.7 must be an integer"),
    ({"epochs": 2.0}, r"epochs=2\.0 must be an integer"),
    ({"epochs": None}, r"epochs=None must be an integer; 1000, its default, is no limit in data"),
    ({"warmup": True}, r"warmup=True must be an integer"),
    ({"d_model": 256.0}, r"d_model=256\.0 must be an integer"),
    ({"max_steps": "10"}, r"max_steps='10' must be an integer"),
    ({"betas": 0.9}, r"betas=0\.9 must be two numbers"),
    ({"betas": (0.9,)}, r"betas=\(0\.9,\) must be two numbers"),
    ({"betas": "0.9,0.98"}, r"betas='0\.9,0\.98' must be two numbers"),
    ({"betas": (0.9, "0.98")}, r"betas=.* must be two numbers"),
    ({"max_minutes": "30"}, r"max_minutes='30' must be a number"),
    ({"dropout": True}, r"dropout=True must be a number"),
    ({"compile": "yes"}, r"compile='yes' must be True or False"),
    ({"norm_first": 1}, r"norm_first=1 must be True or False"),
    ({"preset": 3}, r"preset=3 must be a string"),
    ({"device": 5}, r"device=5 must be a string"),
    ({"amp": 16}, r"amp=16 must be a string"),
    ({"device": "tpu"}, r"device='tpu' must be auto, cpu, cuda, cuda:N or mps"),
    ({"device": "cuda:x"}, r"device='cuda:x' must be auto"),
    ({"device": "xla"}, r"device='xla' must be auto"),  # PyTorch knows it; the library does not run there
    ({"train_src": 5}, r"train_src=5 must be a file's path"),
    ({**_CORPUS, "corpus_sha256": 5}, r"corpus_sha256=5 must be a dict of strings"),
    ({**_CORPUS, "corpus_sha256": {"train_src": 5}}, r"corpus_sha256=.* must be a dict of strings"),
])
def test_a_value_not_of_its_fields_type_is_refused_naming_the_field(values, match):
    with pytest.raises(ValueError, match=match):
        TrainConfig(**values)


def test_the_type_check_takes_numbers_of_any_type_and_keeps_plain_ones():
    import numpy as np

    config = TrainConfig(epochs=np.int64(3), max_minutes=5, betas=[0.9, np.float32(0.98)], max_steps=None,
                         clip_grad_norm=np.float32(0.5))
    assert config.epochs == 3 and type(config.epochs) is int  # numpy's integer made an int (JSON takes it)
    assert config.betas == (0.9, pytest.approx(0.98)) and all(type(b) is float for b in config.betas)
    assert config.max_minutes == 5 and config.max_steps is None
    assert config.clip_grad_norm == 0.5 and type(config.clip_grad_norm) is float
    json.dumps(config.to_dict())
    # the command line refuses the same values, by its field's type, with the same hint for epochs
    with pytest.raises(ValueError, match="epochs='2.7': expected int"):
        parse_overrides(["epochs=2.7"])
    with pytest.raises(ValueError, match="epochs='none': expected int; 1000, its default, is no limit in data"):
        parse_overrides(["epochs=none"])


@pytest.mark.parametrize("seed", [-1, 2**32, 2**64, 2**70])
def test_a_seed_outside_the_range_every_use_takes_is_refused_when_the_config_is_made(seed):
    with pytest.raises(ValueError, match=rf"seed={seed} must be in \[0, 2\*\*32\)"):
        TrainConfig(seed=seed)
    with pytest.raises(ValueError, match=rf"seed={seed} must be"):  # from the command line too
        TrainConfig(**parse_overrides([f"seed={seed}"]))


def test_the_largest_seed_accepted_seeds_torch_and_the_batcher():
    seed = TrainConfig(seed=2**32 - 1).seed
    torch.manual_seed(seed)  # what the trainer calls first
    token_batches([3, 4, 5], [4, 5, 6], 20, seed=seed, epoch=10**6)  # seed * 1_000_003 + epoch
    with pytest.raises((RuntimeError, ValueError)):  # what the check keeps from reaching a run
        torch.manual_seed(2**70)
    torch.manual_seed(0)


@pytest.mark.parametrize("device", ["auto", "cpu", "cuda", "cuda:1", "mps", "mps:0"])
def test_every_device_the_library_runs_on_is_accepted_whatever_this_machine_has(device):
    assert TrainConfig(device=device).device == device  # whether the machine has it, the run checks


def test_the_conversions_are_a_base_without_fields_and_the_old_name_stays_an_attribute():
    from dataclasses import is_dataclass

    from transformer_lib import config as module

    assert TrainConfig.__mro__[1] is module._Conversions and not is_dataclass(module._Conversions)
    config = TrainConfig.from_preset("tiny")
    with pytest.warns(FutureWarning, match="TrainConfig.max_len is now TrainConfig.max_sentence_len"):
        config.max_len = 50
    with pytest.warns(FutureWarning, match="TrainConfig.max_len is now"):
        assert config.max_len == 50 == config.max_sentence_len
    assert "max_len" not in config.to_dict() and TrainConfig.from_dict(config.to_dict()) == config


def test_training_attention_kernel_gives_the_same_loss_and_gradients():
    torch.manual_seed(0)
    model = Transformer(TransformerConfig(vocab_size=40, d_model=32, n_heads=4, n_encoder_layers=1,
                                          n_decoder_layers=1, d_ff=64, dropout=0.0))
    batch = make_batch([[5, 6, 7, 8], [9, 10]], [[11, 12], [13, 14, 15, 16, 17]])
    criterion = LabelSmoothingLoss(40, 0, 0.1, reduction="sum")
    results = []
    for trainer_kernels, context in enumerate((nullcontext(), training_attention(torch.device("cpu")))):
        model.zero_grad()
        with context:
            flash = torch.backends.cuda.flash_sdp_enabled()  # the switch covers the CPU's flash kernel too
            loss, _ = batch_loss(model, batch, criterion)
        assert flash is not bool(trainer_kernels)  # training on the CPU leaves only the math kernel
        loss.backward()
        results.append((loss.detach(), [p.grad.clone() for p in model.parameters()]))
    (loss_a, grads_a), (loss_b, grads_b) = results
    torch.testing.assert_close(loss_a, loss_b, rtol=1e-5, atol=1e-5)
    for a, b in zip(grads_a, grads_b, strict=True):
        torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-5)


# ---------------------------------------------------------------- checkpoints


def test_checkpoint_round_trip_and_errors(tmp_path):
    path = save_checkpoint({"format": "transformer_lib.training/1", "w": torch.arange(5.0), "cfg": {"a": 1}},
                           tmp_path / "c.pt")
    assert torch.equal(load_checkpoint(path)["w"], torch.arange(5.0))
    assert [p.name for p in tmp_path.iterdir()] == ["c.pt"]  # no temporary files left behind
    data = path.read_bytes()
    (tmp_path / "truncated.pt").write_bytes(data[: len(data) // 2])
    with pytest.raises(CheckpointError, match="truncated.pt is truncated or corrupt"):
        load_checkpoint(tmp_path / "truncated.pt")
    (tmp_path / "garbage.pt").write_bytes(b"not a checkpoint at all")
    with pytest.raises(CheckpointError, match="garbage.pt"):
        load_checkpoint(tmp_path / "garbage.pt")
    with pytest.raises(CheckpointError, match="no checkpoint"):
        load_checkpoint(tmp_path / "missing.pt")
    torch.save({"something": 1}, tmp_path / "foreign.pt")
    with pytest.raises(CheckpointError, match="not a checkpoint of transformer_lib"):
        load_checkpoint(tmp_path / "foreign.pt")


def test_a_file_neither_zip_nor_pickle_is_not_a_checkpoint_and_not_called_corrupt(tmp_path):
    (tmp_path / "notes.pt").write_text("not a checkpoint", encoding="utf-8")
    with pytest.raises(CheckpointError) as caught:
        load_checkpoint(tmp_path / "notes.pt")
    assert "notes.pt is not a checkpoint" in str(caught.value) and "corrupt" not in str(caught.value)
    state = {"format": "transformer_lib.training/1", "w": torch.arange(3.0)}
    path = save_checkpoint(state, tmp_path / "c.pt")
    data = path.read_bytes()
    assert data[:4] == b"PK\x03\x04"  # torch.save's zip archive
    for cut in (data[:2], data[: len(data) // 2], b""):  # a damaged zip archive, an empty file
        (tmp_path / "cut.pt").write_bytes(cut)
        with pytest.raises(CheckpointError, match="cut.pt is truncated or corrupt"):
            load_checkpoint(tmp_path / "cut.pt")
    torch.save(state, tmp_path / "old.pt", _use_new_zipfile_serialization=False)  # a pickle
    assert (tmp_path / "old.pt").read_bytes()[:1] == b"\x80"
    assert torch.equal(load_checkpoint(tmp_path / "old.pt")["w"], torch.arange(3.0))


def test_config_mismatch_names_the_fields():
    saved = {"d_model": 64, "n_heads": 2, "vocab_size": 500}
    check_model_config(saved, dict(saved), "run/last.pt")
    with pytest.raises(CheckpointError, match=r"d_model: checkpoint has 64, requested 128.*n_heads") as info:
        check_model_config(saved, {**saved, "d_model": 128, "n_heads": 4}, "run/last.pt")
    assert "vocab_size" not in str(info.value)


def test_average_weights():
    a = {"w": torch.tensor([1.0, 2.0]), "n": torch.tensor(3)}
    b = {"w": torch.tensor([3.0, 6.0]), "n": torch.tensor(3)}
    avg = average_weights([a, b])
    assert torch.equal(avg["w"], torch.tensor([2.0, 4.0])) and avg["w"].dtype == torch.float32
    assert torch.equal(average_weights([a])["w"], a["w"])


def test_validation_loss_is_the_token_average_of_the_smoothed_loss_worked_out_sentence_by_sentence():
    torch.manual_seed(0)
    v, eps = 30, 0.1
    model = Transformer(TransformerConfig(vocab_size=v, d_model=16, n_heads=2, n_encoder_layers=1, n_decoder_layers=1,
                                          d_ff=32, dropout=0.3))  # in training mode: the loss must switch dropout off
    g = torch.Generator().manual_seed(1)
    src = [torch.randint(4, v, (n,), generator=g).tolist() for n in (3, 7, 1, 5, 4)]
    tgt = [torch.randint(4, v, (n,), generator=g).tolist() for n in (4, 2, 6, 5, 1)]
    q_other = eps / (v - 2)  # the smoothed target: 1 - eps on the label, eps / (V - 2) on the others but <pad>
    entropy = (1 - eps) * math.log(1 - eps) + (v - 2) * q_other * math.log(q_other)
    loss_sum = nll_sum = tokens = 0.0
    model.eval()
    with torch.no_grad():
        for s, t in zip(src, tgt, strict=True):  # one sentence at a time: no padding, no batching
            log_p = model(torch.tensor([s + [2]]), torch.tensor([[1] + t]))[0].double()  # (T, V); <bos> 1, <eos> 2
            for position, label in enumerate(t + [2]):
                cross = -(1 - eps) * log_p[position, label] - q_other * (log_p[position, 1:].sum() - log_p[position,
                                                                                                            label])
                loss_sum += float(cross) + entropy  # KL(q || p) = cross-entropy - entropy of q
                nll_sum -= float(log_p[position, label])
                tokens += 1
    model.train()
    result = validation_loss(model, src, tgt, max_tokens=12, smoothing=eps)  # several batches, with padding
    assert model.training  # left as it was
    assert result["tokens"] == tokens == sum(len(t) + 1 for t in tgt)
    assert result["loss"] == pytest.approx(loss_sum / tokens, rel=1e-5)
    assert result["nll"] == pytest.approx(nll_sum / tokens, rel=1e-5)
    assert result["ppl"] == pytest.approx(math.exp(nll_sum / tokens), rel=1e-5)


class _Payload:
    """A pickled object that runs code when unpickled: here it creates the file `marker`."""

    def __init__(self, marker: Path) -> None:
        self.marker = marker

    def __reduce__(self):
        return (Path.touch, (self.marker,))


def test_a_checkpoint_holding_a_pickled_object_is_refused_without_running_it(tmp_path):
    marker = tmp_path / "code-ran"
    torch.save({"format": "transformer_lib.training/1", "model": {}, "model_config": _Payload(marker)},
               tmp_path / "evil.pt")
    torch.load(tmp_path / "evil.pt", weights_only=False)  # the payload is live: an unrestricted load runs it
    assert marker.exists()
    marker.unlink()
    for load in (load_checkpoint, load_model):
        with pytest.raises(CheckpointError, match=r"evil\.pt .*Weights only load failed"):
            load(tmp_path / "evil.pt")
        assert not marker.exists()


# ---------------------------------------------------------------- kill and resume

SCRIPT = textwrap.dedent(
    """
    import sys
    import torch
    torch.set_num_threads(1)
    from transformer_lib.tokenizer import BPETokenizer
    from transformer_lib.config import TrainConfig
    from transformer_lib.training_run import train
    config = TrainConfig.from_preset(
        "tiny", d_model=32, n_heads=2, n_encoder_layers=1, n_decoder_layers=1, d_ff=64, dropout=0.1,
        train_subset=300, max_tokens=400, warmup=20, cooldown=0.5, epochs=5, log_every=3, average_last=2, seed=7,
        checkpoint_every=2)  # last.pt every 2 steps: the kill lands in the middle of an epoch
    train(config, sys.argv[1], resume=sys.argv[2] == "resume", progress=False,
          tokenizer=BPETokenizer.load(sys.argv[3]))
    """
)


def _run(out: Path, mode: str, tokenizer_path: Path) -> subprocess.Popen:
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    return subprocess.Popen([sys.executable, "-c", SCRIPT, str(out), mode, str(tokenizer_path)], env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE)


def _losses(out: Path) -> list[tuple]:
    records = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    return [(r["kind"], r["step"], r.get("loss"), r.get("nll"), r.get("lr"), r.get("val_loss"))
            for r in records if r["kind"] != "setup"]


def test_killed_run_resumes_to_identical_weights_and_losses(tmp_path, small_tokenizer):
    full, killed = tmp_path / "full", tmp_path / "killed"
    reference = _run(full, "new", small_tokenizer)  # runs alongside the killed one
    victim = _run(killed, "new", small_tokenizer)
    deadline = time.time() + 120
    while not (killed / "last.pt").exists():
        assert victim.poll() is None, victim.communicate()[1].decode()[-2000:]
        assert time.time() < deadline
        time.sleep(0.005)
    victim.send_signal(signal.SIGKILL)
    assert victim.wait() == -signal.SIGKILL
    first = load_checkpoint(killed / "last.pt")
    assert first["epoch"] < 5, "the run finished before it could be killed"
    assert first["position"] > 0, "killed at an epoch's end, not in the middle of one"
    resumed = _run(killed, "resume", small_tokenizer)
    for proc in (reference, resumed):
        _, err = proc.communicate(timeout=120)
        assert proc.returncode == 0, err.decode()[-3000:]

    a, b = load_checkpoint(full / "last.pt"), load_checkpoint(killed / "last.pt")
    assert a["step"] == b["step"] > first["step"]
    for name, tensor in a["model"].items():
        assert torch.equal(tensor, b["model"][name]), name
    for name, tensor in load_checkpoint(full / "model.pt")["model"].items():
        assert torch.equal(tensor, load_checkpoint(killed / "model.pt")["model"][name]), name
    assert _losses(full) == _losses(killed)
    assert len([r for r in _losses(full) if r[0] == "train"]) >= 10
    assert len(list(killed.glob("average*.pt"))) == 2  # only the snapshots that average_last needs are kept
    rates = [r[4] for r in _losses(full) if r[0] == "train"]
    assert rates[-1] < 0.2 * max(rates)  # the cooldown (over epochs here) has brought the rate down

    # a resume with a different model names the field; a fresh run refuses to overwrite
    with pytest.raises(CheckpointError, match="d_model: checkpoint has 32, requested 48"):
        train(TrainConfig.from_preset("tiny", d_model=48, n_heads=2), full, resume=True, progress=False)
    with pytest.raises(CheckpointError, match="already exists"):
        train(TrainConfig.from_preset("tiny"), full, progress=False)


def test_a_run_from_before_the_dropout_fields_resumes(tmp_path, small_tokenizer):
    tokenizer = BPETokenizer.load(small_tokenizer)
    config = TrainConfig.from_preset("tiny", d_model=32, n_heads=2, n_encoder_layers=1, n_decoder_layers=1, d_ff=64,
                                     train_subset=200, max_tokens=400, max_steps=2, epochs=1)
    train(config, tmp_path, progress=False, tokenizer=tokenizer)
    state = load_checkpoint(tmp_path / "last.pt")
    for fields in (state["model_config"], state["train_config"]):  # as the previous release wrote them
        del fields["attention_dropout"], fields["ffn_dropout"]
    save_checkpoint(state, tmp_path / "last.pt")
    resumed = train(replace(config, max_steps=3, epochs=2), tmp_path, resume=True, progress=False, tokenizer=tokenizer)
    assert resumed.history[-1]["step"] == 3
    with pytest.raises(CheckpointError, match="attention_dropout: checkpoint has 0.1, requested 0.0"):
        train(replace(config, max_steps=4, epochs=2, attention_dropout=0.0), tmp_path, resume=True, progress=False,
              tokenizer=tokenizer)


def test_late_inner_dropout_switches_on_at_its_fraction_of_the_budget(tmp_path, small_tokenizer, monkeypatch):
    from transformer_lib.attention import MultiHeadAttention
    from transformer_lib.layers import PositionwiseFeedForward, SublayerConnection
    from transformer_lib.training_step import OptimiserStep

    seen = []  # the (attention, FFN, residual) rates of each step
    original = OptimiserStep.__call__

    def recording(self, micro_batches, n_tgt):
        rates = {(type(m).__name__, m.dropout if isinstance(m, MultiHeadAttention) else m.dropout.p)
                 for m in self.model.modules()
                 if isinstance(m, (MultiHeadAttention, PositionwiseFeedForward, SublayerConnection))}
        seen.append(sorted(rates))
        return original(self, micro_batches, n_tgt)

    monkeypatch.setattr(OptimiserStep, "__call__", recording)
    tokenizer = BPETokenizer.load(small_tokenizer)
    config = TrainConfig.from_preset("tiny", d_model=32, n_heads=2, n_encoder_layers=1, n_decoder_layers=1, d_ff=64,
                                     dropout=0.1, train_subset=200, max_tokens=400, max_steps=6, epochs=1000,
                                     inner_dropout_from=0.5)
    train(config, tmp_path / "run", progress=False, tokenizer=tokenizer)
    off = [("MultiHeadAttention", 0.0), ("PositionwiseFeedForward", 0.0), ("SublayerConnection", 0.1)]
    on = [("MultiHeadAttention", 0.1), ("PositionwiseFeedForward", 0.1), ("SublayerConnection", 0.1)]
    assert seen == [off] * 3 + [on] * 3  # progress before step k is (k - 1) / 6
    seen.clear()  # a resumed run sets the rates before its first step, from its budget: 6 of 14 steps is under half
    train(replace(config, max_steps=14), tmp_path / "run", resume=True, progress=False, tokenizer=tokenizer)
    assert seen == [off] + [on] * 7
    with pytest.raises(ValueError, match="inner_dropout_from"):
        TrainConfig(inner_dropout_from=1.0)


# ---------------------------------------------------------------- the allocator


GLIBC_ONLY = pytest.mark.skipif(not sys.platform.startswith("linux") or platform.libc_ver()[0] != "glibc",
                                reason="mallopt is glibc's")
# Page faults counted in 4 KiB pages: PR_SET_THP_DISABLE (41) turns transparent huge pages off for the process, so
# the counts do not depend on the kernel's setting (with 2 MiB pages a fresh block faults 512 times less often).
NO_HUGE_PAGES = "import ctypes; assert ctypes.CDLL(None).prctl(41, 1, 0, 0, 0) == 0\n"
# A 64 MiB block, allocated, written and freed: glibc hands a block that large back to the system at once by
# default (its mmap threshold stops at 32 MiB), so every round faults all of its pages in again.
FAULTS_PER_BLOCK = textwrap.dedent("""
    import resource, statistics, torch
    def faults_per_block(rounds=5):
        # The median round: a thread that train() left winding down may allocate between two rounds and make one
        # of them fault its block in again; with glibc's defaults every round faults, with the setting most reuse.
        torch.empty(16 << 20).fill_(1.0)  # the first use of a region faults its pages in whatever the setting
        faults = []
        for _ in range(rounds):
            start = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
            torch.empty(16 << 20).fill_(1.0)  # 64 MiB, freed at once
            faults.append(resource.getrusage(resource.RUSAGE_SELF).ru_minflt - start)
        return statistics.median(faults)
""")


def _python(script: str) -> str:
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, cwd=ROOT,
                          env={**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(ROOT)}, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    return done.stdout


@GLIBC_ONLY
def test_keep_freed_memory_lets_each_training_step_reuse_the_last_ones_memory():
    script = NO_HUGE_PAGES + textwrap.dedent("""
        import resource, torch
        from transformer_lib.model import Transformer
        from transformer_lib.config import TrainConfig
        from transformer_lib.recipe import LabelSmoothingLoss, batch_loss, make_batch
        from transformer_lib.runtime import keep_freed_memory

        def faults_per_step(steps=3):
            batch_loss(model, batch, criterion)[0].backward()
            start = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
            for _ in range(steps):
                model.zero_grad(set_to_none=True)
                batch_loss(model, batch, criterion)[0].backward()
            return (resource.getrusage(resource.RUSAGE_SELF).ru_minflt - start) / steps

        torch.manual_seed(0)  # a small model with a real vocabulary: the (B, T, V) tensors are the large blocks
        model = Transformer(TrainConfig.from_preset("tiny").model_config(vocab_size=8000))
        criterion = LabelSmoothingLoss(8000, model.config.pad_id, 0.1)
        sentences = [torch.randint(4, 8000, (n,)).tolist() for n in torch.randint(10, 20, (100,)).tolist()]
        batch = make_batch(sentences, sentences)
        before = faults_per_step()
        kept = keep_freed_memory()
        print(kept, before, faults_per_step())
    """)
    kept, before, after = _python(script).split()
    assert kept == "True"
    assert float(after) < float(before) / 4, (before, after)


@GLIBC_ONLY
def test_train_and_the_command_line_keep_freed_memory(tmp_path, small_tokenizer):
    """The effect, not the call: after train(), and after the command line, a freed 64 MiB block is kept for reuse.
    Each runs in a fresh process, which starts with glibc's defaults (128 KiB thresholds)."""
    train_run = textwrap.dedent(f"""
        from transformer_lib import TrainConfig, train
        from transformer_lib.tokenizer import BPETokenizer
        config = TrainConfig.from_preset("tiny", d_model=32, n_heads=2, n_encoder_layers=1, n_decoder_layers=1,
                                         d_ff=64, train_subset=200, max_tokens=400, max_steps=1, epochs=1, device="cpu")
        train(config, {str(tmp_path / "run")!r}, progress=False, tokenizer=BPETokenizer.load({str(small_tokenizer)!r}))
    """)
    command_line = textwrap.dedent("""
        from transformer_lib import cli
        assert cli.main(["translate", "-c", "missing/model.pt", "Hallo"]) == cli.EXIT_USAGE  # fails after the setting
    """)
    for work in (train_run, command_line):
        script = NO_HUGE_PAGES + FAULTS_PER_BLOCK + "before = faults_per_block()\n" + work + textwrap.dedent("""
            print(before, faults_per_block())
        """)
        before, after = map(float, _python(script).split()[-2:])
        assert before >= 16384 * 0.9, before  # glibc's default: the block's 16,384 pages fault in every round
        assert after < before / 100, (before, after)


def test_batch_loss_keeps_fixed_shapes_and_compiles_into_one_graph():
    """The loss masks padded positions instead of picking the real ones out (a nonzero, a host sync on a GPU, and
    a shape that changes with every batch): the same sums, and Dynamo captures it whole."""
    torch.manual_seed(0)
    model = Transformer(TransformerConfig(vocab_size=20, d_model=16, n_heads=2, n_encoder_layers=1, n_decoder_layers=1,
                                          d_ff=32)).eval()
    batch = make_batch([[5, 6, 7], [8]], [[9, 10], [11, 12, 13, 14]])
    criterion = LabelSmoothingLoss(20, 0, 0.1, reduction="sum")
    loss, nll = batch_loss(model, batch, criterion)
    memory, src_mask = model.encode(batch.src)  # the reference: only the real positions reach the generator
    keep = batch.tgt_out != 0
    log_probs = model.generator(model.decode(batch.tgt_in, memory, src_mask)[keep])
    assert torch.allclose(loss, criterion(log_probs, batch.tgt_out[keep]), atol=1e-5)
    assert torch.allclose(nll, -log_probs.gather(-1, batch.tgt_out[keep].unsqueeze(-1)).sum(), atol=1e-5)
    compiled = torch.compile(lambda b: batch_loss(model, b, criterion), backend="eager", fullgraph=True)
    assert torch.allclose(compiled(batch)[0], loss)


@given(st.lists(st.lists(st.integers(1, 99), max_size=6), min_size=1, max_size=5))
def test_pad_ids_equals_padding_row_by_row(seqs):
    padded = pad_ids(seqs, pad_id=0)
    assert padded.shape == (len(seqs), max(map(len, seqs)))
    for row, seq in zip(padded.tolist(), seqs):
        assert row == seq + [0] * (padded.shape[1] - len(seq))
