"""A writer for test_handover.py: one home's process writing session "s" of a shared store in bursts.

    python handover.py HOME NAME SEED SERIAL

Prints {"ready": recovered} once its home is open (its restart recovered the dead process's journal,
or set it aside until it takes the lease). Then, for each line `burst K` on stdin, makes K ops
(turns, state changes, facts, bookmarks, chosen by the seed), printing one JSON line per op once it
is acknowledged, then `done`; between bursts it is idle, so its lease goes after PAGER_LEASE_IDLE_S.
`close` closes the home. A write refused because this home's lease lapsed under ops another home
then numbered over closes the home (its journal kept for the next process) and prints `restart`. Texts and keywords are `NAME<serial>`, unique across restarts (SERIAL is
where this process starts counting). The store comes from PAGER_DB.
"""

import json
import random
import sys

from pager.config import Config
from pager.embed import HashEmbedder
from pager.errors import LeaseLapsed, StoreError
from pager.facts import Draft
from pager.home import Home


def main() -> None:
    home_dir, name, seed, serial = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4])
    # recovery at start does not wait for another home's lease (the session's ops then wait for this
    # home's first write of it); writes wait for it
    config = Config.load(home=home_dir, lease_s=1.0, lease_idle_s=0.3, lease_wait_s=0, budget=2048, page_tokens=128)
    home = Home(config, embedder=HashEmbedder())
    home.leases.wait_s = 300
    s = home.open("s")
    print(json.dumps({"ready": home.recovered, "waiting": home.waiting(s.key())}), flush=True)
    rng = random.Random(seed)
    own = None   # this process's last turn: (number, tag)
    for line in sys.stdin:
        command = line.split()
        if command[0] == "close":
            home.close()
            print("closed", flush=True)
            return
        for _ in range(int(command[1])):
            serial += 1
            tag = f"{name}{serial}"
            try:
                ack = op(s, rng, name, serial, tag, own)
            except LeaseLapsed as exc:   # the store answered slower than the lease: nothing of it was accepted,
                if "restart this process" in str(exc):   # nothing to check; the next op takes the lease again
                    home.close()
                    print("restart", flush=True)
                    return
                continue
            except StoreError as exc:
                if "restart this process" not in str(exc):
                    raise
                home.close()   # its lease lapsed under unflushed ops another home numbered over: the next
                print("restart", flush=True)   # process of this home recovers them
                return
            if ack["kind"] == "turn":
                own = (ack["turn"], tag)
            print(json.dumps(ack), flush=True)
        print("done", flush=True)


def op(s, rng, name: str, serial: int, tag: str, own) -> dict:
    """One op, chosen by the seed; returns what was acknowledged."""
    kind = rng.choice(["turn", "turn", "state", "fact", "bookmark"]) if own else "turn"
    if kind == "turn":
        words = " ".join(f"{tag}w{j}" for j in range(rng.randint(2, 40)))
        return {"kind": "turn", "tag": tag, "turn": s.append(name, f"{tag} says {words}").turn}
    if kind == "state":
        key = f"{name} slot {serial % 3}"
        s.set_state(key, tag)
        return {"kind": "state", "tag": tag, "key": key}
    if kind == "fact":
        s.add_facts([Draft(f"{name} subject", f"{tag} is a fact", (own[0],))], "model")
        return {"kind": "fact", "tag": tag, "about": own[1]}
    s.bookmark([max(s.turn_pages({own[0]})[own[0]][0])], [tag])
    return {"kind": "bookmark", "tag": tag, "about": own[1]}


if __name__ == "__main__":
    main()
