"""A writer for test_handover.py: one home's process writing session "s" of a shared store in bursts.

    python handover.py HOME NAME SEED SERIAL

Prints {"ready": recovered} once its home is open (its restart recovered the dead process's journal,
or set it aside until it takes the lease). Then, for each line `burst K` on stdin, makes K ops
(turns, state changes, facts, bookmarks, chosen by the seed), printing one JSON line per op once it
is acknowledged, then `done`; between bursts it is idle, so its lease goes after PAGER_LEASE_IDLE_S.
`close` closes the home. Texts and keywords are `NAME<serial>`, unique across restarts (SERIAL is
where this process starts counting). The store comes from PAGER_DB.
"""

import json
import random
import sys

from pager.config import Config
from pager.embed import HashEmbedder
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
            kind = rng.choice(["turn", "turn", "state", "fact", "bookmark"]) if own else "turn"
            if kind == "turn":
                words = " ".join(f"{tag}w{j}" for j in range(rng.randint(2, 40)))
                turn = s.append(name, f"{tag} says {words}")
                own = (turn.turn, tag)
                ack = {"kind": "turn", "tag": tag, "turn": turn.turn}
            elif kind == "state":
                key = f"{name} slot {serial % 3}"
                s.set_state(key, tag)
                ack = {"kind": "state", "tag": tag, "key": key}
            elif kind == "fact":
                s.add_facts([Draft(f"{name} subject", f"{tag} is a fact", (own[0],))], "model")
                ack = {"kind": "fact", "tag": tag, "about": own[1]}
            else:
                page = max(s._turn_pages({own[0]})[own[0]][0])
                s.bookmark([page], [tag])
                ack = {"kind": "bookmark", "tag": tag, "about": own[1]}
            print(json.dumps(ack), flush=True)
        print("done", flush=True)


if __name__ == "__main__":
    main()
