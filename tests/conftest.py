import os
import sys
from pathlib import Path

import pytest

from pager.config import Config
from pager.embed import HashEmbedder
from pager.home import Home
from pager.store import MemoryStore

ROOT = Path(__file__).resolve().parents[1]
SHARED = ROOT.parent / "shared" / "data"
LOCOMO = SHARED / "locomo" / "locomo_dev.json"


def pytest_addoption(parser):
    parser.addoption("--long", action="store_true", help="run the long reliability runs")


def pytest_collection_modifyitems(config, items):
    if config.getoption("--long"):
        return
    skip = pytest.mark.skip(reason="long mode only (pytest --long)")
    for item in items:
        if "slow" in item.keywords:
            item.add_marker(skip)


@pytest.fixture
def config(tmp_path):
    return Config(home=tmp_path / "home", budget=2048, page_tokens=128, embedder="hash")


@pytest.fixture
def mem_home(config):
    """A home with an in-memory store and the hashing embedder: fast, no LanceDB."""
    home = Home(config, store=MemoryStore(), embedder=HashEmbedder(), durable=False)
    yield home
    home.journal.close(remove=True)


@pytest.fixture
def lance_home(config):
    home = Home(config, embedder=HashEmbedder())
    yield home
    if not home._closed:
        home.close()


@pytest.fixture
def tmpfs(tmp_path):
    """A 3 MB tmpfs, for disks that really fill up (needs root to mount; skipped otherwise)."""
    import subprocess

    mount = tmp_path / "small"
    mount.mkdir()
    if subprocess.run(["mount", "-t", "tmpfs", "-o", "size=3m", "tmpfs", str(mount)], capture_output=True).returncode:
        pytest.skip("cannot mount a small tmpfs here (needs root)")
    yield mount
    subprocess.run(["umount", "-l", str(mount)], capture_output=True)


def say(session, n, start=0, words=12):
    """Append n turns with distinct, checkable text."""
    msgs = [{"speaker": "ann" if i % 2 else "bob", "text": f"turn {i} says " + " ".join(f"w{i}x{j}" for j in range(words))}
            for i in range(start, start + n)]
    return session.append_many(msgs)


def run_py(code: str, env=None, **kw):
    import subprocess

    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          env={**os.environ, **(env or {})}, **kw)
