"""A self-contained HTML timeline of a trace: frames down, model calls across.

Each column is one assembled context (one model call); each row one frame. A cell shows the
page in that frame: yellow where it was faulted in for this call, magenta when pinned, cyan
for the open tail, grey otherwise; a red corner marks a frame whose previous page was
evicted. Hovering a cell shows the page's header and text; hovering a column head shows the
message and the token counts.
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
    evicted_frames: set[int]
    pinned: set[int]
    tail: int
    tokens: dict


@dataclass
class Timeline:
    columns: list[Column] = field(default_factory=list)
    pages: dict[int, str] = field(default_factory=dict)
    title: str = ""
    faults: int = 0       # fault events of the run (a page entering a frame)
    evictions: int = 0    # evict events of the run (a page leaving a frame, by policy or page_out)


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
        evicted = {e["frame"] for e in new if e["kind"] == "evict" and e.get("frame", -1) >= 0}
        timeline.columns.append(Column(
            label=str(i), message=seen["message"], slots=list(session.frames.slots), faulted=faulted,
            evicted_frames=evicted, pinned={n for n, e in session.table.items() if e.pinned},
            tail=session.tail_n, tokens=dict(ctx.tokens)))
        for n in session.frames.slots:
            if n is not None and n not in timeline.pages:
                timeline.pages[n] = session.render.header(n) + "\n" + (session.render.body(n) or "")

    run = replay(path, on_context=on_context)
    timeline.faults, timeline.evictions = run.count("fault"), run.count("evict")   # what `trace show` counts
    return timeline


def render(timeline: Timeline) -> str:
    rows = max((len(c.slots) for c in timeline.columns), default=0)
    cell, head = 34, 26
    width, height = 60 + cell * len(timeline.columns), head + 18 * rows + 10
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
                text = html.escape(timeline.pages.get(n, f"p{n}")[:600])
                parts.append(f'<g class="c" data-p="{n}"><rect x="{left}" y="{top}" width="{cell - 2}" height="16" '
                             f'fill="{color}"/><text x="{left + 3}" y="{top + 12}">p{n}</text><title>{text}</title></g>')
            if r in column.evicted_frames:
                parts.append(f'<path d="M{left + cell - 9},{top} h7 v7 z" fill="#d62728"><title>evicted here</title></path>')
    parts.append("</svg>")
    legend = ('<span style="background:#ffd84d">faulted in</span> <span style="background:#cfcfcf">resident</span> '
              '<span style="background:#d58be3">pinned</span> <span style="background:#7fd6e8">open tail</span> '
              '<span style="color:#d62728">◥ evicted from this frame</span>')
    faults, evictions = timeline.faults, timeline.evictions
    return f"""<!doctype html>
<html><head><meta charset="utf-8"><title>pager timeline · {html.escape(timeline.title)}</title>
<style>body{{font-family:system-ui,sans-serif;margin:16px}} .wrap{{overflow-x:auto;border:1px solid #ddd}}
span{{padding:1px 6px;margin-right:6px;border-radius:3px}} g.c:hover rect{{stroke:#000;stroke-width:1.5}}</style></head>
<body><h2>pager timeline · {html.escape(timeline.title)}</h2>
<p>{len(timeline.columns)} model calls · {rows} frames at most · {faults} faults · {evictions} evictions · hover a cell for the page</p>
<p>{legend}</p><div class="wrap">{''.join(parts)}</div></body></html>
"""


def write(path: Path, out: Path) -> Timeline:
    timeline = collect(path)
    Path(out).write_text(render(timeline), encoding="utf-8")
    return timeline
