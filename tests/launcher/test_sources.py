"""Where the cluster description comes from (checked with --dry-run: no workers)."""
import json
import os

import pytest


def dry(job, *args, **env):
    job.script("w.py", "print('ok')\n")
    r = job.run("--dry-run", *args, "w.py", env=job.env(**env))
    assert r.rc == 0, r.err
    return dict(line.split("=", 1) for line in r.out.splitlines())


SM2 = {"SM_HOSTS": '["algo-1","algo-2","algo-3"]', "SM_CURRENT_HOST": "algo-2"}
SLURM = {"SLURM_NODEID": "1", "SLURM_NNODES": "5", "SLURM_JOB_NODELIST": "node[01-04,07]"}


def test_local_default(job):
    d = dry(job)
    assert d["source"] == "local"
    assert d["nnodes"] == "1" and d["node_rank"] == "0" and d["nproc_per_node"] == "1"
    assert d["master_addr"] == "127.0.0.1" and d["master_port"] != "29500"  # a free port for one node


def test_local_gpus_from_cuda_visible_devices(job):
    assert dry(job, CUDA_VISIBLE_DEVICES="0,1,2")["nproc_per_node"] == "3"
    # auto as torchrun means it: the GPUs, else the cores.
    assert dry(job, "--nproc-per-node", "auto", CUDA_VISIBLE_DEVICES="")["nproc_per_node"] == str(len(os.sched_getaffinity(0)))
    assert dry(job, CUDA_VISIBLE_DEVICES="")["nproc_per_node"] == "1"  # no flag: GPUs, else 1


def test_sagemaker_env(job):
    d = dry(job, SM_NUM_GPUS="8", **SM2)
    assert d["source"] == "sagemaker"
    assert (d["nnodes"], d["node_rank"], d["nproc_per_node"]) == ("3", "1", "8")
    assert d["master_addr"] == "algo-1" and d["hosts"] == "algo-1,algo-2,algo-3"
    assert d["master_port"] == "29500" and d["rdzv_port"] == "29501"
    assert d["world_size"] == "24"


def test_sagemaker_cpus_when_no_gpu(job):
    d = dry(job, SM_NUM_GPUS="0", SM_NUM_CPUS="4", **SM2)
    assert d["nproc_per_node"] == "4" and "SM_NUM_CPUS" in d["nproc_detail"]


def test_sagemaker_resourceconfig(job):
    cfg = job.dir / "resourceconfig.json"
    cfg.write_text(json.dumps({"current_host": "algo-4", "hosts": ["algo-3", "algo-4"],
                               "network_interface_name": "eth0"}))
    d = dry(job, SHOAL_SM_RESOURCE_CONFIG=cfg)
    assert d["source"] == "sagemaker" and str(cfg) in d["source_detail"]
    assert (d["nnodes"], d["node_rank"], d["master_addr"]) == ("2", "1", "algo-3")


def test_sagemaker_single_host_uses_loopback(job):
    d = dry(job, SM_HOSTS='["algo-1"]', SM_CURRENT_HOST="algo-1")
    assert d["source"] == "sagemaker" and d["master_addr"] == "127.0.0.1"


def test_flags_override_fields_of_environment_source(job):
    d = dry(job, "--nproc-per-node", "2", "--master-port", "40000", "--master-addr", "10.1.1.1", **SM2)
    assert d["source"] == "sagemaker" and d["nproc_per_node"] == "2"
    assert d["master_port"] == "40000" and d["rdzv_port"] == "40001" and d["master_addr"] == "10.1.1.1"


def test_flags_win_over_environment(job):
    d = dry(job, "--nnodes", "2", "--node-rank", "0", **SM2, **SLURM)
    assert d["source"] == "flags" and d["nnodes"] == "2" and d["node_rank"] == "0"


def test_sagemaker_before_slurm_before_ompi(job):
    assert dry(job, **SM2, **SLURM)["source"] == "sagemaker"
    ompi = {"OMPI_COMM_WORLD_RANK": "0", "OMPI_COMM_WORLD_SIZE": "2", "MASTER_ADDR": "h0"}
    assert dry(job, **SLURM, **ompi)["source"] == "slurm"
    assert dry(job, **ompi)["source"] == "openmpi"


@pytest.mark.parametrize("nodelist,hosts", [
    ("node[01-04,07]", "node01,node02,node03,node04,node07"),
    ("a1,b[2-3],c", "a1,b2,b3,c"),
    ("rack[1-2]-n[08-10]", "rack1-n08,rack1-n09,rack1-n10,rack2-n08,rack2-n09,rack2-n10"),
    ("x[8-10]", "x8,x9,x10"),
    ("gpu[001-002],cpu", "gpu001,gpu002,cpu"),
    ("single", "single"),
])
def test_slurm_nodelist(job, nodelist, hosts):
    n = len(hosts.split(","))
    d = dry(job, SLURM_NODEID=str(n - 1), SLURM_NNODES=str(n), SLURM_JOB_NODELIST=nodelist)
    assert d["source"] == "slurm" and d["hosts"] == hosts
    assert d["node_rank"] == str(n - 1) and d["node_name"] == hosts.split(",")[-1]
    assert d["master_addr"] == (hosts.split(",")[0] if n > 1 else "127.0.0.1")


def test_ompi(job):
    d = dry(job, "--master-addr", "head", OMPI_COMM_WORLD_RANK="2", OMPI_COMM_WORLD_SIZE="4",
            OMPI_COMM_WORLD_LOCAL_SIZE="1")
    assert d["source"] == "openmpi" and (d["nnodes"], d["node_rank"], d["master_addr"]) == ("4", "2", "head")


def test_standalone(job):
    d = dry(job, "--standalone", "--nproc-per-node", "4")
    assert d["source"] == "flags" and d["nnodes"] == "1" and d["nproc_per_node"] == "4"


def test_verbose_says_which_source(job):
    job.script("w.sh", "#!/bin/sh\necho hi\n")
    r = job.run("-v", "--no-python", "./w.sh", env=job.env(SLURM_NODEID="0", SLURM_NNODES="1",
                                                           SLURM_JOB_NODELIST="solo"))
    assert r.rc == 0, r.err
    assert "cluster description from slurm (SLURM_NODEID, SLURM_NNODES, SLURM_JOB_NODELIST)" in r.err
    assert "[0]: hi" in r.out
