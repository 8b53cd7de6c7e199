"""The benchmarks that run a model. `pager bench answers`: LoCoMo's answer F1 as its task_eval computes it,
the fixed question sample, and end-to-end runs of every system with scripted models (what each was sent
decides what it answers). `pager bench producer`: a memory model's facts written once and shown by
`pager bench locomo --memory FILE` as the dataset's recorded ones are."""

import json

import pytest

from pager.bench import answers
from pager.bench.answers import answer_f1, containment, normalize, sample, token_f1
from pager.config import Config
from pager.formats import parse_locomo
from pager.model import HandlerModel

pytest.importorskip("nltk")


def test_normalize_drops_commas_articles_punctuation_and_case_as_locomo_does():
    assert normalize("The Yjs CRDT, and an EpiPen!") == "yjs crdt epipen"
    assert normalize("  7 May  2023. ") == "7 may 2023"


def test_token_f1_stems_and_counts_shared_tokens():
    assert token_f1("running races", "run race") == 1.0            # Porter stems: run, race
    assert token_f1("peanuts", "peanuts") == 1.0
    assert token_f1("He is allergic to peanuts", "peanuts") == pytest.approx(2 * (1 / 5) * 1 / (1 / 5 + 1))
    assert token_f1("shellfish", "peanuts") == 0.0


def test_multi_hop_answers_are_scored_part_by_part_and_open_domain_keeps_its_first_alternative():
    # cat 1: the mean over the answer's parts of the best match among the prediction's parts
    assert answer_f1("Paris, Rome", "Rome, Paris", 1) == 1.0
    assert answer_f1("Paris", "Rome, Paris", 1) == 0.5
    # cat 3: only the first of the ';' alternatives counts
    assert answer_f1("likely yes", "likely yes; maybe", 3) == 1.0
    assert answer_f1("maybe", "likely yes; maybe", 3) == 0.0


def test_containment_rewards_a_long_right_answer_that_f1_punishes():
    long = "Sam Okafor is allergic to peanuts and carries an EpiPen."
    assert containment(long, "peanuts", 4) == 1.0
    assert token_f1(long, "peanuts") < 0.3
    assert containment("walnuts", "peanuts", 4) == 0.0
    assert containment("Rome and Paris", "Rome, Paris, Oslo", 1) == pytest.approx(2 / 3)


def _locomo(path, filler: int = 70):
    """A LoCoMo-format file: the allergy told on day one, filler talk after, two questions."""
    first = [{"speaker": "Ana", "dia_id": "D1:1", "text": "Sam Okafor is severely allergic to peanuts."},
             {"speaker": "Ben", "dia_id": "D1:2", "text": "Noted, I will tell the caterer about Sam."}]
    later = [{"speaker": "Ana" if i % 2 else "Ben", "dia_id": f"D2:{i + 1}",
              "text": f"Routine sync number {i}: the build queue, the flaky test list and the lunch rota again."}
             for i in range(filler)]
    sample = {"sample_id": "conv-t", "conversation": {
        "speaker_a": "Ana", "speaker_b": "Ben",
        "session_1_date_time": "1:56 pm on 8 May, 2023", "session_1": first,
        "session_2_date_time": "2:00 pm on 20 June, 2023", "session_2": later},
        "qa": [{"question": "What is Sam Okafor allergic to?", "answer": "peanuts", "evidence": ["D1:1"], "category": 4},
               {"question": "What is on the lunch rota list?", "answer": "lunch rota", "evidence": ["D2:3"], "category": 4},
               {"question": "Is it a trap?", "adversarial_answer": "x", "evidence": ["D2:1"], "category": 5}]}
    path.write_text(json.dumps([sample]))
    return path


def reads_its_prompt(messages, tools):
    """Answers from what it was sent: 'peanuts' only when the day-one turn is in its prompt."""
    sent = " ".join(str(m.get("content") or "") for m in messages[:-1])
    return {"content": "peanuts" if "allergic to peanuts" in sent else "I do not know"}


def test_the_sample_is_fixed_and_leaves_out_adversarial_questions(tmp_path):
    convs = parse_locomo(_locomo(tmp_path / "l.json"))
    first, again = sample(convs, 5), sample(parse_locomo(tmp_path / "l.json"), 5)
    assert [q.question for _, q in first] == [q.question for _, q in again]
    assert {q.category for _, q in first} == {4} and len(first) == 2
    assert len(sample(convs, 1)) == 1


def test_pager_finds_the_old_turn_recent_truncation_cannot_hold(tmp_path):
    data = _locomo(tmp_path / "l.json")
    report = answers.run(data, HandlerModel(reads_its_prompt, name="scripted"), [1024], ["pager", "recent", "bm25"],
                         per_conversation=1, config=Config(embedder="hash"))
    systems = report["results"][0]["systems"]
    assert report["questions"] == 1 and report["answers"][0]["question"] == "What is Sam Okafor allergic to?"
    assert systems["pager"]["f1"] == 1.0 and systems["pager"]["recall"] == 1.0
    assert systems["bm25"]["f1"] == 1.0
    assert systems["recent"]["f1"] == 0.0 and systems["recent"]["recall"] == 0.0
    for name in ("pager", "recent", "bm25"):
        s = systems[name]
        assert s["crashed"] == 0 and s["raw_call_answers"] == 0
        assert s["prompt_tokens"] <= 1024, (name, s["prompt_tokens"])


def test_a_call_written_as_text_is_run_and_never_scored_as_the_answer(tmp_path):
    data = _locomo(tmp_path / "l.json")

    def writes_a_tag_first(messages, tools):
        if not any(m["role"] == "tool" for m in messages):
            return {"content": '<tool_call>\n{"name": "search", "arguments": {"query": "allergic"}}\n</tool_call>'}
        return reads_its_prompt(messages, tools)

    report = answers.run(data, HandlerModel(writes_a_tag_first, name="scripted"), [2048], ["pager-tools"],
                         per_conversation=1, config=Config(embedder="hash"), traces=tmp_path / "traces")
    tools = report["results"][0]["systems"]["pager-tools"]
    assert tools["calls_in_text"] == 1 and tools["tool_calls"] == 1 and tools["model_calls"] == 2
    assert tools["raw_call_answers"] == 0 and tools["f1"] == 1.0
    (trace,) = (tmp_path / "traces").glob("*.jsonl")
    from pager.replay import replay
    assert replay(trace, check=True).divergence is None


def test_a_crash_is_counted_and_the_run_goes_on_and_the_cache_resumes_it(tmp_path):
    data = _locomo(tmp_path / "l.json")
    cache = tmp_path / "answers.jsonl"
    calls = []

    def breaks_once(messages, tools):
        calls.append(1)
        if len(calls) == 1:
            raise RuntimeError("the server went away")
        return reads_its_prompt(messages, tools)

    report = answers.run(data, HandlerModel(breaks_once, name="scripted"), [1024], ["pager", "bm25"],
                         per_conversation=1, config=Config(embedder="hash"), cache=cache)
    systems = report["results"][0]["systems"]
    assert systems["pager"]["crashed"] == 1 and systems["bm25"]["f1"] == 1.0
    assert len(cache.read_text().splitlines()) == 2

    def never(messages, tools):
        raise AssertionError("a cached answer was asked again")

    again = answers.run(data, HandlerModel(never, name="scripted"), [1024], ["pager", "bm25"],
                        per_conversation=1, config=Config(embedder="hash"), cache=cache)
    assert again["results"] == report["results"]


def test_a_memory_models_facts_are_written_once_and_counted_as_coverage(tmp_path):
    import re

    from pager.bench import locomo, producer
    from pager.memory import MemoryWriter

    data = _locomo(tmp_path / "l.json")
    calls = []

    def keeper(messages, tools):
        """A scripted memory model: a fact for each turn it is shown that tells of an allergy."""
        prompt = messages[-1]["content"]
        calls.append(prompt)
        facts = [{"op": "ADD", "subject": "allergy", "text": line, "turns": [int(turn)]}
                 for turn, line in re.findall(r"^\(t(\d+)\) [^:]+: (.*)$", prompt, re.M) if "allergic" in line]
        return {"content": json.dumps({"bookmarks": {}, "facts": facts or [{"op": "NONE"}], "state": []})}

    out = tmp_path / "facts.json"
    config = Config(embedder="hash", memory_model="pager/keeper", bookmark_batch=4)
    made = producer.write(data, ["conv-t"], config, out, writer=MemoryWriter(HandlerModel(keeper, "pager/keeper"), 4))
    conv = made["conversations"]["conv-t"]
    assert conv["failed_calls"] == 0 and conv["calls"] == len(calls) >= conv["pages"] // 4
    assert producer.read(out) == {"conv-t": [("allergy", "Sam Okafor is severely allergic to peanuts.", ["D1:1"])]}
    report = locomo.run(data, [512], Config(embedder="hash"), memory=str(out), progress=False)
    pager = report["results"][0]["pager"]
    assert report["memory"] == "facts.json"
    assert pager["coverage"] >= pager["recall"] and pager["fact_tokens"] > 0


def test_pager_with_tools_can_be_limited_to_the_first_questions_of_the_sample(tmp_path):
    data = _locomo(tmp_path / "l.json")
    report = answers.run(data, HandlerModel(reads_its_prompt, name="scripted"), [1024], ["pager", "pager-tools"],
                         per_conversation=2, config=Config(embedder="hash"), tools_questions=1)
    systems = report["results"][0]["systems"]
    assert systems["pager"]["questions"] == 2 and systems["pager-tools"]["questions"] == 1
    first = sample(parse_locomo(data), 2)[0][1].question
    assert [a["question"] for a in report["answers"] if a["system"] == "pager-tools"] == [first]
