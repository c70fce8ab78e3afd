"""The committed baselines stay summaries: every bench/results/* folder holds at most
bench.baseline.LIMIT_BYTES (128 KiB) and no plot, and the summary they keep is the median,
p10 and p90 it says it is."""

import json

import pytest

from bench import baseline
from bench.compare import report

FOLDERS = sorted(p for p in baseline.RESULTS.iterdir() if p.is_dir())


def test_there_are_baselines_to_check():
    assert len(FOLDERS) > 20, FOLDERS


@pytest.mark.parametrize("folder", FOLDERS, ids=lambda p: p.name)
def test_a_baseline_stays_under_the_limit(folder):
    size = baseline.folder_bytes(folder)
    assert size <= baseline.LIMIT_BYTES, (
        f"{folder.relative_to(baseline.ROOT)} holds {size} bytes, over the {baseline.LIMIT_BYTES} of a baseline: "
        "keep results.md, meta.json and summary.json there, and raw rows and plots in bench/out/")
    plots = [p.name for p in folder.rglob("*.png")]
    assert not plots, f"plots are regenerated into bench/out/, not committed: {plots}"


def test_the_size_check_sees_every_file_of_a_folder(tmp_path):
    (tmp_path / "a").write_bytes(b"x" * 1000)
    (tmp_path / "sub").mkdir()
    (tmp_path / "sub" / "b").write_bytes(b"y" * 24)
    assert baseline.folder_bytes(tmp_path) == 1024


def test_quantiles_interpolate_between_ranks():
    assert baseline.spread([5.0]) == [5.0, 5.0, 5.0]
    assert baseline.spread([4.0, 1.0, 3.0, 2.0, 5.0]) == [3.0, 1.4, 4.6]
    assert baseline.spread(range(1, 12)) == [6.0, 2.0, 10.0]


def test_the_summary_of_starts_per_implementation_and_size(tmp_path):
    row = {"op": "allreduce", "bytes": 8, "wrong": 0}
    rows = [dict(row, impl="shoal", time_us=t, busbw=8 / t / 1e3, start=i) for i, t in enumerate([3.0, 1.0, 2.0])]
    rows += [dict(row, impl="gloo", time_us=10.0, busbw=0.0008, wrong=2)]
    path = tmp_path / "summary.json"
    report.write_summary(path, rows)
    got = {r["impl"]: r for r in baseline.read_summary(path)}
    assert got["shoal"]["starts"] == 3
    assert (got["shoal"]["time_us_median"], got["shoal"]["time_us_p10"], got["shoal"]["time_us_p90"]) == (2.0, 1.2, 2.8)
    assert got["shoal"]["busbw_p90"] > got["shoal"]["busbw_median"] > got["shoal"]["busbw_p10"]
    assert got["gloo"] == dict(got["gloo"], starts=1, time_us_median=10.0, time_us_p90=10.0, wrong=2)
    assert len(json.loads(path.read_text())["rows"]) == 2


@pytest.mark.parametrize("path", sorted(baseline.RESULTS.rglob("summary*.json")),
                         ids=lambda p: str(p.relative_to(baseline.RESULTS)))
def test_every_committed_summary_reads_and_is_ordered(path):
    rows = baseline.read_summary(path)
    assert rows, path
    for r in rows:
        assert r["time_us_p10"] <= r["time_us_median"] <= r["time_us_p90"], r
