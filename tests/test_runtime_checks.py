"""Settings this machine's PyTorch cannot run are refused before any work starts, with a clear message."""
import contextlib
import warnings

import pytest
import torch

from transformer_lib import cli, training
from transformer_lib.training import TrainConfig, UnsupportedSetting, check_runtime

CPU = torch.device("cpu")


def test_supported_settings_pass():
    check_runtime(CPU, "off")
    check_runtime(CPU, "auto")


def test_bf16_on_a_cpu_without_bf16_instructions_warns(monkeypatch):
    monkeypatch.setattr(training, "cpu_has_native_bf16", lambda: False)
    with pytest.warns(UserWarning, match="this CPU has no bfloat16 instructions"):
        check_runtime(CPU, "bf16")
    monkeypatch.setattr(training, "cpu_has_native_bf16", lambda: True)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        check_runtime(CPU, "bf16")


@pytest.mark.parametrize("amp, name", [("fp16", "fp16"), ("bf16", "bf16")])
def test_autocast_that_does_nothing_is_refused(monkeypatch, amp, name):
    # Old CPU builds of PyTorch only warn for an unsupported autocast dtype and then compute in float32.
    monkeypatch.setattr(torch, "autocast", lambda *args, **kwargs: contextlib.nullcontext())
    with pytest.raises(UnsupportedSetting, match=f"amp={name}: PyTorch .* has no {name} autocast on cpu"):
        check_runtime(CPU, amp)


def test_autocast_that_raises_is_refused(monkeypatch):
    def broken(*args, **kwargs):
        raise RuntimeError("no autocast here")

    monkeypatch.setattr(torch, "autocast", broken)
    with pytest.raises(UnsupportedSetting, match="amp=fp16"):
        check_runtime(CPU, "fp16")


def test_compile_without_dynamo_is_refused(monkeypatch):
    import torch._dynamo

    monkeypatch.setattr(torch._dynamo, "is_dynamo_supported", lambda: False)
    with pytest.raises(UnsupportedSetting, match=r"compile=True: torch.compile does not support Python \d+\.\d+"):
        check_runtime(CPU, "off", compile=True)


@pytest.mark.skipif(torch.cuda.is_available(), reason="this machine has CUDA")
def test_missing_cuda_is_refused():
    with pytest.raises(UnsupportedSetting, match="device=cuda: this PyTorch sees no CUDA device"):
        check_runtime(torch.device("cuda"), "auto")


def test_train_refuses_before_touching_data_or_the_run_folder(tmp_path, monkeypatch):
    monkeypatch.setattr(torch, "autocast", lambda *args, **kwargs: contextlib.nullcontext())
    out = tmp_path / "run"
    with pytest.raises(UnsupportedSetting, match="amp=fp16"):
        training.train(TrainConfig.from_preset("tiny", amp="fp16"), out, data_dir=tmp_path / "no-data-here")
    assert not out.exists()


@pytest.mark.skipif(torch.cuda.is_available(), reason="this machine has CUDA")
def test_command_line_gives_one_line_and_usage_exit(tmp_path, capsys):
    code = cli.main(["train", "--preset", "tiny", "--out", str(tmp_path / "run"), "--set", "device=cuda", "--quiet"])
    err = capsys.readouterr().err.strip().splitlines()
    assert code == cli.EXIT_USAGE
    assert err[-1].startswith("error: --set: device=cuda: this PyTorch sees no CUDA device"), err
    assert not any("Traceback" in line for line in err)
