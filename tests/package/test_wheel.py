"""The wheel: what it holds, and the installed shoal working away from the checkout."""
import re
import subprocess
import zipfile

from conftest import BUILD, dev_torch_version, free_port, outside_env, run

JOB = """\
import sys
import torch
import torch.distributed as dist
import shoal
import shoal.torch  # registers the backend "shoal"

dist.init_process_group(backend="shoal")
rank, size = dist.get_rank(), dist.get_world_size()
t = torch.full((1000,), float(rank + 1))
dist.all_reduce(t)
ok = bool((t == size * (size + 1) / 2).all())
print(f"rank {rank} of {size}: backend {dist.get_backend()} sum-ok {ok} shoal {shoal.__file__} python {sys.executable}",
      flush=True)
dist.destroy_process_group()
"""


def site_packages(venv):
    return next((venv / "lib").glob("python3*/site-packages"))


def runpaths(path):
    """The RPATH and RUNPATH entries of an ELF file."""
    out = subprocess.run(["readelf", "-d", str(path)], capture_output=True, text=True, check=True).stdout
    return [p for m in re.finditer(r"\((?:RPATH|RUNPATH)\)\s+Library r(?:un)?path: \[(.*)\]", out)
            for p in m.group(1).split(":")]


def test_wheel_holds_the_native_parts_and_pins_its_torch(wheel):
    with zipfile.ZipFile(wheel) as z:
        names = set(z.namelist())
        dist_info = next(n.split("/")[0] for n in names if n.endswith(".dist-info/METADATA"))
        metadata = z.read(f"{dist_info}/METADATA").decode()
        entry_points = z.read(f"{dist_info}/entry_points.txt").decode()
    assert re.match(r"shoal-[0-9.]+-cp3\d+-cp3\d+-linux_x86_64\.whl$", wheel.name), wheel.name
    for name in ("shoal/lib/libshoal.so", "shoal/bin/shoalrun", "shoal/share/shoalrun/shoalrun_boot.py",
                 "shoal/_build_info.py", "shoal/info.py", "smdistributed/dataparallel/torch/torch_smddp.py"):
        assert name in names, name
    assert [n for n in names if re.fullmatch(r"shoal/_C\.cpython-.*\.so", n)], sorted(names)
    assert not [n for n in names if n.startswith("shoal/csrc")]
    torch_release = dev_torch_version().split("+")[0]
    assert f"Requires-Dist: torch=={torch_release}" in metadata.splitlines()
    assert "shoalrun = shoal.run:main" in entry_points
    assert "shoal = shoal.torch:entry_point" in entry_points


def test_installed_libraries_find_each_other_by_relative_paths(venv):
    pkg = site_packages(venv) / "shoal"
    c_ext = next(pkg.glob("_C.*.so"))
    assert runpaths(c_ext) == ["$ORIGIN/lib", "$ORIGIN/../torch/lib"]
    assert runpaths(pkg / "bin" / "shoalrun") == ["$ORIGIN/../lib"]
    assert runpaths(pkg / "lib" / "libshoal.so") == []


def test_import_outside_the_source_tree(venv):
    env = outside_env(venv / "bin")
    r = run([venv / "bin" / "python", "-c",
             "import shoal.torch, shoal._C, torch.distributed as dist; "
             "print(shoal.__file__); print(shoal._C.__file__); print(dist.Backend.SHOAL)"], env=env)
    shoal_file, c_file, backend = r.stdout.split()
    root = str(site_packages(venv) / "shoal")
    assert shoal_file.startswith(root) and c_file.startswith(root), r.stdout
    assert backend == "shoal"


def test_shoal_info_reports_the_build_the_torch_and_the_knobs(venv):
    env = outside_env(venv / "bin", SHOAL_ALGO="allreduce=ring", SHOAL_SHM="copy", SHOAL_SECRET="ab" * 16)
    r = run([venv / "bin" / "python", "-m", "shoal.info"], env=env)
    lines = r.stdout.splitlines()

    def field(name):
        found = [line.split(":", 1)[1].strip() for line in lines if line.startswith(name + ":")]
        assert len(found) == 1, (name, r.stdout)
        return found[0]

    torch_version = dev_torch_version()
    assert field("built against torch").startswith(torch_version + " ")
    assert field("torch imported").startswith(torch_version + " ")
    assert "MISMATCH" not in r.stdout
    pkg = str(site_packages(venv) / "shoal")
    assert field("shoal").split()[1] == f"({pkg})"
    assert field("libshoal") == f"{pkg}/lib/libshoal.so"
    assert field("shoalrun") == f"{pkg}/bin/shoalrun"
    assert re.search(r"^  shm\s+ranks of one host: the shared ring only \(SHOAL_SHM=copy\)$", r.stdout, re.M)
    knobs = {m.group(2): (m.group(1) == "*", m.group(3)) for m in
             re.finditer(r"^  ([* ]) (SHOAL_[A-Z0-9_]+)\s+(.*)$", r.stdout, re.M)}
    assert knobs["SHOAL_ALGO"] == (True, "allreduce=ring")
    assert knobs["SHOAL_SEGMENT_BYTES"] == (False, "524288")
    assert knobs["SHOAL_SECRET"] == (True, "(set, not shown)")
    assert "ab" * 16 not in r.stdout
    # Every knob of the library's table, which shoal-perf --knobs prints too.
    table = run([BUILD / "bin" / "shoal-perf", "--knobs"]).stdout
    assert sorted(knobs) == sorted(re.findall(r"^\| `(SHOAL_[A-Z0-9_]+)`", table, re.M))


def test_shoal_info_fails_on_a_torch_mismatch(venv):
    # What a torch upgrade under an installed shoal looks like to shoal.info.
    info = site_packages(venv) / "shoal" / "_build_info.py"
    text = info.read_text()
    try:
        info.write_text(re.sub(r'torch_version = ".*"', 'torch_version = "2.0.0"', text))
        r = run([venv / "bin" / "python", "-m", "shoal.info"], env=outside_env(venv / "bin"), check=False)
    finally:
        info.write_text(text)
    assert r.returncode == 1, r.stdout + r.stderr
    assert "built against torch: 2.0.0 " in r.stdout
    assert "  MISMATCH: shoal._C was built against another torch; rebuild shoal against this one" in r.stdout


def test_a_two_rank_all_reduce_through_the_installed_shoalrun(venv, tmp_path):
    (tmp_path / "job.py").write_text(JOB)
    env = outside_env(venv / "bin")
    r = run(["shoalrun", "--nproc-per-node", "2", "--master-port", free_port(), "job.py"],
            env=env, cwd=tmp_path, timeout=120)
    pkg = str(site_packages(venv) / "shoal")
    for rank in (0, 1):
        # The workers run under the venv's interpreter (the console script's).
        want = (f"[{rank}]: rank {rank} of 2: backend shoal sum-ok True shoal {pkg}/__init__.py "
                f"python {venv}/bin/python")
        assert [line for line in r.stdout.splitlines() if line.startswith(want)], r.stdout + r.stderr
