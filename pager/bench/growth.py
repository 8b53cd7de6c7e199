"""`pager bench scale --session-pages 10000,100000`: one session as it grows.

An agent that talks all year has one session of 100K pages, not fifty of 2,000. For each size a
home of its own holds one session of that many pages (synthetic conversation, real embeddings and
bookmarks, written through the store as `bench scale` writes its measured session), opened and
closed once so that its index cache is on disk, as any earlier process leaves it. Then, per size:

- **open**: a new process opens the session (imports, tokenizer and embedder loaded before the
  clock starts), and says the RSS the open added; then the first read of the bookmark directory
  (which places the pages' keywords, as the first search does) is timed, and what the session then
  holds is counted (`held_bytes`);
- **cold search**: a new `pager search` process, start to exit (the median of three, sizes in turn);
- **paging and search**: every size's session open in this process, each question assembled
  (automatic paging plus assembly) and searched on every size in turn, in rotating order, so that
  all sizes meet the same moment of a shared machine; wall and process CPU time;
- **screened against exact**: on the largest session, if it has pieces enough to be screened
  (search.Index.SCREEN_FROM), the pages and pieces its search finds against those of the exact search.

`growth` is each figure of the largest size over the smallest's, from the same run: the ratio, not
the milliseconds, is what carries between machines.
"""

from __future__ import annotations

import gc
import json
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

from ..config import Config
from ..context import build
from ..home import Home
from ..session import settle
from ..tokens import get_tokenizer

SEARCH = "budget review"   # the cold `pager search`'s query, as in `bench scale`


def _config(folder: Path) -> Config:
    return Config.load(home=folder, session="measured", user="u0", db=str(folder / "db"))


def build_home(folder: Path, pages: int) -> dict:
    """One session of `pages` pages in a home of its own; its first open (the index made from the
    store's vectors) and close (the index cache and snapshot written) timed."""
    from .scale import _bulk_session

    config = _config(folder)
    t0 = time.perf_counter()
    with Home(config) as home:
        got, turns = _bulk_session(home.store, get_tokenizer(config.encoding), "u0", "measured", pages,
                                   config.page_tokens, seed=7, embedder=home.embedder)
        home.store.compact(0)
    built = time.perf_counter() - t0
    with Home(config) as home:
        _load_parts(home)
        t0 = time.perf_counter()
        home.open()
        first = time.perf_counter() - t0
    return {"pages": got, "turns": turns, "build_s": round(built, 1), "first_open_s": round(first, 2)}


def _load_parts(home: Home) -> None:
    """The store, embedder and tokenizer loaded before the clock starts: the open alone is timed."""
    for part in (home.store, home.embedder, home.tokenizer):
        assert part is not None


def _rss_bytes() -> int:
    try:
        with open("/proc/self/statm") as fh:
            return int(fh.read().split()[1]) * 4096
    except OSError:   # not Linux: the peak, which for this process is the open's
        import resource

        return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024


def probe(folder: Path) -> dict:
    """In a new process: open the session as a user would, and what the open holds."""
    config = _config(folder)
    with Home(config) as home:
        _load_parts(home)
        gc.collect()
        before = _rss_bytes()
        t0, c0 = time.perf_counter(), time.process_time()
        session = home.open()
        open_s, open_cpu_s = time.perf_counter() - t0, time.process_time() - c0
        gc.collect()
        rss = _rss_bytes() - before
        # the bookmark directory places the pages' keywords when first read (the first search): timed apart,
        # and what the session holds counted once it has
        t0, c0 = time.perf_counter(), time.process_time()
        assert session.directory.index is not None
        place_s, place_cpu_s = time.perf_counter() - t0, time.process_time() - c0
        gc.collect()
        placed = _rss_bytes() - before
        held = held_bytes(session)
        pages = max(len(session.pages), 1)
        return {"open_s": round(open_s, 3), "open_cpu_s": round(open_cpu_s, 3), "rss_mb": round(rss / 2**20, 1),
                "rss_bytes_per_page": round(rss / pages), "directory_s": round(place_s, 3),
                "directory_cpu_s": round(place_cpu_s, 3), "rss_placed_bytes_per_page": round(placed / pages),
                "held_bytes_per_page": {k: round(v / pages) for k, v in held.items()}}


def probe_process(folder: Path) -> dict:
    """`probe` in a new process: the open as a user's command meets it, and its RSS alone."""
    out = subprocess.run([sys.executable, "-m", "pager.bench.growth", str(folder)], capture_output=True, check=True,
                         text=True)
    return json.loads(out.stdout.strip().splitlines()[-1])


def held_bytes(session) -> dict[str, int]:
    """Bytes of the Python objects and arrays an open session holds, by what holds them: the search
    index (its vectors, BM25 postings, per-piece lists, vocabulary, a large session's vector screen), the
    pages, the page table, the bookmark directory, and what the RSS the open added holds besides
    (LanceDB's and Arrow's own memory, the allocator's free lists). An object two of them share is counted once, in the first."""
    index = session.index
    seen: set[int] = set()
    parts = {
        "index_vectors": _deep([index._vectors, getattr(index, "_spare", None), index._pending], seen),
        "index_bm25": _deep([index.bm25], seen),
        "index_vocabulary": _deep([index.vocabulary], seen),
        "index_per_piece": _deep([index.piece_terms, index.piece_update, index.piece_page, index.piece_speaker,
                                  index.piece_ts, index.piece_importance, index.piece_kind, index.page_pieces], seen),
        "index_arrays": _deep([index._cache], seen),
        "index_screen": _deep([getattr(index, "screen", None)], seen),   # a large session's sign codes, once searched
        "pages": _deep([session.pages], seen),
        "page_table": _deep([session.paging], seen),
        "directory": _deep([session.directory], seen),
    }
    parts["index_other"] = _deep([index], seen)
    return parts


def _deep(roots: list, seen: set[int]) -> int:
    """sys.getsizeof over everything reachable from roots (a numpy array counts its buffer once,
    through the array that owns it; an Arrow table its buffers), skipping what `seen` holds and adding to it."""
    import types

    skip = (type, types.ModuleType, types.FunctionType, types.BuiltinFunctionType, types.MethodType)
    total, stack = 0, [r for r in roots if r is not None]
    while stack:
        obj = stack.pop()
        if id(obj) in seen or isinstance(obj, skip):
            continue
        if isinstance(obj, np.ndarray):   # its buffer once, whichever array (or view of it) comes first
            owner = obj
            while isinstance(owner.base, np.ndarray):
                owner = owner.base
            buffer = owner if owner.base is None else owner.base
            if id(buffer) not in seen:
                seen.add(id(buffer))
                total += owner.nbytes
            seen.add(id(obj))
            continue
        seen.add(id(obj))
        if hasattr(obj, "get_total_buffer_size"):   # an Arrow table or array: its buffers (the pages' columns)
            total += obj.get_total_buffer_size()
            continue
        total += sys.getsizeof(obj)
        stack.extend(gc.get_referents(obj))
    return total


def _percentiles(values: list[float]) -> dict:
    from .scale import _percentiles

    return _percentiles(values)


def cold_search(folder: Path) -> float:
    config = _config(folder)
    t0 = time.perf_counter()
    subprocess.run([sys.executable, "-m", "pager.cli", "--home", str(folder), "--db", config.db_uri, "search", SEARCH,
                    "-s", "measured"], env=_env(), capture_output=True, check=True)
    return time.perf_counter() - t0


def _env() -> dict:
    import os

    return {**os.environ, "PAGER_USER": "u0"}


def page_and_search(folders: dict[int, Path], queries: int) -> dict[int, dict]:
    """Paging + assembly and the search tool on every size's session, question by question, sizes in
    rotating order."""
    asks = questions(queries)
    homes = {n: Home(_config(folder)) for n, folder in folders.items()}
    try:
        sessions = {n: home.open() for n, home in homes.items()}
        settle()   # as the REPL and the MCP server do
        wall: dict[int, list[float]] = {n: [] for n in folders}
        cpu: dict[int, list[float]] = {n: [] for n in folders}
        searching: dict[int, list[float]] = {n: [] for n in folders}
        sizes = list(folders)
        for i, q in enumerate(asks):
            for n in sizes[i % len(sizes):] + sizes[: i % len(sizes)]:
                t0, c0 = time.perf_counter(), time.process_time()
                build(sessions[n], q, prefix="You are a helpful assistant.", budget=8192)
                wall[n].append((time.perf_counter() - t0) * 1000)
                cpu[n].append((time.process_time() - c0) * 1000)
                t0 = time.perf_counter()
                sessions[n].search(q, k=5)
                searching[n].append((time.perf_counter() - t0) * 1000)
        return {n: {"paging_ms": _percentiles(wall[n]), "paging_cpu_ms": _percentiles(cpu[n]),
                    "search_ms": _percentiles(searching[n])} for n in folders}
    finally:
        for home in homes.values():
            home.close()


def questions(queries: int) -> list[str]:
    """The bench's questions: a speaker and two of the synthetic conversation's words each."""
    from .scale import NAMES, WORDS

    return [f"what did {NAMES[i % len(NAMES)]} say about the {WORDS[20 + i % 50]} and {WORDS[25 + (7 * i) % 50]}?"
            for i in range(queries)]


def screened_against_exact(folder: Path, queries: int) -> dict | None:
    """What the vector screen (pager/screen.py) changes, on a session large enough to be screened: for the
    search tool's k and automatic paging's, against the same session's search with every piece scored
    exactly, the share of questions whose best page is the same, of the exact top-k pages found, of
    questions given the same k pages in the same order, and of the exact top 50 pieces found. None below
    the screen's threshold."""
    with Home(_config(folder)) as home:
        session = home.open()
        index = session.index
        if len(index.piece_page) < index.SCREEN_FROM:
            return None
        room = session.autopage_room()
        out = {}
        for name, k, depth in (("search_tool", 5, None), ("automatic_paging", room, room)):
            found: dict[bool, list] = {}
            for exact in (True, False):
                index.SCREEN_FROM = 2**62 if exact else type(index).SCREEN_FROM
                index.__dict__.pop("_memo", None)   # the last query's scores, kept across searches
                found[exact] = []
                for q in questions(queries):
                    hits = index.search(q, home.embedder, session.directory, k, {session.tail_n}, session.clock(),
                                        None, None, depth)
                    scored = index.scored if index.scored is not None else np.zeros(0)
                    found[exact].append(([h.n for h in hits], set(np.argsort(-scored, kind="stable")[:50].tolist())))
            pairs = list(zip(found[True], found[False]))
            out[name] = {"k": k,
                         "top_page_same": round(float(np.mean([a[0][:1] == b[0][:1] for a, b in pairs])), 4),
                         "top_pages_found": round(float(np.mean([len(set(a[0]) & set(b[0])) / max(len(a[0]), 1)
                                                                 for a, b in pairs])), 4),
                         "same_list": round(float(np.mean([a[0] == b[0] for a, b in pairs])), 4),
                         "top_pieces_found": round(float(np.mean([len(a[1] & b[1]) / 50 for a, b in pairs])), 4)}
        del index.SCREEN_FROM   # the class's threshold again
        return out


def run(sizes: list[int], folder: Path, queries: int = 200, progress: bool = True, cold_runs: int = 3) -> dict:
    say = (lambda text: print(text, file=sys.stderr, flush=True)) if progress else (lambda text: None)
    sizes = sorted(set(sizes))
    folders = {n: folder / f"session_{n}" for n in sizes}
    rows: dict[int, dict] = {}
    for n, where in folders.items():
        say(f"building one session of {n:,} pages")
        rows[n] = build_home(where, n)
    say(f"opening each in a new process, {cold_runs} time(s)")
    probes: dict[int, list[dict]] = {n: [] for n in sizes}
    for _ in range(cold_runs):   # sizes in turn, so that each meets the same moments of the machine
        for n, where in folders.items():
            probes[n].append(probe_process(where))
    for n in sizes:   # the process whose open took the median time, with what it held
        rows[n].update(sorted(probes[n], key=lambda p: p["open_s"])[len(probes[n]) // 2])
    say(f"cold `pager search`, {cold_runs} time(s) each")
    colds: dict[int, list[float]] = {n: [] for n in sizes}
    for _ in range(cold_runs):
        for n, where in folders.items():
            colds[n].append(cold_search(where))
    for n in sizes:
        rows[n]["cold_search_s"] = round(float(np.median(colds[n])), 3)
    say(f"paging and search, {queries} questions on every size in turn")
    for n, timed in page_and_search(folders, queries).items():
        rows[n].update(timed)
    say("the screened search against the exact, on the largest session")
    screen = screened_against_exact(folders[sizes[-1]], queries)
    small, large = rows[sizes[0]], rows[sizes[-1]]

    def ratio(get) -> float:
        return round(get(large) / max(get(small), 1e-9), 2)

    growth = {"pages": ratio(lambda r: r["pages"]),
              "paging_p95": ratio(lambda r: r["paging_ms"]["p95"]),
              "paging_cpu_p95": ratio(lambda r: r["paging_cpu_ms"]["p95"]),
              "search_p95": ratio(lambda r: r["search_ms"]["p95"]),
              "open": ratio(lambda r: r["open_s"]),
              "open_cpu": ratio(lambda r: r["open_cpu_s"]),
              "cold_search": ratio(lambda r: r["cold_search_s"]),
              "rss": ratio(lambda r: r["rss_mb"])}
    return {"session_pages": [rows[n]["pages"] for n in sizes], "sizes": {str(n): rows[n] for n in sizes},
            "growth": growth, "screened_against_exact": screen}


def main(sizes: list[int], home: Path | None) -> dict:
    """One session of each size, in `home` if given (kept) or a temporary folder."""
    import tempfile

    if home:
        return run(sizes, Path(home))
    with tempfile.TemporaryDirectory(prefix="pager-growth-") as folder:
        return run(sizes, Path(folder))


if __name__ == "__main__":   # python -m pager.bench.growth HOME: the open, measured in this new process
    print(json.dumps(probe(Path(sys.argv[1]))))
