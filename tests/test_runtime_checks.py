"""Settings this machine's PyTorch cannot run are refused before any work starts, with a clear message."""
import contextlib
import types
import warnings

import pytest
import torch

from transformer_lib import cli, records, runtime
from transformer_lib.training_run import train
from transformer_lib.config import TrainConfig
from transformer_lib.runtime import UnsupportedSetting, check_runtime

CPU = torch.device("cpu")


def test_supported_settings_pass_without_a_word(monkeypatch):
    for native in (False, True):  # "auto" is float32 on a CPU without bfloat16 instructions, bfloat16 with them
        monkeypatch.setattr(runtime, "cpu_has_native_bf16", lambda native=native: native)
        with warnings.catch_warnings():
            warnings.simplefilter("error")
            assert check_runtime(CPU, "off") is None
            assert check_runtime(CPU, "auto") is None


def test_bf16_on_a_cpu_without_bf16_instructions_warns(monkeypatch):
    monkeypatch.setattr(runtime, "cpu_has_native_bf16", lambda: False)
    with pytest.warns(UserWarning) as caught:
        check_runtime(CPU, "bf16")
    assert [str(w.message) for w in caught] == [  # once, in the devices page's words
        "amp=bf16: this CPU lists no bfloat16 instructions, so PyTorch emulates bfloat16, and a training step may be "
        "slower than in float32; amp=auto chooses for you"]
    assert caught[0].filename == __file__  # the warning points at the caller's line, not into the library
    monkeypatch.setattr(runtime, "cpu_has_native_bf16", lambda: True)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        check_runtime(CPU, "bf16")


@pytest.mark.parametrize("machine, flags, expected", [
    ("x86_64", "fpu sse2 avx2 avx512f avx512bw avx512_bf16", True),   # Cooper Lake, Zen 4
    ("x86_64", "fpu sse2 avx2 avx512f avx512bw amx_tile amx_bf16", True),  # AMX
    ("x86_64", "fpu sse2 avx2 avx512f avx512bw avx512_vnni", False),  # Skylake / Cascade Lake: emulated
    ("x86_64", "fpu sse2 avx2 fma", False),
    ("aarch64", "fp asimd sve bf16 i8mm", True),                      # Neoverse V1 / N2
    ("aarch64", "fp asimd atomics", False),                           # Neoverse N1
    ("aarch64", "fp asimd svebf16", False),                           # another flag, not BF16
    ("riscv64", "bf16", False),
])
def test_bf16_is_native_only_with_the_hardware_flags(monkeypatch, machine, flags, expected):
    monkeypatch.setattr(runtime, "cpu_flags", lambda: set(flags.split()))
    monkeypatch.setattr(runtime.platform, "machine", lambda: machine)
    # oneDNN's own check says yes on any AVX-512 CPU; the choice must not follow it
    monkeypatch.setattr(torch.ops.mkldnn, "_is_mkldnn_bf16_supported", lambda: True, raising=False)
    assert runtime.cpu_has_native_bf16() is expected
    assert runtime.resolve_amp("auto", CPU) == (torch.bfloat16 if expected else None)


def test_cpu_flags_are_read_from_cpuinfo_lines(monkeypatch, tmp_path):
    x86 = "processor\t: 0\nflags\t\t: fpu avx512f avx512_bf16\nbugs\t\t: spectre_v1\n"
    arm = "processor\t: 0\nFeatures\t: fp asimd bf16\nCPU part\t: 0xd40\n"
    import builtins
    real_open = builtins.open
    for text, flag in [(x86, "avx512_bf16"), (arm, "bf16")]:
        (tmp_path / "cpuinfo").write_text(text)
        monkeypatch.setattr(builtins, "open", lambda path, *a, **k: real_open(
            tmp_path / "cpuinfo" if path == "/proc/cpuinfo" else path, *a, **k))
        flags = runtime.cpu_flags()
        assert flag in flags and "spectre_v1" not in flags and "0xd40" not in flags
    monkeypatch.setattr(builtins, "open", lambda *a, **k: (_ for _ in ()).throw(OSError("no such file")))
    assert runtime.cpu_flags() == set()


def test_fp16_on_a_cpu_warns():
    with pytest.warns(UserWarning, match="amp=fp16: most CPUs have no float16 matrix instructions"):
        try:
            check_runtime(CPU, "fp16")
        except UnsupportedSetting:
            pytest.skip("this PyTorch has no float16 autocast on the CPU")


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
        train(TrainConfig.from_preset("tiny", amp="fp16"), out, data_dir=tmp_path / "no-data-here")
    assert not out.exists()


@pytest.mark.skipif(torch.cuda.is_available(), reason="this machine has CUDA")
def test_command_line_gives_one_line_and_usage_exit(tmp_path, capsys):
    code = cli.main(["train", "--preset", "tiny", "--out", str(tmp_path / "run"), "--set", "device=cuda", "--quiet"])
    err = capsys.readouterr().err.strip().splitlines()
    assert code == cli.EXIT_USAGE
    assert err[-1].startswith("error: --set: device=cuda: this PyTorch sees no CUDA device"), err
    assert not any("Traceback" in line for line in err)


def _one_gpu(monkeypatch, capability=(9, 0), memory=80 * 2**30):
    """Pretend this machine has one CUDA GPU of the given compute capability and memory in bytes."""
    import types

    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 1)
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda device=None: capability)
    monkeypatch.setattr(torch.cuda, "get_device_properties",
                        lambda device=None: types.SimpleNamespace(total_memory=memory))


def test_a_gpu_index_past_the_last_gpu_is_refused(monkeypatch):
    _one_gpu(monkeypatch)
    check_runtime(torch.device("cuda:0"))
    with pytest.raises(UnsupportedSetting, match="device=cuda:7: this machine has one GPU, cuda:0; use one of those"):
        check_runtime(torch.device("cuda:7"))
    with pytest.raises(UnsupportedSetting, match="runs on cpu, cuda or mps"):
        check_runtime(torch.device("meta"))


@pytest.mark.parametrize("command", [["train", "--preset", "tiny", "--quiet"], ["translate", "-c", "none.pt", "Hallo"],
                                     ["evaluate", "-c", "none.pt", "--src", "a", "--ref", "b"]])
@pytest.mark.parametrize("device, message", [("cuda:7", "error: --device: device=cuda:7: this machine has one GPU, cuda:0"),
                                             ("gpu", "error: --device gpu: not a device; use auto, cpu, cuda")])
def test_command_line_refuses_a_device_in_one_line(tmp_path, capsys, monkeypatch, command, device, message):
    _one_gpu(monkeypatch)
    monkeypatch.chdir(tmp_path)
    (tmp_path / "none.pt").write_bytes(b"")  # never read: the device is refused first
    for name in ("a", "b"):
        (tmp_path / name).write_text("Hallo\n", encoding="utf-8")
    assert cli.main([*command, "--device", device]) == cli.EXIT_USAGE
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith(message), err
    assert not (tmp_path / "runs").exists()


def test_auto_picks_an_apple_gpu_when_pytorch_reports_one(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    monkeypatch.setattr(runtime, "mps_available", lambda: True)
    mps = runtime.resolve_device("auto")
    assert mps == torch.device("mps")
    assert runtime.resolve_amp("auto", mps) is None  # float32: supported by every PyTorch that has mps
    runtime.check_device(mps)
    monkeypatch.setattr(runtime, "mps_available", lambda: False)
    assert runtime.resolve_device("auto") == CPU
    with pytest.raises(UnsupportedSetting, match="device=mps: this PyTorch sees no Apple GPU"):
        runtime.check_device(torch.device("mps"))


def test_cuda_only_calls_stay_behind_a_device_check(monkeypatch):
    def no_cuda(*args, **kwargs):
        raise AssertionError("a CUDA call for a run on another device")

    for name in ("get_rng_state", "get_rng_state_all", "set_rng_state", "set_rng_state_all", "get_device_capability"):
        monkeypatch.setattr(torch.cuda, name, no_cuda)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)  # a machine with a GPU, training on the CPU
    state = runtime.rng_state(CPU)
    assert set(state) == {"torch", "python"}
    runtime.set_rng_state({**state, "cuda": [torch.zeros(8, dtype=torch.uint8)]}, CPU)
    assert runtime.resolve_amp("auto", CPU) in (None, torch.bfloat16)


def test_rng_state_of_the_device_in_use_survives_fewer_gpus(monkeypatch):
    """A checkpoint of 8 GPUs resumed on 1: each process saves and restores the state of its own GPU only."""
    saved, restored = {}, []
    monkeypatch.setattr(torch.cuda, "get_rng_state", lambda device="cuda": saved.setdefault(str(device),
                                                                                          torch.full((4,), 7)))
    monkeypatch.setattr(torch.cuda, "set_rng_state", lambda state, device="cuda": restored.append((state, device)))
    gpu = torch.device("cuda:0")
    state = runtime.rng_state(gpu)
    assert torch.equal(state["cuda"], torch.full((4,), 7))  # one state, not one per visible GPU
    runtime.set_rng_state(state, gpu)
    assert torch.equal(restored[-1][0], torch.full((4,), 7)) and restored[-1][1] == gpu
    eight = [torch.full((4,), k) for k in range(8)]  # the older format: get_rng_state_all of 8 GPUs
    runtime.set_rng_state({**state, "cuda": eight}, gpu)
    assert torch.equal(restored[-1][0], eight[0])
    runtime.set_rng_state({**state, "cuda": eight[:1]}, torch.device("cuda:3"))  # no state of that GPU: left
    assert len(restored) == 2


def test_a_t4_gets_float16_with_loss_scaling(monkeypatch):
    """Free Colab's T4 (capability 7.5) has no bfloat16: amp="auto" chooses float16 (the trainer then scales the loss)."""
    _one_gpu(monkeypatch, capability=(7, 5))  # amp_for_capability's table: tests/test_training_runs.py
    assert runtime.resolve_amp("auto", torch.device("cuda")) == torch.float16  # the scaler: tests/test_run_safety.py


@pytest.mark.parametrize("gpu, expected", [(None, "cpu"), ((7, 5), "colab"), ((7, 0), "colab"), ((8, 0), "gpu"),
                                           ((9, 0), "gpu")])
def test_the_machine_picks_its_preset(monkeypatch, gpu, expected):
    """No GPU: the cpu preset; a GPU without bfloat16 (a T4 is 7.5, a V100 7.0): colab; Ampere (8.0) on: gpu."""
    monkeypatch.setattr(runtime, "mps_available", lambda: False)
    if gpu is None:
        monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    else:
        _one_gpu(monkeypatch, capability=gpu)
    assert runtime.machine_preset() == expected


GiB = 2**30


@pytest.mark.parametrize("capability, memory, expected", [
    ((8, 6), 8 * GiB, "colab"),        # an 8 GiB RTX card: the gpu preset's 11.1 GiB estimate does not fit
    ((8, 6), 11.7 * GiB, "colab"),     # a 12 GB card as CUDA reports it: under 14 GiB
    ((8, 9), 16 * GiB, "gpu"),         # a 16 GB card
    ((8, 0), 40 * GiB, "gpu"),         # an A100
    ((7, 5), 15 * GiB, "colab"),       # a T4: memory enough, no bfloat16
])
def test_the_gpu_preset_needs_the_memory_its_estimate_asks(monkeypatch, capability, memory, expected):
    """machine_preset gives the gpu preset only to a bfloat16 GPU with at least 14 GiB (eng_devices: the
    preset's estimated 11.1 GiB plus headroom); a smaller card trains the colab preset."""
    monkeypatch.setattr(runtime, "mps_available", lambda: False)
    _one_gpu(monkeypatch, capability=capability, memory=int(memory))
    assert runtime.machine_preset() == expected
    assert runtime.GPU_PRESET_MEMORY == 14 * GiB


def _glibc_with(monkeypatch, mallopt):
    """A Linux with glibc whose mallopt is `mallopt`, whatever this machine runs."""
    monkeypatch.setattr(runtime.sys, "platform", "linux")
    monkeypatch.setattr(runtime.platform, "libc_ver", lambda: ("glibc", "2.17"))
    monkeypatch.setattr(runtime.ctypes, "CDLL", lambda name: types.SimpleNamespace(mallopt=mallopt))


M_TRIM_THRESHOLD, M_MMAP_THRESHOLD, MiB = -1, -3, 2**20


def test_keep_freed_memory_sets_both_thresholds_where_glibc_accepts_them(monkeypatch):
    calls = []
    _glibc_with(monkeypatch, lambda param, value: calls.append((param, value)) or 1)
    assert runtime.keep_freed_memory() is True
    assert calls == [(M_MMAP_THRESHOLD, 1024 * MiB), (M_TRIM_THRESHOLD, 1024 * MiB)]


def test_keep_freed_memory_falls_back_to_32_mib_where_an_older_glibc_refuses_more(monkeypatch):
    """An older glibc's mallopt answers 0 for an mmap threshold above HEAP_MAX_SIZE / 2, 32 MiB on 64 bits."""
    calls = []

    def older_glibc(param, value):
        calls.append((param, value))
        return 0 if param == M_MMAP_THRESHOLD and value > 32 * MiB else 1

    _glibc_with(monkeypatch, older_glibc)
    assert runtime.keep_freed_memory() is True
    assert calls == [(M_MMAP_THRESHOLD, 1024 * MiB), (M_MMAP_THRESHOLD, 32 * MiB), (M_TRIM_THRESHOLD, 1024 * MiB)]


def test_keep_freed_memory_changes_nothing_where_glibc_refuses_every_mmap_threshold(monkeypatch):
    calls = []
    _glibc_with(monkeypatch, lambda param, value: calls.append((param, value)) or 0)
    assert runtime.keep_freed_memory() is False
    assert all(param == M_MMAP_THRESHOLD for param, _ in calls)  # the trim threshold left as it was
    calls.clear()
    assert runtime.keep_freed_memory(16 * MiB) is False and calls == [(M_MMAP_THRESHOLD, 16 * MiB)]


def test_keep_freed_memory_is_false_without_glibc(monkeypatch):
    monkeypatch.setattr(runtime.ctypes, "CDLL", lambda name: pytest.fail("mallopt called without glibc"))
    monkeypatch.setattr(runtime.sys, "platform", "darwin")
    assert runtime.keep_freed_memory() is False
    monkeypatch.setattr(runtime.sys, "platform", "linux")
    monkeypatch.setattr(runtime.platform, "libc_ver", lambda: ("", ""))  # musl, say
    assert runtime.keep_freed_memory() is False


def test_an_apple_gpu_trains_the_cpu_preset(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    monkeypatch.setattr(runtime, "mps_available", lambda: True)
    assert runtime.machine_preset() == "cpu"


def _cxx_compiler() -> str | None:
    import os
    import shutil

    return next((path for name in (os.environ.get("CXX"), "g++", "c++", "clang++") if name
                 for path in [shutil.which(name)] if path), None)


@pytest.mark.skipif(_cxx_compiler() is None, reason="Inductor compiles C++ on the CPU, and no C++ compiler is installed")
def test_inductor_computes_the_loss_of_eager(tmp_path, monkeypatch):
    """torch.compile with its default backend, Inductor, once on the CPU on a tiny model: the loss equals eager's
    within float32 reordering, and Inductor really generated code (in its cache folder, empty before). The forward
    pass only: compiling the backward too takes minutes on two busy cores (test_training_runs checks a compiled
    training run with Dynamo's eager backend)."""
    import torch._dynamo
    import torch._inductor.config
    from torch.nn.attention import SDPBackend, sdpa_kernel

    from transformer_lib.model import Transformer, TransformerConfig
    from transformer_lib.recipe import LabelSmoothingLoss, batch_loss, make_batch

    if not torch._dynamo.is_dynamo_supported():
        pytest.skip("torch.compile does not support this Python version")
    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", str(tmp_path / "inductor"))
    torch._dynamo.reset()
    torch.manual_seed(0)
    model = Transformer(TransformerConfig(vocab_size=40, d_model=16, n_heads=2, n_encoder_layers=1, n_decoder_layers=1,
                                          d_ff=32, dropout=0.0, max_len=16)).eval()
    g = torch.Generator().manual_seed(1)
    batch = make_batch([torch.randint(4, 40, (n,), generator=g).tolist() for n in (5, 7, 3)],
                       [torch.randint(4, 40, (n,), generator=g).tolist() for n in (6, 4, 7)])
    criterion = LabelSmoothingLoss(40, 0, 0.1, reduction="sum")
    compiled = torch.compile(lambda b: batch_loss(model, b, criterion), backend="inductor")
    with torch.no_grad(), sdpa_kernel([SDPBackend.MATH]), torch._inductor.config.patch(compile_threads=1):
        eager = batch_loss(model, batch, criterion)
        got = compiled(batch)
    torch._dynamo.reset()
    for value, expected in zip(got, eager, strict=True):  # the summed loss and negative log-likelihood
        assert torch.allclose(value, expected, rtol=1e-5), (value, expected)  # float32: eps 1.2e-7, sums reordered
    assert list((tmp_path / "inductor").rglob("*.py")), "no code generated: Inductor did not run"


@pytest.mark.parametrize("norm_first, S, T", [(False, 9, 7), (True, 5, 12)])
def test_training_flops_equal_pytorchs_count(norm_first, S, T):
    """The oracle: FlopCounterMode counts every matrix product of a real forward and backward pass (the math attention
    kernel, which it sees as products); on sentences of equal lengths there is no padding, so the two must agree to
    the FLOP. With padding PyTorch counts more than the real tokens' work, which training_flops leaves out."""
    from torch.nn.attention import SDPBackend, sdpa_kernel
    from torch.utils.flop_counter import FlopCounterMode

    from transformer_lib.model import Transformer, TransformerConfig
    from transformer_lib.recipe import LabelSmoothingLoss, batch_loss, make_batch

    torch.manual_seed(0)
    config = TransformerConfig(vocab_size=300, d_model=32, n_heads=4, n_encoder_layers=2, n_decoder_layers=3, d_ff=48,
                               norm_first=norm_first)
    model = Transformer(config)
    criterion = LabelSmoothingLoss(300, 0, 0.1, reduction="sum")

    def counted(src, tgt):
        with FlopCounterMode(display=False) as counter, sdpa_kernel([SDPBackend.MATH]):
            batch_loss(model, make_batch(src, tgt), criterion)[0].backward()
        return counter.get_total_flops()

    src = torch.randint(4, 300, (5, S)).tolist()
    tgt = torch.randint(4, 300, (5, T)).tolist()
    assert records.training_flops(config, [S + 1] * 5, [T + 1] * 5) == counted(src, tgt)  # + <eos>; <bos> + target
    ragged_src, ragged_tgt = [s[: S - k] for k, s in enumerate(src)], [t[: T - k] for k, t in enumerate(tgt)]
    real = records.training_flops(config, [S + 1 - k for k in range(5)], [T + 1 - k for k in range(5)])
    assert real < counted(ragged_src, ragged_tgt)  # the padded batch's work is more than its real tokens'


def test_the_peak_of_a_gpu_by_its_name(monkeypatch):
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda device=None: "NVIDIA H100 PCIe")
    assert records.peak_flops(torch.device("cuda")) == records.PEAK_FLOPS["H100 PCIe"]  # the longest name that fits
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda device=None: "NVIDIA H100 80GB HBM3")
    assert records.peak_flops(torch.device("cuda")) == 989e12
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda device=None: "Tesla T4")
    assert records.peak_flops(torch.device("cuda")) == 65e12
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda device=None: "NVIDIA A100-SXM4-80GB")
    assert records.peak_flops(torch.device("cuda")) == 312e12
    for unlisted in ("NVIDIA L40S", "NVIDIA L40", "Some Future GPU"):  # "L4" is not a part of "L40S"
        monkeypatch.setattr(torch.cuda, "get_device_name", lambda device=None, name=unlisted: name)
        assert records.peak_flops(torch.device("cuda")) is None, unlisted
    assert records.peak_flops(CPU) is None


def test_bf16_on_a_gpu_before_ampere_is_called_emulated(monkeypatch):
    """A T4 (capability 7.5) has no bfloat16 tensor cores: check_runtime's reason to warn; an A100 (8.0) has."""
    _one_gpu(monkeypatch, capability=(7, 5))
    assert "capability 7.5) has no bfloat16 tensor cores" in runtime._slow_amp(torch.device("cuda"), torch.bfloat16)
    assert runtime._slow_amp(torch.device("cuda"), torch.float16) is None
    _one_gpu(monkeypatch, capability=(8, 0))
    assert runtime._slow_amp(torch.device("cuda"), torch.bfloat16) is None
