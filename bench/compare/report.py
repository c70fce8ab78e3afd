"""bench/compare's reports: results.md (machine, command, one table per op
with the targets' notes), summary.json (median, p10 and p90 over the starts),
results.jsonl, plot.png, and the median of several starts. compare.py runs the
implementations and calls these; `python3 -m bench.compare --render-only --out DIR`
(or `--baseline NAME`) rewrites a run's reports from its meta.json and raw rows.
"""

import datetime
import json
import sys

from bench import baseline
from bench.baseline import spread
from bench.probes import core_probe, load

FLAT_RING = "allreduce=ring"  # SHOAL_ALGO of shoal-flat-ring (allreduce only)


def warn(msg):
    print(f"compare: warning: {msg}", file=sys.stderr, flush=True)


def info(msg):
    print(f"compare: {msg}", flush=True)


def fmt_size(n):
    for unit, shift in (("GiB", 30), ("MiB", 20), ("KiB", 10)):
        if n >= (1 << shift) and n % (1 << shift) == 0:
            return f"{n >> shift} {unit}"
    return f"{n} B"


def write_jsonl(path, rows):
    with open(path, "w") as f:
        for r in rows:
            f.write(json.dumps(r) + "\n")


def fmt_bw(v):
    if v >= 100:
        return f"{v:.0f}"
    if v >= 0.01:
        return f"{v:.3f}"
    return f"{v:.2e}"


def fmt_us(v):
    return f"{v:.1f}" if v < 1e4 else f"{v:.0f}"


def write_markdown(path, args, meta, rows, raw_dir=None):
    """raw_dir: where the raw rows, runs and plot are, when not beside results.md (a baseline)."""
    m = meta["machine"]
    impls = [i for i in args.impls if any(r["impl"] == i for r in rows)]
    bed = meta.get("netbed") if args.netbed else None
    L = []
    if bed:
        L.append(f"# Collective benchmark on a net bed: {', '.join(args.impls)} "
                 f"({args.hosts} hosts x {args.per_host} ranks)\n")
    else:
        L.append(f"# Collective benchmark: {', '.join(args.impls)} ({args.np} ranks)\n")
    L.append(f"- date: {meta['date']}")
    L.append(f"- command: `{meta['command']}`")
    L.append(f"- CPU: {m['cpu']}; {m['cores']}")
    L.append(f"- memory: {m['memory']}; kernel {m['kernel']}; OS {m['os']}")
    if m.get("memcpy"):
        L.append(f"- memcpy: {m['memcpy']} (the physical reference for shared memory)")
    L.append(f"- torch {m['torch']}; {m['openmpi']}; Python {m['python']}; shoal git {m['git']}")
    L.append(f"- load average (1/5/15 min) at start: {m['loadavg']}, at end: "
             f"{meta.get('loadavg_end', '?')}; run time {meta['seconds']:.0f} s "
             "(a load above the rank count means other work shared the cores: noisy numbers)")
    per_impl = {}
    for rec in meta["runs"]:
        d = per_impl.setdefault(rec["impl"], [0.0, 0.0])
        d[0] += rec["seconds"] or 0.0
        d[1] += (rec.get("other_cpu") or 0.0) * (rec["seconds"] or 0.0)
    if per_impl:
        L.append("- per implementation: run time, and CPUs' worth of time taken by other "
                 "processes meanwhile (0 = quiet machine; near the core count = very noisy): "
                 + "; ".join(f"{i} {d[0]:.0f} s (others {d[1] / d[0] if d[0] else 0:.2f} CPU)"
                             for i, d in per_impl.items()))
    if bed:
        L.extend(netbed_lines(args, bed))
    where = (f"= {args.hosts} hosts x {args.per_host} per host on the net bed" if bed
             else "on one host")
    L.append(f"- ranks: {args.np} {where}; sizes {fmt_size(args.minbytes)} .. "
             f"{fmt_size(args.maxbytes)} x{args.stepfactor}; float32; iters {args.iters} "
             f"(cut to fit ~{args.budget:g} s per size, >= {args.min_iters}), warmup {args.warmup}")
    if args.starts > 1:
        L.append(f"- median of {args.starts} process starts: every implementation ran "
                 f"{args.starts} times, interleaved; each row is the median start at that size, "
                 f"and `worst/median` is the slowest start's time over it (all starts in "
                 f"results.jsonl, field `start`)")
    if getattr(args, "load", None):
        L.append(f"- **under load** (`--load {args.load}`): "
                 f"{load.Load(args.load).describe()}, started before and stopped after "
                 f"every implementation's run, so each met the same interference")
    if getattr(args, "touch", False):
        L.append("- **touched** (`--touch`): before each timed iteration, untimed, every rank "
                 "rewrote its input in place and read its output (a store and a load per cache "
                 "line), as a training step writes what it sends and reads what it received")
    L.append("- time_us: median over iterations per rank, max over ranks (each iteration "
             "preceded by an untimed barrier, shoal-perf's `--barrier` included). busbw in GB/s (1e9 B/s) with "
             "nccl-tests factors: allreduce 2(n-1)/n, allgather (n-1)/n, broadcast 1; "
             "allgather bytes = output size per rank."
             + (" reduce_scatter: factor (n-1)/n, bytes = input size per rank."
                if "reduce_scatter" in args.ops else ""))
    if bed:
        L.append(f"- mpi-tcp: mpirun on host 0 with a hostfile of the bed's addresses "
                 f"(slots={args.per_host}) and `--mca plm_rsh_agent <bed's agent>` (runs "
                 f"Open MPI's daemons with `ip netns exec`), `--mca pml ob1 --mca btl "
                 f"tcp,self --mca btl_tcp_if_include {bed['subnet']} --mca "
                 f"oob_tcp_if_include {bed['subnet']} --bind-to none`"
                 + (" and, as the bed's ranks outnumber this machine's cores, `--mca "
                    "mpi_yield_when_idle 1` (what Open MPI sets itself on a node it knows "
                    "is oversubscribed)" if bed.get("oversubscribed") else "")
                 + ". gloo: "
                 f"`GLOO_SOCKET_IFNAME={bed['iface']}`. shoal-flat-ring: shoal-perf with "
                 f"`SHOAL_ALGO={FLAT_RING}` (allreduce only).")
    else:
        L.append("- mpi-tcp: `--mca pml ob1 --mca btl tcp,self --mca btl_tcp_if_include lo`; "
                 "mpi-sm: Open MPI defaults (vader shared memory); both `--bind-to none`.")
    for impl, why in meta["skipped"].items():
        L.append(f"- **{impl} skipped**: {why}")
    for rec in meta["runs"]:
        if rec["error"]:
            L.append(f"- **{rec['impl']} error** ({rec['tag']}): {rec['error']}")
    bad = [r for r in rows if r.get("wrong")]
    if bad:
        L.append(f"- **{len(bad)} rows with wrong results** (marked `WRONG`)")
    L.append("")

    by = {(r["impl"], r["op"], r["bytes"]): r for r in rows}
    for op in args.ops:
        op_sizes = sorted({r["bytes"] for r in rows if r["op"] == op})
        L.append(f"## {op}\n")
        if not op_sizes:
            L.append("(no results)\n")
            continue
        link = bed.get("link_GBps") if bed else 0
        pct = bool(link) and op == "allreduce"
        if bed:
            L.append(f"Link line rate: {bed['rate']} = {link:g} GB/s each way"
                     + (f"; `% link` = busbw / {link:g} GB/s" if pct else "") + ".\n")
        head = ["size"]
        for i in impls:
            head += [f"{i} busbw", f"{i} time_us"]
        head.append("shoal/gloo busbw")
        starts = args.starts > 1
        if starts:
            head += [f"{i} worst/median" for i in impls]
        if pct:
            head += [f"{i} % link" for i in impls]
        L.append("| " + " | ".join(head) + " |")
        L.append("|" + "|".join(["---:"] * len(head)) + "|")
        for s in op_sizes:
            cells = [fmt_size(s)]
            for i in impls:
                r = by.get((i, op, s))
                if r is None:
                    cells += ["-", "-"]
                    continue
                flag = f" WRONG={r['wrong']}" if r.get("wrong") else ""
                cells += [fmt_bw(r["busbw"]) + flag, fmt_us(r["time_us"])]
            r = bw_ratio(by.get(("shoal", op, s)), by.get(("gloo", op, s)))
            cells.append(f"{r:.2f}x" if r is not None else "-")
            if starts:
                for i in impls:
                    w = (by.get((i, op, s)) or {}).get("worst_over_median")
                    cells.append(f"{w:.2f}" if w else "-")
            if pct:
                for i in impls:
                    r = by.get((i, op, s))
                    cells.append(f"{100 * r['busbw'] / link:.0f}%" if r else "-")
            L.append("| " + " | ".join(cells) + " |")
        L.append("")
        noise = {}
        for rec in meta["runs"]:
            if rec["tag"].split("-")[-1] == op or f"-{op}-" in rec["tag"]:
                w = noise.setdefault(rec["impl"], [0.0, 0.0])
                w[0] += rec["seconds"] or 0.0
                w[1] += (rec.get("other_cpu") or 0.0) * (rec["seconds"] or 0.0)
        if noise:
            L.append("- other processes' CPU use during these runs (0 = quiet, 2 = both cores "
                     "busy): " + ", ".join(f"{i} {w[1] / w[0] if w[0] else 0:.2f}"
                                           for i, w in noise.items()))
        far = core_probe.note([rec for rec in meta["runs"] if rec["tag"].split("-")[-1] == op
                                 or f"-{op}-" in rec["tag"]])
        if far:
            L.append(far)
        spread = core_probe.by_distance(by, impls, op, op_sizes, fmt_size) if starts else None
        if spread:
            L.append(spread)
        L.append(netbed_note(op, by, op_sizes, bed) if bed else target_note(op, by, op_sizes))
        L.append("")
    if raw_dir:
        L.append("Median, p10 and p90 over the starts per implementation, op and size: `summary.json`; "
                 f"what ran: `meta.json`. The command writes every raw row, run and the plot into "
                 f"`{raw_dir}/` (`results.jsonl`, `runs.json`, `plot.png`; ignored by git).")
    else:
        L.append("Median, p10 and p90 over the starts: `summary.json`; raw rows: `results.jsonl`; "
                 "runs: `runs.json`; plot: `plot.png`; what ran: `meta.json`.")
    path.write_text("\n".join(L) + "\n")


def probe_line(bed):
    """The results.md line of the TCP probes, or None without them."""
    pr = bed.get("tcp_probe")
    if not pr:
        return None
    link = bed.get("link_GBps") or 0

    def fmt(key):
        vals = [pr.get(when, {}).get(key) for when in ("before", "after")]
        txt = " / ".join("failed" if v is None else f"{v:.3f}" for v in vals)
        pct = " / ".join("-" if v is None else f"{100 * v / link:.0f}%" for v in vals) if link else ""
        return f"{txt} GB/s" + (f" ({pct} of the line rate)" if pct else "")
    return (f"- plain TCP through the bed (`tools/netbed/link_probe.py`, 2 s each, before / after "
            f"the benchmarks), GB/s per direction: one stream one way {fmt('one_stream')}; "
            f"{bed.get('per_host', 1)} streams each way in both directions at once (the "
            f"hierarchical allreduce's pattern) {fmt('both_ways')}")


def probe_reference(bed):
    """The larger both-ways probe (GB/s per direction), or None."""
    pr = bed.get("tcp_probe") or {}
    vals = [pr.get(w, {}).get("both_ways") for w in ("before", "after")]
    vals = [v for v in vals if v]
    return max(vals) if vals else None


def netbed_lines(args, bed):
    delay = ("none requested" if not bed["delay_us"]
             else f"{bed['delay_us']:g} us (netem)" if bed["delay_applied"]
             else f"{bed['delay_us']:g} us requested, **NOT applied**: {bed['delay_note']}")
    queue = (f"queue {bed['limit']} B at the switch port, {bed['host_limit']} B at the host"
             if "host_limit" in bed else f"queue {bed['limit']} B")
    shaping = (f"{bed['rate']} = {bed['link_GBps']:g} GB/s each way (tc tbf on both ends of "
               f"each link: burst {bed['burst']} B, {queue})" if bed["rate_bps"] else "unshaped")
    lines = [f"- net bed (tools/netbed): {bed['hosts']} hosts = network namespaces, each with "
             f"one veth link (`{bed['iface']}`, {bed['subnet']}) to a bridge in a namespace of "
             f"its own; all hosts share this machine's CPUs",
             f"- link line rate: {shaping}; MTU {bed['mtu']}; one-way delay: {delay}"]
    probe = probe_line(bed)
    return lines + ([probe] if probe else [])


def netbed_note(op, by, op_sizes, bed):
    """The net bed's bars: allreduce busbw >= 85% of the link at >= 16 MiB, ahead of the
    flat ring, Gloo and MPI there; allgather/reduce_scatter ahead of Gloo and MPI everywhere."""
    out = []
    link = bed.get("link_GBps") or 0
    if op == "allreduce":
        big = [s for s in op_sizes if s >= 16 << 20]
        peers = ("shoal-flat-ring", "gloo", "mpi-tcp")
        if not big:
            return "- bars at >= 16 MiB: n/a (no sizes >= 16 MiB)"
        mine = [(s, by[("shoal", op, s)]["busbw"]) for s in big if ("shoal", op, s) in by]
        worst_size, worst_bw = min(mine, key=lambda t: t[1]) if mine else (None, None)
        if mine and link:
            out.append(f"- shoal busbw at >= 16 MiB: min {worst_bw:.3f} GB/s = "
                       f"{100 * worst_bw / link:.0f}% of the {link:g} GB/s link at "
                       f"{fmt_size(worst_size)} (target >= 85%: "
                       f"{'met' if worst_bw >= 0.85 * link else 'NOT met'})")
        else:
            out.append("- shoal busbw at >= 16 MiB: n/a (no shoal rows or unshaped link)")
        ref = probe_reference(bed)
        if mine and ref:
            out.append(f"- shoal busbw at >= 16 MiB against what plain TCP moved through the "
                       f"bed in the same pattern ({ref:.3f} GB/s per direction, the larger "
                       f"probe): min {100 * worst_bw / ref:.0f}% at {fmt_size(worst_size)} "
                       f"(>= 85%: {'met' if worst_bw >= 0.85 * ref else 'NOT met'})")
        sizes_ = big
    else:
        peers = ("gloo", "mpi-tcp")
        sizes_ = op_sizes
    scope = ">= 16 MiB" if op == "allreduce" else "every size"
    for peer in peers:
        ratios = {s: bw_ratio(by.get(("shoal", op, s)), by.get((peer, op, s))) for s in sizes_}
        ratios = {s: r for s, r in ratios.items() if r is not None}
        if not ratios:
            out.append(f"- shoal vs {peer} at {scope}: n/a (needs both)")
            continue
        worst = min(ratios, key=ratios.get)
        r = ratios[worst]
        out.append(f"- shoal vs {peer} at {scope}: min {r:.2f}x at {fmt_size(worst)} "
                   f"(target > 1x: {'met' if r > 1 else 'NOT met'}"
                   + (f"; {len(ratios) - sum(v > 1 for v in ratios.values())} of "
                      f"{len(ratios)} sizes behind" if r <= 1 else "") + ")")
    return "\n".join(out)


def bw_ratio(a, b):
    """busbw(a) / busbw(b) for rows of the same op and size.

    Equal to time(b) / time(a) (same bytes and bus factor); computed from the times, which
    tools print with more significant digits than tiny busbw values."""
    if not a or not b:
        return None
    if a["time_us"] > 0 and b["time_us"] > 0:
        return b["time_us"] / a["time_us"]
    return a["busbw"] / b["busbw"] if b["busbw"] > 0 else None


def target_note(op, by, op_sizes):
    """The bars for one host: over TCP (shoal-tcp, or shoal if it was not run), >= 1.5x Gloo's
    busbw at >= 64 KiB and <= 1/4 of Gloo's latency at the smallest size (issue 2); with
    shared memory (shoal) against Open MPI's shared memory (mpi-sm), ahead at every size,
    >= 2x busbw at >= 16 MiB and a latency no higher (issue 5)."""
    tcp = "shoal-tcp" if any(k[0] == "shoal-tcp" and k[1] == op for k in by) else "shoal"
    out = []

    def latency(mine, peer, factor, label):
        small = op_sizes[0]
        a, b = by.get((mine, op, small)), by.get((peer, op, small))
        if not (a and b):
            return f"{mine} {fmt_size(small)} latency vs {peer}: n/a (needs both rows)"
        ratio = a["time_us"] / b["time_us"] if b["time_us"] > 0 else float("inf")
        def us(t):  # two decimals below 10 us, so that the times shown give the ratio shown
            return f"{t:.2f}" if t < 10 else f"{t:.1f}"
        return (f"{mine} {fmt_size(small)} latency vs {peer}: {us(a['time_us'])} us vs "
                f"{us(b['time_us'])} us = {ratio:.2f}x of {peer}'s time (target <= {label}: "
                f"{'met' if ratio <= factor else 'NOT met'})")

    def bandwidth(mine, peer, floor, factor):
        rs = {s: bw_ratio(by.get((mine, op, s)), by.get((peer, op, s)))
              for s in op_sizes if s >= floor}
        rs = {s: r for s, r in rs.items() if r is not None}
        if not rs:
            return f"{mine}/{peer} busbw at >= {fmt_size(floor)}: n/a (needs both rows)"
        worst = min(rs, key=rs.get)
        return (f"{mine}/{peer} busbw at >= {fmt_size(floor)}: min {rs[worst]:.2f}x at "
                f"{fmt_size(worst)} (target >= {factor:g}x: "
                f"{'met' if rs[worst] >= factor else 'NOT met'})")

    out.append(latency(tcp, "gloo", 0.25, "0.25x"))
    out.append(bandwidth(tcp, "gloo", 64 << 10, 1.5))
    if tcp != "shoal" or any(k[0] == "mpi-sm" for k in by):
        out.append(latency("shoal", "mpi-sm", 1.0, "1x"))
        out.append(bandwidth("shoal", "mpi-sm", 16 << 20, 2.0))
        out.append(bandwidth("shoal", "mpi-sm", 0, 1.0).replace("at >= 0 B", "at every size"))
    return "\n".join("- " + line for line in out)


def write_plot(path, args, rows):
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
        from matplotlib.ticker import FuncFormatter, LogLocator
    except ImportError as e:
        warn(f"matplotlib not available ({e}); no plot")
        return False
    impls = [i for i in args.impls if any(r["impl"] == i for r in rows)]
    ops = args.ops
    fig, axes = plt.subplots(2, len(ops), figsize=(5.5 * len(ops), 8), squeeze=False)
    style = {"shoal": ("tab:red", "o"), "gloo": ("tab:blue", "s"),
             "mpi-tcp": ("tab:green", "^"), "mpi-sm": ("tab:gray", "v"),
             "shoal-flat-ring": ("tab:orange", "D"), "shoal-tcp": ("tab:purple", "P"),
             "shoal-torch": ("tab:pink", "X")}
    sizefmt = FuncFormatter(lambda v, _: fmt_size(int(v)).replace(" ", "") if v >= 1 else "")
    for j, op in enumerate(ops):
        for row, (key, label) in enumerate((("busbw", "busbw (GB/s)"),
                                            ("time_us", "time (us)"))):
            ax = axes[row][j]
            for i in impls:
                pts = sorted((r["bytes"], r[key]) for r in rows
                             if r["impl"] == i and r["op"] == op and r[key] > 0)
                if not pts:
                    continue
                c, mk = style.get(i, (None, "."))
                ax.plot([p[0] for p in pts], [p[1] for p in pts], marker=mk, ms=4,
                        color=c, label=i)
            ax.set_xscale("log", base=2)
            ax.set_yscale("log")
            ax.xaxis.set_major_locator(LogLocator(base=4))
            ax.xaxis.set_major_formatter(sizefmt)
            ax.tick_params(axis="x", labelrotation=45, labelsize=8)
            ax.grid(True, which="both", alpha=0.3)
            ax.set_ylabel(label)
            if row == 0:
                bed = getattr(args, "bed_info", None)
                if bed:
                    ax.set_title(f"{op} ({args.hosts} hosts x {args.per_host} ranks, "
                                 f"{bed['rate']} links)")
                    if op == "allreduce" and bed.get("link_GBps"):
                        ax.axhline(bed["link_GBps"], color="k", ls=":", lw=1, label="link")
                else:
                    ax.set_title(f"{op} ({args.np} ranks)")
            else:
                ax.set_xlabel("size (bytes per rank)")
            ax.legend(fontsize=8)
    fig.suptitle(f"shoal vs gloo vs Open MPI - {datetime.date.today().isoformat()}")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return True


SUMMARY_COLUMNS = ["impl", "op", "bytes", "starts", "time_us_median", "time_us_p10", "time_us_p90",
                   "busbw_median", "busbw_p10", "busbw_p90", "wrong"]
SUMMARY_NOTE = ("per implementation, op and size, over the starts (each start's time_us is its median over "
                "iterations, slowest rank): median, p10 and p90 of time_us and of busbw (GB/s); wrong: "
                "wrong elements of every start together")


def summarize(rows):
    """Per (impl, op, bytes), in the rows' order, a row of SUMMARY_COLUMNS."""
    groups = {}
    for r in rows:
        groups.setdefault((r["impl"], r["op"], int(r["bytes"])), []).append(r)
    return [[impl, op, size, len(g)] + spread(r["time_us"] for r in g) + spread(r["busbw"] for r in g)
            + [sum(int(r.get("wrong") or 0) for r in g)]
            for (impl, op, size), g in groups.items()]


def write_summary(path, rows):
    baseline.write_summary(path, SUMMARY_COLUMNS, summarize(rows), SUMMARY_NOTE)


def median_of_starts(rows):
    """With --starts N: per (impl, op, bytes), the row of the median start (the
    lower median for even N), with the times of all starts in `time_us_starts`
    and the slowest start's time over the median's in `worst_over_median`.
    Rows without a start pass unchanged."""
    groups, order = {}, []
    for r in rows:
        key = (r.get("impl"), r.get("op"), r.get("bytes"))
        if "start" not in r:
            order.append(r)
            continue
        if key not in groups:
            groups[key] = []
            order.append(key)
        groups[key].append(r)
    out = []
    for k in order:
        if not isinstance(k, tuple):
            out.append(k)
            continue
        g = sorted(groups[k], key=lambda r: r["time_us"])
        med = g[(len(g) - 1) // 2]
        out.append(dict(med, time_us_starts=[r["time_us"] for r in groups[k]],
                        core_rtt_starts=[r.get("core_rtt_ns") for r in groups[k]],
                        worst_over_median=g[-1]["time_us"] / med["time_us"] if med["time_us"] else None))
    return out
