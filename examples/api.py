"""Sluice from Python: a list of prompts through the built-in simulator, the answers read back in
order. Set OPENAI_BASE_URL (and OPENAI_API_KEY) to send them to a real provider instead.

    python examples/api.py
"""

from __future__ import annotations

import sluice

REVIEWS = ["The kettle is great", "Broke after a week", "Does what it says", "Too loud", "Lovely colour"]


def main() -> int:
    requests = [
        {
            "custom_id": f"review-{n}",
            "method": "POST",
            "url": "/v1/chat/completions",
            "body": {
                "model": "gpt-4o-mini",
                "messages": [{"role": "user", "content": f"Positive or negative, in one word: {text}"}],
                "max_tokens": 5,
            },
        }
        for n, text in enumerate(REVIEWS)
    ]
    try:
        job = sluice.run(requests, name="reviews", out="out", concurrency=4)
    except sluice.SluiceError as exc:
        print(f"refused (exit code {exc.code} on the command line): {exc}")
        return exc.code
    for result in job.results():
        answer = result["response"]["body"]["choices"][0]["message"]["content"]
        print(f"{result['custom_id']}: {answer}")
    for error in job.errors():
        print(f"{error['custom_id']}: {error['error']['code']}: {error['error']['message']}")
    print(f"{job.status}: {job.summary['counts']} — report: {job.report_path}")
    return 0 if job.succeeded else 1


if __name__ == "__main__":
    raise SystemExit(main())
