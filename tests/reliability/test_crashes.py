"""SIGKILL at random points, many times: every acknowledged turn is there exactly once afterwards."""

import random
import time

import pytest

from harness import kills, run_until_killed, seed_for
from pager import fsck
from pager.config import Config
from pager.embed import HashEmbedder
from pager.home import Home


def _verify(home_path, sessions, acked):
    config = Config(home=home_path, embedder="hash", budget=2048)
    with Home(config, embedder=HashEmbedder()) as home:
        for session in sessions:
            s = home.open(session)
            home.flush()
            turns = home.store.turns("", session)
            # the driver's texts are unique (seed and counter); the offline shell's replies may repeat
            texts = [t.text for t in turns if t.text.startswith(f"{session} seed")]
            assert len(texts) == len(set(texts)), f"{session}: a turn is stored twice"
            assert [t.turn for t in turns] == list(range(1, len(turns) + 1)), f"{session}: turn numbers have a gap"
            assert s.turn_count == len(turns)
            problems = fsck.acknowledged(home, "", session, acked.get(session, []))
            assert not problems, f"{session}: {problems[:3]}"
            report = fsck.check(home, "", session)
            assert report.ok, report.problems
            s.search("alpha budget", k=3)  # the index reopens and answers
            assert len(s.pages) > 0 or s.turn_count < 5
    journal = list((home_path / "journal").glob("*.jsonl"))
    assert not journal, f"journal segments left after a clean close: {journal}"
    tmp = list((home_path / "db").glob("*/data/.tmp*")) if (home_path / "db").exists() else []
    # a killed writer may leave one; the next process sweeps those old enough to belong to no live write
    stale = [p for p in tmp if time.time() - p.stat().st_mtime > Home.TMP_AGE_S + 5]
    assert not stale, f"temporary files were not swept: {stale}"
    return len(tmp)


@pytest.mark.parametrize("mode", ["ingest", "mixed", "tools"])
def test_sigkill_loses_no_acknowledged_turn(tmp_path, request, mode):
    seed = seed_for("sigkill", mode)
    rng = random.Random(seed)
    home = tmp_path / "home"
    acked: dict[str, list] = {}
    rounds = kills(request, short=2, long=18)
    tmp_counts = []
    for round_ in range(rounds):
        # killed after the driver's first acknowledgement, plus a seeded delay: however loaded the
        # machine, each kill lands while the driver is writing
        delay = rng.uniform(0.0, 1.5)
        try:
            got = run_until_killed(home, "crash", seed_for(seed, round_), mode, delay=delay)
            acked.setdefault("crash", []).extend(got)
            tmp_counts.append(_verify(home, ["crash"], acked))
        except AssertionError as exc:
            raise AssertionError(f"seed {seed}, round {round_}, delay {delay:.3f}s: {exc}") from exc
    total = sum(len(v) for v in acked.values())
    assert total > 0, "the driver acknowledged nothing; the test proved nothing"
    assert max(tmp_counts) <= rounds, f"more temporary files than kills: {tmp_counts}"
    print(f"\n{mode}: {rounds} SIGKILLs, {total} acknowledged turns, all present exactly once")
