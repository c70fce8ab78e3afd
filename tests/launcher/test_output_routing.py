"""Where the workers' output goes: torchrun's --log-dir, -r/--redirects,
-t/--tee, --local-ranks-filter and --duplicate-std{out,err}-filters."""
import json

from conftest import assert_rank_files

TALK = '#!/bin/sh\necho "out $RANK"\necho "err $RANK" >&2\ntouch "$JOB_DIR/ran.$RANK"\n'


def lines(path):
    return sorted(path.read_text().splitlines())


def test_redirects_and_tee_per_stream_and_local_rank(job):
    job.script("w.sh", TALK)
    logs = job.dir / "logs"
    # local rank 0: stdout to the file only; 1: stderr to the file only;
    # 2: both streams to the file and the console (--tee wins over --redirects).
    r = job.run("--nproc-per-node", "3", "--log-dir", logs, "-r", "0:1,1:2,2:3", "--tee", "2:3", "--no-python",
                "./w.sh")
    assert r.rc == 0, r.err
    assert sorted(r.out.splitlines()) == ["[1]: out 1", "[2]: out 2"]
    assert sorted(l for l in r.err.splitlines() if l.startswith("[")) == ["[0]: err 0", "[2]: err 2"]
    assert lines(logs / "rank_0.log") == ["out 0"]
    assert lines(logs / "rank_1.log") == ["err 1"]
    assert lines(logs / "rank_2.log") == ["err 2", "out 2"]


def test_redirects_without_log_dir_get_a_new_one(job):
    job.script("w.sh", TALK)
    r = job.run("--nproc-per-node", "2", "--redirects", "3", "--no-python", "./w.sh",
                env=job.env(TMPDIR=job.dir))
    assert r.rc == 0, r.err
    assert r.out == "" and not [l for l in r.err.splitlines() if l.startswith("[")]
    said = [l for l in r.err.splitlines() if "the workers' logs go to" in l]
    assert len(said) == 1, r.err
    made = said[0].split("go to ", 1)[1].split(" (", 1)[0]
    assert made.startswith(str(job.dir / "shoalrun-logs-"))
    for rank in range(2):
        assert lines(job.dir / made / f"rank_{rank}.log") == [f"err {rank}", f"out {rank}"]


def test_log_dir_alone_keeps_the_console_and_the_error_files(job):
    job.script("boom.py", "import os\nprint('before', os.environ['RANK'])\nraise ValueError('bad ' + os.environ['RANK'])\n")
    logs = job.dir / "logs"
    r = job.run("--nproc-per-node", "1", "--log-dir", logs, "boom.py")
    assert r.rc == 1
    assert "[0]: before 0" in r.out  # as torchrun: nothing is redirected without -r/-t
    assert not (logs / "rank_0.log").exists()
    err = json.loads((logs / "error_rank0.json").read_text())
    assert err["type"] == "ValueError" and err["message"] == "bad 0"


def test_local_ranks_filter_keeps_others_off_the_console_only(job):
    job.script("w.sh", TALK)
    logs = job.dir / "logs"
    r = job.run("--nproc-per-node", "3", "--local-ranks-filter", "1", "--tee", "3", "--log-dir", logs, "--no-python",
                "./w.sh")
    assert r.rc == 0, r.err
    assert r.out.splitlines() == ["[1]: out 1"]
    assert [l for l in r.err.splitlines() if l.startswith("[")] == ["[1]: err 1"]
    assert_rank_files(job, "ran", 3)
    for rank in range(3):
        assert lines(logs / f"rank_{rank}.log") == [f"err {rank}", f"out {rank}"]


def test_duplicate_filters(job):
    job.script("w.sh", r"""#!/bin/sh
echo "loss,x $RANK"
echo "loss $RANK"
echo "epoch $RANK"
echo "other $RANK"
echo "warn $RANK" >&2
echo "quiet $RANK" >&2
""")
    logs = job.dir / "logs"
    r = job.run("--nproc-per-node", "2", "--log-dir", logs, "--duplicate-stdout-filters", "loss,,x,epoch",
                "--duplicate_stderr_filters=warn", "--no-python", "./w.sh")
    assert r.rc == 0, r.err
    assert len(r.out.splitlines()) == 8  # the console still gets everything
    assert lines(logs / "filtered_stdout.log") == ["[0]: epoch 0", "[0]: loss,x 0", "[1]: epoch 1", "[1]: loss,x 1"]
    assert lines(logs / "filtered_stderr.log") == ["[0]: warn 0", "[1]: warn 1"]
