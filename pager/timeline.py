"""A self-contained HTML timeline of a trace: frames down, model calls across.

Each column is one assembled context (one model call); each row one frame. A cell shows the
page in that frame: yellow where it was faulted in for this call, magenta when pinned, cyan
for the open tail, grey otherwise; a red corner marks a frame whose previous page was
evicted, and hovering it names the pages that left and why (the policy, or page_out). Hovering a
cell shows the page's header and text; hovering a column head shows the message and the token
counts.

Below the frames, one lane per memory tier shows what changed at or after each call: the
working state (a key set or unset), facts (written; orange when one supersedes another, red
when one ends another) and summaries (`summary` events, a new summary or a new version), each
mark with its details on hover. Changes made before the first call (an ingest, a memory model's first batches) show in
the first column.
"""

from __future__ import annotations

import html
import json
from dataclasses import dataclass, field
from pathlib import Path

from .replay import replay


@dataclass
class Column:
    label: str
    message: str
    slots: list[int | None]
    faulted: set[int]
    evicted_frames: dict[int, list[str]]   # frame → what left it since the call before: "p62 (policy clock)"
    pinned: set[int]
    tail: int
    tokens: dict
    start: int = 0        # events of the run before this call
    marks: dict[str, list[tuple[str, str]]] = field(default_factory=dict)   # lane → (kind, detail)


LANES = ("state", "facts", "summaries", "reranker")
MARK_COLORS = {"set": "#9ad29a", "unset": "#b9b9b9", "fact": "#8fb8e8", "supersedes": "#f0a050", "ends": "#e06666",
               "summary": "#c9a0e8", "reranked": "#f5d76e", "failed": "#e06666"}
# what each lane's marks count as in the page's summary line (a reranker's failures apart)
COUNTED = {"state": "state changes", "facts": "facts", "summaries": "summaries", "reranker": "reranker answers"}


@dataclass
class Timeline:
    columns: list[Column] = field(default_factory=list)
    pages: dict[int, str] = field(default_factory=dict)
    title: str = ""
    faults: int = 0       # fault events of the run (a page entering a frame)
    evictions: int = 0    # evict events of the run (a page leaving a frame, by policy or page_out)
    tiers: dict[str, int] = field(default_factory=dict)   # state changes, facts, superseded, ended, summaries


def collect(path: Path) -> Timeline:
    """Replay the trace and keep the frame map at every assembled context."""
    timeline = Timeline(title=Path(path).name)
    seen: dict = {"events": 0, "message": ""}

    def on_context(i, ctx, session, events) -> None:
        new = events[seen["events"]:]
        seen["events"] = len(events)
        for e in new:
            if e["kind"] == "user":
                seen["message"] = e["text"]
        faulted = {int(e["page"][1:]) for e in new if e["kind"] == "fault"}
        evicted: dict[int, list[str]] = {}
        for e in new:
            if e["kind"] == "evict" and e.get("frame", -1) >= 0:
                why = f"policy {e['policy']}" if e.get("reason") == "policy" else e.get("reason", "")
                evicted.setdefault(e["frame"], []).append(f"{e['page']} ({why})")
        seen["session"] = session
        timeline.columns.append(Column(
            label=str(i), message=seen["message"], slots=list(session.frames.slots), faulted=faulted,
            evicted_frames=evicted, pinned={n for n, e in session.table.items() if e.pinned},
            tail=session.tail_n, tokens=dict(ctx.tokens), start=len(events)))
        for n in session.frames.slots:
            if n is not None and n not in timeline.pages:
                timeline.pages[n] = session.render.header(n) + "\n" + (session.render.body(n) or "")

    run = replay(path, on_context=on_context)
    timeline.faults, timeline.evictions = run.count("fault"), run.count("evict")   # what `trace show` counts
    _tier_marks(timeline, run.events, seen.get("session"))
    return timeline


def _tier_marks(timeline: Timeline, events: list[dict], session) -> None:
    """Put each tier event in the lane of the column it happened at or after (the first, if before any)."""
    counts = dict.fromkeys(("state changes", "facts", "superseded", "ended", "summaries", "reranker answers",
                            "reranker failures"), 0)
    ends = [c.start for c in timeline.columns[1:]] + [len(events)]
    for x, (column, end) in enumerate(zip(timeline.columns, ends)):
        begin = 0 if x == 0 else column.start
        for i in range(begin, end):
            mark = _mark(events[i], session)
            if mark:
                lane, kind, detail = mark
                # what follows a context is its reply's (facts and state written from it), but a reranker
                # answers while the next context is made: its mark goes there
                later = lane == "reranker" and i >= column.start and x + 1 < len(timeline.columns)
                timeline.columns[x + 1 if later else x].marks.setdefault(lane, []).append((kind, detail))
                counts["reranker failures" if kind == "failed" else COUNTED[lane]] += 1
                counts["superseded"] += kind == "supersedes"
                counts["ended"] += kind == "ends"
    timeline.tiers = counts


def _mark(e: dict, session) -> tuple[str, str, str] | None:
    kind = e["kind"]
    if kind in ("state", "state_in"):
        change = f"unset {e['key']}" if e["unset"] else f"{e['key']} = {e['value']}"
        return "state", "unset" if e["unset"] else "set", f"{change} (change {e['change']}, {e['source']}, {e['page']})"
    if kind in ("fact", "fact_in"):
        fid = e.get("fact") or f"f{e['n']}"
        fact = session.facts.get(int(fid[1:])) if session is not None else None
        text = f"{fid} [{e['subject']}]: {fact.text if fact else e.get('text', '')}"
        if e.get("ends"):
            return "facts", "ends", f"{text} (ends {e.get('supersedes') or 'the fact before it'})"
        if e.get("supersedes"):
            return "facts", "supersedes", f"{text} (supersedes {e['supersedes']})"
        return "facts", "fact", text
    if kind in ("pieces_reranked", "facts_reranked"):   # a reranker's answer (pager/rerank.py)
        stage, first = kind.split("_")[0], e["order"][0]
        name = f"p{first[0]}'s piece {first[1] + 1}" if stage == "pieces" else f"f{first}"
        return "reranker", "reranked", f"{e['model']}: {len(e['order'])} {stage} reordered, {name} first"
    if kind == "rerank_failed":
        return "reranker", "failed", f"{e['model']} failed on the {e.get('stage', '')}: {e['error']}"
    if kind in ("summary", "summary_in", "summary_written"):   # the summaries tier's events
        if "summary" in e or "n" in e:
            sid = e.get("summary") or f"s{e['n']}"
            pages = "–".join(str(p) for p in e.get("pages", []))
            return "summaries", "summary", (f"{sid} {e.get('type', '')} {e.get('key', '')} v{e.get('version', '?')}"
                                            + (f", {pages}" if pages else "") + (f": {e['text']}" if e.get("text") else ""))[:400]
        detail = {k: v for k, v in e.items() if k not in ("kind", "seq", "ts", "v")}
        return "summaries", "summary", json.dumps(detail, ensure_ascii=False)[:400]
    return None


def render(timeline: Timeline) -> str:
    rows = max((len(c.slots) for c in timeline.columns), default=0)
    cell, head = 34, 26
    lanes = [lane for lane in LANES if any(c.marks.get(lane) for c in timeline.columns)]
    width, height = 60 + cell * len(timeline.columns), head + 18 * rows + 10 + (8 + 18 * len(lanes) if lanes else 0)
    parts = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" font-family="monospace" font-size="10">']
    for r in range(rows):
        parts.append(f'<text x="4" y="{head + 18 * r + 12}" fill="#555">f{r}</text>')
    for x, column in enumerate(timeline.columns):
        left = 60 + cell * x
        tip = html.escape(f"call {column.label}: {column.message[:200]}\n" + json.dumps(column.tokens))
        parts.append(f'<text x="{left + 4}" y="14" fill="#333"><title>{tip}</title>{column.label}</text>')
        for r in range(rows):
            top = head + 18 * r
            if r >= len(column.slots):
                parts.append(f'<rect x="{left}" y="{top}" width="{cell - 2}" height="16" fill="#222"/>')
                continue
            n = column.slots[r]
            if n is None:
                parts.append(f'<rect x="{left}" y="{top}" width="{cell - 2}" height="16" fill="#f4f4f4"/>')
            else:
                color = ("#7fd6e8" if n == column.tail else "#d58be3" if n in column.pinned
                         else "#ffd84d" if n in column.faulted else "#cfcfcf")
                parts.append(f'<g class="c" data-p="{n}"><rect x="{left}" y="{top}" width="{cell - 2}" height="16" '
                             f'fill="{color}"/><text x="{left + 3}" y="{top + 12}">p{n}</text></g>')
            if r in column.evicted_frames:
                gone = html.escape(", ".join(column.evicted_frames[r]))
                parts.append(f'<path d="M{left + cell - 9},{top} h7 v7 z" fill="#d62728"><title>evicted from f{r}: '
                             f'{gone}</title></path>')
    parts += _lanes(timeline, lanes, head + 18 * rows + 8, cell)
    parts.append("</svg>")
    legend = ('<span style="background:#ffd84d">faulted in</span> <span style="background:#cfcfcf">resident</span> '
              '<span style="background:#d58be3">pinned</span> <span style="background:#7fd6e8">open tail</span> '
              '<span style="color:#d62728">◥ evicted from this frame</span>')
    legend += (' · tiers: ' + ' '.join(f'<span style="background:{MARK_COLORS[k]}">{label}</span>' for k, label in
                                      (("set", "state set"), ("unset", "state unset"), ("fact", "fact"),
                                       ("supersedes", "supersedes a fact"), ("ends", "ends a fact"),
                                       ("summary", "summary"))
                                      + ((("reranked", "reranked"), ("failed", "reranker failed"))
                                         if "reranker" in lanes else ()))) if lanes else ""
    tiers = timeline.tiers
    tier_line = (" · " + " · ".join(f"{n} {name}" for name, n in tiers.items() if n)) if any(tiers.values()) else ""
    faults, evictions = timeline.faults, timeline.evictions
    return f"""<!doctype html>
<html><head><meta charset="utf-8"><title>pager timeline · {html.escape(timeline.title)}</title>
<style>body{{font-family:system-ui,sans-serif;margin:16px}} .wrap{{overflow-x:auto;border:1px solid #ddd}}
span{{padding:1px 6px;margin-right:6px;border-radius:3px}} g.c:hover rect{{stroke:#000;stroke-width:1.5}}
#tip{{position:fixed;display:none;max-width:40em;white-space:pre-wrap;background:#fffff0;border:1px solid #999;
padding:4px 6px;font:12px monospace;pointer-events:none}}</style></head>
<body><h2>pager timeline · {html.escape(timeline.title)}</h2>
<p>{len(timeline.columns)} model calls · {rows} frames at most · {faults} faults · {evictions} evictions{tier_line} · hover a cell for the page</p>
<p>{legend}</p><div class="wrap">{''.join(parts)}</div><div id="tip"></div>
{_page_texts(timeline)}</body></html>
"""


def _page_texts(timeline: Timeline) -> str:
    """Each page's header and text once, shown on hover by a few lines of script: a <title> in every cell
    repeated it in each column it sat in (2,292 calls of 55 frames: 21 MB of the page's 40)."""
    texts = json.dumps({n: text[:600] for n, text in timeline.pages.items()}, ensure_ascii=False)
    texts = texts.replace("<", "\\u003c")   # no "</script>" in a page's text can end the script
    return (f'<script type="application/json" id="pages">{texts}</script>\n<script>\n'
            'const pages = JSON.parse(document.getElementById("pages").textContent), tip = document.getElementById("tip");\n'
            'document.addEventListener("mousemove", e => {\n'
            '  const cell = e.target.closest && e.target.closest("g.c");\n'
            '  if (!cell) { tip.style.display = "none"; return; }\n'
            '  tip.textContent = pages[cell.dataset.p] || "p" + cell.dataset.p;\n'
            '  tip.style.left = Math.min(e.clientX + 12, innerWidth - tip.offsetWidth - 4) + "px";\n'
            '  tip.style.top = Math.min(e.clientY + 12, innerHeight - tip.offsetHeight - 4) + "px";\n'
            '  tip.style.display = "block";\n'
            '});\n</script>')


def _lanes(timeline: Timeline, lanes: list[str], top: int, cell: int) -> list[str]:
    """One row per memory tier: a mark where the tier changed, coloured by its strongest change."""
    parts = []
    for r, lane in enumerate(lanes):
        y = top + 18 * r
        parts.append(f'<text x="4" y="{y + 12}" fill="#555">{lane}</text>')
        for x, column in enumerate(timeline.columns):
            marks = column.marks.get(lane)
            if not marks:
                continue
            kinds = [k for k, _ in marks]
            strongest = next((k for k in ("ends", "supersedes", "unset", "set", "fact", "summary", "failed", "reranked")
                              if k in kinds), kinds[0])
            tip = html.escape("\n".join(detail for _, detail in marks)[:1500])
            left = 60 + cell * x
            parts.append(f'<g class="m" data-lane="{lane}" data-kind="{strongest}"><rect x="{left}" y="{y}" '
                         f'width="{cell - 2}" height="16" rx="4" fill="{MARK_COLORS[strongest]}"/>'
                         f'<text x="{left + 3}" y="{y + 12}">{len(marks)}</text><title>{tip}</title></g>')
    return parts


def write(path: Path, out: Path) -> Timeline:
    timeline = collect(path)
    Path(out).write_text(render(timeline), encoding="utf-8")
    return timeline
