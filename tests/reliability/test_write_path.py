"""The one write path, interleaving by interleaving: each test reproduces a way release 0.1 lost,
double-numbered or orphaned an acknowledged turn, with several homes in one process standing for
several processes (each home has its own journal segment and takes the same flocks)."""

import errno
import json
import os
import zlib

import pytest

from pager import fsck
from pager.config import Config
from pager.embed import HashEmbedder
from pager.errors import StoreError
from pager.home import Home
from pager.journal import frame, read_segment
from pager.trace import new_trace_path

pytestmark = pytest.mark.smoke   # in the one-minute subset: pytest -m smoke


@pytest.fixture
def cfg(tmp_path):
    return Config(home=tmp_path / "h", embedder="hash", budget=2048, flush_turns=10_000, keep_versions_s=0)


def home(cfg, **kw):
    return Home(cfg, embedder=HashEmbedder(), **kw)


def dies(h: Home) -> None:
    """A process killed with SIGKILL: its segment stays, unlocked; nothing is flushed."""
    h.journal.close(remove=False)
    h.leases.stop()   # and its lease thread dies with it
    h.closed = True


def healthy(h: Home, session: str, user: str = "") -> fsck.Report:
    report = fsck.check(h, user, session)
    assert report.ok, report.problems
    return report


def covered(s) -> list[int]:
    """Turn numbers on the session's pages and open tail, in order, one per piece start."""
    starts = [t for p in sorted(s.pages.values(), key=lambda p: p.n) for t, a, _ in p.spans if a == 0]
    return starts + [p.turn.turn for p in s.packer.pieces if p.start == 0]


def test_a_process_opening_mid_run_packs_turns_still_in_a_live_journal(cfg):
    a = home(cfg)
    sa = a.open("s")
    for i in range(5):
        sa.append("ann", f"early turn {i}")
    a.flush()
    b = home(cfg)
    b.open("s").append("bob", "the chat's first line: the harbour key is blue")  # only in b's journal
    sa.append("ann", "a later turn")  # numbered after b's; a flushes only its own turns: the store has a hole
    a.flush()
    c = home(cfg)  # opens while the hole is in the store
    sc = c.open("s")
    assert covered(sc) == list(range(1, 8))
    assert any("harbour key" in c_.line for c_ in sc.packer.pieces) or sc.search("harbour key", k=1)
    hits = sc.search("harbour key blue", k=3)
    assert hits and "harbour key" in sc.render.snippet(hits[0])
    for h in (a, b, c):
        h.close()
    with home(cfg) as check:
        healthy(check, "s")


def test_a_reader_never_writes_pages(cfg):
    with home(cfg) as a:
        s = a.open("s")
        for i in range(300):
            s.append("ann", f"line {i} about the lighthouse and its keeper")
        writer = home(cfg)  # leaves 200 turns in its journal only
        w = writer.open("s")
        for i in range(200):
            w.append("bob", f"unflushed {i} of the ferry timetable")
    before = {p: p.stat().st_mtime_ns for p in cfg.home.rglob("*") if p.is_file()}
    reader = home(cfg, read_only=True)
    r = reader.open("s")
    assert r.turn_count == 500 and r.search("ferry timetable", k=2)
    reader.close()
    after = {p: p.stat().st_mtime_ns for p in cfg.home.rglob("*") if p.is_file()}
    assert after == before, "a read-only open wrote something"
    writer.close()


def test_a_segment_is_never_visible_unlocked(cfg, monkeypatch):
    import pager.journal as journal

    first = home(cfg)
    other = journal.Journal(cfg.home / "journal")  # another process, opening the home at the worst moment
    seen = []
    real_flock = journal.fcntl.flock

    def flock_after_a_look(fd, op):
        if op == journal.fcntl.LOCK_EX:  # in the gap between creating a segment and locking it
            seen.extend(p.name for p, _ops, _d in other.orphans())
        return real_flock(fd, op)

    monkeypatch.setattr(journal.fcntl, "flock", flock_after_a_look)
    second = home(cfg)
    monkeypatch.undo()
    s = second.open("s")
    s.append("bob", "acknowledged while the other process looked")
    assert seen == []  # nothing was taken for a dead process's segment
    dies(second)
    first.close()
    other.close(remove=True)
    with home(cfg) as h:
        assert [t.text for t in h.store.turns("", "s")] == ["acknowledged while the other process looked"]


def test_turns_are_numbered_after_the_durable_last_turn(cfg):
    a, b = home(cfg), home(cfg)
    sa, sb = a.open("s"), b.open("s")
    t1 = sa.append("ann", "a1")
    t2, t3 = sb.append_many([{"speaker": "bob", "text": "b1"}, {"speaker": "bob", "text": "b2"}])
    b.flush()  # b's segment is rotated away: a can only learn of b1, b2 from the store
    t4 = sa.append("ann", "a2")
    assert [t.turn for t in (t1, t2, t3, t4)] == [1, 2, 3, 4]
    a.close()
    b.close()
    with home(cfg) as h:
        assert [(t.turn, t.text) for t in h.store.turns("", "s")] == [(1, "a1"), (2, "b1"), (3, "b2"), (4, "a2")]
        healthy(h, "s")


def test_a_writer_dying_between_its_journal_and_its_lock_costs_no_number(cfg, monkeypatch):
    from pager.locks import SessionLock

    a, b = home(cfg), home(cfg)
    sa, sb = a.open("s"), b.open("s")
    sa.append("ann", "first")
    real = SessionLock.advance
    monkeypatch.setattr(SessionLock, "advance", lambda self, last, ops: (_ for _ in ()).throw(SystemExit))
    with pytest.raises(SystemExit):
        sb.append("bob", "durable, then the process died")
    monkeypatch.setattr(SessionLock, "advance", real)
    dies(b)
    t = sa.append("ann", "after the death")
    assert t.turn == 3
    a.close()
    with home(cfg) as h:
        assert [x.text for x in h.store.turns("", "s")] == ["first", "durable, then the process died", "after the death"]
        healthy(h, "s")


def test_a_torn_write_does_not_swallow_the_next_record(cfg, monkeypatch):
    import pager.journal as journal

    h = home(cfg)
    s = h.open("s")
    s.append("ann", "before the disk filled")
    real_write = journal.os.write

    def half_then_enospc(fd, data):
        real_write(fd, bytes(data)[: len(data) // 2])
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(journal.os, "write", half_then_enospc)
    monkeypatch.setattr(journal.os, "ftruncate", lambda fd, n: (_ for _ in ()).throw(OSError(errno.EIO, "EIO")))
    with pytest.raises(StoreError, match="free disk space"):
        s.append("ann", "refused: never acknowledged")
    monkeypatch.undo()
    s.append("ann", "acknowledged after the torn write")
    dies(h)
    with home(cfg) as again:
        texts = [t.text for t in again.store.turns("", "s")]
        assert texts == ["before the disk filled", "acknowledged after the torn write"]
        assert any("checksum" in w or "not a frame" in w for w in again.warnings), again.warnings
        assert list((cfg.home / "journal" / "damaged").iterdir()), "the damaged segment is kept aside"


def test_a_failed_write_is_cut_off_the_journal(cfg, monkeypatch):
    import pager.journal as journal

    h = home(cfg)
    s = h.open("s")
    s.append("ann", "one")
    size = h.journal.path.stat().st_size
    real_write = journal.os.write
    monkeypatch.setattr(journal.os, "write", lambda fd, data: (real_write(fd, bytes(data)[:7]),
                                                                (_ for _ in ()).throw(OSError(errno.ENOSPC, "full")))[1])
    with pytest.raises(StoreError):
        s.append("ann", "two")
    monkeypatch.undo()
    assert h.journal.path.stat().st_size == size
    h.close()


@pytest.mark.parametrize("bad", [
    {"op": "turn", "session": "s", "user": "", "turn": "7", "speaker": "x", "text": "t", "role": "user",
     "date": "", "ts": 0.0, "ref": ""},                                     # a string turn number
    {"op": "turn", "session": "s", "user": "", "turn": 7},                   # missing fields
    {"op": "teleport", "session": "s", "user": ""},                          # unknown op
    "not even an object",
])
def test_a_malformed_record_is_reported_and_the_rest_recovered(cfg, bad):
    h = home(cfg)
    s = h.open("s")
    s.append("ann", "good one")
    path = h.journal.path
    dies(h)
    with open(path, "ab") as fh:
        fh.write(frame([bad]))
        fh.write(frame([{"op": "turn", "session": "s", "user": "", "turn": 2, "speaker": "ann", "text": "good two",
                         "role": "user", "date": "", "ts": 0.0, "ref": ""}]))
    (cfg.home / "journal" / "odd.wal").mkdir()       # a folder where a segment would be
    (cfg.home / "journal" / "odd.jsonl").mkdir()
    with home(cfg) as again:
        assert [t.text for t in again.store.turns("", "s")] == ["good one", "good two"]
        assert any(path.name in w and "offset" in w for w in again.warnings), again.warnings
        healthy(again, "s")


def test_a_version_1_segment_is_recovered(cfg):
    h = home(cfg)
    h.open("s").append("ann", "from this release")
    dies(h)
    legacy = cfg.home / "journal" / "00000000000000000001-1.jsonl"
    record = {"v": 1, "op": "turn", "session": "s", "turn": 2, "speaker": "old", "text": "from release 0.1",
              "role": "user", "date": "", "ts": 0.0, "ref": "", "user": ""}
    legacy.write_text(json.dumps(record) + "\n" + '{"v": 1, "op": "tu')  # and a torn last line
    with home(cfg) as again:
        assert [t.text for t in again.store.turns("", "s")] == ["from this release", "from release 0.1"]


def test_frames_skip_damage_and_wait_for_a_live_tail(tmp_path):
    path = tmp_path / "x.wal"
    one, two = frame([{"op": "pin", "user": "", "session": "s", "page": 1, "pinned": True}]), frame(
        [{"op": "pin", "user": "", "session": "s", "page": 2, "pinned": False}])
    path.write_bytes(one + two[:10])
    live = read_segment(path)
    assert len(live.ops) == 1 and live.end == len(one) and not live.damage  # the tail is still being written
    dead = read_segment(path, final=True)
    assert len(dead.ops) == 1 and not dead.damage  # a torn tail: never acknowledged
    damaged = bytearray(one + two)
    damaged[len(one) + 30] ^= 0xFF
    path.write_bytes(bytes(damaged) + one)
    read = read_segment(path)
    assert [op["page"] for op in read.ops] == [1, 1] and len(read.damage) == 1
    assert zlib.crc32(b"") == 0  # (framing uses CRC-32 of the body)


def test_ingest_is_one_transaction(cfg, monkeypatch):
    import pager.journal as journal

    h = home(cfg)
    a, b = h.open("a"), h.open("b")
    real_write = journal.os.write

    def killed_mid_write(fd, data):
        real_write(fd, bytes(data)[: len(data) * 2 // 3])
        raise SystemExit  # SIGKILL in the middle of the frame

    monkeypatch.setattr(journal.os, "write", killed_mid_write)
    with pytest.raises(SystemExit):
        h.accept({a: [{"text": f"a{i}"} for i in range(1200)], b: [{"text": f"b{i}"} for i in range(300)]})
    monkeypatch.undo()
    dies(h)
    with home(cfg) as again:
        assert again.store.turn_count("", "a") == 0 and again.store.turn_count("", "b") == 0


def test_messages_with_a_known_key_are_not_stored_twice(cfg):
    messages = [{"text": f"line {i}", "key": f"k{i}"} for i in range(5)]
    with home(cfg) as h:
        s = h.open("s")
        first = s.append_many(messages[:3])
    with home(cfg) as h:
        s = h.open("s")
        again = s.append_many(messages)  # a retry of the whole file after a partial run
        assert [t.turn for t in again] == [1, 2, 3, 4, 5]
        assert [t.turn for t in first] == [1, 2, 3]
        assert [t.turn for t in s.append_many(messages[4:])] == [5]
    with home(cfg) as h:
        assert [t.text for t in h.store.turns("", "s")] == [f"line {i}" for i in range(5)]


def test_a_retry_after_the_store_refused_adds_nothing_twice(cfg, monkeypatch):
    from pager.formats import keyed

    lines = keyed([{"speaker": "ann", "text": f"imported {i}"} for i in range(40)])
    h = home(cfg)
    monkeypatch.setattr(h.store, "put", lambda batch, fence=None: (_ for _ in ()).throw(StoreError("read-only store")))
    h.open("s").append_many(lines)
    with pytest.raises(StoreError):
        h.close()  # the user sees an error and runs the import again
    monkeypatch.undo()
    with home(cfg) as again:
        again.open("s").append_many(lines)
    with home(cfg) as h:
        assert [t.text for t in h.store.turns("", "s")] == [f"imported {i}" for i in range(40)]


def test_two_runs_never_share_a_trace_file(tmp_path):
    paths = {new_trace_path(tmp_path, "", name, "chat") for name in ("a/b", "a_b", "a b", "a/b", "a/b")}
    assert len(paths) == 5
    assert all(p.exists() for p in paths)


def test_export_round_trips_through_ingest(cfg, tmp_path):
    from pager.export import export_turns
    from pager.formats import parse_jsonl

    with home(cfg) as h:
        s = h.open("s")
        s.append_many([{"speaker": "Maya", "text": "We chose Yjs.\nTwo lines, \"quotes\" and ünïcode.",
                        "date": "8 May 2023", "ref": "D1:1"},
                       {"speaker": "assistant", "role": "assistant", "text": "Noted.", "ts": 1683540000.5}])
        live = home(cfg)
        live.open("s").append("bob", "still in a live journal")
        out = tmp_path / "s.jsonl"
        count = export_turns(h, "", "s", out)
    assert count == 3
    groups = parse_jsonl(out, "copy")
    with home(cfg) as h:
        h.open("copy").append_many(groups["copy"])
    live.close()
    with home(cfg) as h:
        original, copy = h.store.turns("", "s"), h.store.turns("", "copy")
    fields = lambda t: (t.turn, t.speaker, t.text, t.role, t.date, t.ts, t.ref)  # noqa: E731
    assert [fields(t) for t in copy] == [fields(t) for t in original[:3]]
    assert out.read_text().count("\n") == 3 and os.path.getsize(out) > 0
    with home(cfg) as h:  # a session's own export imported back into it adds nothing
        assert h.accept({h.open("s"): parse_jsonl(out, "s")["s"]}).new[h.open("s")] == 0
        h.open("s").append("ann", "a new turn after the export")
        lines = parse_jsonl(out, "s")["s"]
        edited = {k: v for k, v in lines[0].items() if k != "key"}
        edited["text"] += " (edited)"
        assert h.accept({h.open("s"): [edited] + lines[1:]}).new[h.open("s")] == 1  # only the edited line


def test_processes_with_other_models_cut_the_same_pages(cfg):
    """A chat on a gpt-4o model (o200k tokens) and an MCP server with no model (cl100k) on one
    session: the session's first transaction fixes how its pages are cut, for both."""
    words = "the quick brown fox jumps over the lazy dog while Zürich 会話 tokens differ ".split()
    a = home(cfg.with_(model="gpt-4o-mini"))
    b = home(cfg)
    sa, sb = a.open("s"), b.open("s")  # both open before anything is written
    for i in range(40):
        (sa if i % 3 else sb).append("ann", " ".join(words[(i + j) % len(words)] for j in range(25)) + f" {i}")
    sb.sync()
    assert sa.packer.tokenizer.name == sb.packer.tokenizer.name == "cl100k_base"
    assert [p.text for _, p in sorted(sa.pages.items())] == [p.text for _, p in sorted(sb.pages.items())]
    a.close()
    b.close()
    with home(cfg.with_(model="gpt-4o-mini")) as h:
        assert h.open("s").packer.tokenizer.name == "cl100k_base"
        healthy(h, "s")


def test_pager_ingest_twice_says_what_was_new(tmp_path):
    from typer.testing import CliRunner

    from pager.cli.app import app

    data = tmp_path / "c.jsonl"
    data.write_text("".join(json.dumps({"speaker": "ann", "text": f"line {i}"}) + "\n" for i in range(30)))
    run = lambda: CliRunner().invoke(app, ["--home", str(tmp_path / "h"), "ingest", str(data), "-s", "c"],  # noqa: E731
                                     env={"PAGER_EMBEDDER": "hash"})
    first, second = run(), run()
    assert first.exit_code == second.exit_code == 0, first.output + second.output
    assert "c: 30 new turns → 30 turns" in first.output
    assert "c: 0 new turns, 30 already held → 30 turns" in second.output
    with data.open("a") as fh:  # lines added to the file later are the only ones taken
        fh.write(json.dumps({"speaker": "ann", "text": "line 30"}) + "\n")
    assert "c: 1 new turn, 30 already held → 31 turns" in run().output
