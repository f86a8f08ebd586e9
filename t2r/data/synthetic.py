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


def documents(count: int, seed: int = 0) -> list[str]:
    rng = random.Random(seed)
    return [document(rng) for _ in range(count)]


def write_jsonl(path: str | Path, count: int = 2000, seed: int = 0) -> Path:
    """Write `count` documents as {"text", "source"} lines (the layout every t2r loader reads)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "w") as fh:
        for text in documents(count, seed):
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
