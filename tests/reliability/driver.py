"""A process that writes to (or reads) a pager home, printing what was acknowledged.

    python driver.py HOME SESSION SEED [MODE] [COUNT]

MODE: ingest (append_many batches), chat (the offline agent), tools (Toolkit remember/search),
mcp (an in-process MCP client calling `remember` and `search`), mixed, or reader (a read-only
home searching). Writers print "ack <turn> <text>" once that turn is durable; the text is unique
(session, seed, counter), so a verifier can check every acknowledged turn is present exactly once.
COUNT (default: until killed) stops a writer after that many acknowledgements, closing cleanly.
"""

import random
import sys

from pager.config import Config
from pager.errors import StoreError
from pager.home import Home


def main() -> None:
    home_path, session_name, seed = sys.argv[1], sys.argv[2], int(sys.argv[3])
    mode = sys.argv[4] if len(sys.argv) > 4 else "mixed"
    count = int(sys.argv[5]) if len(sys.argv) > 5 else 0
    rng = random.Random(seed)
    config = Config(home=home_path, session=session_name, embedder="hash", budget=2048, flush_turns=32,
                    compact_every=4, keep_versions_s=0)
    counter = 0
    acks = 0

    def text() -> str:
        nonlocal counter
        counter += 1
        return f"{session_name} seed{seed} n{counter} " + " ".join(rng.choice(WORDS) for _ in range(rng.randrange(3, 40)))

    def ack(turn, t) -> bool:
        nonlocal acks
        print("ack", turn, t, flush=True)
        acks += 1
        return bool(count) and acks >= count

    if mode == "reader":
        reads = 0
        while not count or reads < count:
            with Home(config, read_only=True) as home:
                s = home.open()
                s.search(rng.choice(WORDS), k=3, record=False)
                print("read", s.turn_count, flush=True)
            reads += 1
        return
    if mode == "tools":
        from pager.tools import Toolkit

        with Toolkit(config=config) as kit:
            while True:
                t = text()
                reply = kit.call("remember", {"text": t})
                if ack(reply.split()[3], t):
                    return
                if rng.random() < 0.2:
                    kit.call("search", {"query": rng.choice(WORDS)})
    if mode == "mcp":
        import asyncio

        from mcp import Client

        from pager.tools import Toolkit
        from pager.tools.mcp_server import build

        async def run(kit) -> None:
            async with Client(build(kit)) as client:
                while True:
                    t = text()
                    result = await client.call_tool("remember", {"text": t})
                    if ack(result.content[0].text.split()[3], t):
                        return
                    if rng.random() < 0.2:
                        await client.call_tool("search", {"query": rng.choice(WORDS)})

        with Toolkit(config=config) as kit:
            asyncio.run(run(kit))
        return
    with Home(config) as home:
        session = home.open()
        agent = None
        while True:
            action = mode if mode != "mixed" else rng.choice(["ingest", "ingest", "chat"])
            if action == "ingest":
                batch = [{"speaker": rng.choice(["ann", "bob"]), "text": text()} for _ in range(rng.randrange(1, 12))]
                done = False
                try:
                    accepted = session.append_many(batch)
                except StoreError as exc:  # a full disk: refused, as a server would, and it keeps trying
                    print("refused", " ".join(str(exc).split())[:200], flush=True)
                    continue
                for turn in accepted:
                    done = ack(turn.turn, turn.text) or done
                if done:
                    return
            else:
                if agent is None:
                    from pager.agent import Agent
                    from pager.llm import LiteLLMModel, register
                    from pager.offline import OfflineShell

                    register("offline", OfflineShell())
                    agent = Agent(session, LiteLLMModel("pager/offline"))
                question = text() + "?"
                agent.ask(question)  # the question is durable before the model is called; the reply after it
                if ack(agent.last_turn, question):
                    return


WORDS = ("alpha beta gamma delta sync engine budget Lisbon offsite peanut allergy Okta contract Priya "
         "standup review deploy coffee weather garden boat key wifi password marathon Berlin").split()

if __name__ == "__main__":
    main()
