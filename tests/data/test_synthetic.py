"""The generated smoke-run corpus: deterministic, and every question is answerable from its document."""

import json
import re

from t2r.data.synthetic import documents, write_jsonl


def test_deterministic_and_answerable(tmp_path):
    docs = documents(50, seed=3)
    assert docs == documents(50, seed=3) and docs != documents(50, seed=4)
    for doc in docs:
        body, question, answer = doc.split("\n")
        assert question.startswith("Question: ") and answer.startswith("Answer: ")
        person = re.search(r"(?:does|on|is) (\w+)(?:'s| live| do)", question).group(1)
        value = re.sub(r"^(It is|The number is|\w+ (lives in|is))\s+", "", answer[len("Answer: "):]).rstrip(".")
        assert person in body and value in body, doc
    path = write_jsonl(tmp_path / "d.jsonl", count=5, seed=3)
    rows = [json.loads(line) for line in path.read_text().splitlines()]
    assert [r["text"] for r in rows] == documents(5, seed=3)
