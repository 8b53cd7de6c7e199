"""`pager bench startup`: what a person waits for before each command answers, and serve's first answers.

Every command runs as a fresh process on a fresh home holding one small session (the seven lines of
NOTES, one open page), as a new user's first commands do. Each is run `repeat` times; the report
gives the median wall and CPU seconds (user + system, of the process and its children) and both as
ratios to `pager --help` timed in the same run, so a figure taken on a busy machine can be compared
with one taken on a quiet one. One more run of each under `python -X importtime` says which packages
its imports spent the time in, and one process timed phase by phase says where a read-only command's
seconds go: the imports, opening the session from its snapshot, the embedder and the search, and
what reading the store instead would add (LanceDB's import, the encoding to count the open page
again, the session from its tables).

`serve` starts `pager serve` on a fresh home and times, from the client: the start until `/healthz`
says ok, the first offline chat call after that, the hundredth, the first call of a second session
after those (what opening a session costs a warm server), and the refusal of a model the server
cannot serve (`gpt-4o-mini` without OPENAI_API_KEY, and a name no provider has), checking that nothing
of a refused request was stored.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import resource
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

NOTES = [{"speaker": "Maya", "text": "We chose Yjs over OT for the sync engine.", "date": "8 May 2023"},
         {"speaker": "Sam", "text": "Then the offline edits merge by themselves.", "date": "8 May 2023"},
         {"role": "assistant", "content": "Noted: Yjs, a CRDT."},
         {"speaker": "Maya", "text": "The Lisbon offsite budget is 4,000 euros.", "date": "9 May 2023"},
         {"speaker": "Sam", "text": "Okta stays our identity provider for now.", "date": "9 May 2023"},
         {"speaker": "Maya", "text": "I am allergic to peanuts, remember that for the dinner.", "date": "10 May 2023"},
         {"role": "assistant", "content": "Noted: peanut allergy."}]

SESSION = "planning"
LOOKS = [("check", ["check", "-s", SESSION]), ("export", ["export", "-s", SESSION]),
         ("search", ["search", "Lisbon budget", "-s", SESSION]), ("inspect", ["inspect", "-s", SESSION]),
         ("inspect --json", ["inspect", "-s", SESSION, "--json"]), ("sessions", ["sessions"])]
SHOWN = 6   # packages per command in the import profile


def clean_env() -> dict:
    """This environment without pager's settings and without provider keys: a new user's."""
    return {k: v for k, v in os.environ.items() if not k.startswith("PAGER_") and not k.endswith("_API_KEY")}


def timed(args: list[str], env: dict, python: list[str] | None = None) -> tuple[float, float, subprocess.CompletedProcess]:
    """Wall and CPU seconds of one `pager` process."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    started = time.perf_counter()
    out = subprocess.run([*(python or [sys.executable, "-m", "pager"]), *args], env=env, capture_output=True, text=True)
    wall = time.perf_counter() - started
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    if out.returncode:
        raise RuntimeError(f"pager {' '.join(args)} failed ({out.returncode}): {out.stderr.strip()[-400:]}")
    return wall, cpu, out


def imports(args: list[str], env: dict) -> dict[str, float]:
    """Seconds of import per top-level package (each module's own time, summed), the largest first."""
    _, _, out = timed(args, env, [sys.executable, "-X", "importtime", "-m", "pager"])
    spent: dict[str, float] = {}
    for line in out.stderr.splitlines():
        if not line.startswith("import time:") or "|" not in line:
            continue
        own, _, name = line.removeprefix("import time:").split("|")
        if not own.strip().isdigit():
            continue   # the header line
        top = name.strip().split(".")[0]
        spent[top] = spent.get(top, 0.0) + int(own) / 1e6
    return {k: round(v, 3) for k, v in sorted(spent.items(), key=lambda kv: -kv[1])[:SHOWN]}


def fresh_home(root: Path, notes: Path, env: dict, n: int) -> tuple[Path, float, float]:
    home = root / f"home-{n}"
    wall, cpu, _ = timed(["--home", str(home), "ingest", str(notes), "-s", SESSION], env)
    return home, wall, cpu


def commands(root: Path, repeat: int) -> dict:
    env = clean_env()
    notes = root / "notes.jsonl"
    notes.write_text("".join(json.dumps(n) + "\n" for n in NOTES))
    helps = [timed(["--help"], env)[:2] for _ in range(repeat)]
    rows: dict[str, dict] = {}
    ingests = [fresh_home(root, notes, env, n)[1:] for n in range(repeat)]
    home = root / "home-0"
    rows["ingest"] = _row(ingests, imports(["--home", str(root / "home-import"), "ingest", str(notes), "-s", SESSION], env))
    again = [timed(["--home", str(home), "ingest", str(notes), "-s", SESSION], env)[:2] for _ in range(repeat)]
    rows["ingest (nothing new)"] = _row(again, {})
    for name, args in LOOKS:
        runs = [timed(["--home", str(home), *args], env)[:2] for _ in range(repeat)]
        rows[name] = _row(runs, imports(["--home", str(home), *args], env))
    profile = phases(home, env)
    helps += [timed(["--help"], env)[:2] for _ in range(repeat)]
    help_wall, help_cpu = statistics.median(w for w, _ in helps), statistics.median(c for _, c in helps)
    for row in rows.values():
        row["wall_ratio"] = round(row["wall_s"] / help_wall, 1)
        row["cpu_ratio"] = round(row["cpu_s"] / help_cpu, 1)
    return {"help": {"wall_s": round(help_wall, 3), "cpu_s": round(help_cpu, 3)}, "commands": rows, "phases": profile}


PHASES = """
import json, resource, sys, time
def cpu():
    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_utime + r.ru_stime
spent = {}
def phase(name, fn):
    wall, used = time.perf_counter(), cpu()
    out = fn()
    spent[name] = [round(time.perf_counter() - wall, 3), round(cpu() - used, 3)]
    return out
phase("python and typer", lambda: __import__("typer"))
phase("import pager (home, session, numpy)", lambda: (__import__("pager.home"), __import__("pager.session")))
from pager.config import Config
from pager.home import Home
home = Home(Config.load(home=sys.argv[1]), read_only=True)
s = phase("session from its snapshot (the open page's counts with it)", lambda: home.open(sys.argv[2], read_only=True))
phase("embedder (wordllama)", lambda: home.embedder)
phase("search: the index and the query's vector", lambda: s.search("Lisbon budget", k=8, record=False))
phase("LanceDB imported, the store opened", lambda: home.store)
phase("the encoding (tiktoken cl100k_base), for counts not known", lambda: home.tokenizer._enc)
from pager.session import Session
phase("the session read from the store", lambda: Session(home, home.config.user, sys.argv[2]))
print(json.dumps(spent))
"""


def phases(home: Path, env: dict) -> dict:
    """Where a read-only command's seconds go, phase by phase, in one fresh process: [wall, CPU]."""
    out = subprocess.run([sys.executable, "-c", PHASES, str(home), SESSION], env=env, capture_output=True, text=True)
    if out.returncode:
        raise RuntimeError(f"the phase profile failed: {out.stderr.strip()[-400:]}")
    return json.loads(out.stdout.strip().splitlines()[-1])


def _row(runs: list[tuple[float, float]], spent: dict) -> dict:
    return {"wall_s": round(statistics.median(w for w, _ in runs), 3),
            "cpu_s": round(statistics.median(c for _, c in runs), 3), "imports_s": spent}


def serve(root: Path, calls: int = 100) -> dict:
    """Serve's first answers: ready, the first offline chat, the hundredth, and two refusals."""
    from .serve import start_server

    home = root / "serve"
    home.mkdir()
    env = clean_env()
    started = time.perf_counter()
    proc, url = start_server(home, env)
    try:
        return asyncio.run(_serve_calls(url, proc, started, calls))
    finally:
        proc.send_signal(signal.SIGINT)
        proc.wait(120)


async def _serve_calls(url: str, proc, started: float, calls: int) -> dict:
    import httpx

    async with httpx.AsyncClient(base_url=url, timeout=600) as http:
        while True:
            if proc.poll() is not None:
                raise RuntimeError(f"pager serve exited with {proc.returncode}; see serve.log in its home")
            with contextlib.suppress(httpx.TransportError):   # not listening yet
                if (await http.get("/healthz")).status_code == 200:
                    break
            await asyncio.sleep(0.02)
        ready = time.perf_counter() - started
        latencies = []
        for i in range(calls):
            body = {"model": "offline", "messages": [{"role": "user", "content": f"note {i}: the Lisbon budget is {i} euros"}]}
            t = time.perf_counter()
            r = await http.post("/v1/chat/completions", json=body, headers={"X-Pager-Session": "first"})
            latencies.append(time.perf_counter() - t)
            if r.status_code != 200:
                raise RuntimeError(f"offline chat call {i + 1} answered {r.status_code}: {r.text[:300]}")
        body = {"model": "offline", "messages": [{"role": "user", "content": "note: the Lisbon budget is 7 euros"}]}
        t = time.perf_counter()   # a session's first call opens it (its lock file, its trace): as the first call did
        await http.post("/v1/chat/completions", json=body, headers={"X-Pager-Session": "second"})
        another = time.perf_counter() - t
        refusals = {}
        for model in ("gpt-4o-mini", "no-such-model"):
            body = {"model": model, "messages": [{"role": "user", "content": "is this stored?"}]}
            t = time.perf_counter()
            r = await http.post("/v1/chat/completions", json=body, headers={"X-Pager-Session": f"refused-{model}"})
            refusals[model] = {"s": round(time.perf_counter() - t, 3), "status": r.status_code,
                               "message": r.json().get("error", {}).get("message", "")}
        listed = {row["session"] for row in (await http.get("/sessions")).json()["data"]}
    later = sorted(latencies[1:])
    return {"ready_s": round(ready, 3), "first_chat_s": round(latencies[0], 3),
            "hundredth_chat_s": round(latencies[min(99, len(latencies) - 1)], 3),
            "chat_p50_s": round(statistics.median(later), 3) if later else 0.0,
            "another_session_first_chat_s": round(another, 3),
            "refusals": refusals, "refused_stored": sorted(s for s in listed if s.startswith("refused-"))}


def main(repeat: int = 5, keep: Path | None = None, with_serve: bool = True) -> dict:
    root = Path(keep) if keep else Path(tempfile.mkdtemp(prefix="pager-bench-startup-"))
    root.mkdir(parents=True, exist_ok=True)
    try:
        report = {"session": f"{len(NOTES)} lines, one open page", "repeat": repeat, **commands(root, repeat)}
        if with_serve:
            report["serve"] = serve(root)
        report["load_average"] = [round(x, 2) for x in os.getloadavg()]
        report["cpus"] = os.cpu_count()
        return report
    finally:
        if not keep:
            shutil.rmtree(root, ignore_errors=True)
