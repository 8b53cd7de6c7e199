"""Two homes (hosts) on one store take turns writing one session, handing the lease over when idle
(PAGER_LEASE_IDLE_S); each round one of them is killed with SIGKILL in the middle of a burst (after
a seeded number of acknowledgements: an event, not a clock), the other writes over its lapsed lease,
and the killed one restarts while the other writes. Afterwards every acknowledged turn, state
change, fact and bookmark is stored exactly once, each home's in the order acknowledged, numbers
without gaps, and what the facts and bookmarks point at is the turn they were made for."""

import json
import os
import random
import signal
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

from harness import kills, seed_for
from pager import fsck
from pager.config import Config
from pager.embed import HashEmbedder
from pager.home import Home

WRITER = Path(__file__).with_name("handover.py")


class Writer:
    """One process of a home, driven through handover.py."""

    def __init__(self, home: Path, name: str, seed: int, serial: int, env: dict) -> None:
        self.err = tempfile.TemporaryFile(mode="w+")
        self.proc = subprocess.Popen([sys.executable, str(WRITER), str(home), name, str(seed), str(serial)],
                                     stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=self.err, text=True,
                                     env={**os.environ, **env})
        self.started = False
        self.restart = False

    def ready(self) -> dict:
        line = self.proc.stdout.readline()
        assert line, self.stderr()
        self.started = True
        return json.loads(line)

    def burst(self, k: int, kill_at: int | None = None) -> list[dict]:
        """k ops; with kill_at, SIGKILL once that many are acknowledged. Returns the acknowledged ones."""
        self.proc.stdin.write(f"burst {k}\n")
        self.proc.stdin.flush()
        acks: list[dict] = []
        while True:
            line = self.proc.stdout.readline()
            assert line, f"the writer died: {self.stderr()}"
            if line.strip() == "done":
                return acks
            if line.strip() == "restart":   # its lease lapsed under unflushed ops: its next process recovers them
                self.proc.wait()
                self.restart = True
                return acks
            acks.append(json.loads(line))
            if kill_at is not None and len(acks) == kill_at:
                os.kill(self.proc.pid, signal.SIGKILL)
                self.proc.wait()
                return acks

    def close(self) -> None:
        self.proc.stdin.write("close\n")
        self.proc.stdin.flush()
        assert self.proc.stdout.readline().strip() == "closed", self.stderr()
        self.proc.wait()

    def stderr(self) -> str:
        self.err.seek(0)
        return self.err.read()[-3000:]


@pytest.fixture(params=["disk", "s3"])
def store(request, tmp_path):
    if request.param == "disk":
        return request.param, {"PAGER_DB": str(tmp_path / "store")}
    env, uri = request.getfixturevalue("s3")
    return request.param, {**env, "PAGER_DB": uri}


def test_homes_handing_a_lease_over_and_killed_mid_burst_lose_nothing(store, tmp_path, request):
    kind, env = store
    env = {**env, "PAGER_EMBEDDER": "hash"}
    seed = seed_for("handover", kind)
    rng = random.Random(seed)
    rounds = kills(request, short=2, long=8)
    acks: dict[str, list[dict]] = {"a": [], "b": []}
    serial = iter(range(0, 10**9, 10**6))
    writers: dict[str, Writer] = {}
    paths: list[str] = []
    try:
        for name in "ab":   # one after the other: two processes creating one store on plain S3 at once conflict
            writers[name] = Writer(tmp_path / name, name, seed_for(seed, name), next(serial), env)
            writers[name].ready()
        for round_ in range(rounds):
            victim, other = ("a", "b") if round_ % 2 == 0 else ("b", "a")
            k = rng.randint(3, 12)
            acks[victim] += writers[victim].burst(k, kill_at=rng.randint(1, k))
            # the other home writes over the lapsed lease while the killed one restarts
            restarted = Writer(tmp_path / victim, victim, seed_for(seed, victim, round_), next(serial), env)
            acks[other] += writers[other].burst(rng.randint(3, 12))
            writers[victim] = restarted
            ready = restarted.ready()
            paths.append("recovered at start" if ready["ready"] else "waited for the lease" if ready["waiting"]
                         else "nothing to recover")
            acks[victim] += restarted.burst(rng.randint(1, 8))
            for name, w in list(writers.items()):   # a live writer whose lease lapsed under unflushed ops
                if w.restart:
                    paths.append(f"{name} lost its lease alive")
                    writers[name] = Writer(tmp_path / name, name, seed_for(seed, name, round_, "again"), next(serial),
                                           env)
                    writers[name].ready()
        for w in writers.values():
            w.close()
        for name in "ab":   # a writer whose lease lapsed under unflushed ops keeps them for its home's next process
            last = Writer(tmp_path / name, name, 0, next(serial), env)
            if last.ready()["ready"]:
                paths.append(f"{name} recovered at the last start")
            last.close()
        _verify(tmp_path, env, acks)
    except AssertionError as exc:
        if os.environ.get("HANDOVER_DUMP"):   # for a person chasing a failure: the acknowledgements and the store
            with Home(Config.load(env=env, home=tmp_path / "dump"), embedder=HashEmbedder(), read_only=True) as dump:
                turns = [(t.turn, t.text[:12], t.ts) for t in dump.store.turns("", "s")]
            errs = {name: w.stderr() for name, w in writers.items()}
            Path(os.environ["HANDOVER_DUMP"]).write_text(json.dumps({"acks": acks, "paths": paths, "turns": turns,
                                                                     "stderr": errs}))
        raise AssertionError(f"seed {seed} ({kind}), paths {paths}: {exc}") from exc
    finally:
        for w in writers.values():
            if w.proc.poll() is None:
                w.proc.kill()
                w.proc.wait()
    print(f"\n{kind}: {rounds} kills, {sum(map(len, acks.values()))} acknowledged ops, recovery paths {paths}")


def _verify(tmp_path: Path, env: dict, acks: dict[str, list[dict]]) -> None:
    config = Config.load(env=env, home=tmp_path / "reader", budget=2048, page_tokens=128)
    with Home(config, embedder=HashEmbedder(), read_only=True) as reader:
        report = fsck.check(reader, "", "s")
        assert report.ok, report.problems
        turns = reader.store.turns("", "s")
        assert [t.turn for t in turns] == list(range(1, len(turns) + 1))
        number: dict[str, list[int]] = {}
        for t in turns:
            number.setdefault(t.text.split(" says ", 1)[0], []).append(t.turn)
        changes = reader.store.state_changes("", "s")
        facts = reader.store.facts("", "s")
        marks = reader.store.bookmarks("", "s")
        assert [c.seq for c in changes] == list(range(1, len(changes) + 1))
        assert [f.n for f in facts] == list(range(1, len(facts) + 1))
        s = reader.open("s")
        for name, acked in acks.items():
            order: dict[str, list[int]] = {"turn": [], "state": [], "fact": []}
            for ack in acked:
                tag = ack["tag"]
                if ack["kind"] == "turn":
                    assert len(number.get(tag, [])) == 1, f"turn {tag}: stored {len(number.get(tag, []))} times"
                    order["turn"].append(number[tag][0])
                elif ack["kind"] == "state":
                    held = [c for c in changes if c.value == tag]
                    assert len(held) == 1 and held[0].key == ack["key"], f"state change {tag}: {held}"
                    order["state"].append(held[0].seq)
                elif ack["kind"] == "fact":
                    held_facts = [f for f in facts if f.text == f"{tag} is a fact"]
                    assert len(held_facts) == 1, f"fact {tag}: stored {len(held_facts)} times"
                    assert held_facts[0].turns == tuple(number[ack["about"]]), (tag, held_facts[0], number[ack["about"]])
                    order["fact"].append(held_facts[0].n)
                else:
                    held_marks = [m for m in marks if tag in m.keywords]
                    assert len(held_marks) == 1, f"bookmark {tag}: stored {len(held_marks)} times"
                    about = number[ack["about"]][0]
                    assert set(held_marks[0].pages) & set(s.turn_pages({about})[about][0]), (
                        f"bookmark {tag} on {held_marks[0].pages}, its turn {about} on {s.turn_pages({about})}")
            for what, numbers in order.items():
                assert numbers == sorted(numbers), f"home {name}'s {what}s out of the order acknowledged: {numbers}"
    for name in ("a", "b"):
        left = list((tmp_path / name).rglob("*.wal"))
        assert not left, f"journal segments left in home {name}: {left}"
