"""torchrun's command line, flag by flag, through --dry-run (no worker starts).

Every option of torch.distributed.run is accepted in each of its spellings
(dashes, underscores, `=`), and from PET_<NAME> as torchrun's env-default
actions read it; the plan that --dry-run prints shows the value landed where
it means something. The command line wins over PET_*. Options shoalrun cannot
honour, and bad values, are one line naming the flag or variable, exit 2.
The jobs that show what the values do are in test_torchrun_jobs.py,
test_output_routing.py, test_c10d.py and test_loopback.py.
"""
import pytest

from conftest import one_error_line

# name (argparse's dest), its flags (dashed long name first), value (None: a
# flag without one), other arguments the case needs, and what the plan shows.
FLAGS = [
    ("nnodes", ["--nnodes"], "2", ["--master-addr", "10.0.0.1"], {"nnodes": "2", "source": "flags"}),
    ("nproc_per_node", ["--nproc-per-node", "--nproc_per_node"], "3", [], {"nproc_per_node": "3"}),
    ("node_rank", ["--node-rank", "--node_rank"], "1", ["--nnodes", "2", "--master-addr", "10.0.0.1"],
     {"node_rank": "1", "world_size": "2"}),
    ("master_addr", ["--master-addr", "--master_addr"], "10.9.8.7", ["--nnodes", "2", "--node-rank", "1"],
     {"master_addr": "10.9.8.7", "rdzv_host": "10.9.8.7"}),
    ("master_port", ["--master-port", "--master_port"], "23456", [], {"master_port": "23456"}),
    ("rdzv_backend", ["--rdzv-backend", "--rdzv_backend"], "c10d", ["--nnodes", "2", "--rdzv-endpoint", "10.0.0.1"],
     {"rdzv_backend": "c10d", "node_rank": "assigned at the rendezvous", "rdzv_port": "29400"}),
    ("rdzv_endpoint", ["--rdzv-endpoint", "--rdzv_endpoint"], "10.0.0.3:4567", ["--nnodes", "2", "--node-rank", "1"],
     {"rdzv_host": "10.0.0.3", "rdzv_port": "4567", "master_addr": "10.0.0.3"}),
    ("rdzv_id", ["--rdzv-id", "--rdzv_id"], "job-42", [], {"rdzv_id": "job-42"}),
    ("rdzv_conf", ["--rdzv-conf", "--rdzv_conf"],
     "join_timeout=5,last_call_timeout=2,close_timeout=3,heartbeat_timeout=4,keep_alive_interval=0.5,"
     "keep_alive_max_attempt=6,read_timeout=7,store_type=tcp", [],
     {"join_timeout": "5", "last_call_timeout": "2", "close_timeout": "3", "heartbeat_timeout": "4",
      "keep_alive_interval": "0.5", "keep_alive_max_attempt": "6", "read_timeout": "7"}),
    ("standalone", ["--standalone"], None, ["--nproc-per-node", "2"],
     {"source": "flags", "nnodes": "1", "master_addr": "127.0.0.1"}),
    ("max_restarts", ["--max-restarts", "--max_restarts"], "3", [], {"max_restarts": "3"}),
    ("monitor_interval", ["--monitor-interval", "--monitor_interval"], "0.5", [], {"monitor_interval": "0.5"}),
    ("start_method", ["--start-method", "--start_method"], "forkserver", [], {"start_method": "forkserver"}),
    ("event_log_handler", ["--event-log-handler", "--event_log_handler"], "console", [], {"verbose": "1"}),
    ("role", ["--role"], "trainer", [], {"role": "trainer"}),
    ("module", ["-m", "--module"], None, [], {"command_end": "shoalrun_boot.py -m ./w.py"}),
    ("no_python", ["--no-python", "--no_python"], None, [], {"command": "./w.py"}),
    ("run_path", ["--run-path", "--run_path"], None, ["--no-python"], {"command_end": "shoalrun_boot.py ./w.py"}),
    ("log_dir", ["--log-dir", "--log_dir"], "logs", [], {"log_dir": "logs"}),
    ("redirects", ["-r", "--redirects"], "3", [], {"redirects": "3"}),
    ("tee", ["-t", "--tee"], "0:1,1:2", [], {"tee": "0:1,1:2"}),
    ("local_ranks_filter", ["--local-ranks-filter", "--local_ranks_filter"], "0,2", [], {"local_ranks_filter": "0,2"}),
    ("duplicate_stdout_filters", ["--duplicate-stdout-filters", "--duplicate_stdout_filters"], "loss,,acc,epoch", [],
     {"duplicate_stdout_filters": "loss,acc|epoch"}),
    ("duplicate_stderr_filters", ["--duplicate-stderr-filters", "--duplicate_stderr_filters"], "warn", [],
     {"duplicate_stderr_filters": "warn"}),
    ("local_addr", ["--local-addr", "--local_addr"], "10.0.0.7", [], {"local_addr": "10.0.0.7"}),
    ("signals_to_handle", ["--signals-to-handle", "--signals_to_handle"], "SIGTERM,USR1", [],
     {"signals_to_handle": "SIGUSR1,SIGTERM"}),
    ("shutdown_timeout", ["--shutdown-timeout", "--shutdown_timeout"], "7", [], {"shutdown_timeout": "7"}),
    ("virtual_local_rank", ["--virtual-local-rank", "--virtual_local_rank"], None, [], {"virtual_local_rank": "1"}),
]


def spellings():
    """Each flag's spellings: every name as `NAME VALUE`, the long ones also as
    `NAME=VALUE`, and PET_<DEST>."""
    for name, flags, value, extra, want in FLAGS:
        for i, flag in enumerate(flags):
            if value is None:
                forms = [[flag]]
            elif flag.startswith("--") and i == len(flags) - 1:
                forms = [[f"{flag}={value}"]]
            else:
                forms = [[flag, value]]
            for args in forms:
                yield pytest.param(args + extra, {}, want, id=" ".join(args))
        pet = "PET_" + name.upper()
        yield pytest.param(extra, {pet: "1" if value is None else value}, want, id=pet)


def plan(job, *args, **env):
    job.script("w.py", "print('ok')\n")
    r = job.run("--dry-run", *args, "./w.py", env=job.env(**env))
    assert r.rc == 0, r.err
    return dict(line.split("=", 1) for line in r.out.splitlines()), r.err


@pytest.mark.parametrize("args,env,want", list(spellings()))
def test_every_spelling_lands_in_the_plan(job, args, env, want):
    got, _ = plan(job, *args, **env)
    for key, value in want.items():
        if key == "command_end":
            assert got["command"].endswith(value), got["command"]
        else:
            assert got[key] == value, (key, got)


def test_help_names_every_option(job):
    r = job.run("--help")
    assert r.rc == 0, r.err
    for _, flags, _, _, _ in FLAGS:
        for flag in flags:
            assert flag in r.out, flag
    for flag in ("--logs-specs", "--numa-binding", "--same-host-nodes", "--rdzv-port", "--term-timeout"):
        assert flag in r.out, flag
    assert "PET_<NAME>" in r.out
    assert "every worker is a fresh process" in r.out  # what --start-method means here


def test_flags_off_by_default_and_by_pet_zero(job):
    got, _ = plan(job, PET_STANDALONE="0", PET_VIRTUAL_LOCAL_RANK="0")
    assert got["source"] == "local" and got["virtual_local_rank"] == "0"
    assert got["rdzv_backend"] == "static" and got["rdzv_id"] == "none" and got["role"] == "default"
    assert got["signals_to_handle"] == "SIGHUP,SIGINT,SIGQUIT,SIGUSR1,SIGUSR2,SIGTERM"


def test_command_line_wins_over_pet(job):
    got, _ = plan(job, "--nnodes", "2", "--node-rank", "0", "--master-port", "2222", "--role", "cli",
                  PET_NNODES="3", PET_NODE_RANK="1", PET_MASTER_PORT="1111", PET_ROLE="env",
                  PET_MASTER_ADDR="10.0.0.9")
    assert (got["nnodes"], got["node_rank"], got["master_port"], got["role"]) == ("2", "0", "2222", "cli")
    assert got["master_addr"] == "10.0.0.9"  # not on the command line: PET_MASTER_ADDR


def test_kubeflow_pytorchjob_environment(job):
    # What a Kubeflow PyTorchJob sets for a worker replica.
    got, _ = plan(job, PET_NNODES="2", PET_NPROC_PER_NODE="3", PET_NODE_RANK="1",
                  PET_MASTER_ADDR="pytorchjob-master-0", PET_MASTER_PORT="23456")
    assert got["source"] == "flags" and "PET_NNODES 2 PET_NODE_RANK 1" in got["source_detail"]
    assert (got["nnodes"], got["node_rank"], got["nproc_per_node"], got["world_size"]) == ("2", "1", "3", "6")
    assert (got["master_addr"], got["master_port"], got["rdzv_port"]) == ("pytorchjob-master-0", "23456", "23457")


def test_torch_elastic_shutdown_timeout(job):
    assert plan(job, TORCH_ELASTIC_SHUTDOWN_TIMEOUT="9")[0]["shutdown_timeout"] == "9"
    assert plan(job, "--shutdown-timeout", "4", TORCH_ELASTIC_SHUTDOWN_TIMEOUT="9")[0]["shutdown_timeout"] == "4"
    assert plan(job, "--term-timeout", "5")[0]["shutdown_timeout"] == "5"


def test_elastic_range_and_its_meaning_in_the_plan(job):
    got, _ = plan(job, "--nnodes", "2:4", "--rdzv-backend", "c10d", "--rdzv-endpoint", "10.0.0.1:3000")
    assert (got["nnodes"], got["max_nnodes"], got["rdzv_hosted_here"]) == ("2", "4", "no")
    assert got["world_size"] == "assigned at the rendezvous" and got["master_port"] == "a free port of node 0"


@pytest.mark.parametrize("args,note", [
    (["--nnodes", "2", "--node-rank", "1", "--rdzv-backend", "c10d", "--rdzv-endpoint", "10.0.0.1"],
     "--node-rank 1 is not used with --rdzv-backend c10d: node ranks are assigned at the rendezvous"),
    (["--nnodes", "2", "--master-addr", "10.0.0.2", "--rdzv-backend", "c10d", "--rdzv-endpoint", "10.0.0.1"],
     "--master-addr is not used with --rdzv-backend c10d"),
    (["--standalone", "--rdzv-backend", "c10d", "--rdzv-endpoint", "10.0.0.1:5"],
     "--standalone: one node on a free local port; --rdzv-backend, --rdzv-endpoint and --rdzv-id are not used"),
])
def test_values_without_effect_are_said(job, args, note):
    _, err = plan(job, *args)
    assert f"shoalrun: note: {note}" in err, err


@pytest.mark.parametrize("args,env,expect", [
    # torchrun options shoalrun cannot honour
    (["--logs-specs", "mine"], {}, "--logs-specs mine: shoalrun has no logs-specs plug-ins"),
    (["--logs_specs=mine"], {}, "--logs-specs mine: shoalrun has no logs-specs plug-ins"),
    (["--numa-binding", "node"], {}, "--numa-binding node: shoalrun does not bind workers to NUMA nodes"),
    (["--event-log-handler", "dynamic_rendezvous"], {}, "--event-log-handler dynamic_rendezvous: shoalrun has no such"),
    ([], {"PET_EVENT_LOG_HANDLER": "x"}, "PET_EVENT_LOG_HANDLER x: shoalrun has no such event handler"),
    (["--rdzv-backend", "etcd-v2"], {}, "--rdzv-backend etcd-v2: shoalrun has no etcd rendezvous"),
    (["--nproc-per-node", "xpu"], {}, "--nproc-per-node xpu: shoalrun counts no XPU devices"),
    (["--rdzv-conf", "store_type=file"], {}, "--rdzv-conf store_type=file: shoalrun's rendezvous store is TCP only"),
    # bad values, named by flag or variable
    (["--rdzv_backend=zk"], {}, "--rdzv-backend zk: use c10d or static"),
    ([], {"PET_RDZV_BACKEND": "zk"}, "PET_RDZV_BACKEND zk: use c10d or static"),
    (["--start-method", "thread"], {}, "--start-method thread: must be spawn, fork or forkserver"),
    (["--rdzv-conf", "colour=red"], {}, "--rdzv-conf: unknown key 'colour'"),
    (["--rdzv-conf", "join_timeout=soon"], {}, "--rdzv-conf join_timeout: 'soon' is not a number"),
    (["--rdzv-conf", "is_host=maybe"], {}, "--rdzv-conf is_host: 'maybe' is not a boolean"),
    (["--rdzv-conf", "keep_alive_max_attempt=0"], {}, "--rdzv-conf keep_alive_max_attempt: must be >= 1"),
    (["--rdzv-conf", "join_timeout=5,timeout=6"], {}, "join_timeout and timeout are the same setting"),
    (["--rdzv-conf", "nokey"], {}, "--rdzv-conf 'nokey': expected key=value"),
    ([], {"PET_RDZV_CONF": "last_call_timeout=-1"}, "PET_RDZV_CONF last_call_timeout: must be >= 0, got -1"),
    (["-r", "4"], {}, "--redirects '4': use 0 (none), 1 (stdout), 2 (stderr), 3 (both)"),
    (["--tee", "0:9"], {}, "--tee '0:9': use 0 (none)"),
    (["--tee", "0:1,0:2"], {}, "--tee '0:1,0:2' names local rank 0 twice"),
    (["--local-ranks-filter", "0,a"], {}, "--local-ranks-filter must be a comma-separated list of local ranks"),
    (["--signals-to-handle", "SIGSEGV"], {}, "--signals-to-handle: 'SIGSEGV' is not a signal shoalrun forwards"),
    ([], {"PET_STANDALONE": "yes"}, "PET_STANDALONE='yes': use 1 (on) or 0 (off)"),
    ([], {"PET_NNODES": "two"}, "PET_NNODES: 'two' is not an integer"),
    ([], {"PET_MAX_RESTARTS": "-2"}, "PET_MAX_RESTARTS: must be >= 0, got -2"),
    ([], {"PET_NPROC_PER_NODE": "0"}, "PET_NPROC_PER_NODE must be at least 1 (got 0)"),
    (["--monitor-interval", "0"], {}, "--monitor-interval: must be > 0, got 0"),
    (["--shutdown-timeout", "-1"], {}, "--shutdown-timeout: must be >= 0, got -1"),
    (["--shutdown-timeout", "5", "--term-timeout", "6"], {}, "are the same setting; give one"),
    (["--nnodes", "3:2"], {}, "--nnodes 3:2: MAX is smaller than MIN"),
    (["--nnodes", "1:2:3"], {}, "--nnodes 1:2:3: use N or MIN:MAX"),
    ([], {"PET_NNODES": "1:4"}, "PET_NNODES 1:4: a range of node counts (an elastic job) needs --rdzv-backend c10d"),
    (["--rdzv-id", "a/b"], {}, "--rdzv-id 'a/b': 1 to 256 characters, no '/'"),
    (["--nnodes", "2", "--rdzv-backend", "c10d"], {}, "a multi-node job needs --rdzv-endpoint HOST[:PORT]"),
    (["--nnodes", "2", "--rdzv-backend", "c10d", "--rdzv-endpoint", "10.0.0.1:5", "--rdzv-port", "6"], {},
     "--rdzv-port is for the static rendezvous"),
    (["--nnodes", "2", "--rdzv-backend", "c10d", "--rdzv-endpoint", "10.0.0.1:29400", "--master-port", "29400"], {},
     "--master-port 29400 is the rendezvous port of --rdzv-endpoint"),
    (["--nnodes", "2", "--rdzv-endpoint", "10.0.0.1:99999"], {}, "port 99999 is not a TCP port"),
    (["--nnodes", "2", "--rdzv-endpoint", ":5"], {}, "--rdzv-endpoint ':5': no host"),
    (["--nnodes", "2", "--rdzv-endpoint", "10.0.0.1:5", "--rdzv-port", "6"], {}, "both name the port; give one"),
    (["--rdzv-timeout", "5", "--rdzv-conf", "join_timeout=6"], {}, "--rdzv-timeout and --rdzv-conf join_timeout disagree"),
    (["--run-path", "-m"], {}, "--run-path runs a script path; it cannot be combined with -m"),
    (["--virtual-local-rank", "--nproc-per-node", "2"], {"CUDA_VISIBLE_DEVICES": "3"},
     "--virtual-local-rank: local rank 1 has no device in CUDA_VISIBLE_DEVICES=3"),
    (["--role", ""], {}, "--role is empty"),
    (["--local-addr", ""], {}, "--local-addr is empty"),
    (["--standalone", "--nnodes", "1:2"], {}, "--standalone runs one node; it cannot be combined with --nnodes 2"),
    (["--nproc", "2"], {}, "unknown option --nproc"),  # argparse's prefix matching is not offered
])
def test_refused_with_one_line_naming_the_flag(job, args, env, expect):
    job.script("w.py", "print('ok')\n")
    r = job.run(*args, "w.py", env=job.env(**env))
    line = one_error_line(r)
    assert expect in line, line
    assert r.out == ""
