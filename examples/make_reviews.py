"""Regenerate examples/reviews.jsonl: 2,000 product-review sentiment requests, deterministic.

`python examples/make_reviews.py --lines 50000 --out big.jsonl` makes a bigger file of the same kind.
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


def build(n: int = 2000, seed: int = 7) -> list[dict[str, object]]:
    rng = random.Random(seed)
    rows = []
    for i in range(n):
        product = rng.choice(PRODUCTS)
        review = f"The {product}: {rng.choice(GOOD if rng.random() < 0.6 else BAD)}"
        prompt = PROMPT.format(review=review)
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


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description="Write a file of product-review sentiment requests.")
    parser.add_argument("--lines", type=int, default=2000, help="how many requests (default: 2000)")
    parser.add_argument("--out", type=Path, default=Path(__file__).with_name("reviews.jsonl"))
    args = parser.parse_args()
    if args.lines < 1:
        parser.error("--lines: give 1 or more")
    args.out.write_text("".join(json.dumps(row) + "\n" for row in build(args.lines)))
    print(f"wrote {args.out} ({args.lines:,} requests)")
