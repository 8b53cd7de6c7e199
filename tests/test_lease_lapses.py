"""A lease that runs out under a write, across hosts sharing a store: a lease is counted from before
its commit, renewed while the home flushes and before each flush writes; a holder stalled past its lease
(its store slow or away) keeps its acknowledged turns for its next process while the new holder writes;
a stale write landing late costs no turn; a session lost to another home does not stop the flush of the
others; a message or a tier record built under a lease that ran out is numbered again, once, or refused."""

import threading
import time

import pytest

from pager import fsck
from pager.config import Config
from pager.embed import HashEmbedder
from pager.errors import LeaseHeld
from pager.fsck import check
from pager.home import Home
from pager.store import Batch

from test_leases import texts
from test_store_outage import Outage


class _Clock:
    def __init__(self) -> None:
        self.t = 1000.0

    def __call__(self) -> float:
        return self.t


class _SlowLeases:
    """A store's leases whose compare-and-swap takes `delay` seconds of the clock to come back (S3 under load)."""

    def __init__(self, clock: _Clock) -> None:
        self.rows: dict = {}
        self.clock = clock
        self.delay = 0.0

    def swap_lease(self, user, session, change):
        entry, result = change(self.rows.get((user, session)))
        self.clock.t += self.delay
        if entry is None:
            self.rows.pop((user, session), None)
        else:
            self.rows[(user, session)] = entry
        return result


def test_a_lease_is_trusted_from_before_its_commit_not_from_when_it_came_back(monkeypatch):
    """A home counted its lease from when the store's commit came back, while the lease ran from before
    it: with a commit taking 2.5 s of a 3 s lease, it kept writing 0.5 s past the expiry, beside the
    home that had taken the lease over (a suspect for the turn the handover test on S3 under load stored twice)."""
    from pager.errors import LeaseHeld
    from pager.lease import Leases

    monkeypatch.setattr(Leases, "_start", lambda self: None)   # no renewal thread: the clock is ours
    clock = _Clock()
    store = _SlowLeases(clock)
    a = Leases(lambda: store, "a", lease_s=3.0, wait_s=0.0, clock=clock)
    b = Leases(lambda: store, "b", lease_s=3.0, wait_s=0.0, clock=clock)
    store.delay = 2.5
    assert a.ensure("", "s")          # claimed at 1000.0, came back at 1002.5: it expires at 1003.0
    store.delay = 0.0
    clock.t = 1003.2
    assert b.ensure("", "s")          # lapsed: b takes it over
    with pytest.raises(LeaseHeld):
        a.ensure("", "s")             # a asks the store again, and is refused, instead of writing beside b


class _LeaseTable:
    """A store's leases table in memory; says when a lease is renewed while the home's idle flush runs."""

    def __init__(self) -> None:
        import threading

        self.rows: dict = {}
        self.lock = threading.Lock()
        self.flushing = threading.Event()
        self.renewed_while_flushing = threading.Event()

    def _lease_slot(self, user, session) -> int:
        return 0

    def swap_lease(self, user, session, change):
        return self.swap_leases([(user, session)], change)[(user, session)]

    def swap_leases(self, keys, change):
        with self.lock:
            out = {}
            for key in keys:
                entry, out[key] = change(self.rows.get(key))
                if entry is None:
                    self.rows.pop(key, None)
                else:
                    self.rows[key] = entry
                    if self.flushing.is_set():
                        self.renewed_while_flushing.set()
            return out


def test_a_lease_is_renewed_while_the_home_flushes_before_giving_it_up():
    """The lease thread flushed the idle home itself before giving the lease up, and renewed nothing
    meanwhile: a flush slower than the lease (S3 under load) let it lapse, another home took it and
    numbered its turns over those being flushed (the handover test lost an acknowledged turn on S3)."""
    from pager.lease import Leases

    table = _LeaseTable()
    given: list = []

    def flush_then_give_up(keys):   # WritePath.release_idle, with a flush that ends once a renewal was seen
        table.flushing.set()
        table.renewed_while_flushing.wait(60)
        given.extend(leases.give_up(keys))

    leases = Leases(lambda: table, "a", lease_s=0.3, wait_s=0.0, idle_s=0.05, on_idle=flush_then_give_up)
    try:
        leases.ensure("", "s")
        assert table.renewed_while_flushing.wait(60), "the lease was not renewed while the home flushed"
        while not given:
            table.renewed_while_flushing.wait(0.05)   # the event: the lease given up after the flush
        assert given == [("", "s")] and ("", "s") not in table.rows and ("", "s") not in leases.held
    finally:
        leases.stop()


def test_a_home_whose_lease_lapsed_under_unflushed_turns_keeps_them_for_its_next_process(tmp_path):
    """Host a stalls (nothing renews its lease: a pause, a network cut off from the store) with three
    acknowledged turns not yet flushed; host b takes the lapsed lease and writes turn 1. Host a's next
    write took the lease back as if it had never lost it, numbered turn 4, and its flush stored turns
    2-4: its acknowledged turn 1 was lost (the store keeps the first record of a number) and its pages
    did not hold b's turn. Now the write is refused naming the fix, and the next process of home a
    recovers the three after b's turn, as a dead process's."""
    from pager.config import Config
    from pager.errors import StoreError

    store = str(tmp_path / "store")

    def config(name: str, **kw):
        return Config.load(env={"PAGER_EMBEDDER": "hash", "PAGER_DB": store}, home=tmp_path / name, budget=2048, **kw)

    a = Home(config("a", lease_s=1.0), embedder=HashEmbedder())
    sa = a.open("s")
    for i in range(3):
        sa.append("ann", f"a {i}")
    a.leases.stop()   # the stall: host a lives on, its lease is no longer renewed
    with Home(config("b", lease_wait_s=120), embedder=HashEmbedder()) as b:
        assert b.open("s").append("bob", "b 0").turn == 1   # waited for the lapse; a's turns are in no store
    with pytest.raises(StoreError, match="restart this process"):
        sa.append("ann", "a 3")
    a.close()
    with Home(config("a"), embedder=HashEmbedder()) as again:
        assert again.recovered == 3, again.warnings
    with Home(config("c"), embedder=HashEmbedder(), read_only=True) as reader:
        assert texts(reader, "s") == ["b 0", "a 0", "a 1", "a 2"]
        assert check(reader, "", "s").ok


def test_a_flush_renews_the_lease_before_it_writes(tmp_path):
    """A flush trusted a lease renewed up to lease_s/3 before, so a store write slower than the two
    thirds left could finish after another home had taken the lapsed lease over and numbered its turns
    over the ones being written (the handover test on S3 under load). It renews first: the write has a
    whole lease."""
    from pager.config import Config

    config = Config.load(env={"PAGER_EMBEDDER": "hash", "PAGER_DB": str(tmp_path / "store")}, home=tmp_path / "a",
                         budget=2048)
    with Home(config, embedder=HashEmbedder()) as a:
        a.open("s").append("ann", "a turn to flush")
        seen = a.store.lease("", "s")["seen"]
        a.flush()
        assert a.store.lease("", "s")["seen"] > seen


LEASE_S = 1.0


def _config(env: dict, uri: str, home, **kw) -> Config:
    return Config.load(env={**env, "PAGER_EMBEDDER": "hash"}, home=home, db=uri, budget=2048, page_tokens=128,
                       flush_turns=100_000, lease_s=LEASE_S, lease_idle_s=0, **kw)


def _final(config: Config, session: str = "s") -> list[str]:
    """The session's turns once every home closed, checked from outside the engine (pager check)."""
    with Home(config, embedder=HashEmbedder(), read_only=True) as reader:
        report = fsck.check(reader, "", session)
        assert report.ok, report.problems
        reader.store.refresh()
        turns = reader.store.turns("", session)
        assert [t.turn for t in turns] == list(range(1, len(turns) + 1))
        return [t.text for t in turns]


def test_a_flush_stalled_past_its_lease_does_not_land_beside_the_new_holders_turns(s3, tmp_path):
    """A's flush passes its lease check, then stalls (its path to the store cut) until B has taken the
    lapsed lease, numbered its turns after the store's last and flushed them; A's path comes back and its
    write goes on. Before: A's turns landed at B's numbers, each stored twice. Now the store asks before
    each commit whether the lease still has time (WritePath.fence); A's write is stopped, its turns stay in
    its journal and its next process stores them after B's."""
    env, uri = s3
    outage = Outage(env["PAGER_S3_ENDPOINT"])
    try:
        a = Home(_config({**env, "PAGER_S3_ENDPOINT": outage.url}, uri, tmp_path / "a"), embedder=HashEmbedder())
        sa = a.open("s")
        said = [sa.append("ann", f"a flushed {i}").text for i in range(5)]
        a.flush()
        late = [sa.append("ann", f"a acknowledged {i}").text for i in range(3)]
        stalled, go, flushed = threading.Event(), threading.Event(), []
        append_new = a.store._append_new

        def stall_then_append(name, *args):
            if name == "turns" and not go.is_set():   # after the lease check and the refresh: the gap
                outage.cut()
                stalled.set()
                go.wait()
            return append_new(name, *args)

        a.store._append_new = stall_then_append

        def flush_a():
            try:
                a.flush()
                flushed.append("ok")
            except Exception as exc:  # noqa: BLE001 - asserted below
                flushed.append(exc)

        thread = threading.Thread(target=flush_a)
        thread.start()
        assert stalled.wait(60)
        config_b = _config(env, uri, tmp_path / "b", lease_wait_s=60)
        with Home(config_b, embedder=HashEmbedder()) as b:   # waits for A's lease to lapse (the event ends it)
            sb = b.open("s")
            mine = [sb.append("bob", f"b {i}") for i in range(3)]
            assert [t.turn for t in mine] == [6, 7, 8]
            b.flush()
        outage.restore()
        go.set()
        thread.join(60)
        # the fence stopped the stalled commit; the flush then took the lease again, learned that B wrote at
        # its numbers and kept its turns in its journal, not written (before the retry: refused in one line)
        assert flushed == ["ok"], flushed
        a.close()
        assert any("written the session at their numbers" in w for w in a.warnings), a.warnings
        # A's next process stores them after B's, in the order acknowledged
        with Home(_config(env, uri, tmp_path / "a"), embedder=HashEmbedder()) as again:
            assert again.recovered == 3
        assert _final(config_b) == said + [t.text for t in mine] + late
    finally:
        outage.close()


def test_a_stale_write_landing_before_the_new_holder_flushes_costs_none_of_its_turns(tmp_path):
    """B took the lapsed lease and numbered its turns; a write of A's that was under way before the lease
    lapsed lands now, at the same numbers (the store has no fencing token: a request in flight); then B
    flushes. Before: B's flush found the numbers taken, skipped its turns as written and removed the
    journal that held them: three acknowledged turns lost, and `pager check` said all was well. Now B
    compares what it wrote with what the store holds (WritePath.verify_written) and keeps its records for
    its next process, which stores them after the last."""
    uri = str(tmp_path / "store")
    a = Home(_config({}, uri, tmp_path / "a"), embedder=HashEmbedder())
    sa = a.open("s")
    said = [sa.append("ann", f"a flushed {i}").text for i in range(5)]
    a.flush()
    late = [sa.append("ann", f"a acknowledged {i}") for i in range(3)]
    a.leases.stop()   # A's path to the store is gone: no renewal; its lease lapses
    config_b = _config({}, uri, tmp_path / "b", lease_wait_s=60)
    b = Home(config_b, embedder=HashEmbedder())
    sb = b.open("s")
    mine = [sb.append("bob", f"b {i}") for i in range(3)]
    assert [t.turn for t in mine] == [6, 7, 8]
    a.store.put(Batch(turns=late))   # A's write in flight since before the lapse lands now
    b.flush()
    assert any("another home stored its own turns" in w for w in b.warnings), b.warnings
    with pytest.raises(Exception, match="restart this process"):
        sb.append("bob", "b after the clash")
    b.close()
    with Home(config_b, embedder=HashEmbedder()) as again:   # B's next process
        assert again.recovered == 3
    a.close()   # A's turns are in the store already: nothing written twice
    assert _final(config_b) == said + [t.text for t in late] + [t.text for t in mine]


def test_a_session_lost_to_another_home_does_not_stop_the_flush_of_the_others(tmp_path):
    """A holds sessions s and t with acknowledged turns of both in its journal; its renewals stop (the
    store away) long enough for B to take s and write it. Before: every flush of A's raised LeaseHeld for
    s, so t's turns never reached the store while B held s (and a write of t that triggered a flush was
    answered with s's error). Now s's records wait in A's journal, kept at close, and t is flushed."""
    uri = str(tmp_path / "store")
    config_a = _config({}, uri, tmp_path / "a")
    a = Home(config_a, embedder=HashEmbedder())
    sa, ta = a.open("s"), a.open("t")
    said = [sa.append("ann", f"a flushed {i}").text for i in range(5)]
    a.flush()
    late = [sa.append("ann", f"a acknowledged {i}").text for i in range(3)]
    other = [ta.append("ann", "t before the cut").text]
    renew = a.leases._renew_all
    a.leases._renew_all = lambda: None   # the store away: no renewal gets through
    config_b = _config({}, uri, tmp_path / "b", lease_wait_s=60)
    b = Home(config_b, embedder=HashEmbedder())
    sb = b.open("s")
    mine = [sb.append("bob", f"b {i}").text for i in range(3)]
    b.flush()
    a.leases._renew_all = renew   # the store is back
    other.append(ta.append("ann", "t after the store came back").text)
    a.flush()
    b.store.refresh()
    assert [t.text for t in b.store.turns("", "t")] == other
    assert any("wait in this home's journal" in w for w in a.warnings), a.warnings
    with pytest.raises(LeaseHeld):
        sa.append("ann", "a while b writes s")
    b.close()
    a.close()
    with Home(config_a, embedder=HashEmbedder()) as again:
        assert again.recovered == 3
    assert _final(config_b) == said + mine + late
    assert _final(config_b, "t") == other


def test_a_message_is_not_numbered_under_a_lease_that_ran_out_before_its_journal_write(tmp_path):
    """The lease was checked, then the home stalled (a slow store answering its catch-up, a pause) past
    the lease's expiry before the journal write, and meanwhile another home took the session and wrote
    turn 2. Before: the message was acknowledged as turn 2 too, numbered from what the store held before.
    Now the home takes the lease again, takes in what the other home wrote, and numbers after it (at
    first this was a refusal, which a loaded machine turned into failed writes: tests/reliability)."""
    store = str(tmp_path / "store")
    home = Home(_config({}, store, tmp_path / "a"), embedder=HashEmbedder())
    s = home.open("s")
    s.append("ann", "first")
    home.flush()
    late = [0.0]
    home.leases.clock = lambda: time.time() + late[0]
    sync = s.sync

    def stalled(*args, **kwargs):   # inside accept: after the lease check, before the journal write
        if not late[0]:
            late[0] = 2 * LEASE_S
            other = Home(_config({}, store, tmp_path / "b"), embedder=HashEmbedder())
            other.leases.clock = lambda: time.time() + late[0]   # A's lease has run out by B's clock too
            other.open("s").append("bob", "written by b meanwhile")
            other.close()
        return sync(*args, **kwargs)

    s.sync = stalled
    assert s.append("ann", "numbered after the lease ran out").turn == 3
    s.sync = sync
    home.close()
    assert _final(_config({}, store, tmp_path / "a")) == ["first", "written by b meanwhile",
                                                          "numbered after the lease ran out"]


def test_a_message_whose_every_numbering_outlasts_the_lease_is_refused_and_nothing_of_it_kept(tmp_path):
    """A store so slow that the lease runs out during each numbering: refused in one line naming the
    setting, nothing of the message accepted; the next message, on a store that answers, is turn 2."""
    home = Home(_config({}, str(tmp_path / "store"), tmp_path / "a"), embedder=HashEmbedder())
    s = home.open("s")
    s.append("ann", "first")
    late = [0.0]
    home.leases.clock = lambda: time.time() + late[0]
    sync = s.sync

    def stalled(*args, **kwargs):
        late[0] += 2 * LEASE_S
        return sync(*args, **kwargs)

    s.sync = stalled
    with pytest.raises(Exception, match="lease ran out before the message was written") as refused:
        s.append("ann", "never numbered in time")
    assert "\n" not in str(refused.value) and "PAGER_LEASE_S" in str(refused.value)
    with pytest.raises(Exception, match="lease ran out before the message was written"):
        s.set_state("city", "Lisbon")
    s.sync = sync
    assert s.append("ann", "second").turn == 2
    assert s.state.current == {}
    home.close()
    assert _final(_config({}, str(tmp_path / "store"), tmp_path / "a")) == ["first", "second"]


def test_state_and_facts_built_again_under_a_lease_taken_again_are_written_once(tmp_path):
    """A state change or a batch of facts is built under the session's lock; when the lease ran out while
    it was built, the home takes the lease again and builds it again, from scratch: once, not twice."""
    from pager.facts import Draft

    home = Home(_config({}, str(tmp_path / "store"), tmp_path / "a"), embedder=HashEmbedder())
    s = home.open("s")
    s.append("ann", "the venue is Lisbon")
    late = [0.0]
    home.leases.clock = lambda: time.time() + late[0]
    sync, stalls = s.sync, [0]

    def stalled_once_per_write(*args, **kwargs):
        stalls[0] += 1
        if stalls[0] % 2:   # the first numbering of each write outlasts the lease; the second does not
            late[0] += 2 * LEASE_S
        return sync(*args, **kwargs)

    s.sync = stalled_once_per_write
    made = s.add_facts([Draft("venue", "The venue is Lisbon", (1,))], "model")
    change = s.set_state("city", "Lisbon")
    s.sync = sync
    assert stalls[0] == 4, stalls   # each write was built twice
    assert [f.n for f in made] == [1] and [f.n for f in s.facts.items] == [1]
    assert change is not None and change.seq == 1 and s.state.current["city"].value == "Lisbon"
    home.close()
    with Home(_config({}, str(tmp_path / "store"), tmp_path / "a"), embedder=HashEmbedder()) as again:
        t = again.open("s")
        assert [f.text for f in t.facts.items] == ["The venue is Lisbon"]
        assert [c.seq for c in t.state.changes] == [1]


def test_a_flush_the_fence_stopped_takes_the_lease_again_and_writes_once(tmp_path):
    """A flush whose commit came after its lease ran out by the home's clock (a store slow for a moment,
    a loaded machine) was refused outright, and recovery's flush with it: a home opening on a busy machine
    failed to start (tests/reliability/test_handover.py beside two busy loops). Now the home takes the
    lease again and flushes again; only a store slow at every try is refused, and nothing is lost."""
    from pager.errors import LeaseLapsed

    home = Home(_config({}, str(tmp_path / "store"), tmp_path / "a"), embedder=HashEmbedder())
    s = home.open("s")
    s.append_many([{"speaker": "ann", "text": f"turn {i} about the venue"} for i in range(5)])
    late, puts = [0.0], []
    home.leases.clock = lambda: time.time() + late[0]
    put = home.store.put

    def slow_put(batch, fence=None):
        puts.append(len(batch.turns))
        if len(puts) % 2:   # the first try of each flush outlasts the lease
            late[0] += 2 * LEASE_S
        return put(batch, fence)

    home.store.put = slow_put
    home.flush()
    assert puts == [5, 5]
    assert [t.turn for t in home.store.turns("", "s")] == [1, 2, 3, 4, 5]

    def always_slow(batch, fence=None):
        late[0] += 2 * LEASE_S
        return put(batch, fence)

    s.append("ann", "acknowledged while the store crawls")
    home.store.put = always_slow
    with pytest.raises(LeaseLapsed, match="PAGER_LEASE_S"):
        home.flush()
    home.store.put = put
    home.close()
    assert _final(_config({}, str(tmp_path / "store"), tmp_path / "a")) == (
        [f"turn {i} about the venue" for i in range(5)] + ["acknowledged while the store crawls"])
