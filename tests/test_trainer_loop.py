"""The trainer's loop leaves the device alone: no host read of a tensor in a step, no walk over the model's modules,
checkpoints written beside the steps and complete when a run stops, any model from a factory, the weights kept for
averaging in memory equal to those on disk (a data-parallel run's averaging: tests/test_distributed.py)."""
import traceback
from pathlib import Path

import pytest
import torch
from torch import nn
from torch.overrides import TorchFunctionMode

import transformer_lib
from transformer_lib.attention import MultiHeadAttention
from transformer_lib.checkpoints import load_checkpoint
from transformer_lib.config import TrainConfig
from transformer_lib.data import load_multi30k
from transformer_lib.distributed import start_processes
from transformer_lib.layers import PositionwiseFeedForward
from transformer_lib.training_run import train
from transformer_lib.model import Transformer, TransformerConfig
from transformer_lib.recipe import average_weights
from transformer_lib.tokenizer import BPETokenizer
from transformer_lib.trainer import Trainer
from transformer_lib.training_step import TrainingBatches

ROOT = Path(__file__).resolve().parents[1]
LIBRARY = str(Path(transformer_lib.__file__).parent)
SMALL = dict(d_model=32, n_heads=2, n_encoder_layers=1, n_decoder_layers=1, d_ff=64, dropout=0.1, train_subset=200,
             max_tokens=400, warmup=10, epochs=3, log_every=1, average_last=1, seed=5, device="cpu", amp="off")


@pytest.fixture(scope="module")
def tokenizer(small_tokenizer):
    return BPETokenizer.load(small_tokenizer)


class HostReads(TorchFunctionMode):
    """Counts .item(), .tolist() and .cpu() called from the library's own code (on a GPU each one waits for it)."""

    def __init__(self) -> None:
        super().__init__()
        self.calls: list[str] = []

    def __torch_function__(self, func, types, args=(), kwargs=None):
        if getattr(func, "__name__", "") in ("item", "tolist", "cpu"):
            caller = traceback.extract_stack()[-2]  # the frame that called it: a read in torch's own code is not ours
            if caller.filename.startswith(LIBRARY):
                self.calls.append(f"{Path(caller.filename).name}:{caller.lineno}")
        return func(*args, **(kwargs or {}))


def _trainer(config: TrainConfig, tokenizer: BPETokenizer, out: Path, **kwargs) -> Trainer:
    pairs = load_multi30k("train")[:200]
    src = [tokenizer.encode(de) for de, _ in pairs]
    tgt = [tokenizer.encode(en) for _, en in pairs]
    return Trainer(config, out, tokenizer, start_processes("cpu"), (src, tgt, src[:20], tgt[:20]), progress=False,
                   **kwargs)


def test_a_step_reads_nothing_back_and_walks_no_modules_only_a_record_reads(tmp_path, tokenizer, monkeypatch):
    # a record every 6 steps: steps 1 to 5 are the loop's work between records (the step, the agreement, the
    # schedule, the dropout, the sums), step 6 ends with a record
    config = TrainConfig.from_preset("tiny", **{**SMALL, "inner_dropout_from": 0.5, "max_steps": 6, "log_every": 6})
    run = _trainer(config, tokenizer, tmp_path)
    run.begin()
    assert len(run.plan) > 6 * run.per_step  # no epoch ends (and no validation point) in these steps
    walks = []
    original = nn.Module.modules
    monkeypatch.setattr(nn.Module, "modules", lambda self: walks.append(1) or original(self))
    with HostReads() as reads:
        decisions = [run.step() for _ in range(5)]
    assert reads.calls == [] and walks == []
    assert [d["record"] for d in decisions] == [None] * 5
    assert run.inner_dropout.on  # switched on halfway through the budget, without a walk
    with HostReads() as reads:
        decision = run.step()  # a record: the one place the host reads the sums
    assert decision["record"] is not None and decision["record"]["step"] == run.global_step == 6
    assert len(reads.calls) == 1 and reads.calls[0].startswith("records.py") and walks == []


def test_inner_dropout_sites_are_found_once_in_ours_and_in_pytorchs_layers():
    config = TrainConfig.from_preset("tiny", **SMALL).model_config(300)
    ours = Transformer(config)
    from transformer_lib.training_step import inner_dropout_sites

    sites = inner_dropout_sites(ours, config)
    attention = [m for m in ours.modules() if isinstance(m, MultiHeadAttention)]
    ffn = [m for m in ours.modules() if isinstance(m, PositionwiseFeedForward)]
    assert len(sites) == len(attention) + len(ffn) == 3 + 2  # 1 encoder layer: 1 + 1; 1 decoder layer: 2 + 1
    torch_layer = nn.TransformerEncoderLayer(32, 2, 64, dropout=0.1, batch_first=True)
    assert {(type(obj), name) for obj, name, _ in inner_dropout_sites(torch_layer, config)} == {
        (nn.MultiheadAttention, "dropout"), (nn.Dropout, "p")}


def test_the_trainer_builds_the_model_its_factory_gives(tmp_path, tokenizer):
    built = []

    def factory(config):
        built.append(config)
        return Transformer(config)

    result = train(TrainConfig.from_preset("tiny", **SMALL, max_steps=2), tmp_path, progress=False,
                   tokenizer=tokenizer, model_factory=factory)
    assert len(built) == 1 and built[0].d_model == 32 and result.history[-1]["step"] == 2


def test_kept_weights_in_memory_equal_the_files_and_the_average_is_theirs(tmp_path, tokenizer):
    config = TrainConfig.from_preset("tiny", **{**SMALL, "average_last": 3}, eval_every=2, max_steps=8)
    run = _trainer(config, tokenizer, tmp_path)
    run.metrics.history.append({"kind": "setup"})
    run.fit([0])
    on_disk = {int(p.stem[len("average"):]): load_checkpoint(p)["model"] for p in tmp_path.glob("average*.pt")}
    assert [k for k, _ in run.kept] == sorted(on_disk) == [4, 6, 8]
    for k, weights in run.kept:
        assert all(torch.equal(weights[name], on_disk[k][name]) for name in weights)
    expected = average_weights([on_disk[k] for k in (4, 6, 8)])  # the average read back from the files
    run.finish()
    model = load_checkpoint(tmp_path / "model.pt")
    averaged = [r for r in run.metrics.history if r["kind"] == "averaged"][-1]
    chosen = expected if averaged["kept"] else load_checkpoint(tmp_path / "last.pt")["model"]
    assert all(torch.equal(model["model"][name], chosen[name]) for name in chosen)


def test_a_resumed_run_takes_the_kept_weights_back_from_disk(tmp_path, tokenizer):
    config = TrainConfig.from_preset("tiny", **{**SMALL, "average_last": 3}, eval_every=2, max_steps=6)
    train(config, tmp_path, progress=False, tokenizer=tokenizer)
    state = load_checkpoint(tmp_path / "last.pt")
    run = _trainer(TrainConfig.from_preset("tiny", **{**SMALL, "average_last": 3}, eval_every=2, max_steps=8),
                   tokenizer, tmp_path)
    run.restore(state)
    assert [k for k, _ in run.kept] == [2, 4, 6]
    assert all(torch.equal(run.kept[-1][1][name], state["model"][name]) for name in state["model"])


# ---------------------------------------------------------------- batches of few shapes


def test_an_epoch_of_the_gpu_presets_data_in_fixed_shapes(tmp_path):
    """The gpu preset's batching (its max_tokens, the full corpus) with length_bucket=8: every pair once an epoch,
    and as many shapes as there are groups of length, counted here from the lengths alone."""
    from transformer_lib.recipe import encode_pairs
    from transformer_lib.tokenizer import multi30k_tokenizer

    config = TrainConfig.from_preset("gpu", length_bucket=8)
    tokenizer = multi30k_tokenizer(config.vocab_size)
    src, tgt = encode_pairs(load_multi30k("train"), tokenizer, config.max_sentence_len)
    small = dict(d_model=32, n_heads=2, n_encoder_layers=1, n_decoder_layers=1, d_ff=64, device="cpu", amp="off")
    run = Trainer(TrainConfig.from_preset("gpu", length_bucket=8, **small), tmp_path, tokenizer,
                  start_processes("cpu"), (src, tgt, src[:5], tgt[:5]), progress=False)
    groups = {-(-max(len(s) + 1, len(t) + 1) // 8) for s, t in zip(src, tgt)}
    shapes = set()
    for epoch in range(2):
        batches = run.batches.epoch(epoch)
        seen = sorted(i for idx in batches for i in idx if i >= 0)
        assert seen == list(range(len(src)))  # every pair once (the corpus fills whole steps: one process)
        for position in range(len(batches)):
            batch = run.batches.micro_batches(batches, position, run.device)[0]
            shapes.add((tuple(batch.src.shape), tuple(batch.tgt_in.shape)))
    assert len(shapes) == len(groups) <= 13
    today = TrainingBatches(src, tgt, TrainConfig.from_preset("gpu", **small), run.procs)
    free = {(len(b), max(len(src[i]) for i in b), max(len(tgt[i]) for i in b)) for b in today.epoch(0)}
    assert len(free) > 2 * len(groups)  # today's batching: nearly one shape a batch


def test_fixed_shapes_leave_the_loss_per_real_token_unchanged(tmp_path, tokenizer):
    """The same pairs, the same weights, no dropout, float64: the summed loss, log-likelihood and token counts over
    an epoch are those of chapter 11's batches; empty rows and extra padding add nothing."""
    from transformer_lib.attention import rows_have_keys
    from transformer_lib.recipe import LabelSmoothingLoss, batch_loss

    previous = torch.get_default_dtype()
    torch.set_default_dtype(torch.float64)
    try:
        totals = []
        for bucket in (None, 8):
            config = TrainConfig.from_preset("tiny", **{**SMALL, "dropout": 0.0}, length_bucket=bucket)
            run = _trainer(config, tokenizer, tmp_path)
            run.model.eval()
            criterion = LabelSmoothingLoss(tokenizer.vocab_size, tokenizer.pad_id, 0.1, reduction="sum")
            loss = nll = tokens = 0.0
            batches = run.batches.epoch(0)
            with torch.no_grad(), rows_have_keys():
                for position in range(len(batches)):
                    batch = run.batches.micro_batches(batches, position, run.device)[0]
                    a, b = batch_loss(run.model, batch, criterion)
                    loss, nll, tokens = loss + float(a), nll + float(b), tokens + batch.n_tgt_tokens
            totals.append((loss, nll, tokens, len({len(b) for b in batches})))
    finally:
        torch.set_default_dtype(previous)
    (loss0, nll0, tokens0, _), (loss8, nll8, tokens8, rows8) = totals
    assert tokens8 == tokens0 == sum(len(t) + 1 for t in _trainer(config, tokenizer, tmp_path).batches.tgt_ids)
    # the generator's log-softmax runs in float32: sums in another order agree to ~1e-8; one more label would
    # move them by ~1e-4
    assert loss8 == pytest.approx(loss0, rel=1e-6) and nll8 == pytest.approx(nll0, rel=1e-6)
    assert rows8 <= 10  # one row count per group


@pytest.mark.parametrize("seed", [0, 1])
def test_validation_loss_under_bfloat16_autocast_stays_near_float32(tokenizer, seed):
    """The same model and pairs: bfloat16 autocast moves the loss, but only by rounding. Over seeds 0 to 5 of this
    model the relative difference was at most 8e-5; a log-softmax computed in bfloat16 (8 significant bits) would
    move it by about 1e-3."""
    from transformer_lib.training_step import validation_loss

    pairs = load_multi30k("val")[:40]
    src, tgt = [tokenizer.encode(de) for de, _ in pairs], [tokenizer.encode(en) for _, en in pairs]
    torch.manual_seed(seed)
    model = Transformer(TransformerConfig(
        vocab_size=tokenizer.vocab_size, d_model=64, n_heads=4, n_encoder_layers=2, n_decoder_layers=2, d_ff=128))
    full, bf16 = validation_loss(model, src, tgt, amp=None), validation_loss(model, src, tgt, amp=torch.bfloat16)
    assert full["tokens"] == bf16["tokens"] == sum(len(t) + 1 for t in tgt)
    assert 0 < abs(bf16["loss"] - full["loss"]) < 5e-4 * full["loss"]
    assert 0 < abs(bf16["nll"] - full["nll"]) < 5e-4 * full["nll"]


def test_compiled_fixed_shapes_stay_compiled_past_dynamos_limit(tmp_path, tokenizer, monkeypatch):
    """length_bucket gives a static graph per batch shape, and the late dropout's switch may give another each
    (torch 2.13 recompiles for it, 2.11 does not): with more than Dynamo's 8, every step still runs a compiled
    graph, none falls back to eager, and the changed dropout rate reaches the graph (seen by a backend that
    compiles nothing and records each call's loss, on a loss that is cheap to trace)."""
    from torch import _dynamo

    import transformer_lib.training_step as training_step

    _dynamo.reset()
    # Dynamo's default limit, and both limits back after the test (Dynamo's own patch: a monkeypatch of its
    # config module leaves accumulated_recompile_limit undefined for the tests that compile after it)
    with _dynamo.config.patch(recompile_limit=8, accumulated_recompile_limit=256):
        losses = []  # the loss of each call of a compiled graph

        def recording(graph, example_inputs):
            def call(*args):
                out = graph(*args)
                losses.append(float(next(t.detach() for t in torch.utils._pytree.tree_leaves(out)
                                         if isinstance(t, torch.Tensor))))
                return out
            return call

        compile_ = torch.compile
        monkeypatch.setattr(torch, "compile", lambda net, **kwargs: compile_(net, backend=recording, **kwargs))
        sites = []  # the run's inner-dropout sites, read by the loss below as the model's dropout reads them

        def cheap_loss(self, batch):
            weight = next(self.model.parameters())
            loss = weight.sum() * 0 + batch.tgt_in.float().sum() * sites[0][0].dropout + batch.src.size(1)
            return loss, loss.detach()

        monkeypatch.setattr(training_step.LossComputation, "forward", cheap_loss)
        lengths = range(1, 33)  # one pair of each length; with <eos>, 2 to 33 tokens: nine groups, 4 to 36
        data = ([[5] * n for n in lengths], [[6] * n for n in lengths], [[5]], [[6]])
        config = TrainConfig.from_preset("tiny", **{**SMALL, "dropout": 0.1, "max_tokens": 200, "length_bucket": 4,
                                                    "compile": True, "inner_dropout_from": 0.5})
        run = Trainer(config, tmp_path, tokenizer, start_processes("cpu"), data, progress=False)
        sites.extend(run.inner_dropout.sites)
        one_of_each = list({run.batches.shape(idx): idx for idx in run.batches.epoch(0)}.values())
        assert len(one_of_each) == 9
        for progress in (0.0, 1.0):  # inner dropout off, then on: the rates each graph holds change
            run.set_inner_dropout(progress)
            for position in range(len(one_of_each)):  # the optimiser step on each shape's batch
                n_tgt, _ = run.batches.tokens(one_of_each[position : position + 1])
                run.update(run.batches.micro_batches(one_of_each, position, run.device), n_tgt)
        assert len(losses) == 2 * 9  # every step ran a compiled graph
        off, on = losses[:9], losses[9:]
        # the same batches, the inner-dropout rate changed: each graph's loss moved with it
        assert all(b > a for a, b in zip(off, on)), (off, on)


def test_fit_is_step_in_a_loop(tmp_path, tokenizer):
    """Trainer.step is the whole step: a run driven by hand, step() until the processes agree to stop, then the end
    fit gives it (a last validation, last.pt), leaves the same weights, records and files as fit itself. Anything fit
    did between steps that step() does not would show here."""
    # two epochs of records, validation points by data and by steps, checkpoints by steps, late dropout, a cooldown
    config = TrainConfig.from_preset("tiny", **{**SMALL, "epochs": 2, "eval_epochs": 0.5, "checkpoint_every": 3,
                                                "inner_dropout_from": 0.5, "cooldown": 0.3, "average_last": 2})
    for name in ("fit", "hand"):
        (tmp_path / name).mkdir()
    fitted = _trainer(config, tokenizer, tmp_path / "fit")
    fitted.fit([0])
    by_hand = _trainer(config, tokenizer, tmp_path / "hand")
    decision = by_hand.begin()
    while by_hand.epoch < config.epochs and not decision["stop"]:
        decision = by_hand.step()
    by_hand.validate_end()
    by_hand.checkpoint()
    by_hand.flush()
    assert by_hand.global_step == fitted.global_step > 2 * 3  # more than two checkpoints' worth of steps
    for a, b in zip(fitted.model.state_dict().values(), by_hand.model.state_dict().values(), strict=True):
        assert torch.equal(a, b)
    timeless = [{k: v for k, v in r.items() if k not in ("minutes", "tokens_per_s")} for r in fitted.metrics.history]
    assert timeless == [{k: v for k, v in r.items() if k not in ("minutes", "tokens_per_s")}
                        for r in by_hand.metrics.history]
    assert {"train", "val"} <= {r["kind"] for r in timeless}
    assert sorted(p.name for p in (tmp_path / "fit").iterdir()) == sorted(p.name for p in (tmp_path / "hand").iterdir())
