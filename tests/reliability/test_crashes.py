"""SIGKILL at random points, many times: every acknowledged turn is there exactly once afterwards."""

import random
import time

import pytest

from harness import kills, run_until_killed
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
            present = set(texts)
            lost = [text for turn, text in acked.get(session, []) if text not in present]
            assert not lost, f"{session}: acknowledged but lost: {lost[:3]}"
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
    rng = random.Random(hash(mode) % 1000)
    home = tmp_path / "home"
    acked: dict[str, list] = {}
    rounds = kills(request, short=2, long=18)
    tmp_counts = []
    for round_ in range(rounds):
        # chatting imports litellm first (seconds): give that mode longer lives so kills land mid-turn
        window = (5.0, 11.0) if mode == "mixed" else (1.8, 4.0)
        got = run_until_killed(home, "crash", round_, mode, seconds=rng.uniform(*window))
        acked.setdefault("crash", []).extend(got)
        tmp_counts.append(_verify(home, ["crash"], acked))
    total = sum(len(v) for v in acked.values())
    assert total > 0, "the driver acknowledged nothing; the test proved nothing"
    assert max(tmp_counts) <= rounds, f"more temporary files than kills: {tmp_counts}"
    print(f"\n{mode}: {rounds} SIGKILLs, {total} acknowledged turns, all present exactly once")
