"""Writes the demo conversation that `pager demo` ingests (pager/data/demo_conversation.jsonl).

Nine months of weekly check-ins between Maya, who leads the platform team of a small
notes-app startup, and her assistant. A dozen facts are planted early (a decision, an
allergy, a budget, an incident's root cause, a hire's start date…) among everyday talk
that reuses the same words in other contexts, and the demo asks about them much later.
Written by the project, deterministic: `python -m pager.data.demo_script` rewrites the file, and
demo_memory.jsonl beside it: the facts a memory model would make of the conversation (MEMORY),
which the demo loads as a recorded memory model.
"""

from __future__ import annotations

import json
import random
from datetime import date, timedelta
from pathlib import Path

# (sitting, user line, assistant line): the facts the demo later asks about.
FACTS = {
    1: ("For context: I'm Maya Lindqvist, and I lead the platform team at Loom. Six engineers, one SRE.",
        "Noted, Maya. Platform team at Loom, six engineers and one SRE. I'll keep that in mind."),
    3: ("Booking the team dinner for the kickoff. Remind me: Sam Okafor is allergic to peanuts, severe, he carries an EpiPen.",
        "Got it: Sam Okafor has a severe peanut allergy and carries an EpiPen. I'll flag it for any catering."),
    5: ("We decided: the sync engine will use the Yjs CRDT instead of operational transform. OT kept breaking on long offline edits.",
        "Decision recorded: Yjs CRDT over operational transform for the sync engine, because OT failed on long offline edits."),
    8: ("Lisbon offsite is approved. Budget is 18,400 euros, we booked Casa do Rio for 12 to 14 June.",
        "Lisbon offsite: 18,400 euro budget, Casa do Rio, 12-14 June. Want a packing list closer to the date?"),
    11: ("Migration plan: MongoDB to Postgres 16. The staging cluster is called heron-staging, production will be heron-prod.",
         "Migration: MongoDB to Postgres 16, staging cluster heron-staging, production heron-prod."),
    14: ("My corgi Biscuit has his vet appointment on Thursday at 8:30, so I'll be late to standup.",
         "Biscuit the corgi, vet Thursday 8:30. I'll note that you'll be late to standup."),
    17: ("Postmortem done. On 2 July the sync service dropped writes for 41 minutes. Root cause: a missing index on doc_versions.updated_at made the compaction job lock the table.",
         "Postmortem summary: 2 July, 41 minutes of dropped writes in sync; root cause a missing index on doc_versions.updated_at, compaction locked the table."),
    20: ("Priya Raman accepted the senior SRE offer! She starts on 1 September.",
         "Wonderful news. Priya Raman, senior SRE, start date 1 September."),
    23: ("We settled the public API rate limit: 600 requests per minute per workspace, burst of 100.",
         "Rate limit recorded: 600 requests/minute per workspace with a burst of 100."),
    26: ("Launch date for Loom 2.0 is 14 October. Code freeze on 30 September.",
         "Loom 2.0 launches 14 October, code freeze 30 September."),
    29: ("Halvorsen Shipping wants SSO through Okta before they sign. The contract is worth 96,000 dollars a year.",
         "Halvorsen Shipping: Okta SSO required to sign, contract 96,000 dollars a year."),
    32: ("Personal goal: I'm training for the Berlin half marathon in April, aiming for 1:45.",
         "Berlin half marathon in April, target time 1:45. I can help plan your training weeks."),
}

# Everyday talk that reuses the facts' words in other contexts (distractors for search).
SMALL_TALK = [
    ("Standup ran long again today, everyone had opinions about the sprint board.",
     "Maybe timebox each update to two minutes and move debates to a follow-up."),
    ("Reviewed three pull requests this morning, one of them touched the sync retry logic.",
     "Retry logic is easy to get subtly wrong; did it have tests for the backoff?"),
    ("Coffee machine on our floor is broken, productivity is down 40 percent.",
     "A crisis of the first order. The kitchen on the third floor still works, I hear."),
    ("Reading 'Designing Data-Intensive Applications' again, the chapter on replication.",
     "A classic. The replication chapter pairs well with your sync work."),
    ("The budget review for Q3 tools is next week, need to justify the observability spend.",
     "Lead with incidents it shortened; numbers on time-to-detect persuade finance."),
    ("Rainy week. Took the tram instead of cycling.",
     "Sensible. The tram at least comes with a book."),
    ("Onboarding doc is out of date, the section on local setup still mentions Docker Compose v1.",
     "Worth a quick pass; new hires judge a team by its setup doc."),
    ("Had a 1:1 with Jonas, he wants to move towards the data team eventually.",
     "Good that he said it; you can plan a gradual handover."),
    ("Dinner plans with friends on Saturday, trying the new ramen place.",
     "Enjoy it. Report back on the broth."),
    ("The office is planning a summer party, someone suggested a boat.",
     "A boat party is memorable, for better or worse."),
    ("We're deprecating the v1 export endpoint, customers have until the end of the year.",
     "Send the reminder emails early and again a month before the cutoff."),
    ("Spent the afternoon on flaky tests in the editor package.",
     "Flaky tests erode trust; quarantining them while you fix helps."),
    ("Our CI bill jumped after we added the browser tests.",
     "Running them only on main and nightly might halve it."),
    ("Thinking about a team reading group, one paper every two weeks.",
     "Start with short papers; momentum matters more than depth at first."),
    ("Security audit scheduled for next month, the auditors want our access logs.",
     "Check log retention now so the window they ask for exists."),
    ("Sam gave a great demo of the new presence indicators today.",
     "Nice. Presence makes collaboration feel alive."),
    ("Priya, I mean our recruiter Petra, sent over five more SRE candidates.",
     "Five is a healthy pipeline; a take-home or a pairing session?"),
    ("I keep forgetting to drink water during long review days.",
     "A bottle on the desk works better than good intentions."),
    ("The marketing team wants a blog post about how sync works.",
     "A diagram of the merge flow would carry most of the post."),
    ("Cycling to work again, the weather finally turned.",
     "Good for the head. Mind the tram tracks."),
    ("Customer call went fine, they mostly asked about pricing tiers.",
     "Pricing questions are a buying signal."),
    ("We moved the design review to Wednesdays.",
     "Midweek reviews leave time to act on feedback before Friday."),
    ("Thinking of switching my editor theme, staring at the same colours for years.",
     "Low stakes, oddly refreshing. Try a light theme for a week."),
    ("The database slow query log is noisy since the new dashboard shipped.",
     "The dashboard might be missing an index or polling too often."),
]


def build(seed: int = 7) -> list[dict]:
    rng = random.Random(seed)
    start = date(2025, 3, 3)
    rows: list[dict] = []
    for sitting in range(1, 37):
        day = start + timedelta(weeks=sitting - 1, days=rng.randrange(0, 4))
        label = f"{day.day} {day.strftime('%B')} {day.year}"
        exchanges = rng.sample(SMALL_TALK, k=rng.randrange(4, 7))
        if sitting in FACTS:
            exchanges.insert(rng.randrange(1, len(exchanges)), FACTS[sitting])
        for user_line, assistant_line in exchanges:
            rows.append({"speaker": "Maya", "role": "user", "text": user_line, "date": label})
            rows.append({"speaker": "assistant", "role": "assistant", "text": assistant_line, "date": label})
    return rows


# What a memory model would make of the facts above: (subject, statement) per sitting, written by the
# project and shipped as pager/data/demo_memory.jsonl (each with the turn it comes from), the demo's
# recorded memory model. A subject holds one value at a time: the team's size changes when Priya joins.
MEMORY = {
    1: [("Maya's role", "Maya Lindqvist leads the platform team at Loom."),
        ("platform team size", "The platform team has six engineers and one SRE.")],
    3: [("Sam Okafor's allergy", "Sam Okafor has a severe peanut allergy and carries an EpiPen.")],
    5: [("sync engine", "The sync engine uses the Yjs CRDT instead of operational transform, which broke on long "
                        "offline edits.")],
    8: [("Lisbon offsite", "The Lisbon offsite is approved: a budget of 18,400 euros, Casa do Rio, 12 to 14 June.")],
    11: [("database migration", "Loom is moving from MongoDB to Postgres 16: staging cluster heron-staging, "
                                "production heron-prod.")],
    14: [("Maya's dog", "Maya has a corgi called Biscuit.")],
    17: [("July sync outage", "On 2 July the sync service dropped writes for 41 minutes; the root cause was a missing "
                              "index on doc_versions.updated_at.")],
    20: [("platform team size", "The platform team grows to six engineers and two SREs: Priya Raman joins as senior "
                                "SRE on 1 September."),
         ("Priya Raman", "Priya Raman accepted the senior SRE offer; she starts on 1 September.")],
    23: [("public API rate limit", "The public API allows 600 requests per minute per workspace, with a burst of 100.")],
    26: [("Loom 2.0 launch", "Loom 2.0 launches on 14 October, with a code freeze on 30 September.")],
    29: [("Halvorsen Shipping deal", "Halvorsen Shipping needs SSO through Okta before signing a contract worth "
                                     "96,000 dollars a year.")],
    32: [("Maya's half marathon", "Maya is training for the Berlin half marathon in April, aiming for 1:45.")],
}


def memory(rows: list[dict]) -> list[dict]:
    """MEMORY as recorded facts: each statement with the number of the turn that said it."""
    turn = {row["text"]: i + 1 for i, row in enumerate(rows)}
    return [{"subject": subject, "text": text, "turns": [turn[FACTS[sitting][0]]]}
            for sitting, said in sorted(MEMORY.items()) for subject, text in said]


# What Maya tells the offline shell after the questions: plain statements it keeps in the working state.
STATEMENTS = ["My half marathon target is 1:45.", "My half marathon target is now 1:40."]
# A question about a value that changed, and the phrase of the older fact that answers it.
BEFORE = ("How many SREs did the platform team have before Priya joined?", "one SRE")

# Later questions, each naming the fact it needs (a phrase that must be on a resident page).
QUESTIONS = [
    ("What did we pick for the sync engine back in the spring, and why?", "Yjs CRDT"),
    ("Sam is joining the team dinner tonight. Anything the restaurant should know?", "peanuts"),
    ("How much money did we have for the Lisbon offsite?", "18,400 euros"),
    ("What caused the outage in July?", "doc_versions.updated_at"),
    ("When does Priya start?", "1 September"),
    ("Which identity provider does Halvorsen need for SSO?", "Okta"),
]


def main() -> None:
    rows = build()
    for name, lines in (("demo_conversation.jsonl", rows), ("demo_memory.jsonl", memory(rows))):
        path = Path(__file__).with_name(name)
        with open(path, "w", encoding="utf-8") as fh:
            for row in lines:
                fh.write(json.dumps(row, ensure_ascii=False) + "\n")
        print(f"wrote {path}")


if __name__ == "__main__":
    main()
