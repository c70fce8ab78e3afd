"""The C++ package: `cmake --install` into a prefix, and examples/cpp built
out of tree against it with find_package(shoal), run by the installed shoalrun."""
import shutil

from conftest import REPO, free_port, outside_env, run


def test_install_tree(prefix):
    for name in ("include/shoal/communicator.h", "include/shoal/types.h", "lib/libshoal.so",
                 "lib/cmake/shoal/shoalConfig.cmake", "lib/cmake/shoal/shoalConfigVersion.cmake",
                 "lib/cmake/shoal/shoalTargets.cmake", "bin/shoalrun", "share/shoalrun/shoalrun_boot.py",
                 "bin/shoal-perf", "bin/shoal-trace"):
        assert (prefix / name).is_file(), name
    # The torch extension is the wheel's, not part of a plain install.
    assert not list(prefix.rglob("_C.*.so")) and not list(prefix.rglob("_build_info.py"))
    # libshoal's private dependencies stay out of what consumers link.
    targets = "".join(p.read_text() for p in (prefix / "lib" / "cmake" / "shoal").glob("shoalTargets*.cmake"))
    assert "OpenSSL" not in targets and "HWY" not in targets.upper() and "crypto" not in targets


def test_example_builds_out_of_tree_and_runs(prefix, tmp_path):
    tree = tmp_path / "example"
    env = outside_env()
    generator = ["-G", "Ninja"] if shutil.which("ninja") else []
    run(["cmake", "-S", REPO / "examples" / "cpp", "-B", tree, *generator, f"-DCMAKE_PREFIX_PATH={prefix}"], env=env)
    cache = (tree / "CMakeCache.txt").read_text()
    assert f"shoal_DIR:PATH={prefix}/lib/cmake/shoal" in cache.splitlines()
    run(["cmake", "--build", tree], env=env, timeout=300)
    # Linked with libshoal alone: its private dependencies stay off the link line.
    link = "".join(p.read_text() for p in [tree / "build.ninja", *tree.rglob("link.txt")] if p.exists())
    assert f"{prefix}/lib/libshoal.so" in link and "crypto" not in link and "hwy" not in link
    r = run([prefix / "bin" / "shoalrun", "--nproc-per-node", "2", "--master-port", free_port(), "--no-python",
             tree / "example-allreduce"], env=env, cwd=tmp_path, timeout=60)
    lines = r.stdout.splitlines()
    for rank in (0, 1):
        assert f"[{rank}]: rank {rank} of 2: grad[0] = 0.5" in lines, r.stdout + r.stderr
