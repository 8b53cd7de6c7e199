"""`pager bench serve`: many clients at once against a real `pager serve` on loopback.

The server runs as its own process (`pager serve` on a fresh home, the offline model), the
clients as asyncio tasks here: `clients` on a session each and `shared` more on one common
session, each sending `turns` chat calls in a row and, like most OpenAI clients, resending
its whole history every call. Afterwards the server is stopped and the store is read back:
every question and every reply once, in each client's order, each reply right after its
question. Then, in this process and on the same sessions, the in-process Toolkit `context`
call is timed with the same messages, the reference the HTTP latencies are divided by.

Two phases are timed: under load (every client at once: what a client waits, queueing
included) and alone (one call at a time on the same sessions: what pager adds per call).
`ratio_added` divides a call alone without the model's own time (what pager adds around a
model) by the `context` call; `ratio_alone` keeps the offline model's time in.

With `memory_delay` the load runs once more, on a fresh home, with a memory model that takes that
many seconds per call (`SlowMemory`: it sleeps, then names each page it is shown) and a batch of
one page, so it is asked about every page the chat seals and is at work through the whole load.
`memory.ratio_p95` divides the chat calls' p95 then by their p95 in the load without it: what a
chat call waits for a memory model working beside it (the sleep takes no core, so this measures
the locks, not a model competing for the CPU).
"""

from __future__ import annotations

import asyncio
import os
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

WORDS = ("amber", "basil", "cedar", "delta", "ember", "fjord", "garnet", "harbor", "indigo", "juniper", "kelp",
         "lumen", "maple", "nectar", "onyx", "pepper", "quartz", "raven", "saffron", "tundra")


def message(client: int, turn: int) -> str:
    """Statements, and every fifth turn a question back to an earlier one (the shell then searches)."""
    word = WORDS[(client * 7 + turn * 3) % len(WORDS)]
    if turn % 5 == 4:
        return f"c{client}: what was the code word of my turn {turn - 3}?"
    return f"c{client}: turn {turn}, the code word is {word}-{client}-{turn}; note it for later."


def pct(values: list[float], q: float) -> float:
    values = sorted(values)
    return round(values[min(len(values) - 1, int(q * len(values)))], 2) if values else 0.0


def summary(values: list[float]) -> dict:
    return {"p50": pct(values, 0.5), "p95": pct(values, 0.95), "mean": round(statistics.fmean(values), 2) if values else 0,
            "n": len(values)}


async def client(http, session: str, me: int, turns: int, latencies: list, steps: list, failures: list,
                 engine: list, history: list | None = None) -> None:
    history = [] if history is None else history
    for t in range(turns):
        history.append({"role": "user", "content": message(me, t)})
        started = time.perf_counter()
        r = await http.post("/v1/chat/completions", json={"model": "offline", "messages": history},
                            headers={"X-Pager-Session": session})
        latencies.append((time.perf_counter() - started) * 1000)
        if r.status_code != 200:
            failures.append(f"{session} c{me} t{t}: {r.status_code} {r.text[:200]}")
            history.pop()
            continue
        body = r.json()
        steps.append(body["pager"]["steps"])
        info = body["pager"]
        engine.append((info["engine_ms"], info["model_ms"], info["wait_ms"], latencies[-1]))
        history.append({"role": "assistant", "content": body["choices"][0]["message"]["content"]})


def preload(home: Path, sessions: list[str], turns: int) -> dict:
    """Fill each session with `turns` earlier turns (in process, before the server starts)."""
    from pager.config import Config
    from pager.home import Home

    if not turns:
        return {}
    env = {k: v for k, v in os.environ.items() if not k.startswith("PAGER_")}
    pages = {}
    with Home(Config.load(env=env, home=home)) as h:
        for name in sessions:
            s = h.open(name)
            for start in range(0, turns, 1000):
                s.append_many([{"speaker": "old", "text": f"old note {i} of {name}: the {WORDS[i % 20]} shelf holds "
                                f"box {i * 7 % 1000} with {WORDS[(i * 3) % 20]} parts for project {i % 97}."}
                               for i in range(start, min(turns, start + 1000))])
            pages[name] = len(s.pages)
            h.flush()
            h.sessions.pop((s.user, name), None)  # one session in memory at a time
    return pages


SLOW_MEMORY = "bench-memory"   # served as model pager/bench-memory in the server's process


class SlowMemory:
    """A memory model that takes `delay` seconds per call, then names each page it was shown."""

    def __init__(self, delay: float) -> None:
        self.delay = delay

    def __call__(self, messages, tools) -> dict:
        import json
        import re

        time.sleep(self.delay)
        pages = re.findall(r"^\[(p\d+)", messages[-1]["content"], re.M)
        return {"content": json.dumps({"bookmarks": {p: {"keywords": ["benched"], "note": ""} for p in pages},
                                       "facts": [{"op": "NONE"}], "state": []})}


def register_slow_memory(delay: float) -> None:
    """SlowMemory as model pager/bench-memory, in the server's process (before `pager serve` starts there)."""
    from pager.llm import register

    register(SLOW_MEMORY, SlowMemory(delay))


def start_server(home: Path, env: dict, memory_delay: float = 0.0) -> tuple[subprocess.Popen, str]:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    log = open(home / "serve.log", "w")
    command = [sys.executable, "-m", "pager.cli"]
    if memory_delay:
        command = [sys.executable, "-c", f"from pager.bench.serve import register_slow_memory; register_slow_memory({memory_delay!r}); "
                   "from pager.cli.app import main; main()"]
        env = {**env, "PAGER_MEMORY_MODEL": f"pager/{SLOW_MEMORY}", "PAGER_BOOKMARK_BATCH": "1"}
    proc = subprocess.Popen(command + ["--home", str(home), "serve", "--port", str(port), "--timeout", "600"],
                            stdout=log, stderr=subprocess.STDOUT, env=env)
    return proc, f"http://127.0.0.1:{port}"


async def wait_ready(url: str, proc: subprocess.Popen) -> None:
    import httpx

    async with httpx.AsyncClient(base_url=url) as http:
        while proc.poll() is None:
            try:
                if (await http.get("/healthz")).status_code == 200:
                    return
            except httpx.TransportError:
                pass
            await asyncio.sleep(0.1)
    raise RuntimeError(f"pager serve exited with {proc.returncode}")


async def named_once(http) -> None:
    """Warm the memory model too (litellm's first call, the worker's thread): seal a page of the warm-up
    session and wait until the model's answer for it is kept."""
    note = "warm up the memory model: " + " ".join(WORDS * 8)
    await http.post("/v1/chat/completions", json={"model": "offline", "messages": [{"role": "user", "content": note}]},
                    headers={"X-Pager-Session": "warmup"})
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        marks = (await http.get("/sessions/warmup")).json().get("bookmarks", {})
        if any("benched" in words for words in marks.values()):
            return
        await asyncio.sleep(0.2)
    raise RuntimeError("the memory model named no page of the warm-up session within 120 s; see serve.log")


async def load(url: str, clients: int, shared: int, turns: int, memory: bool = False) -> dict:
    import httpx

    latencies: list[float] = []
    steps: list[int] = []
    failures: list[str] = []
    engine: list[tuple] = []
    limits = httpx.Limits(max_connections=clients + shared + 4)
    async with httpx.AsyncClient(base_url=url, timeout=600, limits=limits) as http:
        # warm the server (litellm's import, the embedder, each session's load) before the clock starts
        await http.post("/v1/chat/completions", json={"model": "offline", "messages": [
            {"role": "user", "content": "warm up"}]}, headers={"X-Pager-Session": "warmup"})
        if memory:
            await named_once(http)
        for name in [f"load-{c}" for c in range(clients)] + ["shared"]:
            await http.get(f"/sessions/{name}")
        started = time.perf_counter()
        tasks = [client(http, f"load-{c}", c, turns, latencies, steps, failures, engine) for c in range(clients)]
        tasks += [client(http, "shared", clients + c, turns, latencies, steps, failures, engine) for c in range(shared)]
        await asyncio.gather(*tasks)
        wall = time.perf_counter() - started
    return {"latency_ms": summary(latencies), "calls": len(latencies), "wall_s": round(wall, 1),
            "calls_per_s": round(len(latencies) / wall, 1), "steps_per_call": round(statistics.fmean(steps), 2) if steps else 0,
            **parts(engine), "failures": failures[:10], "failed": len(failures)}


def parts(engine: list[tuple]) -> dict:
    """Where a call's time went: in the engine (append, paging, assembly, tools), in the model, waiting
    for the session's and the engine's locks (other calls' work), and the rest (HTTP, JSON, threads)."""
    return {"engine_ms": summary([e for e, _, _, _ in engine]), "model_ms": summary([m for _, m, _, _ in engine]),
            "lock_wait_ms": summary([w for _, _, w, _ in engine]),
            "http_ms": summary([total - e - m - w for e, m, w, total in engine])}


async def alone(url: str, clients: int, turns: int) -> dict:
    """One call at a time on the load's sessions (each continues its own history)."""
    import httpx

    latencies: list[float] = []
    steps: list[int] = []
    failures: list[str] = []
    engine: list[tuple] = []
    async with httpx.AsyncClient(base_url=url, timeout=600) as http:
        for c in range(clients):
            await client(http, f"load-{c}", 1000 + c, turns, latencies, steps, failures, engine)
    return {"latency_ms": summary(latencies), "calls": len(latencies), "failed": len(failures),
            "steps_per_call": round(statistics.fmean(steps), 2) if steps else 0, **parts(engine),
            "added_ms": summary([total - m for _, m, _, total in engine])}


def check(home: Path, clients: int, shared: int, turns: int, alone_turns: int, earlier: int = 0) -> list[str]:
    """Every question and reply once, in order, each reply right after its question."""
    from pager.config import Config
    from pager.home import Home

    problems: list[str] = []
    env = {k: v for k, v in os.environ.items() if not k.startswith("PAGER_")}
    with Home(Config.load(env=env, home=home)) as h:
        plans = {f"load-{c}": [c, 1000 + c] for c in range(clients)} | {"shared": list(range(clients, clients + shared))}
        for session, owners in plans.items():
            got = h.store.turns("", session, after=earlier)
            texts = [t.text for t in got]
            if [t.turn for t in got] != list(range(earlier + 1, earlier + len(got) + 1)):
                problems.append(f"{session}: turn numbers not {earlier + 1}..{earlier + len(got)}")
            for owner in owners:
                n = alone_turns if owner >= 1000 else turns
                mine = [i for i, t in enumerate(got) if t.role == "user" and t.text.startswith(f"c{owner}:")]
                asked = [texts[i] for i in mine]
                if asked != [message(owner, t) for t in range(n)]:
                    problems.append(f"{session} c{owner}: {len(asked)} questions stored for {n} asked, or out of order")
                if any(i + 1 >= len(got) or got[i + 1].role != "assistant" for i in mine):
                    problems.append(f"{session} c{owner}: a question not followed by its reply")
            expected = 2 * sum(alone_turns if o >= 1000 else turns for o in owners)
            if len(got) != expected:
                problems.append(f"{session}: {len(got)} turns stored, {expected} expected (lost or duplicated)")
    return problems


def reference(home: Path, clients: int, turns: int) -> tuple[dict, dict]:
    """In process, on the same sessions with the same messages: the Toolkit `context` call, and the
    Toolkit calls an agent makes for one turn (remember the question, context, remember the reply)."""
    from pager.config import Config
    from pager.tools import Toolkit

    context: list[float] = []
    turn: list[float] = []
    for c in range(clients):
        env = {k: v for k, v in os.environ.items() if not k.startswith("PAGER_")}
        with Toolkit(config=Config.load(env=env, home=home, session=f"load-{c}"), trace=False) as memory:
            memory.call("context", {"query": "warm up", "budget": 8192})
            for t in range(turns):
                started = time.perf_counter()
                memory.call("context", {"query": message(c, t), "budget": 8192})
                context.append((time.perf_counter() - started) * 1000)
            for t in range(turns):
                started = time.perf_counter()
                memory.call("remember", {"text": f"r{c}: {message(c, t)}"})
                memory.call("context", {"query": message(c, t), "budget": 8192})
                memory.call("remember", {"text": f"noted, r{c} {t}", "role": "assistant"})
                turn.append((time.perf_counter() - started) * 1000)
    return {"latency_ms": summary(context)}, {"latency_ms": summary(turn)}


def with_memory(clients: int, shared: int, turns: int, delay: float, earlier: int = 0) -> dict:
    """The load again, on a fresh home, with SlowMemory as the memory model: the chat calls' latency, the
    pages it named meanwhile, those it still owed when the server stopped (named at the next open), and
    the store's check that nothing was lost or duplicated."""
    home = Path(tempfile.mkdtemp(prefix="pager-bench-serve-memory-"))
    try:
        preload(home, [f"load-{c}" for c in range(clients)] + ["shared"], earlier)
        env = {k: v for k, v in os.environ.items() if not k.startswith("PAGER_")}
        proc, url = start_server(home, env, memory_delay=delay)
        try:
            asyncio.run(wait_ready(url, proc))
            under_load = asyncio.run(load(url, clients, shared, turns, memory=True))
        finally:
            proc.send_signal(signal.SIGINT)
            proc.wait(120)
        problems = check(home, clients, shared, turns, 0, earlier)
        named, owed, sealed = memory_work(home, [f"load-{c}" for c in range(clients)] + ["shared"])
    finally:
        shutil.rmtree(home, ignore_errors=True)
    return {"delay_s": delay, "batch": 1, "load": under_load, "pages_sealed": sealed, "pages_named": named,
            "pages_owed_at_stop": owed, "problems": problems}


def memory_work(home: Path, sessions: list[str]) -> tuple[int, int, int]:
    """(pages the memory model named, pages the stored sessions still owe it, pages sealed), as stored."""
    from pager.config import Config
    from pager.home import Home

    named = owed = sealed = 0
    env = {k: v for k, v in os.environ.items() if not k.startswith("PAGER_")}
    with Home(Config.load(env=env, home=home), read_only=True) as h:
        for name in sessions:
            named += len({n for m in h.store.bookmarks("", name) if m.source == "writer" for n in m.pages})
            owed += len((h.store.state("", name) or {}).get("unwritten", ()))
            sealed += len(h.store.pages("", name, with_vectors=False)[0])
    return named, owed, sealed


def main(clients: int = 32, shared: int = 8, turns: int = 50, alone_turns: int = 10, keep: Path | None = None,
         earlier: int = 0, memory_delay: float = 0.0) -> dict:
    home = Path(keep) if keep else Path(tempfile.mkdtemp(prefix="pager-bench-serve-"))
    home.mkdir(parents=True, exist_ok=True)
    started = time.perf_counter()
    pages = preload(home, [f"load-{c}" for c in range(clients)] + ["shared"], earlier)
    preload_s = time.perf_counter() - started
    env = {k: v for k, v in os.environ.items() if not k.startswith("PAGER_")}
    proc, url = start_server(home, env)
    try:
        asyncio.run(wait_ready(url, proc))
        under_load = asyncio.run(load(url, clients, shared, turns))
        by_itself = asyncio.run(alone(url, clients, alone_turns))
    finally:
        proc.send_signal(signal.SIGINT)
        proc.wait(120)
    try:
        problems = check(home, clients, shared, turns, alone_turns, earlier)
        ref, ref_turn = reference(home, clients, alone_turns)
    finally:
        if not keep:
            shutil.rmtree(home, ignore_errors=True)
    ref_p50, ref_p95 = ref["latency_ms"]["p50"], ref["latency_ms"]["p95"]
    report = {
        "clients": clients, "shared": shared, "turns": turns, "model": "offline", "earlier_turns": earlier,
        "pages_before": {"min": min(pages.values()), "max": max(pages.values())} if pages else {},
        "preload_s": round(preload_s, 1),
        "load": under_load, "alone": by_itself, "toolkit_context": ref, "toolkit_turn": ref_turn,
        "ratio_alone": {"p50": round(by_itself["latency_ms"]["p50"] / ref_p50, 2),
                        "p95": round(by_itself["latency_ms"]["p95"] / ref_p95, 2)},
        "ratio_load": {"p50": round(under_load["latency_ms"]["p50"] / ref_p50, 2),
                       "p95": round(under_load["latency_ms"]["p95"] / ref_p95, 2)},
        "ratio_added": {"p50": round(by_itself["added_ms"]["p50"] / ref_p50, 2),
                        "p95": round(by_itself["added_ms"]["p95"] / ref_p95, 2)},
        "load_average": [round(x, 2) for x in os.getloadavg()],
        "ratio_alone_to_turn": {"p50": round(by_itself["latency_ms"]["p50"] / ref_turn["latency_ms"]["p50"], 2),
                                "p95": round(by_itself["latency_ms"]["p95"] / ref_turn["latency_ms"]["p95"], 2)},
        "problems": problems, "home": str(home) if keep else "",
    }
    if memory_delay:
        memory = with_memory(clients, shared, turns, memory_delay, earlier)
        without, working = under_load["latency_ms"], memory["load"]["latency_ms"]
        memory["ratio_p95"] = round(working["p95"] / without["p95"], 2) if without["p95"] else 0.0
        memory["ratio_p50"] = round(working["p50"] / without["p50"], 2) if without["p50"] else 0.0
        memory["without_ms"], memory["with_ms"] = without, working
        report["memory"] = memory
        problems += [f"with the memory model: {p}" for p in memory["problems"]]
    return report
