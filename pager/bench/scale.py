"""`pager bench scale --pages N`: what pager costs as memory grows (`--session-pages N,M`: one session
of each size instead, pager/bench/growth.py).

Builds a home of N pages across many sessions and users (synthetic conversation text,
deterministic), then measures on one large session: durable ingest throughput, automatic
paging plus assembly per turn, the `search` tool, a cold `pager search` process, peak RSS,
bytes on disk per page, and LanceDB files and versions after compaction.

`pages` in the report is the N built; the measured session then grows through the durable
path, so `measured_session_pages` and `home_pages` (every page in the home at the end) are larger.

The background sessions are bulk-written through the store (pages packed by the real
packer, vectors drawn at random: they are on disk to be filtered past, never searched); the
measured session gets real embeddings and is then extended turn by turn through the durable
path, journal fsync included.

In the same run, on the same data, it times the reference work a vector-store memory does, so
machines that differ by 2x compare by ratio: per turn one LanceDB IVF-PQ vector query plus one
full-text query, both filtered to the session (`reference_query_ms`; queries embedded
beforehand, so the reference pays no embedding and the ratio does not flatter pager), and for
ingest the same turns embedded with the configured embedder and appended in batches of 1,000
with no journal (`reference_append_turns_per_s`). Each is timed beside pager's own: every append
of 1,000 turns next to the reference's append of the same turns, every question's paging next to
the reference's two queries for it, in alternating order, so that both meet the same moment of a
shared machine (timed one after the other, minutes apart, the reference's query p95 alone moved
from 11 to 37 ms between runs of the same code: BENCHMARKS.md, "Cost against a plain vector store").
`paging_ratio` = paging p95 / reference p95;
`ingest_ratio` = durable ingest rate / reference rate, pager appending in groups of 1,000 as the
reference does (one journal fsync per group, each acknowledged after it; `pager ingest FILE` makes
the whole file one group), with appends of 50 reported beside it (`ingest_50_turns_per_s`,
`ingest_50_ratio`) and both in CPU time too (`ingest_cpu_ratio`). On a shared machine wall time includes
waiting for a core, so paging and the reference queries are timed in CPU time of the process as
well (`paging_cpu_ms`, `reference_query_cpu_ms`: LanceDB's own threads count too), and
`paging_cpu_ratio` is their p95 ratio.

The cost of the memory tiers is measured in the same run too: the measured session is given
recorded-style facts, a working state and summaries, and each question is assembled with them and without
them (`paging_with_tiers_ms`, `paging_without_tiers_ms`, `tiers_paging_ratio` of their p95s; the same
in CPU time as `paging_with_tiers_cpu_ms`, `paging_without_tiers_cpu_ms`, `tiers_paging_cpu_ratio`).
"""

from __future__ import annotations

import json
import os
import resource
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

from . import need
from ..config import Config
from ..context import build
from ..home import Home
from ..page import Packer, Turn
from ..session import settle
from ..store import Batch
from ..tokens import get_tokenizer

WORDS = ("the a to and of we I you it that is was for on in with this my our team plan build deploy review "
         "sync engine budget meeting offsite contract launch design test bug fix release customer data model "
         "cache index query page memory frame policy latency disk journal report dashboard metrics alert "
         "garden coffee lunch weekend trip train bike run marathon concert movie book recipe dinner family "
         "kids dog cat school doctor appointment flight hotel beach mountain lake museum market river").split()
NAMES = "Maya Sam Priya Jonas Petra Ottilie Ines Tomas Lena Arjun Chen Noor Felix Ada Kofi Sofia".split()
MONTHS = "January February March April May June July August September October November December".split()


class TextGenerator:
    """Deterministic, conversation-like turns: Zipf-distributed words, names, numbers, dates."""

    def __init__(self, seed: int) -> None:
        self.rng = np.random.default_rng(seed)
        ranks = np.arange(1, len(WORDS) + 1)
        self.p = (1 / ranks) / (1 / ranks).sum()

    def turns(self, count: int) -> list[str]:
        lengths = self.rng.integers(6, 40, size=count)
        words = self.rng.choice(len(WORDS), size=int(lengths.sum()), p=self.p)
        names = self.rng.integers(0, len(NAMES), size=count)
        numbers = self.rng.integers(1, 5000, size=count)
        days = self.rng.integers(1, 28, size=count)
        months = self.rng.integers(0, 12, size=count)
        out, at = [], 0
        for i, n in enumerate(lengths):
            body = " ".join(WORDS[w] for w in words[at : at + n])
            at += n
            out.append(f"{NAMES[names[i]]} said {body} around {numbers[i]} on {days[i]} {MONTHS[months[i]]}.")
        return out


def _bulk_session(store, tokenizer, user: str, session: str, pages: int, page_tokens: int, seed: int,
                  embedder=None, start_ts: float = 1.7e9) -> tuple[int, int]:
    """Write about `pages` pages of one session straight through the store; returns (pages, turns)."""
    gen = TextGenerator(seed)
    packer = Packer(session, tokenizer, page_tokens, user=user)
    sealed: list = []
    turns: list[Turn] = []
    n = 0
    rng = np.random.default_rng(seed + 1)
    longest = (packer.capacity + 1) * tokenizer.longest_token
    while len(sealed) < pages:
        for text in gen.turns(256):
            n += 1
            turn = Turn(session, n, NAMES[n % len(NAMES)], text, "user", "", start_ts + n * 60.0, "", user)
            turns.append(turn)
            # each turn's line counted as the durable path's early count does (Intake.take_accepted), so the
            # pages carry their pieces' counts as pages sealed by an ingest do (Page.piece_tokens)
            line = tokenizer.count(f"{turn.speaker}: {text}") if len(text) <= longest else None
            sealed.extend(packer.add(turn, line_tokens=line))
            if len(sealed) >= pages:
                break
    if embedder is not None:  # the measured session's pages get their automatic bookmarks, as sealing gives them
        from dataclasses import replace

        from ..bookmarks import extract

        sealed = [replace(p, keywords=tuple(extract(p.text))) for p in sealed]
    last_turn = sealed[-1].last_turn
    turns = [t for t in turns if t.turn <= last_turn]
    if embedder is not None:
        flat = [p.piece_text(i).split(": ", 1)[-1] for p in sealed for i in range(len(p.spans))]
        vectors = embedder.embed(flat).astype(np.float16).astype(np.float32)
    else:
        vectors = rng.standard_normal((sum(len(p.spans) for p in sealed), store.dim)).astype(np.float32)
        vectors /= np.linalg.norm(vectors, axis=1, keepdims=True)
    per_page, row = [], 0
    for p in sealed:
        per_page.append(vectors[row : row + len(p.spans)])
        row += len(p.spans)
    for i in range(0, len(sealed), 20_000):
        # a page's last turn may continue on the next page: store turns up to the last whole one
        store.put(Batch(turns=[t for t in turns if sealed[i].first_turn <= t.turn <= sealed[min(i + 20_000, len(sealed)) - 1].last_turn],
                        pages=sealed[i : i + 20_000], vectors=per_page[i : i + 20_000]))
    return len(sealed), len(turns)


INGEST_APPEND = 1_000   # turns per durable append in the headline ingest figure: the reference's batch


def _ingest(home: Home, session, texts: list[str], size: int, bar,
            reference: "_Reference | None" = None) -> tuple[float, float]:
    """(turns/s wall, turns/s of process CPU) appending texts through the durable path in groups of
    `size` (one journal fsync each, acknowledged after it), then flushing them to the store (pager's
    time). With a reference, each group is timed beside the reference's append of the same turns, in
    alternating order so that neither always follows the other."""
    task = bar.add_task(f"durable ingest, appends of {size}" + (", beside the reference" if reference else ""),
                        total=len(texts))
    wall = cpu = 0.0
    for k, i in enumerate(range(0, len(texts), size)):
        group = texts[i : i + size]
        for ours in ((True, False) if k % 2 else (False, True)):
            if not ours:
                if reference is not None:
                    reference.append(group, i)
                continue
            t0, c0 = time.perf_counter(), time.process_time()
            session.append_many([{"speaker": NAMES[j % len(NAMES)], "text": t} for j, t in enumerate(group)])
            wall, cpu = wall + time.perf_counter() - t0, cpu + time.process_time() - c0
        bar.update(task, completed=i + len(group))
    t0, c0 = time.perf_counter(), time.process_time()
    home.flush()
    wall, cpu = wall + time.perf_counter() - t0, cpu + time.process_time() - c0
    return len(texts) / wall, len(texts) / cpu


class _Bulk:
    """The background sessions written in large batches, as a bulk import would write them: one
    LanceDB append per table per `size` pages (on an object store, a handful of objects and one
    manifest) instead of one per session, and without Store.put's read of the keys already stored (a
    filtered scan per session and table, which on the object store grew with the table: 14 of the 74
    s of building 100K pages into the local S3 server). Only for a fresh store no other process
    writes; pager's own durable path is untouched (the measured session's ingest goes through it)."""

    def __init__(self, store, size: int = 20_000) -> None:
        self.store, self.size, self.batch = store, size, Batch()

    @property
    def dim(self) -> int:
        return self.store.dim

    def put(self, batch: Batch, fence=None) -> None:
        self.batch.turns += batch.turns
        self.batch.pages += batch.pages
        self.batch.vectors += batch.vectors
        if len(self.batch.pages) >= self.size:
            self.flush()

    def flush(self) -> None:
        batch, self.batch = self.batch, Batch()
        if not batch.pages:
            return
        from ..store import LanceStore, _page_row, _turn_row

        if not isinstance(self.store, LanceStore):
            self.store.put(batch)
            return
        import pyarrow as pa

        schemas = self.store._schemas()
        for name, rows in (("turns", [_turn_row(t) for t in batch.turns]),
                           ("pages", [_page_row(p, v) for p, v in zip(batch.pages, batch.vectors)])):
            self.store._tables[name].add(pa.Table.from_pylist(rows, schema=schemas[name]))


def _percentiles(values: list[float]) -> dict:
    xs = np.array(values)
    return {"p50": round(float(np.percentile(xs, 50)), 3), "p95": round(float(np.percentile(xs, 95)), 3),
            "p99": round(float(np.percentile(xs, 99)), 3)}


def run(pages: int, home_path: Path, measured_pages: int | None = None, ingest_turns: int = 4000,
        queries: int = 300, progress: bool = True, db: str | None = None) -> dict:
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    # the store's location and its object-store settings come from --db and the environment, as for every command
    config = Config.load(home=home_path, session="measured", user="u0", db=db or str(home_path / "db"))
    measured_pages = measured_pages or max(200, min(10_000, pages // 10))
    tokenizer = get_tokenizer(config.encoding)
    load_before = os.getloadavg()[0]   # the machine's load, for reading the milliseconds (the ratios hold up better)
    started = time.perf_counter()
    phases: dict[str, float] = {}   # seconds per phase of the run, to see where a slow store spends them
    with Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
                  disable=not progress, transient=True) as bar:
        clock = [time.perf_counter()]

        def phase(name: str) -> None:
            now = time.perf_counter()
            phases[name] = round(now - clock[0], 1)
            clock[0] = now
            if progress:
                bar.console.print(f"{name}: {phases[name]:.1f} s", style="dim")
        with Home(config) as home:
            store, embedder = home.store, home.embedder
            background = pages - measured_pages
            per_session = 2_000
            task = bar.add_task("building background sessions", total=background)
            written, sessions = 0, 0
            bulk = _Bulk(store)
            while written < background:
                size = min(per_session, background - written)
                got, _ = _bulk_session(bulk, tokenizer, f"u{sessions % 50}", f"s{sessions}", size,
                                       config.page_tokens, seed=sessions + 10)
                written += got
                sessions += 1
                bar.update(task, completed=min(written, background))
            bulk.flush()
            phase("background sessions")
            task = bar.add_task("building the measured session", total=1)
            got, _ = _bulk_session(store, tokenizer, "u0", "measured", measured_pages, config.page_tokens,
                                            seed=7, embedder=embedder)
            bar.update(task, completed=1)
            phase("measured session")
            store.compact(0)
            phase("compaction")
            built_s = time.perf_counter() - started
        total_pages = written + got
        # open the measured session as a user would, and extend it through the durable path
        with Home(config) as home:
            t0 = time.perf_counter()
            session = home.open()
            open_s = time.perf_counter() - t0
            phase("open the session")
            settle()  # as the REPL and the MCP server do
            texts = TextGenerator(99).turns(ingest_turns)
            reference = _Reference(home)
            # appends of 1,000 turns, each beside the reference's append of the same 1,000: one journal fsync
            # each, acknowledged after it (`pager ingest FILE` makes the whole file one such append); then
            # appends of 50 (a chat's or a proxy's smaller groups), so nothing is hidden
            ingest = {INGEST_APPEND: _ingest(home, session, texts, INGEST_APPEND, bar, reference),
                      50: _ingest(home, session, TextGenerator(98).turns(ingest_turns // 2), 50, bar)}
            phase("durable ingest")
            asks = [f"what did {NAMES[i % len(NAMES)]} say about the {WORDS[20 + i % 50]} and {WORDS[25 + (7 * i) % 50]}?"
                    for i in range(queries)]
            reference.index(asks)
            phase("the reference's indexes")
            bar.stop()  # the progress display's refresh thread would compete for the GIL while timing
            paging, paging_cpu, searching = [], [], []
            for i, q in enumerate(asks):
                for ours in ((True, False) if i % 2 else (False, True)):   # each question beside the reference's
                    if not ours:
                        reference.query(i)
                        continue
                    t0, c0 = time.perf_counter(), time.process_time()
                    build(session, q, prefix="You are a helpful assistant.", budget=8192)
                    paging.append((time.perf_counter() - t0) * 1000)
                    paging_cpu.append((time.process_time() - c0) * 1000)
                    t0 = time.perf_counter()
                    session.search(q, k=5)
                    searching.append((time.perf_counter() - t0) * 1000)
            reference.close()
            phase("paging and search, beside the reference")
            tiers = _tier_costs(session, asks, session.turn_count)
            phase("tiers")
            bar.start()
            session_pages = len(session.pages)
        rss_mb = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
        with Home(config) as home:
            home.store.compact(0)
            stats = home.store.stats()
        phase("close, compact, stats")
        t0 = time.perf_counter()
        subprocess.run([sys.executable, "-m", "pager.cli", "--home", str(home_path), "--db", config.db_uri, "search",
                        "budget review", "-s", "measured"], env=_env({"PAGER_USER": "u0"}), capture_output=True, check=True)
        cold_s = time.perf_counter() - t0
        phase("cold search")
        raw = _raw_bytes(config)
        phase("raw bytes")
    ingest_rate, ingest_cpu_rate = ingest[INGEST_APPEND]
    timed = reference.report()
    return {
        "pages": total_pages,
        "load_average": [round(load_before, 2), round(os.getloadavg()[0], 2)],
        "sessions": sessions + 1,
        "measured_session_pages": session_pages,
        "home_pages": written + session_pages,   # `pages` is the size built; the measured session then grows
        "build_s": round(built_s, 1),
        "phases_s": phases,
        "open_session_s": round(open_s, 3),
        "ingest_append_turns": INGEST_APPEND,
        "ingest_turns_per_s": round(ingest_rate, 1),
        "ingest_cpu_turns_per_s": round(ingest_cpu_rate, 1),
        "ingest_50_turns_per_s": round(ingest[50][0], 1),
        "ingest_50_cpu_turns_per_s": round(ingest[50][1], 1),
        "paging_ms": _percentiles(paging),
        "paging_cpu_ms": _percentiles(paging_cpu),
        "search_ms": _percentiles(searching),
        "cold_search_s": round(cold_s, 3),
        "rss_mb": round(rss_mb, 1),
        "disk_bytes_per_page": round(stats["bytes"] / max(total_pages, 1), 1),
        "raw_text_and_vector_bytes_per_page": round(raw / max(total_pages, 1), 1),
        "lance_files": stats["files"],
        "lance_versions": stats["versions"],
        "reference_query_ms": timed["query_ms"],
        "reference_query_cpu_ms": timed["query_cpu_ms"],
        "reference_vector_ms": timed["vector_ms"],
        "reference_fts_ms": timed["fts_ms"],
        "reference_append_turns_per_s": round(timed["append_turns_per_s"], 1),
        "reference_append_cpu_turns_per_s": round(timed["append_cpu_turns_per_s"], 1),
        "paging_ratio": round(float(np.percentile(paging, 95)) / max(timed["query_ms"]["p95"], 1e-9), 3),
        **tiers,
        "ingest_ratio": round(ingest_rate / timed["append_turns_per_s"], 3),
        "ingest_50_ratio": round(ingest[50][0] / timed["append_turns_per_s"], 3),
        "ingest_cpu_ratio": round(ingest_cpu_rate / timed["append_cpu_turns_per_s"], 3),
        # the same ratio in CPU time (every thread of the process): on a shared machine, wall time is
        # also the time spent waiting for a core, which the ratio above does not separate out
        "paging_cpu_ratio": round(float(np.percentile(paging_cpu, 95)) / max(timed["query_cpu_ms"]["p95"], 1e-9), 3),
    }


def _tier_costs(session, asks: list[str], turns: int) -> dict:
    """Paging + assembly with the memory tiers present against without, in the same run on the same
    questions: the measured session gets recorded-style facts (one per 10 turns, some superseding
    older ones on their subject, as a memory model writes them), a working state of 12 keys, and
    episode summaries (one per 50 turns) with a rolling one; then each question is assembled with
    the tiers and without them (the session's facts, state and summaries set aside), in alternating
    order so neither side always follows the other, each from the same paging state (the one the
    question found), so that neither pays for or profits from the frames the other left."""
    from ..facts import Draft, Facts
    from ..state import State
    from ..summaries import Draft as SummaryDraft, Summaries

    rng = np.random.default_rng(23)
    count = max(1, turns // 10)
    drafts = []
    for _ in range(count):
        name, thing = NAMES[int(rng.integers(len(NAMES)))], WORDS[20 + int(rng.integers(len(WORDS) - 20))]
        drafts.append(Draft(f"{name.lower()} {thing}", f"{name}'s {thing} is {int(rng.integers(1, 5000))} since "
                                                       f"{int(rng.integers(1, 28))} {MONTHS[int(rng.integers(12))]}",
                            (int(rng.integers(1, turns + 1)),)))
    session.add_facts(drafts, "recorded")
    episodes = []   # an episode summary per 50 turns, and the rolling one, as a summarizer writes them
    for first in range(1, turns + 1, 50):
        who = [NAMES[int(rng.integers(len(NAMES)))] for _ in range(3)]
        what = [WORDS[20 + int(rng.integers(len(WORDS) - 20))] for _ in range(6)]
        episodes.append(SummaryDraft("episode", f"episode {first // 50 + 1}",
                                     f"{who[0]} and {who[1]} talked about the {what[0]} and the {what[1]}; {who[2]} "
                                     f"decided to {what[2]} the {what[3]} by {int(rng.integers(1, 28))} "
                                     f"{MONTHS[int(rng.integers(12))]}, and asked about the {what[4]} {what[5]}.",
                                     (first, min(turns, first + 49))))
    episodes.append(SummaryDraft("rolling", "rolling", "So far: " + " ".join(d.text for d in episodes[-3:]), (1, turns)))
    session.add_summaries(episodes, "recorded")
    for i in range(12):
        session.set_state(f"{WORDS[40 + i]}_{i}", f"{NAMES[i % len(NAMES)]} owns the {WORDS[60 + i]} until {i + 1} May")
    tiered, bare = (session.facts, session.state, session.summaries), (Facts(), State(), Summaries())
    wall: dict[bool, list[float]] = {True: [], False: []}
    cpu: dict[bool, list[float]] = {True: [], False: []}
    shown: list = []
    for i, q in enumerate(asks):
        start = session.paging_state()   # both sides start from the same frames: neither inherits the other's
        for tiers in ((tiered, bare) if i % 2 else (bare, tiered)):
            session.load_paging_state(start)
            session.facts, session.state, session.summaries = tiers
            t0, c0 = time.perf_counter(), time.process_time()
            ctx = build(session, q, prefix="You are a helpful assistant.", budget=8192)
            wall[tiers is tiered].append((time.perf_counter() - t0) * 1000)
            cpu[tiers is tiered].append((time.process_time() - c0) * 1000)
            if tiers is tiered:
                shown.append(len(ctx.facts))
    session.facts, session.state, session.summaries = tiered
    return {"tiers": {"facts": len(session.facts), "state_keys": len(session.state.current),
                      "summaries": len(session.summaries), "facts_shown_mean": round(float(np.mean(shown)), 1)},
            "paging_with_tiers_ms": _percentiles(wall[True]), "paging_without_tiers_ms": _percentiles(wall[False]),
            "tiers_paging_ratio": _ratio(wall[True], wall[False]),
            # the same in CPU time of the process: on a shared machine wall time includes waiting for a core
            "paging_with_tiers_cpu_ms": _percentiles(cpu[True]), "paging_without_tiers_cpu_ms": _percentiles(cpu[False]),
            "tiers_paging_cpu_ratio": _ratio(cpu[True], cpu[False])}


def _ratio(slower: list[float], faster: list[float]) -> float:
    """p95 over p95."""
    return round(float(np.percentile(slower, 95)) / max(float(np.percentile(faster, 95)), 1e-9), 3)


class _Reference:
    """The work of a vector-store memory on the same store, timed beside pager's (`_ingest`, the
    question loop of `run`) so that both meet the same moment of a shared machine: the same turns
    embedded and appended in batches of 1,000 to a table of their own, no journal; then an IVF-PQ index
    over the page vectors and a full-text index over page text (as LanceDB recommends at this size),
    made after the ingest (and a compaction) so they cover what pager's questions search, and per
    question one ANN query and one full-text query filtered to the session. Its table and indexes are
    dropped before the store's files are counted."""

    TABLE = "reference_turns"

    def __init__(self, home: Home) -> None:
        import pyarrow as pa

        from ..store import LanceStore

        store = home.store
        assert isinstance(store, LanceStore), "the reference work runs on LanceDB"
        self.store, self.embedder = store, home.embedder
        self.schema = pa.schema([("user", pa.string()), ("session", pa.string()), ("turn", pa.int64()),
                                 ("text", pa.string()), ("vector", pa.list_(pa.float32(), self.store.dim))])
        self.table = self.store.db.create_table(self.TABLE, schema=self.schema, mode="overwrite")
        self.append_s = self.append_cpu_s = 0.0
        self.appended = 0
        self.vector_ms: list[float] = []
        self.fts_ms: list[float] = []
        self.both_ms: list[float] = []
        self.cpu_ms: list[float] = []

    def append(self, texts: list[str], first: int) -> None:
        import pyarrow as pa

        t0, c0 = time.perf_counter(), time.process_time()
        # an embedder that keeps what it embedded (minilm) is asked anew: the reference pays its own embedding
        embed = getattr(self.embedder, "fresh", self.embedder.embed)
        embedded = np.ascontiguousarray(embed(texts), dtype=np.float32)
        # built column by column, the vectors handed over as one buffer: rows of Python lists of floats
        # cost the reference ~8 ms per 1,000 turns more (BENCHMARKS.md, "Cost against a plain vector store")
        self.table.add(pa.table({"user": pa.array(["u0"] * len(texts)), "session": pa.array(["reference"] * len(texts)),
                                 "turn": pa.array(np.arange(first + 1, first + len(texts) + 1, dtype=np.int64)),
                                 "text": pa.array(texts),
                                 "vector": pa.FixedSizeListArray.from_arrays(pa.array(embedded.ravel()), self.store.dim)},
                                schema=self.schema))
        self.append_s += time.perf_counter() - t0
        self.append_cpu_s += time.process_time() - c0
        self.appended += len(texts)

    def index(self, asks: list[str]) -> None:
        """The indexes over the pages as they are after the ingest, and the questions' vectors (embedded
        beforehand, so the reference pays no embedding and the ratio does not flatter pager)."""
        import math

        from lancedb.expr import col, lit

        self.store.compact(0)
        self.pages = self.store._tables["pages"]
        self.pages.checkout_latest()
        before = {i.name for i in self.pages.list_indices()}
        rows = self.pages.count_rows()
        self.pages.create_index(metric="cosine", vector_column_name="vector", index_type="IVF_PQ",
                                num_partitions=max(1, int(math.sqrt(rows))), num_sub_vectors=max(1, self.store.dim // 16))
        self.pages.create_fts_index("text", replace=True)
        self.made = [i.name for i in self.pages.list_indices() if i.name not in before]
        self.where = (col("user") == lit("u0")) & (col("session") == lit("measured"))
        self.asks, self.vectors = asks, self.embedder.embed(asks)

    def query(self, i: int) -> None:
        t0, c0 = time.perf_counter(), time.process_time()
        self.pages.search(self.vectors[i].tolist(), vector_column_name="vector").metric("cosine") \
            .where(self.where, prefilter=True).select(["n", "text", "_distance"]).limit(8).to_list()   # naming the score: no deprecation line per query
        t1 = time.perf_counter()
        self.pages.search(self.asks[i], query_type="fts").where(self.where, prefilter=True) \
            .select(["n", "text", "_score"]).limit(8).to_list()
        t2 = time.perf_counter()
        self.vector_ms.append((t1 - t0) * 1000)
        self.fts_ms.append((t2 - t1) * 1000)
        self.both_ms.append((t2 - t0) * 1000)
        self.cpu_ms.append((time.process_time() - c0) * 1000)

    def close(self) -> None:
        self.store.db.drop_table(self.TABLE)
        for name in getattr(self, "made", []):
            self.pages.drop_index(name)

    def report(self) -> dict:
        return {"query_ms": _percentiles(self.both_ms), "query_cpu_ms": _percentiles(self.cpu_ms),
                "vector_ms": _percentiles(self.vector_ms), "fts_ms": _percentiles(self.fts_ms),
                "append_turns_per_s": self.appended / self.append_s,
                "append_cpu_turns_per_s": self.appended / self.append_cpu_s}


def _env(extra: dict) -> dict:
    import os

    return {**os.environ, **extra}


def _raw_bytes(config: Config) -> int:
    """Text of every turn and page plus one float16 vector per piece and a float32 page vector."""
    import lancedb

    db = lancedb.connect(config.db_uri, storage_options=config.storage_options or None)
    turns = db.open_table("turns").search().select(["text"]).limit(None).to_arrow().column("text")
    pages = db.open_table("pages").search().select(["text", "pieces"]).limit(None).to_arrow()
    text = sum(len(t.as_py().encode()) for t in turns) + sum(len(t.as_py().encode()) for t in pages.column("text"))
    dim = db.open_table("pages").schema.field("vector").type.list_size
    vectors = sum(len(b.as_py()) for b in pages.column("pieces")) + pages.num_rows * dim * 4
    return text + vectors


def main(pages: int, out: Path | None, home: Path | None, db: str | None = None) -> dict:
    import tempfile

    with tempfile.TemporaryDirectory(prefix="pager-scale-") as folder:
        report = run(pages, Path(home) if home else Path(folder), db=db)
    if out:
        Path(out).write_text(json.dumps(report, indent=1) + "\n")
    return report


def plot(reports: list[dict], out: Path) -> None:
    """Paging, search and cold-start latency against pages in the home (log scale), to a PNG."""
    import logging

    matplotlib = need("matplotlib", "a plot")
    matplotlib.use("Agg")
    logging.getLogger("matplotlib").setLevel(logging.WARNING)
    import matplotlib.pyplot as plt

    reports = sorted(reports, key=lambda r: r["pages"])
    xs = [r["pages"] for r in reports]
    fig, (left, right) = plt.subplots(1, 2, figsize=(10, 4), dpi=120)
    for key, label, style in (("paging_ms", "automatic paging + assembly", "o-"), ("search_ms", "search tool", "s-")):
        for q, alpha in (("p50", 1.0), ("p95", 0.55)):
            left.plot(xs, [r[key][q] for r in reports], style, alpha=alpha, label=f"{label} {q}")
    left.axhline(10, color="grey", linestyle=":", linewidth=1)
    right.plot(xs, [r["cold_search_s"] for r in reports], "o-", label="cold `pager search` (s)")
    right.plot(xs, [r["open_session_s"] for r in reports], "s-", label="open the session (s)")
    for ax, unit, title in ((left, "ms per turn", "per-turn cost"), (right, "seconds", "cold start")):
        ax.set_xscale("log")
        ax.set_xlabel("pages in the home")
        ax.set_ylabel(unit)
        ax.set_title(title)
        ax.legend(fontsize=7)
        ax.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(out)
    plt.close(fig)


if __name__ == "__main__":  # python -m pager.bench.scale OUT.png REPORT.json...
    plot([json.loads(Path(p).read_text()) for p in sys.argv[2:]], Path(sys.argv[1]))
