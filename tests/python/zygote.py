"""Starts the rank processes of harness.run_job: forked from this process,
which has imported torch once, instead of each importing it anew (about 1.7 s
of CPU a rank).

It reads one request a line on stdin, {"argv": [script, *args], "env": {...},
"cwd": ..., "log": path}, forks, and answers {"pid": N}; when a rank exits it
writes {"exit": N, "status": <wait status>}. The rank runs its script as
`python script args` would: the given environment, working directory and
argv, sys.path from the script's folder and PYTHONPATH, stdin from /dev/null,
stdout and stderr to the log; the script's SystemExit, or its exception,
leaves this module's main() and the interpreter shuts down as it would after
`python script` (threads joined, atexit, the exit code). It imports nothing of shoal:
each rank does, under its own environment. Nothing but torch is imported here
(torch reads no knob of the tests' at import), with OMP_NUM_THREADS=1 as
every rank has it.
"""
import faulthandler
import json
import os
import runpy
import select
import signal
import sys

os.environ["OMP_NUM_THREADS"] = "1"
import torch  # noqa: E402,F401

_OWN_PATH = [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p]
_BASE_PATH = [p for p in sys.path[1:] if p not in _OWN_PATH]


def _run_rank(req, to_close):
    signal.set_wakeup_fd(-1)
    signal.signal(signal.SIGCHLD, signal.SIG_DFL)
    for fd in to_close:
        os.close(fd)
    devnull = os.open(os.devnull, os.O_RDONLY)   # fd 0 (the requests) is still open: this is above 2
    log = os.open(req["log"], os.O_WRONLY | os.O_APPEND)
    os.dup2(devnull, 0)
    os.dup2(log, 1)
    os.dup2(log, 2)
    os.close(devnull)
    os.close(log)
    faulthandler.register(signal.SIGUSR1, all_threads=True)   # harness.run_job: where a hung rank is
    os.chdir(req["cwd"])
    os.environ.clear()
    os.environ.update(req["env"])
    script = req["argv"][0]
    sys.argv = list(req["argv"])
    pythonpath = [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p]
    sys.path[:] = [os.path.dirname(os.path.abspath(script))] + pythonpath + _BASE_PATH
    runpy.run_path(script, run_name="__main__")


def main():
    requests = sys.stdin.fileno()
    answers = os.dup(sys.stdout.fileno())
    os.dup2(sys.stderr.fileno(), sys.stdout.fileno())   # a stray print must not reach the answers
    wake_r, wake_w = os.pipe()
    os.set_blocking(wake_r, False)
    os.set_blocking(wake_w, False)
    signal.set_wakeup_fd(wake_w)
    signal.signal(signal.SIGCHLD, lambda *_: None)
    pending = b""

    def answer(obj):
        os.write(answers, (json.dumps(obj) + "\n").encode())

    while True:
        ready, _, _ = select.select([requests, wake_r], [], [])
        if wake_r in ready:
            try:
                while os.read(wake_r, 512):
                    pass
            except BlockingIOError:
                pass
        while True:
            try:
                pid, status = os.waitpid(-1, os.WNOHANG)
            except ChildProcessError:
                break
            if pid == 0:
                break
            answer({"exit": pid, "status": status})
        if requests in ready:
            chunk = os.read(requests, 1 << 20)
            if not chunk:
                return
            pending += chunk
            while b"\n" in pending:
                line, pending = pending.split(b"\n", 1)
                req = json.loads(line)
                pid = os.fork()
                if pid == 0:
                    # The script's SystemExit or exception leaves main(), and
                    # the interpreter ends as after `python script`.
                    _run_rank(req, (answers, wake_r, wake_w))
                    sys.exit(0)
                answer({"pid": pid})


if __name__ == "__main__":
    main()
