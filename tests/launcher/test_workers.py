"""One node: what each worker gets, and the output."""
import json
import os
import re
from collections import Counter

from conftest import assert_rank_files, env_dump, read_env

ENV_DUMP = env_dump("RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE", "GROUP_RANK", "MASTER_ADDR",
                    "MASTER_PORT", "SHOAL_RESTART_COUNT", "OMP_NUM_THREADS", "CUDA_VISIBLE_DEVICES",
                    "SHOAL_ERROR_FILE")


def test_worker_environment(job):
    job.script("env.sh", ENV_DUMP)
    r = job.run("--nproc-per-node", "3", "--master-port", "31999", "--no-python", "./env.sh",
                env=job.env(CUDA_VISIBLE_DEVICES="5,6"))
    assert r.rc == 0, r.err
    for rank in range(3):
        e = read_env(job, rank)
        assert e["RANK"] == e["LOCAL_RANK"] == str(rank)
        assert e["WORLD_SIZE"] == e["LOCAL_WORLD_SIZE"] == "3"
        assert e["GROUP_RANK"] == "0" and e["SHOAL_RESTART_COUNT"] == "0"
        assert e["MASTER_ADDR"] == "127.0.0.1" and e["MASTER_PORT"] == "31999"
        assert e["CUDA_VISIBLE_DEVICES"] == "5,6"  # left alone
        assert e["SHOAL_ERROR_FILE"].endswith(f"error_rank{rank}.json")
        cores = len(os.sched_getaffinity(0))
        assert e["OMP_NUM_THREADS"] == str(max(1, cores // 3))
    assert r.err.count("OMP_NUM_THREADS is not set") == 1


def test_omp_num_threads_kept_when_set(job):
    job.script("env.sh", ENV_DUMP)
    r = job.run("--nproc-per-node", "2", "--no-python", "./env.sh", env=job.env(OMP_NUM_THREADS="7"))
    assert r.rc == 0, r.err
    assert_rank_files(job, "env", 2)
    for rank in range(2):
        assert read_env(job, rank)["OMP_NUM_THREADS"] == "7"
    assert "OMP_NUM_THREADS" not in r.err


def test_script_arguments_pass_through(job):
    job.script("args.py", "import sys, json, os\n"
                          "open(os.environ['JOB_DIR'] + '/args.' + os.environ['RANK'], 'w')"
                          ".write(json.dumps(sys.argv))\n")
    args = ["--nnodes", "5", "-m", "x", "a b", "", "ünï", "--", "--tee", "*"]
    r = job.run("--nproc-per-node", "2", "args.py", *args)
    assert r.rc == 0, r.err
    for rank in range(2):
        argv = json.loads((job.dir / f"args.{rank}").read_text())
        assert argv == ["args.py", *args]


def test_python_script_sys_path_and_main(job):
    (job.dir / "pkg").mkdir()
    job.script("pkg/helper.py", "VALUE = 42\n")
    job.script("pkg/train.py", "import helper, sys\nprint(__name__, helper.VALUE, sys.argv[0], flush=True)\n")
    r = job.run("pkg/train.py")
    assert r.rc == 0, r.err
    assert "[0]: __main__ 42 pkg/train.py" in r.out


def test_module(job):
    (job.dir / "mymod").mkdir()
    job.script("mymod/__init__.py", "")
    job.script("mymod/__main__.py", "import os, sys\nprint('module', __name__, os.environ['RANK'], sys.argv[1:])\n")
    r = job.run("--nproc-per-node", "2", "-m", "mymod", "x", "--y")
    assert r.rc == 0, r.err
    assert "[0]: module __main__ 0 ['x', '--y']" in r.out
    assert "[1]: module __main__ 1 ['x', '--y']" in r.out


def test_no_python(job):
    r = job.run("--nproc-per-node", "2", "--no-python", "sh", "-c", 'echo "sh rank $RANK"')
    assert r.rc == 0, r.err
    assert sorted(r.out.splitlines()) == ["[0]: sh rank 0", "[1]: sh rank 1"]


def test_prefixes_stdout_and_stderr(job):
    job.script("w.sh", '#!/bin/sh\necho "out $RANK"\necho "err $RANK" >&2\nprintf "no newline $RANK"\n')
    r = job.run("--nproc-per-node", "2", "--no-python", "./w.sh")
    assert r.rc == 0, r.err
    assert sorted(r.out.splitlines()) == ["[0]: no newline 0", "[0]: out 0", "[1]: no newline 1", "[1]: out 1"]
    assert "[0]: err 0" in r.err.splitlines() and "[1]: err 1" in r.err.splitlines()


def test_lines_never_interleave(job):
    # Every worker writes long lines in small pieces, flushing in between.
    job.script("chatty.py", """
import os, sys
r = os.environ["RANK"]
for i in range(60):
    line = (r * 3000)[:3000]
    for j in range(0, len(line), 700):
        sys.stdout.write(line[j:j + 700])
        sys.stdout.flush()
    sys.stdout.write("\\n")
    sys.stdout.flush()
""")
    r = job.run("--nproc-per-node", "3", "chatty.py")
    assert r.rc == 0, r.err
    lines = r.out.splitlines()
    assert len(lines) == 180
    for line in lines:
        m = re.fullmatch(r"\[(\d)\]: (\d+)", line)
        assert m and m.group(2) == m.group(1) * 3000, line[:80]
    # Every rank wrote its 60 lines (not 180 lines from fewer ranks).
    assert Counter(line[1] for line in lines) == {"0": 60, "1": 60, "2": 60}


def test_log_dir_and_tee(job):
    job.script("w.sh", '#!/bin/sh\necho "line $RANK"\necho "warn $RANK" >&2\n')
    logs = job.dir / "logs"
    r = job.run("--nproc-per-node", "2", "--log-dir", logs, "--redirects", "3", "--no-python", "./w.sh")
    assert r.rc == 0, r.err
    assert "line" not in r.out and "warn" not in r.err
    for rank in range(2):
        text = (logs / f"rank_{rank}.log").read_text().splitlines()
        assert sorted(text) == [f"line {rank}", f"warn {rank}"]
    logs2 = job.dir / "logs2"
    r = job.run("--nproc-per-node", "2", "--log-dir", logs2, "--tee", "3", "--no-python", "./w.sh")
    assert r.rc == 0, r.err
    for rank in range(2):
        assert f"[{rank}]: line {rank}" in r.out and f"[{rank}]: warn {rank}" in r.err
        assert sorted((logs2 / f"rank_{rank}.log").read_text().splitlines()) == [f"line {rank}", f"warn {rank}"]


def test_zero_exit_of_all_workers(job):
    # Silent workers that leave a file each: exit 0 and no output must mean both ran.
    r = job.run("--nproc-per-node", "2", "--no-python", "sh", "-c", 'touch "$JOB_DIR/ran.$RANK"',
                env=job.env(OMP_NUM_THREADS=1))
    assert r.rc == 0 and r.out == "" and r.err == ""
    assert_rank_files(job, "ran", 2)
