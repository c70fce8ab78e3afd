"""bench/probes/load.py, the interference `python3 -m bench.compare --load` runs beside every
implementation: start() returns once every worker is in its loop, and a
worker that cannot start is an error, not a benchmark run without load."""

from pathlib import Path

import pytest

from bench.probes import load


def test_start_leaves_every_worker_running_and_stop_ends_them():
    ld = load.Load("burst:2").start()
    procs = list(ld.procs)
    try:
        assert len(procs) == 2
        assert all(p.poll() is None for p in procs), "a worker ended while the load runs"
    finally:
        ld.stop()
    assert ld.procs == []
    assert all(p.poll() is not None for p in procs), "a worker outlived stop()"


def test_a_worker_that_cannot_start_is_an_error(tmp_path, monkeypatch):
    fake = tmp_path / "numpy"
    fake.mkdir()
    (fake / "__init__.py").write_text("raise ImportError('no numpy here')\n")
    monkeypatch.setenv("PYTHONPATH", str(tmp_path))
    ld = load.Load("busy:1")
    with pytest.raises(RuntimeError, match=r"load 'busy:1': worker 0 did not start \(it exited with status 1\)"):
        ld.start()
    assert ld.procs == []


def test_every_worker_runs_in_one_thread():
    # A BLAS thread pool beside a worker spins between its products: "1"
    # would then take 1.75 cores where it promises one.
    ld = load.Load("burst:2").start()
    try:
        for p in ld.procs:
            threads = list(Path(f"/proc/{p.pid}/task").iterdir())
            assert len(threads) == 1, f"worker {p.pid} runs {len(threads)} threads"
    finally:
        ld.stop()


def test_specs_say_what_they_run_and_bad_ones_are_named():
    assert load.parse("1") == ("burst", 2, 0.5)
    assert load.parse("0.2") == ("burst", 1, 0.2)  # one process, not half a core
    assert load.parse("busy:3") == ("busy", 3, 1.0)
    assert load.parse("burst:2:0.25") == ("burst", 2, 0.25)
    for bad, why in (("0", "above 0"), ("-1", "above 0"), ("busy:0", "at least 1"), ("burst:2:0", "duty"),
                     ("burst:1:2:3", "expected"), ("x", "expected")):
        with pytest.raises(ValueError, match=why) as e:
            load.parse(bad)
        assert repr(bad) in str(e.value)
