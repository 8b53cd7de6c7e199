"""Bad input is refused with a message naming the fix, and what was accepted stays."""

import errno
import subprocess

import pytest

from pager.agent import Agent
from pager.config import Config
from pager.embed import HashEmbedder
from pager.errors import BudgetError, InputError, StoreError
from pager.formats import parse_jsonl, parse_locomo
from pager.home import Home
from pager.llm import LiteLLMModel


def test_a_message_larger_than_the_budget_is_refused_before_it_is_accepted(mem_home):
    s = mem_home.open("a")
    s.append("ann", "an accepted turn")
    agent = Agent(s, LiteLLMModel("pager/offline"))
    with pytest.raises(BudgetError, match="raise --budget, send it in parts"):
        agent.ask("word " * 5000)
    assert s.turn_count == 1


def test_a_huge_document_is_stored_whole_across_pages(mem_home):
    s = mem_home.open("a")
    text = " ".join(f"sentence{i}." for i in range(6000))
    turn = s.append("ann", text)
    pieces = sorted((a, b) for p in s.pages.values() for t, a, b in p.spans if t == turn.turn)
    pieces += [(p.start, p.end) for p in s.packer.pieces if p.turn.turn == turn.turn]
    assert "".join(text[a:b] for a, b in sorted(pieces)) == text  # split, never truncated


@pytest.mark.parametrize("content, where", [
    ('[{"sample_id": "x"}]', "has no \"conversation\""),
    ('{"conversation": {"session_1": [{"speaker": "a", "text": ""}]}}', "has no text"),
    ('[{"conversation": {}}, 5]', "sample 1"),
    ("[{,}]", ":1: not JSON"),
])
def test_malformed_locomo_names_the_problem(tmp_path, content, where):
    path = tmp_path / "bad.json"
    path.write_text(content)
    with pytest.raises(InputError, match=where.replace("(", r"\(")):
        parse_locomo(path)


def test_malformed_jsonl_imports_nothing(tmp_path):
    path = tmp_path / "bad.jsonl"
    path.write_text('{"text": "ok"}\n{"text": "also ok"}\n["not an object"]\n')
    with pytest.raises(InputError, match="bad.jsonl:3"):
        parse_jsonl(path, "s")


def _failing_write(real):
    def write(fd, data):
        raise OSError(errno.ENOSPC, "No space left on device")
    return write


def test_a_full_disk_at_the_journal_refuses_the_message_and_loses_nothing(tmp_path, monkeypatch):
    cfg = Config(home=tmp_path / "h", embedder="hash")
    with Home(cfg, embedder=HashEmbedder()) as home:
        s = home.open("a")
        s.append("ann", "accepted before the disk filled")
        import pager.journal as journal

        monkeypatch.setattr(journal.os, "write", _failing_write(journal.os.write))
        with pytest.raises(StoreError, match="free disk space"):
            s.append("ann", "this one cannot be made durable")
        monkeypatch.undo()
        assert s.turn_count == 1
        s.append("ann", "accepted after space was freed")
    with Home(cfg, embedder=HashEmbedder()) as home:
        texts = [t.text for t in home.store.turns("", "a")]
    assert texts == ["accepted before the disk filled", "accepted after space was freed"]


def test_a_store_that_refuses_a_flush_keeps_everything_for_later(tmp_path, monkeypatch):
    cfg = Config(home=tmp_path / "h", embedder="hash", flush_turns=8)
    home = Home(cfg, embedder=HashEmbedder())
    s = home.open("a")
    events = []
    s.events.listeners.append(events.append)
    real_put = home.store.put

    def refuse(batch, fence=None):
        raise StoreError("the store refused a write (No space left on device); free disk space")

    monkeypatch.setattr(home.store, "put", refuse)
    for i in range(30):
        s.append("ann", f"turn {i}")  # flushes fail; appends go on
    assert any(e.kind == "store_error" for e in events)
    with pytest.raises(StoreError):
        home.close()  # the journal is kept
    monkeypatch.setattr(home.store, "put", real_put)
    with Home(cfg, embedder=HashEmbedder()) as again:  # the next process recovers the journal
        assert [t.text for t in again.store.turns("", "a")] == [f"turn {i}" for i in range(30)]


def test_a_really_full_disk(tmpfs, tmp_path):
    cfg = Config(home=tmpfs / "h", embedder="hash", flush_turns=64)
    acked = []
    with pytest.raises(StoreError, match="free disk space"):
        home = Home(cfg, embedder=HashEmbedder())
        s = home.open("a")
        for i in range(100_000):
            turn = s.append("ann", f"turn {i} " + "padding " * 30)
            acked.append(turn.text)
    assert len(acked) > 100
    home.journal.close(remove=False)
    home.leases.stop()   # and its lease thread dies with it
    subprocess.run(["mount", "-o", "remount,size=200m", str(tmpfs)], check=True)
    with Home(cfg, embedder=HashEmbedder()) as home:
        texts = [t.text for t in home.store.turns("", "a")]
    assert texts == acked


def test_unwritable_home_is_one_clear_error(tmp_path):
    blocker = tmp_path / "file"
    blocker.write_text("not a folder")
    with pytest.raises(StoreError, match="pick another with --home"):
        Home(Config(home=blocker / "h", embedder="hash"), embedder=HashEmbedder())


@pytest.mark.parametrize("name", ["a/b", "tab\there", "x" * 201, " "])
def test_a_new_session_gets_only_a_name_pager_serve_can_reach(config, name):
    with Home(config, embedder=HashEmbedder()) as home:
        with pytest.raises(InputError, match="session name"):
            home.open(name).append("ann", "hello")
        home.open("fine").append("ann", "hello")
    with Home(config, embedder=HashEmbedder()) as home:
        assert [row["session"] for row in home.store.sessions()] == ["fine"]
