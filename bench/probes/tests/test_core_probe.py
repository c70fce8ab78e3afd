"""bench/probes/core_probe.py's split of the starts by the cores' distance: the spread
of a library's starts is read within the starts that met the same placement,
so a machine that moves its cores apart does not pass for a slow library, and
a library slow on near cores is not hidden by the far ones."""

from bench.probes import core_probe


def fmt(n):
    return f"{n} B"


def row(times, rtts):
    return {"time_us_starts": times, "core_rtt_starts": rtts}


def test_spread_is_read_within_near_and_far_starts():
    near, far, mixed = [100.0, 110.0], [450.0, 480.0], [100.0, 460.0]
    # 4 near starts at 1.0-1.2 us, 3 far at 3.0-3.3 us, one mixed at 9 us (in neither group).
    times = [1.0, 1.1, 1.2, 1.05, 3.0, 3.3, 3.1, 9.0]
    rtts = [near, near, near, near, far, far, far, mixed]
    by = {("shoal", "allreduce", 2048): row(times, rtts)}
    line = core_probe.by_distance(by, ["shoal"], "allreduce", [2048], fmt)
    assert "shoal near 1.14 at 2048 B (4 starts), far 1.06 at 2048 B (3 starts)" in line, line


def test_the_largest_spread_over_sizes_and_only_fully_probed_starts():
    near, far = [100.0, 100.0], [450.0, 450.0]
    rtts = [near] * 4 + [far] * 3 + [[100.0, None], [None, 450.0]]
    by = {("shoal", "allreduce", 8): row([1.0, 1.0, 1.1, 1.0, 3.0, 3.0, 3.0, 50.0, 60.0], rtts),
          ("shoal", "allreduce", 64): row([1.0, 1.0, 2.0, 1.0, 3.0, 3.0, 4.5, 50.0, 60.0], rtts)}
    line = core_probe.by_distance(by, ["shoal"], "allreduce", [8, 64], fmt)
    # The half-probed starts (50 and 60 us) are in neither group; 64 B spreads more than 8 B.
    assert "shoal near 2.00 at 64 B (4 starts), far 1.50 at 64 B (3 starts)" in line, line


def test_a_slow_near_start_shows():
    near = [100.0, 100.0]
    by = {("shoal", "allreduce", 8): row([1.0, 1.0, 1.0, 5.0, 1.0, 1.0], [near] * 6)}
    line = core_probe.by_distance(by, ["shoal"], "allreduce", [8], fmt)
    assert "shoal near 5.00 at 8 B (6 starts)" in line, line
    assert "far" not in line.split("sizes): ")[1]


def test_nothing_to_say_without_enough_starts_or_probes():
    near = [100.0, 100.0]
    few = {("shoal", "allreduce", 8): row([1.0, 2.0, 3.0], [near] * 3)}
    assert core_probe.by_distance(few, ["shoal"], "allreduce", [8], fmt) is None
    unprobed = {("shoal", "allreduce", 8): row([1.0] * 8, [None] * 8)}
    assert core_probe.by_distance(unprobed, ["shoal"], "allreduce", [8], fmt) is None
