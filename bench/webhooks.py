"""Webhooks locally: the handler's latency behind the receiver, and how soon a shard finishes
after its last webhook, against the same job with every webhook lost (polling only).

    .venv/bin/python bench/webhooks.py --lines 2000 --latency 1
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
# generated inputs and profiles: under out/, which git ignores
WORK = ROOT / "out" / "bench"
sys.path[:0] = [str(ROOT / "functions"), str(ROOT)]


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--lines", type=int, default=2000)
    parser.add_argument("--latency", type=float, default=1.0)
    parser.add_argument("--poll-seconds", type=int, default=30)
    args = parser.parse_args()

    import orjson

    from sluice_local.cloud import LocalCloud, LocalSettings, run_job
    from sluice_local.simulator import SimConfig, SimulatorServer

    WORK.mkdir(parents=True, exist_ok=True)
    path = WORK / "webhooks.jsonl"
    with path.open("wb") as fh:
        for n in range(args.lines):
            body = {"model": "gpt-4o-mini", "input": f"Reply with one word, positive or negative:\n\n{n} great"}
            fh.write(
                orjson.dumps({"custom_id": f"w-{n}", "method": "POST", "url": "/v1/responses", "body": body}) + b"\n"
            )

    for label, drop in (("webhooks", 0.0), ("all webhooks lost", 1.0)):
        with SimulatorServer(SimConfig(latency_s=args.latency, seed=3)) as sim:
            settings = LocalSettings(
                # every run asks the provider: a cache filled by an earlier run would answer it instead
                cache="off",
                concurrency=500,
                map_concurrency=4,
                shard_lines=500,
                poll_seconds=args.poll_seconds,
            )
            cloud = LocalCloud(provider_base_url=sim.base_url, api_key="sk-bench", settings=settings)
            with cloud.running():
                sim.configure(
                    webhook_url=cloud.webhook_url, webhook_secret=cloud.webhook_secret, webhook_drop_rate=drop
                )
                started = time.monotonic()
                run = run_job(cloud, path, metadata={"sluice-mode": "background"})
                wall = time.monotonic() - started
                assert run.status == "SUCCEEDED" and len(run.results) == args.lines, run.summary
                latencies = cloud.receiver.latencies_s if cloud.receiver else []
                handler = cloud.receiver.handler_s if cloud.receiver else []
                hooks = sim.webhooks
                # response id → shard, through the results; then per shard: last delivery → last collect
                shard_of = {
                    r["response"]["body"]["id"]: int(r["custom_id"].split("-")[1]) // settings.shard_lines
                    for r in run.results
                }
                last_hook: dict[int, float] = {}
                for hook in hooks:
                    shard = shard_of.get(hook["data_id"])
                    for delivery in hook["deliveries"]:
                        if shard is not None and delivery.get("t"):
                            last_hook[shard] = max(last_hook.get(shard, 0.0), delivery["t"])
                collected: dict[int, float] = {}
                for inv in cloud.invocations:
                    if inv.step == "collect" and inv.payload:
                        shard = int(inv.payload["shard"]["shard"])
                        collected[shard] = max(collected.get(shard, 0.0), inv.ended_at)
                lags = [collected[s] - last_hook[s] for s in collected if s in last_hook]
            print(
                f"{label}: {args.lines} background responses at {args.latency} s, poll interval {args.poll_seconds} s"
            )
            print(f"  job wall {wall:.1f} s")
            if latencies:
                print(
                    f"  webhook handler latency behind the receiver: p50 {percentile(latencies, 0.5) * 1000:.1f} ms, "
                    f"p99 {percentile(latencies, 0.99) * 1000:.1f} ms over {len(latencies)} deliveries"
                )
            if handler:
                print(
                    f"  webhook handler alone: p50 {percentile(handler, 0.5) * 1000:.1f} ms, "
                    f"p99 {percentile(handler, 0.99) * 1000:.1f} ms"
                )
            if lags:
                print(
                    f"  last webhook → shard collected: median {statistics.median(lags):.2f} s, max {max(lags):.2f} s"
                )
    path.unlink()


if __name__ == "__main__":
    main()
