"""transformer_lib.data: verified, atomic downloads from a local HTTP server, the folder search order, loading;
all-or-nothing writes; reading lines of UTF-8 under each policy for bytes that are not UTF-8."""
import gzip
import hashlib
import http.server
import os
import threading
from functools import partial
from pathlib import Path

import pytest

from transformer_lib import data, files
from transformer_lib.data import (
    MULTI30K_SHA256,
    SPLITS,
    DataError,
    atomic_write,
    cache_dir,
    download_multi30k,
    load_multi30k,
    multi30k_dir,
    read_lines,
)

# Small stand-ins for the six files: the real ones are not needed to test the machinery.
LINES = {"train": 3, "val": 2, "test_2016_flickr": 1}


@pytest.fixture
def fake_files(tmp_path, monkeypatch) -> Path:
    """Six small gzip files in a folder, with MULTI30K_SHA256 patched to their hashes."""
    folder = tmp_path / "served"
    folder.mkdir()
    for stem, n in LINES.items():
        for lang in ("de", "en"):
            name = f"{stem}.{lang}.gz"
            text = "".join(f"{stem} {lang} Satz {i} – ü€😀\n" for i in range(n))
            (folder / name).write_bytes(gzip.compress(text.encode(), mtime=0))
            monkeypatch.setitem(MULTI30K_SHA256, name, files.sha256_file(folder / name))
    return folder


@pytest.fixture(autouse=True)
def private_cache(tmp_path, monkeypatch) -> Path:
    """Never touch the user's real cache or data folder."""
    cache = tmp_path / "cache"
    monkeypatch.setenv("TRANSFORMER_LIB_CACHE", str(cache))
    monkeypatch.delenv("TRANSFORMER_LIB_DATA", raising=False)
    return cache


class _Server:
    """A static file server on 127.0.0.1 at a free port, in a thread."""

    def __init__(self, folder: Path):
        handler = partial(_QuietHandler, directory=str(folder))
        self.httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
        self.thread = threading.Thread(target=self.httpd.serve_forever, args=(0.05,), daemon=True)
        self.thread.start()
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}/{{split}}.{{lang}}.gz"

    def stop(self) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()
        self.thread.join()


class _QuietHandler(http.server.SimpleHTTPRequestHandler):
    def log_message(self, *args) -> None:
        pass


class _TruncatingHandler(_QuietHandler):
    """Announces the full length but sends only half the bytes, then closes: a broken connection."""

    def do_GET(self) -> None:
        body = Path(self.translate_path(self.path)).read_bytes()
        self.send_response(200)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body[: len(body) // 2])
        self.close_connection = True


@pytest.fixture
def server(fake_files):
    srv = _Server(fake_files)
    yield srv
    srv.stop()


def _leftovers(folder: Path) -> list[str]:
    return sorted(p.name for p in folder.iterdir() if p.name.endswith(".part") or p.name.startswith("."))


def test_good_download_succeeds_and_verifies(server, tmp_path):
    dest = tmp_path / "dest"
    assert download_multi30k(dest, base_url=server.url, progress=False) == dest
    assert sorted(p.name for p in dest.iterdir()) == sorted(MULTI30K_SHA256)
    for name, expected in MULTI30K_SHA256.items():
        assert hashlib.sha256((dest / name).read_bytes()).hexdigest() == expected
    assert len(load_multi30k("train", data_dir=dest)) == LINES["train"]


def test_download_skips_verified_files_and_replaces_corrupt_ones(server, tmp_path):
    dest = download_multi30k(tmp_path / "dest", base_url=server.url, progress=False)
    (dest / "val.en.gz").write_bytes(b"not the right bytes")
    before = (dest / "train.de.gz").stat().st_mtime_ns
    download_multi30k(dest, base_url=server.url, progress=False)
    assert files.sha256_file(dest / "val.en.gz") == MULTI30K_SHA256["val.en.gz"]
    assert (dest / "train.de.gz").stat().st_mtime_ns == before


def test_corrupt_download_raises_and_leaves_nothing(server, fake_files, tmp_path):
    (fake_files / "val.de.gz").write_bytes(b"corrupted in transit")
    dest = tmp_path / "dest"
    with pytest.raises(DataError, match="SHA-256") as info:
        download_multi30k(dest, base_url=server.url, progress=False)
    assert "TRANSFORMER_LIB_DATA" in str(info.value)  # says how to supply the files by hand
    assert not (dest / "val.de.gz").exists()
    assert _leftovers(dest) == []


def test_missing_file_404_raises(server, fake_files, tmp_path):
    (fake_files / "test_2016_flickr.en.gz").unlink()
    dest = tmp_path / "dest"
    with pytest.raises(DataError, match="404") as info:
        download_multi30k(dest, base_url=server.url, progress=False)
    assert "TRANSFORMER_LIB_DATA" in str(info.value)
    assert not (dest / "test_2016_flickr.en.gz").exists()
    assert _leftovers(dest) == []


def test_stopped_server_raises(server, tmp_path):
    server.stop()
    dest = tmp_path / "dest"
    with pytest.raises(DataError, match="could not download"):
        download_multi30k(dest, base_url=server.url, progress=False, timeout=5)
    assert list(dest.iterdir()) == []


def test_connection_broken_mid_file_raises_and_leaves_nothing(fake_files, tmp_path):
    handler = partial(_TruncatingHandler, directory=str(fake_files))
    httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=httpd.serve_forever, args=(0.05,), daemon=True)
    thread.start()
    try:
        url = f"http://127.0.0.1:{httpd.server_address[1]}/{{split}}.{{lang}}.gz"
        dest = tmp_path / "dest"
        with pytest.raises(DataError, match=r"connection closed after \d+ of \d+ bytes"):
            download_multi30k(dest, base_url=url, progress=False, timeout=5)
        assert list(dest.iterdir()) == []
    finally:
        httpd.shutdown()
        httpd.server_close()
        thread.join()


def test_cache_is_filled_by_download(server, private_cache, monkeypatch):
    fetch = partial(download_multi30k, base_url=server.url, progress=False)
    monkeypatch.setattr(data, "download_multi30k", fetch)  # multi30k_dir downloads from the local server
    with pytest.raises(DataError, match="missing"):
        multi30k_dir(download=False)
    folder = multi30k_dir()
    assert folder == cache_dir() / "multi30k" and cache_dir() == private_cache
    assert len(load_multi30k("val")) == LINES["val"]


def test_env_folder_is_used(fake_files, monkeypatch):
    monkeypatch.setenv("TRANSFORMER_LIB_DATA", str(fake_files))
    assert multi30k_dir() == fake_files
    pairs = load_multi30k("test2016")
    assert pairs == [("test_2016_flickr de Satz 0 – ü€😀", "test_2016_flickr en Satz 0 – ü€😀")]


def test_argument_wins_over_env(fake_files, tmp_path, monkeypatch):
    monkeypatch.setenv("TRANSFORMER_LIB_DATA", str(tmp_path / "elsewhere"))
    assert multi30k_dir(fake_files) == fake_files


def test_named_folder_with_bad_files_is_rejected_not_repaired(fake_files, monkeypatch):
    (fake_files / "train.en.gz").write_bytes(gzip.compress(b"changed\n"))
    monkeypatch.setenv("TRANSFORMER_LIB_DATA", str(fake_files))
    with pytest.raises(DataError, match=r"train\.en\.gz has SHA-256"):
        multi30k_dir()
    (fake_files / "val.de.gz").unlink()
    with pytest.raises(DataError, match=r"val\.de\.gz is missing"):
        load_multi30k("val", data_dir=fake_files)
    assert not (fake_files / "val.de.gz").exists()


def test_mismatched_line_counts_raise(fake_files, monkeypatch):
    path = fake_files / "val.en.gz"
    path.write_bytes(gzip.compress(b"only one line\n"))
    monkeypatch.setitem(MULTI30K_SHA256, "val.en.gz", files.sha256_file(path))
    with pytest.raises(DataError, match="2 German lines but 1 English"):
        load_multi30k("val", data_dir=fake_files)


def test_invalid_split_lists_valid_ones(fake_files):
    with pytest.raises(ValueError, match="'train', 'val', 'test2016'"):
        load_multi30k("test", data_dir=fake_files)


def test_cache_dir_order(monkeypatch, tmp_path):
    monkeypatch.setenv("TRANSFORMER_LIB_CACHE", str(tmp_path / "a"))
    assert cache_dir() == tmp_path / "a"
    monkeypatch.delenv("TRANSFORMER_LIB_CACHE")
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    assert cache_dir() == tmp_path / "xdg" / "transformer_lib"
    monkeypatch.delenv("XDG_CACHE_HOME")
    assert cache_dir() == Path.home() / ".cache" / "transformer_lib"


REAL_DATA = os.environ.get("TRANSFORMER_LIB_DATA")


@pytest.mark.skipif(not REAL_DATA, reason="TRANSFORMER_LIB_DATA is not set")
def test_real_multi30k_sizes(monkeypatch):
    monkeypatch.setenv("TRANSFORMER_LIB_DATA", REAL_DATA)
    sizes = {split: len(load_multi30k(split)) for split in SPLITS}
    assert sizes == {"train": 29000, "val": 1014, "test2016": 1000}
    german, english = load_multi30k("train")[0]
    assert german.startswith("Zwei junge weiße Männer") and english.startswith("Two young, White males")


def test_atomic_write_replaces_the_file_whole(tmp_path):
    path = tmp_path / "sub" / "f.txt"
    with atomic_write(path, "w") as f:
        f.write("ünïcode\n")
    assert path.read_bytes() == "ünïcode\n".encode("utf-8") and path.stat().st_mode & 0o777 == 0o644
    with atomic_write(path) as f:
        f.write(b"new")
    assert path.read_bytes() == b"new" and [p.name for p in path.parent.iterdir()] == ["f.txt"]


def test_an_interrupted_write_leaves_the_old_file_and_no_temporary_one(tmp_path):
    path = tmp_path / "f.txt"
    path.write_bytes(b"old")
    with pytest.raises(KeyboardInterrupt):
        with atomic_write(path) as f:
            f.write(b"half of the n")
            raise KeyboardInterrupt
    assert path.read_bytes() == b"old" and [p.name for p in tmp_path.iterdir()] == ["f.txt"]


def test_read_lines_splits_at_newlines_only_and_drops_a_byte_order_mark():
    for invalid in ("error", "replace"):
        assert read_lines(b"", invalid=invalid) == []
        assert read_lines(b"a\n", invalid=invalid) == ["a"]
        assert read_lines(b"a\r\n\nb", invalid=invalid) == ["a", "", "b"]
        assert read_lines(b"\xef\xbb\xbfa\x0cb\n", invalid=invalid) == ["a\x0cb"]  # a form feed is no line break


def test_read_lines_raises_naming_the_first_line_that_is_not_utf8():
    with pytest.raises(DataError, match=r"x: line 2 is not valid UTF-8 \(byte 0xff\)"):
        read_lines(b"ok\n\xff\n\xfe\n", "x", invalid="error")


def test_read_lines_replaces_what_is_not_utf8_and_warns_naming_the_lines():
    with pytest.warns(UserWarning, match=r"x: 2 line\(s\) are not valid UTF-8 \(line 2, 4\)"):
        assert read_lines(b"ok\n\xff\nfine\na\xfeb", "x", invalid="replace") == ["ok", "\ufffd", "fine", "a\ufffdb"]


def test_read_lines_needs_a_known_policy():
    with pytest.raises(TypeError):
        read_lines(b"a\n")  # the policy for bytes that are not UTF-8 is always chosen by the caller
    with pytest.raises(ValueError, match="'error' or 'replace'"):
        read_lines(b"a\n", invalid="ignore")
