"""`python -m pager.bench.hosts --db URI`: several hosts, one store.

Starts one process per "host", each with a home of its own (journal, locks, caches), all on one
store. Each ingests `turns` turns into a session of its own through the durable path (batches of
50), and two of them then contend for one shared session: each in turn opens its home, waits for
the lease, appends a batch, and closes (which flushes and releases). Reports ingest turns/s per
host and overall, the lease hand-over time (from one host's release to the other's first write),
and whether every acknowledged turn is in the store exactly once.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

WORKER = """
import json, sys, time
from pager.config import Config
from pager.home import Home
from pager.bench.scale import TextGenerator
home_path, index, turns, rounds = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4])
config = Config.load(home=home_path, lease_wait_s=600)
texts = TextGenerator(index).turns(turns)
with Home(config) as home:
    s = home.open(f"host{index}")
    t0 = time.time()  # from the first append to the closing flush: what ingest costs, not the imports
    for i in range(0, turns, 50):
        s.append_many([{"speaker": f"h{index}", "text": t} for t in texts[i:i + 50]])
t1 = time.time()
print(json.dumps({"event": "ingest", "host": index, "turns": turns, "s": t1 - t0}), flush=True)
for r in range(rounds):
    with Home(config) as home:
        s = home.open("shared")
        s.append_many([{"speaker": f"h{index}", "text": f"host {index} round {r} turn {j}", "key": f"{index}-{r}-{j}"}
                       for j in range(10)])
        got = time.time()
    print(json.dumps({"event": "lease", "host": index, "round": r, "got": got, "released": time.time()}), flush=True)
"""


def run(db: str, hosts: int = 4, turns: int = 10_000, rounds: int = 10, contenders: int = 2) -> dict:
    from ..config import Config
    from ..home import Home

    with tempfile.TemporaryDirectory(prefix="pager-hosts-") as folder:
        procs = [subprocess.Popen([sys.executable, "-c", WORKER, str(Path(folder) / f"host{i}"), str(i), str(turns),
                                   str(rounds if i < contenders else 0)],
                                  env={**os.environ, "PAGER_DB": db}, stdout=subprocess.PIPE, text=True)
                 for i in range(hosts)]
        events = []
        started = time.time()
        for p in procs:
            out, _ = p.communicate()
            if p.returncode:
                raise RuntimeError(f"a host process failed (exit {p.returncode})")
            events += [json.loads(line) for line in out.splitlines() if line.startswith("{")]
        wall = time.time() - started
        with Home(Config.load(home=Path(folder) / "reader", db=db), read_only=True) as reader:
            store = reader.store
            store.refresh()
            counts = {}
            for i in range(hosts):
                stored = store.turns("", f"host{i}")
                counts[f"host{i}"] = (len(stored), len({t.text for t in stored}) == len(stored),
                                      [t.turn for t in stored] == list(range(1, len(stored) + 1)))
            shared = store.turns("", "shared")
            keys = [t.key for t in shared]
    ingest = [e for e in events if e["event"] == "ingest"]
    leases = sorted((e for e in events if e["event"] == "lease"), key=lambda e: e["got"])
    handovers = [b["got"] - a["released"] for a, b in zip(leases, leases[1:]) if a["host"] != b["host"]
                 and b["got"] > a["released"]]
    expected_shared = contenders * rounds * 10
    return {
        "db": db.split("://")[0] + "://…" if "://" in db else "local disk",
        "hosts": hosts, "turns_per_host": turns, "contenders": contenders, "rounds": rounds,
        "ingest_turns_per_s_per_host": round(float(np.mean([e["turns"] / e["s"] for e in ingest])), 1),
        "ingest_turns_per_s_total": round(sum(e["turns"] for e in ingest) / max(e["s"] for e in ingest), 1),
        "handover_ms": ({"p50": round(float(np.percentile(handovers, 50)) * 1000, 1),
                         "p95": round(float(np.percentile(handovers, 95)) * 1000, 1), "n": len(handovers)}
                        if handovers else None),
        "all_turns_once": all(n == turns and unique and gapless for n, unique, gapless in counts.values()),
        "shared_turns": len(shared), "shared_expected": expected_shared,
        "shared_once": len(keys) == len(set(keys)) == expected_shared
                       and [t.turn for t in shared] == list(range(1, len(shared) + 1)),
        "wall_s": round(wall, 1),
    }


if __name__ == "__main__":
    import argparse

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--db", required=True, help="the shared store (a folder or s3://bucket/prefix)")
    parser.add_argument("--hosts", type=int, default=4)
    parser.add_argument("--turns", type=int, default=10_000)
    parser.add_argument("--rounds", type=int, default=10)
    args = parser.parse_args()
    print(json.dumps(run(args.db, args.hosts, args.turns, args.rounds), indent=1))
