"""A process that writes to a pager home until killed, printing what was acknowledged.

    python driver.py HOME SESSION SEED [MODE]

MODE: ingest (append_many batches), chat (the offline agent), tools (Toolkit remember/search),
or mixed. Each line on stdout is "ack <turn> <text>" once that turn is durable; the text
is unique (session, seed, counter), so a verifier can check every acknowledged turn is
present exactly once.
"""

import random
import sys

from pager.config import Config
from pager.home import Home


def main() -> None:
    home_path, session_name, seed = sys.argv[1], sys.argv[2], int(sys.argv[3])
    mode = sys.argv[4] if len(sys.argv) > 4 else "mixed"
    rng = random.Random(seed)
    config = Config(home=home_path, session=session_name, embedder="hash", budget=2048, flush_turns=32,
                    compact_every=4, keep_versions_s=0)
    counter = 0

    def text() -> str:
        nonlocal counter
        counter += 1
        return f"{session_name} seed{seed} n{counter} " + " ".join(rng.choice(WORDS) for _ in range(rng.randrange(3, 40)))

    if mode == "tools":
        from pager.tools import Toolkit

        kit = Toolkit(config=config)
        while True:
            t = text()
            reply = kit.call("remember", {"text": t})
            print("ack", reply.split()[3], t, flush=True)
            if rng.random() < 0.2:
                kit.call("search", {"query": rng.choice(WORDS)})
    home = Home(config)
    session = home.open()
    agent = None
    while True:
        action = mode if mode != "mixed" else rng.choice(["ingest", "ingest", "chat"])
        if action == "ingest":
            batch = [{"speaker": rng.choice(["ann", "bob"]), "text": text()} for _ in range(rng.randrange(1, 12))]
            for turn in session.append_many(batch):
                print("ack", turn.turn, turn.text, flush=True)
        else:
            if agent is None:
                from pager.agent import Agent
                from pager.llm import LiteLLMModel, register
                from pager.offline import OfflineShell

                register("offline", OfflineShell())
                agent = Agent(session, LiteLLMModel("pager/offline"))
            question = text() + "?"
            before = session.turn_count
            agent.ask(question)  # the question is durable before the model is called; the reply after it
            print("ack", before + 1, question, flush=True)


WORDS = ("alpha beta gamma delta sync engine budget Lisbon offsite peanut allergy Okta contract Priya "
         "standup review deploy coffee weather garden boat key wifi password marathon Berlin").split()

if __name__ == "__main__":
    main()
