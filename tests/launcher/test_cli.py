"""Command line and bad input: one line on stderr and exit code 2."""
import json

import pytest

from conftest import one_error_line

OK_SCRIPT = "print('ok')\n"


@pytest.mark.parametrize("args,env,expect", [
    (["--nproc-per-node", "0", "w.py"], {}, "--nproc-per-node must be at least 1"),
    (["--nproc-per-node", "x", "w.py"], {}, "--nproc-per-node"),
    (["--nnodes", "2", "--node-rank", "2", "w.py"], {}, "--node-rank 2 is out of range for --nnodes 2"),
    (["--nnodes", "0", "w.py"], {}, "--nnodes must be at least 1"),
    (["--nnodes", "1:4", "w.py"], {}, "--nnodes 1:4: a range of node counts (an elastic job) needs --rdzv-backend c10d"),
    (["--node-rank", "-1", "--nnodes", "2", "w.py"], {}, "out of range"),
    (["w.py"], {"SM_HOSTS": "[algo-1", "SM_CURRENT_HOST": "algo-1"}, "SM_HOSTS is not valid JSON"),
    (["w.py"], {"SM_HOSTS": '{"a": 1}', "SM_CURRENT_HOST": "algo-1"}, "SM_HOSTS must be a JSON list"),
    (["w.py"], {"SM_HOSTS": "[1, 2]", "SM_CURRENT_HOST": "algo-1"}, "SM_HOSTS must be a JSON list"),
    (["w.py"], {"SM_HOSTS": "[]", "SM_CURRENT_HOST": "algo-1"}, "empty list"),
    (["w.py"], {"SM_HOSTS": '["algo-1","algo-1"]', "SM_CURRENT_HOST": "algo-1"}, "twice"),
    (["w.py"], {"SM_HOSTS": '["algo-1","algo-2"]', "SM_CURRENT_HOST": "algo-9"},
     "SM_CURRENT_HOST 'algo-9' is not one of the hosts (algo-1, algo-2)"),
    (["w.py"], {"SM_HOSTS": '["algo-1"]'}, "SM_CURRENT_HOST is not"),
    (["w.py"], {"SM_HOSTS": '["algo-1"]', "SM_CURRENT_HOST": "algo-1", "SM_NUM_GPUS": "two"}, "SM_NUM_GPUS"),
    (["w.py"], {"SLURM_NODEID": "0", "SLURM_NNODES": "2", "SLURM_JOB_NODELIST": "n[1-2"}, "unbalanced"),
    (["w.py"], {"SLURM_NODEID": "0", "SLURM_NNODES": "2", "SLURM_JOB_NODELIST": "n[3-1]"}, "backwards"),
    (["w.py"], {"SLURM_NODEID": "0", "SLURM_NNODES": "3", "SLURM_JOB_NODELIST": "n[1-2]"}, "lists 2 hosts"),
    (["w.py"], {"SLURM_NODEID": "2", "SLURM_NNODES": "2", "SLURM_JOB_NODELIST": "n[1-2]"}, "out of range"),
    (["w.py"], {"OMPI_COMM_WORLD_RANK": "1", "OMPI_COMM_WORLD_SIZE": "2"}, "--master-addr"),
    (["w.py"], {"OMPI_COMM_WORLD_RANK": "1", "OMPI_COMM_WORLD_SIZE": "2", "OMPI_COMM_WORLD_LOCAL_SIZE": "2",
                "MASTER_ADDR": "h"}, "one per node"),
    (["missing.py"], {}, "script 'missing.py' not found"),
    (["--no-python", "no-such-command-xyz"], {}, "command 'no-such-command-xyz' not found"),
    ([], {}, "no training script given"),
    (["--nproc-per-node", "2"], {}, "no training script given"),
    (["--bogus", "w.py"], {}, "unknown option --bogus"),
    (["-m", "--no-python", "w.py"], {}, "cannot be combined"),
    (["--tee", "w.py"], {}, "--tee 'w.py': use 0 (none), 1 (stdout), 2 (stderr), 3 (both)"),
    (["--master-port", "70000", "w.py"], {}, "not a TCP port"),
    (["--nnodes", "2", "--master-port", "500", "--rdzv-port", "500", "w.py"], {}, "--rdzv-port must differ"),
    (["--standalone", "--nnodes", "2", "w.py"], {}, "--standalone"),
])
def test_bad_input_one_line_exit_2(job, args, env, expect):
    job.script("w.py", OK_SCRIPT)
    r = job.run(*args, env=job.env(**env))
    line = one_error_line(r)
    assert expect in line
    assert r.out == ""


def test_missing_resourceconfig_override(job):
    job.script("w.py", OK_SCRIPT)
    r = job.run("w.py", env=job.env(SHOAL_SM_RESOURCE_CONFIG=job.dir / "nope.json"))
    assert "cannot read" in one_error_line(r)


def test_bad_resourceconfig(job):
    job.script("w.py", OK_SCRIPT)
    (job.dir / "rc.json").write_text(json.dumps({"current_host": "algo-3", "hosts": ["algo-1", "algo-2"]}))
    r = job.run("w.py", env=job.env(SHOAL_SM_RESOURCE_CONFIG=job.dir / "rc.json"))
    assert "current_host 'algo-3' is not one of the hosts" in one_error_line(r)


def test_help_and_version(job):
    r = job.run("--help")
    assert r.rc == 0
    for flag in ("--nproc-per-node", "--nnodes", "--node-rank", "--master-addr", "--master-port", "--standalone",
                 "--max-restarts", "--log-dir", "--tee", "--no-python", "--term-timeout", "--rdzv-timeout",
                 "--rdzv-port", "--module"):
        assert flag in r.out
    r = job.run("--version")
    assert r.rc == 0 and r.out.startswith("shoalrun ")


def test_underscore_and_equals_spellings(job):
    job.script("w.py", OK_SCRIPT)
    r = job.run("--nproc_per_node=3", "--nnodes=2", "--node_rank", "1", "--master_addr=10.0.0.1",
                "--master_port", "1234", "--rdzv_port=4321", "--dry-run", "w.py")
    assert r.rc == 0, r.err
    assert "nproc_per_node=3\n" in r.out and "node_rank=1\n" in r.out and "nnodes=2\n" in r.out
    assert "master_addr=10.0.0.1\n" in r.out and "master_port=1234\n" in r.out and "rdzv_port=4321\n" in r.out
