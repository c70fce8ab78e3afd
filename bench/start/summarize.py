"""summary.json of a start baseline from the rows shoal-start-bench appended.

    python3 -m bench.start.summarize NAME    (reads bench/out/NAME/rows.jsonl,
                                              writes bench/results/NAME/summary.json)

One row per store and rank count: the start (every rank through its first
collective), every rank created, the store's CPU time per rank and per request,
each as median, p10 and p90 over the starts, in microseconds; and the store
requests per rank (means over the ranks, the median over the starts).
"""

import json
import sys
from collections import defaultdict

from bench import baseline

LABELS = {"launcher": "shoal, shoalrun's store", "tcpstore": "shoal, TcpStore server"}
METRICS = [("time_us", "first_ms", 1000), ("created_us", "created_ms", 1000),
           ("store_cpu_us_per_rank", "store_cpu_us_per_rank", 1),
           ("store_cpu_us_per_request", "store_cpu_us_per_request", 1)]


def summarize(rows):
    groups = defaultdict(list)
    for r in rows:
        groups[(r["store"], r["ranks"])].append(r)
    columns = ["impl", "ranks", "starts"] + [f"{m}_{q}" for m, _, _ in METRICS for q in ("median", "p10", "p90")]
    columns += ["create_requests_per_rank", "first_requests_per_rank", "peers_per_rank"]
    out = []
    for (store, ranks), rs in sorted(groups.items()):
        row = [LABELS.get(store, store), ranks, len(rs)]
        for _, key, scale in METRICS:
            row += baseline.spread([r[key] * scale for r in rs], digits=1)
        for key in ("create_requests_mean", "first_requests_mean", "peers_mean"):
            row.append(baseline.spread([r[key] for r in rs], digits=2)[0])
        out.append(row)
    return columns, out


def main(name):
    results, raw = baseline.folders(name)
    rows = [json.loads(line) for line in (raw / "rows.jsonl").read_text().splitlines() if line.strip()]
    columns, out = summarize(rows)
    results.mkdir(parents=True, exist_ok=True)
    baseline.write_summary(results / "summary.json", columns, out,
                           note="the start of an N-rank job on one machine (shoal-start-bench), microseconds")


if __name__ == "__main__":
    if len(sys.argv) != 2:
        sys.exit(__doc__)
    main(sys.argv[1])
