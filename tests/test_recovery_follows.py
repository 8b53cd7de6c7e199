"""A dead lease holder's state changes, facts, summaries, bookmarks and pins, when another home numbered
over its turns: recovery keeps its turns after the last one (test_leases.py); what its other ops refer
to follows them, and an op whose number the other home gave its own is kept after it, not dropped."""

import json
import os
import signal
import subprocess
import sys

from pager.config import Config
from pager.embed import HashEmbedder
from pager.facts import Draft
from pager.fsck import check
from pager.home import Home
from pager.summaries import Draft as SummaryDraft
from test_leases import shared  # noqa: F401 - the fixture: a store on disk, on S3, on S3 with DynamoDB

HOLDER = """
import json, sys
from pager.config import Config
from pager.embed import HashEmbedder
from pager.facts import Draft
from pager.home import Home
from pager.summaries import Draft as SummaryDraft
home = Home(Config.load(home=sys.argv[1], lease_s=1.0, budget=2048, page_tokens=128), embedder=HashEmbedder())
s = home.open("s")
for i in range(9):
    s.append("ann", f"host a {i}: " + " ".join(f"alpha{i}w{j}" for j in range(6)))
s.set_state("city", "Lisbon")
s.add_facts([Draft("venue", "The venue is Lisbon", (4,))], "model")
s.add_summaries([SummaryDraft("episode", "e1", "Host a planned the trip to Lisbon", (1, 9))], "model")
s.bookmark([2], ["alphamark"])
s.pin(2)
print(json.dumps({"p2": [t for t, _, _ in s.pages[2].spans]}), flush=True)
print("holding", flush=True)
sys.stdin.read()
"""


def _holder_killed(home, env: dict) -> list[str]:
    """Host a's holder acknowledges nine turns and one op of every other kind, then is killed with
    SIGKILL (once it says it holds: an event). Returns the texts its page p2 held."""
    child = subprocess.Popen([sys.executable, "-c", HOLDER, str(home)], env={**os.environ, **env},
                             stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    said = child.stdout.readline()
    assert child.stdout.readline().strip() == "holding", child.stderr.read()
    os.kill(child.pid, signal.SIGKILL)
    child.wait()
    return [f"host a {t - 1}: " for t in json.loads(said)["p2"]]


def _host_b_writes(b: Home) -> None:
    s = b.open("s")
    for i in range(6):
        s.append("bob", f"host b {i}: " + " ".join(f"beta{i}w{j}" for j in range(6)))
    s.set_state("city", "Paris")
    s.add_facts([Draft("caterer", "Catering by Marco", (2,))], "model")
    s.add_summaries([SummaryDraft("episode", "e1", "Host b booked the caterer", (1, 6))], "model")


def _number(reader: Home, prefix: str) -> int:
    return next(t.turn for t in reader.store.turns("", "s") if t.text.startswith(prefix))


def _pages_of(reader: Home, turn: int) -> set[int]:
    pages, _ = reader.store.pages("", "s", with_vectors=False)
    s = reader.open("s")
    held = {p.n for p in pages if turn in p.turns}
    return held | ({s.tail_n} if any(piece.turn.turn == turn for piece in s.packer.pieces) else set())


def test_a_dead_holders_other_ops_follow_its_turns_and_are_kept_once(shared, tmp_path):  # noqa: F811
    """Before, host a's acknowledged state change, fact and summary were dropped (host b had used their
    numbers: the store keeps the first record of a number), and its bookmark and pin pointed at host
    b's page p2 instead of the page that now holds what host a's p2 held."""
    config, env = shared
    p2 = _holder_killed(tmp_path / "a", {**env, "PAGER_HOME": str(tmp_path / "a")})
    with Home(config("b", lease_wait_s=120, page_tokens=128), embedder=HashEmbedder()) as b:
        _host_b_writes(b)
    with Home(config("a", page_tokens=128), embedder=HashEmbedder()) as a:
        assert a.recovered == 9, a.warnings
    for _ in range(2):   # a second recovery of the same ops (a restart) adds nothing
        with Home(config("a", page_tokens=128), embedder=HashEmbedder()) as a:
            assert a.recovered == 0
    with Home(config("c", page_tokens=128), embedder=HashEmbedder(), read_only=True) as reader:
        assert check(reader, "", "s").ok, check(reader, "", "s").problems
        last_a, fourth_a = _number(reader, "host a 8: "), _number(reader, "host a 3: ")
        assert last_a == 15 and fourth_a == 10
        changes = [(c.seq, c.key, c.value, c.turn) for c in reader.store.state_changes("", "s")]
        assert changes == [(1, "city", "Paris", 6), (2, "city", "Lisbon", last_a)]
        lisbon = reader.store.state_changes("", "s")[1]
        assert lisbon.page in _pages_of(reader, last_a)
        facts = {f.subject: f for f in reader.store.facts("", "s")}
        assert [f.n for f in reader.store.facts("", "s")] == [1, 2] and set(facts) == {"caterer", "venue"}
        assert facts["venue"].turns == (fourth_a,) and set(facts["venue"].pages) == _pages_of(reader, fourth_a)
        summaries = {x.text: x for x in reader.store.summaries("", "s")}
        ours = summaries["Host a planned the trip to Lisbon"]
        assert ours.n == 2 and ours.turns == (7, last_a) and (ours.key, ours.version) == ("e7", 1)
        assert ours.pages == (min(_pages_of(reader, 7)), max(_pages_of(reader, last_a)))
        assert summaries["Host b booked the caterer"].key == "e1"
        mark = next(m for m in reader.store.bookmarks("", "s") if "alphamark" in m.keywords)
        pages, _ = reader.store.pages("", "s", with_vectors=False)
        by_n = {p.n: p for p in pages}
        held = [reader.store.turns("", "s")[t - 1].text for n in mark.pages for t in by_n[n].turns]
        assert all(any(text.startswith(prefix) for text in held) for prefix in p2), (mark.pages, p2, held)
        assert all(text.startswith("host a") for text in held)
        s = reader.open("s")
        assert sorted(n for n, e in s.table.items() if e.pinned) == sorted(mark.pages)


def test_a_dead_holders_state_change_is_kept_when_another_home_used_its_number_without_writing_turns(tmp_path):
    """Host b wrote no turn, only a state change and a fact, numbered where host a's dead ones were:
    no turn was numbered over, and host a's were dropped all the same. Host a restarts while b still
    holds the lease; its first write (a state change) recovers them first, and is numbered after."""
    store = str(tmp_path / "store")
    env = {"PAGER_EMBEDDER": "hash", "PAGER_DB": store}
    _holder_killed(tmp_path / "a", {**env, "PAGER_HOME": str(tmp_path / "a")})

    def config(name: str, **kw) -> Config:
        return Config.load(env=env, home=tmp_path / name, budget=2048, page_tokens=128, **kw)

    b = Home(config("b", lease_wait_s=120), embedder=HashEmbedder())
    sb = b.open("s")
    sb.set_state("city", "Paris")
    sb.add_facts([Draft("caterer", "Catering by Marco", (2,))], "model")
    b.flush()
    a = Home(config("a"), embedder=HashEmbedder())   # b holds the lease: its recovery waits for a write
    assert a.recovered == 0
    sa = a.open("s")
    with Home(config("a"), embedder=HashEmbedder(), read_only=True) as reader:   # `pager inspect` meanwhile
        r = reader.open("s")   # shows what the writer shows: none of the dead ops, not some at numbers they lose
        assert (r.turn_count, r.state.values(), len(r.facts)) == (sa.turn_count, sa.state.values(), len(sa.facts))
        assert (r.turn_count, r.state.values(), len(r.facts)) == (0, {"city": "Paris"}, 1)
    b.close()
    sa.set_state("pet", "cat")
    assert sa.state.values() == {"city": "Lisbon", "pet": "cat"}
    a.close()
    with Home(config("c"), embedder=HashEmbedder(), read_only=True) as reader:
        assert [(c.seq, c.key, c.value) for c in reader.store.state_changes("", "s")] == [
            (1, "city", "Paris"), (2, "city", "Lisbon"), (3, "pet", "cat")]
        assert [(f.n, f.subject) for f in reader.store.facts("", "s")] == [(1, "caterer"), (2, "venue")]
        assert check(reader, "", "s").ok
