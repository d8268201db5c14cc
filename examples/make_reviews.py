"""Regenerate examples/reviews.jsonl: 2,000 product-review sentiment requests, deterministic.

Every request is distinct (each review is numbered by its seed and line), so a file of any size
is sent in full the first time, not answered from the response cache; another --seed writes a
file that shares no request with the first.

    python examples/make_reviews.py --lines 20000 --seed 1 --out out/big.jsonl
"""

from __future__ import annotations

import argparse
import json
import random
from pathlib import Path

PROMPT = "Reply with one word, positive or negative:\n\n{review}"
PRODUCTS = ["kettle", "headphones", "backpack", "desk lamp", "blender", "running shoes", "phone case", "keyboard"]
GOOD = [
    "Works exactly as described and arrived early.",
    "Great value, I would buy it again.",
    "Excellent build quality, my family loves it.",
    "Comfortable, sturdy and looks great on the shelf.",
    "Fantastic battery life and a perfect fit.",
]
BAD = [
    "Broke after two days, terrible support.",
    "Terrible fit, cheap plastic, returning it.",
    "Stopped working within a week, very disappointed.",
    "Awful smell and the seams are already falling apart.",
    "Poor quality, it arrived damaged and late.",
]
OPENERS = ["Bought it as a gift.", "My second one.", "Ordered it on sale.", "Used it every day.", "", ""]
SINCE = ["after a week", "after a month", "after three months", "after a year", "on the first day"]


def build(n: int = 2000, seed: int = 7) -> list[dict[str, object]]:
    rng = random.Random(seed)
    rows: list[dict[str, object]] = []
    for i in range(n):
        product = rng.choice(PRODUCTS)
        verdict = rng.choice(GOOD if rng.random() < 0.6 else BAD)
        opener = rng.choice(OPENERS)
        # numbered by seed and line: every request is distinct, in one file and across seeds
        review = f"Review {seed}-{i + 1}, the {product} {rng.choice(SINCE)}: {opener} {verdict}"
        prompt = PROMPT.format(review=" ".join(review.split()))
        if i % 2 == 0:
            url, body = (
                "/v1/chat/completions",
                {
                    "model": "gpt-4o-mini",
                    "messages": [{"role": "user", "content": prompt}],
                    "max_tokens": 4,
                },
            )
        else:
            url, body = "/v1/responses", {"model": "gpt-4o-mini", "input": prompt, "max_output_tokens": 16}
        rows.append({"custom_id": f"review-{i:05d}", "method": "POST", "url": url, "body": body})
    return rows


def _lines(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a whole number") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"{text} is not allowed: give 1 or more")
    return value


def _seed(text: str) -> int:
    try:
        return int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a whole number") from None


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description="Write a file of distinct product-review sentiment requests.")
    parser.add_argument("--lines", type=_lines, default=2000, help="how many requests (default: 2000)")
    parser.add_argument(
        "--seed", type=_seed, default=7, help="which reviews: the same seed writes the same file (default: 7)"
    )
    parser.add_argument("--out", type=Path, default=Path(__file__).with_name("reviews.jsonl"))
    args = parser.parse_args()
    # out/, where the README writes its bigger file, is not in a fresh clone (and git ignores it)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text("".join(json.dumps(row) + "\n" for row in build(args.lines, args.seed)))
    print(f"wrote {args.out} ({args.lines:,} distinct requests, seed {args.seed})")
