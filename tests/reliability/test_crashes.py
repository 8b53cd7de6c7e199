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


def test_a_killed_import_keeps_all_of_a_file_or_none(tmp_path, request):
    """`pager ingest` killed while it writes: the file's lines are all there or none is."""
    import json
    import os
    import subprocess
    import sys

    seed = seed_for("import-kill")
    rng = random.Random(seed)
    home = tmp_path / "home"
    lines = tmp_path / "big.jsonl"
    lines.write_text("".join(json.dumps({"speaker": "imp", "text": f"line {i} " + "word " * 20}) + "\n"
                             for i in range(1200)))
    env = {**os.environ, "PAGER_HOME": str(home), "PAGER_EMBEDDER": "hash"}
    counts = []
    for round_ in range(kills(request, short=2, long=8)):
        proc = subprocess.Popen([sys.executable, "-c", "from pager.cli.app import main; main()", "ingest", str(lines),
                                 "--session", f"imp{round_}"], env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
        journal = home / "journal"
        # the kill point is an event: the import's journal frame has begun to reach the disk
        while proc.poll() is None and not any(p.stat().st_size for p in journal.glob("*.wal") if p.is_file()):
            time.sleep(0.002)
        time.sleep(rng.uniform(0.0, 0.02))
        proc.kill()
        proc.wait()
        with Home(Config(home=home, embedder="hash"), embedder=HashEmbedder()) as h:
            n = h.open(f"imp{round_}").turn_count
            assert fsck.check(h, "", f"imp{round_}").ok
        counts.append(n)
        assert n in (0, 1200), f"seed {seed}, round {round_}: a killed import kept {n} of 1200 lines"
    print(f"\nimport killed {len(counts)} times: kept {counts}")


def test_a_full_disk_then_sigkill_loses_nothing_acknowledged(tmpfs):
    """A writer on a 3 MB tmpfs runs out of space (its appends are refused, it keeps trying), then is
    killed; with the disk enlarged, every acknowledged turn is there once."""
    import subprocess
    import sys

    from harness import DRIVER

    home = tmpfs / "h"
    seed = seed_for("full-disk")
    proc = subprocess.Popen([sys.executable, str(DRIVER), str(home), "full", str(seed), "ingest"],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    acked = []
    for line in proc.stdout:  # until the disk refuses: an event, however slow the machine
        if line.startswith("ack "):
            _, turn, text = line.rstrip("\n").split(" ", 2)
            acked.append((int(turn), text))
        elif line.startswith("refused"):
            break
    proc.kill()
    proc.wait()
    assert acked, f"seed {seed}: nothing acknowledged before the disk filled: {proc.stderr.read()[-2000:]}"
    subprocess.run(["mount", "-o", "remount,size=300m", str(tmpfs)], check=True)
    with Home(Config(home=home, embedder="hash", budget=2048), embedder=HashEmbedder()) as h:
        h.open("full")
        h.flush()
        assert not fsck.acknowledged(h, "", "full", acked), f"seed {seed}"
        assert fsck.check(h, "", "full").ok
    print(f"\nfull disk: {len(acked)} turns acknowledged before ENOSPC, all present after SIGKILL")
