"""The outcome of a job on a bed: each rank's exit and output, and the job's."""

import shlex

from .namespaces import NetBedError


class RankResult:
    def __init__(self, rank, host, local_rank, pid):
        self.rank, self.host, self.local_rank, self.pid = rank, host, local_rank, pid
        self.returncode = None
        self.ended = None             # time.monotonic() when its exit was seen
        self.killed = False           # stopped by the job runner (another rank failed, timeout)
        self._out, self._err = [], []

    @property
    def stdout(self):
        return "".join(self._out)

    @property
    def stderr(self):
        return "".join(self._err)

    def __repr__(self):
        return (f"RankResult(rank={self.rank}, host={self.host}, rc={self.returncode}"
                f"{', killed' if self.killed else ''})")


class JobResult:
    def __init__(self, argv, ranks, seconds, timed_out, timeout):
        self.argv, self.ranks, self.seconds = argv, ranks, seconds
        self.timed_out, self.timeout = timed_out, timeout

    @property
    def ok(self):
        return not self.timed_out and all(r.returncode == 0 for r in self.ranks)

    @property
    def failed(self):
        """The first rank that failed on its own (not killed by the runner), or None."""
        bad = [r for r in self.ranks if r.returncode not in (0, None) and not r.killed]
        return min(bad, key=lambda r: r.ended or float("inf")) if bad else None

    def summary(self, lines=15):
        if self.ok:
            return f"job ok: {len(self.ranks)} ranks in {self.seconds:.1f} s"
        head = (f"job timed out after {self.timeout:.0f} s" if self.timed_out
                else "job failed")
        parts = [f"{head}: {shlex.join(self.argv)}"]
        for r in self.ranks:
            state = "killed by the runner" if r.killed else f"exit {r.returncode}"
            parts.append(f"  rank {r.rank} (host {r.host}, local {r.local_rank}, pid {r.pid}): "
                         f"{state}")
        first = self.failed or next((r for r in self.ranks if r.returncode != 0), None)
        if first is not None:
            tail = (first.stdout + first.stderr).strip().splitlines()[-lines:]
            parts.append(f"  last lines of rank {first.rank}:")
            parts += [f"    {t}" for t in tail]
        return "\n".join(parts)

    def raise_for_status(self):
        if not self.ok:
            raise NetBedError(self.summary())
        return self
