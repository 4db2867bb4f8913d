"""One run owns its folder: a second `train --out X` while a live process holds X is refused at once, in one
line naming the folder and the holder; a killed holder leaves no lock behind."""
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

PY = sys.executable
CLI = str(Path(sys.executable).parent / "transformer-lib")  # the installed command
HOLD = """
import sys, time
from pathlib import Path
from transformer_lib.training_run import _hold_folder
held = _hold_folder(Path(sys.argv[1]))
print("held", flush=True)
time.sleep(600)
"""


def _holder(out):
    proc = subprocess.Popen([PY, "-c", HOLD, str(out)], stdout=subprocess.PIPE, text=True)
    assert proc.stdout.readline().strip() == "held"
    return proc


def test_a_second_train_into_a_held_folder_is_refused_in_one_line(tmp_path):
    out = tmp_path / "run"
    out.mkdir()
    holder = _holder(out)
    try:
        start = time.monotonic()
        second = subprocess.run([CLI, "train", "--preset", "tiny", "--out", str(out),
                                 "--quiet"], capture_output=True, text=True, env={**os.environ, "RANK": "0"})
        assert time.monotonic() - start < 60  # at once: before any data is read or step taken
        assert second.returncode != 0
        errors = [line for line in second.stderr.splitlines() if line.startswith("error:")]
        assert len(errors) == 1, second.stderr
        assert str(out) in errors[0] and f"process {holder.pid}" in errors[0]
        assert not (out / "last.pt").exists() and not (out / "metrics.jsonl").exists()
    finally:
        holder.kill()
        holder.wait()


def test_a_held_folder_with_a_checkpoint_is_refused_for_the_lock_first(tmp_path):
    """A live run has written last.pt: a second run, resuming or not, is told who holds the folder (not to resume),
    and the checkpoint is left as it was."""
    out = tmp_path / "run"
    out.mkdir()
    (out / "last.pt").write_bytes(b"a live run's checkpoint")
    holder = _holder(out)
    try:
        for resume in ([], ["--resume"]):
            second = subprocess.run([CLI, "train", "--preset", "tiny", "--out", str(out), "--quiet", *resume],
                                    capture_output=True, text=True, env={**os.environ, "RANK": "0"})
            assert second.returncode != 0
            errors = [line for line in second.stderr.splitlines() if line.startswith("error:")]
            assert len(errors) == 1 and f"process {holder.pid}" in errors[0], second.stderr
        assert (out / "last.pt").read_bytes() == b"a live run's checkpoint"
    finally:
        holder.kill()
        holder.wait()


def test_a_killed_holder_leaves_the_folder_free(tmp_path):
    out = tmp_path / "run"
    out.mkdir()
    holder = _holder(out)
    os.kill(holder.pid, signal.SIGKILL)
    holder.wait()
    again = _holder(out)  # another process takes the folder at once
    again.kill()
    again.wait()
