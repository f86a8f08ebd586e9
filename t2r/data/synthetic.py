"""A small generated English corpus for smoke runs (no download, no licence question): short
documents of templated facts about made-up people, each ending with a question whose answer
appeared earlier in the document, so a model has to carry a fact across the document (the
recall that recurrent memories find hardest).

    python -m t2r.data.synthetic data/train.jsonl --documents 2000
"""

from __future__ import annotations

import argparse
import json
import random
from pathlib import Path

NAMES = ["Ada", "Boris", "Chen", "Dana", "Emil", "Farah", "Goran", "Hana", "Ivo", "Jia", "Kofi", "Lena",
         "Mateo", "Nadia", "Omar", "Priya", "Quinn", "Rosa", "Sven", "Tariq", "Uma", "Viktor", "Wen", "Yara"]
CITIES = ["Lisbon", "Oslo", "Nairobi", "Lima", "Kyoto", "Tunis", "Quebec", "Tallinn", "Hanoi", "Perth",
          "Bergen", "Porto", "Dakar", "Cusco", "Graz", "Riga"]
JOBS = ["baker", "pilot", "nurse", "carpenter", "teacher", "chemist", "painter", "farmer", "librarian",
        "engineer", "tailor", "fisher"]
THINGS = ["bicycle", "violin", "kayak", "telescope", "boat", "kite", "lantern", "piano", "map", "clock"]
COLOURS = ["red", "blue", "green", "yellow", "white", "black", "orange", "grey"]
FILLER = [
    "The weather was mild that year, and the markets were busy every morning.",
    "Most evenings were spent reading by the window or walking along the river.",
    "Friends often came by on the weekend to share a meal and talk for hours.",
    "The town had a small library, a bakery, and a harbour full of old boats.",
    "Nobody in the family could remember a winter as long as that one.",
    "There was always more work than time, but the days passed quickly.",
]


def _a(noun: str) -> str:
    return ("an " if noun[0] in "aeiou" else "a ") + noun


def document(rng: random.Random) -> str:
    """One document: facts about two or three people, some filler, then a question about one fact."""
    people = rng.sample(NAMES, rng.randint(2, 3))
    facts = []
    for person in people:
        city, job, thing, colour = rng.choice(CITIES), rng.choice(JOBS), rng.choice(THINGS), rng.choice(COLOURS)
        code = rng.randint(100, 999)
        facts.append((person, city, job, thing, colour, code))
    lines = []
    for person, city, job, thing, colour, code in facts:
        lines.append(f"{person} lives in {city} and works as {_a(job)}.")
        lines.append(f"{person} owns a {colour} {thing}, and the number on {person}'s door is {code}.")
        lines.extend(rng.sample(FILLER, rng.randint(0, 2)))
    person, city, job, thing, colour, code = rng.choice(facts)
    question, answer = rng.choice([
        (f"Where does {person} live?", f"{person} lives in {city}."),
        (f"What is the number on {person}'s door?", f"The number is {code}."),
        (f"What colour is {person}'s {thing}?", f"It is {colour}."),
        (f"What does {person} do for a living?", f"{person} is {_a(job)}."),
    ])
    return " ".join(lines) + f"\nQuestion: {question}\nAnswer: {answer}"


def long_document(rng: random.Random, words: int = 1500) -> str:
    """A long document for perplexity by position: facts about many people told across about `words` words
    of filler, then questions about facts from the start, so late tokens depend on early ones."""
    people = rng.sample(NAMES, len(NAMES))
    facts, lines, count = [], [], 0
    while count < words:
        person = people[len(facts) % len(people)]
        city, job, code = rng.choice(CITIES), rng.choice(JOBS), rng.randint(100, 999)
        facts.append((person, city, job, code))
        for line in (f"{person} lives in {city}, works as {_a(job)}, and the number on {person}'s door is {code}.",
                     *rng.sample(FILLER, rng.randint(1, 3))):
            lines.append(line)
            count += len(line.split())
    latest = {person: (city, job, code) for person, city, job, code in facts}
    questions = []
    for person in rng.sample(list(latest), min(6, len(latest))):
        city, job, code = latest[person]
        questions.append(f"Question: Where does {person} live, and what is the number on the door?\n"
                         f"Answer: {person} lives in {city}; the number is {code}.")
    return " ".join(lines) + "\n" + "\n".join(questions)


def documents(count: int, seed: int = 0) -> list[str]:
    rng = random.Random(seed)
    return [document(rng) for _ in range(count)]


def write_jsonl(path: str | Path, count: int = 2000, seed: int = 0) -> Path:
    """Write `count` documents as {"text", "source"} lines (the layout every t2r loader reads)."""
    return _write(path, documents(count, seed))


def write_long_jsonl(path: str | Path, count: int = 16, seed: int = 0, words: int = 1500) -> Path:
    """Write `count` long documents (`long_document`) as {"text", "source"} lines."""
    rng = random.Random(seed)
    return _write(path, [long_document(rng, words) for _ in range(count)])


def _write(path: str | Path, texts: list[str]) -> Path:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "w") as fh:
        for text in texts:
            fh.write(json.dumps({"text": text, "source": "t2r-synthetic"}) + "\n")
    return path


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("out", help="output .jsonl path")
    parser.add_argument("--documents", type=int, default=2000)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    print(f"wrote {args.documents} documents to {write_jsonl(args.out, args.documents, args.seed)}")


if __name__ == "__main__":
    main()
