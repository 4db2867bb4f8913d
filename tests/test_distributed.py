"""Data-parallel training (transformer_lib.training_run under torchrun, gloo on the CPU): the same update as one process."""
import json
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest
import torch

from transformer_lib.data import load_multi30k
from transformer_lib.recipe import LabelSmoothingLoss, NoamSchedule, encode_pairs, make_batch, noam_rate
from transformer_lib.tokenizer import BPETokenizer
from transformer_lib.checkpoints import CheckpointError, load_checkpoint
from transformer_lib.config import TrainConfig
from transformer_lib.distributed import step_shard
from transformer_lib.training_step import LossComputation
from transformer_lib.training_run import train
from transformer_lib.recipe import token_batches

ROOT = Path(__file__).resolve().parents[1]
SETTINGS = dict(d_model=32, n_heads=2, n_encoder_layers=1, n_decoder_layers=1, d_ff=64, dropout=0.0,
                train_subset=300, max_tokens=400, warmup=20, epochs=5, max_steps=12, log_every=1,
                average_last=1, seed=3, device="cpu", threads=1, amp="off")

# The runs compared here add the same gradients in another order: (a + b) + (c + d) against ((a + b) + c) + d.
# In float32 that reordering moves a weight by up to ~1e-5 after a few Adam steps, an amount that depends on the
# CPU's vector width; in float64 it moves it by ~1e-13, so a tolerance of 1e-9 separates reordering from a wrong
# update (which moves weights by the learning rate, ~1e-3) on any machine.
FLOAT64 = "torch.set_default_dtype(torch.float64)"
# the weights of validation points kept and averaged at the end: every 4th step, the last 3 (rank 0 keeps them)
AVERAGING = dict(average_last=3, eval_every=4)
ATOL = 1e-9

# Run on every rank by torchrun: train with SETTINGS and argv's overrides; "fail" makes rank 1 fail at step 3.
WORKER = textwrap.dedent(
    f"""
    import json, os, sys
    import torch
    {FLOAT64}
    import transformer_lib.training_step as trainer
    from transformer_lib.config import TrainConfig
    from transformer_lib.training_run import train
    from transformer_lib.tokenizer import BPETokenizer
    out, mode, tokenizer_path, settings = sys.argv[1], sys.argv[2], sys.argv[3], json.loads(sys.argv[4])
    if mode == "fail" and os.environ["RANK"] == "1":
        calls = []
        make_batch = trainer.make_batch
        def failing(*args, **kwargs):
            calls.append(1)
            if len(calls) == 3:
                raise RuntimeError("rank 1 fails on purpose")
            return make_batch(*args, **kwargs)
        trainer.make_batch = failing
    if mode == "compile":  # Dynamo traces as in a real run; the eager backend skips Inductor's minutes on a CPU
        import functools
        torch.compile = functools.partial(torch.compile, backend="eager")
    train(TrainConfig.from_preset("tiny", **settings), out, resume=mode == "resume",
          progress=False, tokenizer=BPETokenizer.load(tokenizer_path))
    """
)


def _torchrun(tmp: Path, processes: int, out: Path, mode: str, tokenizer: Path, **overrides) -> subprocess.Popen:
    script = tmp / "worker.py"
    script.write_text(WORKER)
    command = [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc_per_node={processes}",
               str(script), str(out), mode, str(tokenizer), json.dumps({**SETTINGS, **overrides})]
    env = dict(os.environ, PYTHONPATH=str(ROOT), OMP_NUM_THREADS="1")
    return subprocess.Popen(command, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, start_new_session=True)


def _finish(proc: subprocess.Popen, timeout: float = 120) -> str:
    _, err = proc.communicate(timeout=timeout)
    assert proc.returncode == 0, err.decode()[-3000:]
    return err.decode()


def _train_losses(out: Path) -> torch.Tensor:
    records = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    return torch.tensor([r["loss"] for r in records if r["kind"] == "train"], dtype=torch.float64)


def _assert_close_weights(a: dict, b: dict, atol: float = ATOL, skip: str | None = None) -> None:
    assert a.keys() == b.keys()
    for name in a:
        if skip is not None and skip in name:
            continue
        assert torch.allclose(a[name], b[name], atol=atol), (name, (a[name] - b[name]).abs().max())


@pytest.fixture(autouse=True)
def float64():
    """Every run in this file, in-process as in the workers, computes in float64 (see FLOAT64)."""
    previous = torch.get_default_dtype()
    torch.set_default_dtype(torch.float64)
    yield
    torch.set_default_dtype(previous)


@pytest.fixture(scope="module")
def two_process_run(tmp_path_factory, small_tokenizer):
    """A 2-process run of 12 steps, averaging its last 3 validation points: its folder."""
    tmp = tmp_path_factory.mktemp("ddp")
    _finish(_torchrun(tmp, 2, tmp / "run", "new", small_tokenizer, **AVERAGING))
    return tmp / "run"


def test_step_shard_gives_every_rank_its_own_equal_share():
    batches = [[i] for i in range(12)]
    for world, accum in [(1, 1), (2, 1), (1, 2), (2, 3), (3, 2)]:
        per_step = world * accum
        for position in range(0, 12 - per_step + 1, per_step):
            shards = [step_shard(batches, position, world, accum, r) for r in range(world)]
            assert all(len(s) == accum for s in shards)
            assert sum(shards, []) == batches[position : position + per_step]  # disjoint, all of the step


def test_two_processes_compute_the_update_of_one_process(tmp_path, small_tokenizer, two_process_run):
    """2 ranks x B tokens == 1 process with accum_steps=2 == 1 process with both batches merged into one (2B)."""
    tokenizer = BPETokenizer.load(small_tokenizer)
    two = load_checkpoint(two_process_run / "last.pt")
    assert two["world_size"] == 2 and two["step"] == 12

    accum = train(TrainConfig.from_preset("tiny", **{**SETTINGS, **AVERAGING}, accum_steps=2), tmp_path / "accum",
                  progress=False, tokenizer=tokenizer)
    assert torch.allclose(_train_losses(tmp_path / "accum"), _train_losses(two_process_run), atol=ATOL)
    _assert_close_weights(load_checkpoint(tmp_path / "accum" / "last.pt")["model"], two["model"])
    # rank 0 kept the same validation points and averaged them as the one process did
    averaged = [[r for r in load_checkpoint(run / "model.pt")["history"] if r["kind"] == "averaged"]
                for run in (tmp_path / "accum", two_process_run)]
    assert len(averaged[0]) == len(averaged[1]) == 1 and averaged[0][0]["checkpoints"] == averaged[1][0]["checkpoints"] == 3
    assert averaged[0][0]["kept"] == averaged[1][0]["kept"]
    assert sorted(p.name for p in two_process_run.glob("average*.pt")) == [f"average{k:07d}.pt" for k in (4, 8, 12)]
    _assert_close_weights(load_checkpoint(tmp_path / "accum" / "model.pt")["model"],
                          load_checkpoint(two_process_run / "model.pt")["model"])

    # one process, one batch per step: the union of the two ranks' batches, padded together
    config = TrainConfig.from_preset("tiny", **SETTINGS)
    src, tgt = encode_pairs(load_multi30k("train")[:300], tokenizer, config.max_sentence_len)
    torch.manual_seed(config.seed)
    model = accum.model.__class__(config.model_config(tokenizer.vocab_size))
    start = {name: tensor.clone() for name, tensor in model.state_dict().items()}
    optimizer = torch.optim.Adam(model.parameters(), lr=noam_rate(1, config.d_model, config.warmup), betas=config.betas,
                                 eps=config.eps)
    schedule = NoamSchedule(optimizer, config.d_model, config.warmup)
    net = LossComputation(model, LabelSmoothingLoss(tokenizer.vocab_size, reduction="sum"))
    batches = token_batches([len(s) + 1 for s in src], [len(t) + 1 for t in tgt], config.max_tokens, seed=config.seed)
    losses = []
    for step in range(12):
        idx = batches[2 * step] + batches[2 * step + 1]
        batch = make_batch([src[i] for i in idx], [tgt[i] for i in idx])
        loss_sum, _ = net(batch)
        optimizer.zero_grad()
        (loss_sum / batch.n_tgt_tokens).backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), config.clip_grad_norm)
        optimizer.step()
        schedule.step()
        losses.append(loss_sum.item() / batch.n_tgt_tokens)
    assert torch.allclose(torch.tensor(losses, dtype=torch.float64), _train_losses(two_process_run), atol=ATOL)
    # Padding the two batches together changes the rounding of every sum, and Adam (eps=1e-9) divides each
    # gradient by its own size, so an element whose true gradient is nearly 0 takes a step set by that noise: the
    # weights part by amounts that depend on the CPU's kernels (up to 6e-4 after 12 steps on some machines).
    # What holds on any machine: each tensor ends within 2% of the distance it travelled (about 0.2% is noise; a
    # step that dropped one of the two batches misses by 8% to 84%). The keys' biases are left out: they add the
    # same number to every score of a query, which softmax ignores, so their true gradient is 0 and every step
    # they take is noise.
    for name, tensor in model.state_dict().items():
        if "k_proj.bias" in name:
            continue
        travelled = (two["model"][name] - start[name]).norm()
        apart = (tensor - two["model"][name]).norm()
        assert apart <= 0.02 * travelled, (name, (apart / travelled).item())


def test_two_process_run_killed_with_sigkill_resumes_to_identical_weights(tmp_path, small_tokenizer,
                                                                          two_process_run):
    out = tmp_path / "killed"
    victim = _torchrun(tmp_path, 2, out, "new", small_tokenizer, checkpoint_every=2)
    deadline = time.time() + 120
    while not (out / "last.pt").exists():
        assert victim.poll() is None, victim.communicate()[1].decode()[-2000:]
        assert time.time() < deadline
        time.sleep(0.005)
    os.killpg(victim.pid, signal.SIGKILL)  # torchrun and both ranks
    victim.wait()
    first = load_checkpoint(out / "last.pt")
    assert 0 < first["step"] < 12 and first["position"] > 0, "the run finished before it could be killed"
    _finish(_torchrun(tmp_path, 2, out, "resume", small_tokenizer, checkpoint_every=2))
    resumed, full = load_checkpoint(out / "last.pt"), load_checkpoint(two_process_run / "last.pt")
    assert resumed["step"] == full["step"] == 12
    for name, tensor in full["model"].items():
        assert torch.equal(tensor, resumed["model"][name]), name
    assert torch.equal(_train_losses(out), _train_losses(two_process_run))

    # a resume that would change the data order is refused, naming the setting
    with pytest.raises(CheckpointError, match="micro-batches per step"):
        train(TrainConfig.from_preset("tiny", **SETTINGS), out, resume=True, progress=False)


def test_a_failing_rank_ends_the_run_with_its_message(tmp_path, small_tokenizer):
    started = time.time()
    proc = _torchrun(tmp_path, 2, tmp_path / "failing", "fail", small_tokenizer)
    _, err = proc.communicate(timeout=90)
    assert proc.returncode != 0
    assert "rank 1 fails on purpose" in err.decode(), err.decode()[-3000:]
    assert time.time() - started < 90


def test_two_processes_with_accumulation_compute_the_update_of_one_process(tmp_path, small_tokenizer):
    """The no_sync branch: 2 ranks x accum_steps=2 == 1 process with accum_steps=4.

    The gradients add up in another order (see FLOAT64), so the keys' biases, whose true gradient is 0 (see the test
    above), take steps of rounding noise: left out of the comparison."""
    _finish(_torchrun(tmp_path, 2, tmp_path / "ddp", "new", small_tokenizer, accum_steps=2, max_steps=6))
    one = train(TrainConfig.from_preset("tiny", **{**SETTINGS, "max_steps": 6}, accum_steps=4), tmp_path / "one",
                progress=False, tokenizer=BPETokenizer.load(small_tokenizer))
    assert len(one.history) and torch.allclose(_train_losses(tmp_path / "one"), _train_losses(tmp_path / "ddp"),
                                               atol=ATOL)
    _assert_close_weights(load_checkpoint(tmp_path / "one" / "last.pt")["model"],
                          load_checkpoint(tmp_path / "ddp" / "last.pt")["model"], skip="k_proj.bias")


def test_a_resume_may_trade_processes_for_accumulation(tmp_path, small_tokenizer, two_process_run):
    """Half the run on 2 processes, the rest on 1 with accum_steps=2: the same steps as the 2-process run."""
    _finish(_torchrun(tmp_path, 2, tmp_path / "run", "new", small_tokenizer, max_steps=6))
    train(TrainConfig.from_preset("tiny", **SETTINGS, accum_steps=2), tmp_path / "run", resume=True,
          progress=False, tokenizer=BPETokenizer.load(small_tokenizer))
    resumed, two = load_checkpoint(tmp_path / "run" / "last.pt"), load_checkpoint(two_process_run / "last.pt")
    assert resumed["step"] == two["step"] == 12 and resumed["world_size"] == 1
    assert torch.allclose(_train_losses(tmp_path / "run"), _train_losses(two_process_run), atol=ATOL)
    _assert_close_weights(resumed["model"], two["model"], skip="k_proj.bias")


def test_a_resume_may_trade_accumulation_for_processes(tmp_path, small_tokenizer, two_process_run):
    """The reverse: half the run on 1 process with accum_steps=2, the rest on 2 processes: the same steps again."""
    train(TrainConfig.from_preset("tiny", **{**SETTINGS, "max_steps": 6}, accum_steps=2), tmp_path / "run",
          progress=False, tokenizer=BPETokenizer.load(small_tokenizer))
    _finish(_torchrun(tmp_path, 2, tmp_path / "run", "resume", small_tokenizer))
    resumed, two = load_checkpoint(tmp_path / "run" / "last.pt"), load_checkpoint(two_process_run / "last.pt")
    assert resumed["step"] == two["step"] == 12 and resumed["world_size"] == 2
    losses = _train_losses(tmp_path / "run")
    assert len(losses) == 12 and torch.allclose(losses, _train_losses(two_process_run), atol=ATOL)
    _assert_close_weights(resumed["model"], two["model"], skip="k_proj.bias")


def test_two_processes_train_compiled(tmp_path, small_tokenizer, two_process_run):
    """DDP around torch.compile's module (Dynamo with the eager backend on the CPU) computes the same losses."""
    _finish(_torchrun(tmp_path, 2, tmp_path / "compiled", "compile", small_tokenizer, compile=True), timeout=300)
    assert torch.allclose(_train_losses(tmp_path / "compiled"), _train_losses(two_process_run), atol=ATOL)



def test_waiting_for_rank_0_alone_uses_the_group_with_the_long_timeout(monkeypatch):
    """While rank 0 trains a tokenizer the others wait at a barrier of the slow-work group that start_processes
    makes, whose timeout is longer than the one that bounds a training step's collectives (the default group's)."""
    from datetime import timedelta

    from transformer_lib import distributed

    timeouts, waits = {}, []

    def new_group(backend: str, timeout: timedelta | None = None) -> str:
        timeouts["slow"] = timeout
        return "slow"

    monkeypatch.setattr(distributed.dist, "is_initialized", lambda: False)
    monkeypatch.setattr(distributed.dist, "init_process_group",
                        lambda backend, timeout: timeouts.update(step=timeout))
    monkeypatch.setattr(distributed.dist, "get_backend", lambda: "gloo")
    monkeypatch.setattr(distributed.dist, "get_rank", lambda: int(os.environ["RANK"]))
    monkeypatch.setattr(distributed.dist, "get_world_size", lambda: 2)
    monkeypatch.setattr(distributed.dist, "new_group", new_group)
    monkeypatch.setattr(distributed.dist, "barrier", lambda group=None: waits.append(group))
    monkeypatch.setenv("WORLD_SIZE", "2")
    for rank in (0, 1):
        monkeypatch.setenv("RANK", str(rank))
        procs = distributed.start_processes("cpu", timeout_minutes=10.0)
        with procs.main_first():
            pass
    assert waits == ["slow", "slow"]
    assert timeouts["step"] == timedelta(minutes=10.0) and timeouts["slow"] > timeouts["step"]
