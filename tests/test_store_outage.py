"""The store stops answering in the middle of a session (an object store's outage, a network cut): what
was accepted is not lost, the failure reads as one line naming the cause, and once the store answers
again the next flush writes everything once, in order. Before, a lease check the store could not
answer at a flush dropped the turns the flush had taken (the next flush that succeeded removed the
journal segment that held them), and the errors were LanceDB's Rust dumps (RuntimeError, a `.cargo`
path), not a StoreError a caller or `pager serve` can act on."""

import socket
import struct
import threading
from urllib.parse import urlparse

import pytest

from pager.config import Config
from pager.embed import HashEmbedder
from pager.errors import StoreError
from pager.home import Home

from conftest import say


def _texts(home, session="talk") -> list[str]:
    return [t.text for t in home.store.turns("", session)]


def test_a_lease_check_the_store_cannot_answer_at_a_flush_loses_nothing(tmp_path, monkeypatch):
    config = Config(home=tmp_path / "h", budget=2048, page_tokens=128, embedder="hash", flush_turns=100_000)
    with Home(config, embedder=HashEmbedder()) as home:
        s = home.open("talk")
        said = [t.text for t in say(s, 10)]
        answering = home.leases.ensure

        def not_answering(*args, **kwargs):
            raise StoreError("the store at s3://memory/team does not answer (the endpoint cannot be reached)")

        monkeypatch.setattr(home.leases, "ensure", not_answering)
        with pytest.raises(StoreError):
            home.flush()
        monkeypatch.setattr(home.leases, "ensure", answering)
        said += [t.text for t in say(s, 5, start=100)]
        home.flush()                                  # the segment holding the first ten goes now
        assert _texts(home) == said
        assert [t.turn for t in home.store.turns("", "talk")] == list(range(1, 16))


class Outage:
    """A TCP proxy in front of the local S3 server that can stop answering: `cut()` closes every open
    connection and resets new ones until `restore()`."""

    def __init__(self, endpoint: str) -> None:
        target = urlparse(endpoint)
        self.target = (target.hostname, target.port)
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.url = f"http://127.0.0.1:{self.listener.getsockname()[1]}"
        self.down = threading.Event()
        self.open: list[socket.socket] = []
        self.lock = threading.Lock()
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while True:
            try:
                client, _ = self.listener.accept()
            except OSError:
                return   # closed
            if self.down.is_set():
                client.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))  # a reset
                client.close()
                continue
            upstream = socket.create_connection(self.target)
            with self.lock:
                self.open += [client, upstream]
            threading.Thread(target=self._pump, args=(client, upstream), daemon=True).start()
            threading.Thread(target=self._pump, args=(upstream, client), daemon=True).start()

    def _pump(self, source: socket.socket, sink: socket.socket) -> None:
        try:
            while data := source.recv(65536):
                sink.sendall(data)
        except OSError:
            pass
        finally:
            for sock in (source, sink):
                try:
                    sock.shutdown(socket.SHUT_RDWR)
                except OSError:
                    pass

    def cut(self) -> None:
        self.down.set()
        with self.lock:
            for sock in self.open:
                try:
                    sock.shutdown(socket.SHUT_RDWR)
                except OSError:
                    pass
            self.open = []

    def restore(self) -> None:
        self.down.clear()

    def close(self) -> None:
        self.cut()
        self.listener.close()


def test_the_object_store_going_away_mid_session_loses_nothing_and_says_so_in_one_line(s3, tmp_path):
    env, uri = s3
    outage = Outage(env["PAGER_S3_ENDPOINT"])
    try:
        config = Config.load(env={**env, "PAGER_S3_ENDPOINT": outage.url, "PAGER_EMBEDDER": "hash"},
                             home=tmp_path / "h", db=uri, budget=2048, flush_turns=100_000)
        with Home(config, embedder=HashEmbedder()) as home:
            s = home.open("talk")
            said = [t.text for t in say(s, 10)]
            home.flush()
            outage.cut()
            for i in range(10):   # accepted while the lease is trusted, refused in one line once it must be asked
                try:
                    said += [t.text for t in say(s, 1, start=100 + i)]
                except StoreError as exc:
                    assert "does not answer" in str(exc) and "\n" not in str(exc) and ".cargo" not in str(exc)
            for attempt in (lambda: home.flush(), lambda: home.leases.ensure("", "talk", trust_s=0.0),
                            lambda: home.store.turns("", "talk")):
                with pytest.raises(StoreError) as refused:
                    attempt()
                said_text = str(refused.value)
                assert "does not answer" in said_text and outage.url in said_text, said_text
                assert "\n" not in said_text and ".cargo" not in said_text, said_text
            outage.restore()
            home.flush()
            assert _texts(home) == said
            assert [t.turn for t in home.store.turns("", "talk")] == list(range(1, len(said) + 1))
        with Home(config, embedder=HashEmbedder()) as again:   # nothing left to recover, nothing twice
            assert again.recovered == 0 and _texts(again) == said
    finally:
        outage.close()
