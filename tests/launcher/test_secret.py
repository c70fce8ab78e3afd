"""The job's secret (docs/security.md): made per job, given by the user, or
handed from node 0 to the other nodes sealed; every worker gets it as
SHOAL_SECRET."""
import re

from test_multinode import start_nodes

DUMP = """#!/bin/sh
echo "${SHOAL_SECRET-unset}" > "$JOB_DIR/secret.$RANK"
"""
HEX64 = re.compile(r"^[0-9a-f]{64}$")


def secrets(job, ranks):
    return [(job.dir / f"secret.{r}").read_text().strip() for r in ranks]


def test_one_node_makes_a_secret_per_job(job):
    job.script("s.sh", DUMP)
    r = job.run("--nproc-per-node", "2", "--no-python", "./s.sh")
    assert r.rc == 0, r.err
    first = secrets(job, range(2))
    assert first[0] == first[1] and HEX64.match(first[0]), first
    for f in job.dir.glob("secret.*"):
        f.unlink()  # what the second job's workers write, not the first's
    r = job.run("--nproc-per-node", "2", "--no-python", "./s.sh")
    assert r.rc == 0, r.err
    second = secrets(job, range(2))
    assert second[0] == second[1] and second[0] != first[0], second  # a new job, a new secret


def test_given_secret_is_passed_on(job):
    job.script("s.sh", DUMP)
    key = "ab" * 24
    (job.dir / "key").write_text(key + "\n")
    r = job.run("--nproc-per-node", "2", "--secret-file", "key", "--no-python", "./s.sh")
    assert r.rc == 0, r.err
    assert secrets(job, range(2)) == [key, key]
    r = job.run("--nproc-per-node", "1", "--no-python", "./s.sh", env=job.env(SHOAL_SECRET="cd" * 16))
    assert r.rc == 0, r.err
    assert secrets(job, [0]) == ["cd" * 16]


def test_bad_secret_is_a_usage_error(job):
    job.script("s.sh", DUMP)
    (job.dir / "short").write_text("abcd")
    for args, env, what in [(["--secret-file", "missing"], None, "--secret-file missing: cannot read it"),
                            (["--secret-file", "short"], None, "--secret-file short: 2 bytes"),
                            ([], {"SHOAL_SECRET": "not hex"}, "SHOAL_SECRET: not a hex string")]:
        r = job.run(*args, "--no-python", "./s.sh", env=job.env(**(env or {})))
        assert r.rc == 2, r.err
        assert what in r.err, r.err
    assert not list(job.dir.glob("secret.*"))


def test_nodes_share_node_zeros_secret_without_a_file(job):
    job.script("s.sh", DUMP)
    launchers, _ = start_nodes(job, 3, nproc=2, script="./s.sh")
    for launcher in launchers:
        assert launcher.wait(30) == 0, launcher.err
    got = secrets(job, range(6))
    assert len(set(got)) == 1 and HEX64.match(got[0]), got


def test_nodes_with_a_secret_file(job):
    job.script("s.sh", DUMP)
    key = "0123456789abcdef" * 4
    (job.dir / "key").write_text(key)
    launchers, _ = start_nodes(job, 2, nproc=1, script="./s.sh", extra=["--secret-file", "key"])
    for launcher in launchers:
        assert launcher.wait(30) == 0, launcher.err
    assert secrets(job, range(2)) == [key, key]


def test_nodes_with_different_secrets_do_not_meet(job):
    job.script("s.sh", DUMP)
    (job.dir / "k0").write_text("11" * 32)
    (job.dir / "k1").write_text("22" * 32)
    launchers, _ = start_nodes(job, 2, nproc=1, script="./s.sh", extra=["--rdzv-timeout", "5"],
                               per_node_args=lambda n: ["--secret-file", f"k{n}"])
    assert launchers[1].wait(30) == 1
    assert "the store did not prove the job's secret" in launchers[1].err, launchers[1].err
    assert launchers[0].wait(30) == 1
    assert "rejected a connection from 127.0.0.1" in launchers[0].err, launchers[0].err
    assert not list(job.dir.glob("secret.*"))
