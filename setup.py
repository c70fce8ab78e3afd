"""shoal's wheel: the Python packages (python/) with libshoal, the torch
extension shoal._C and the launcher shoalrun built by CMake into the package.

pyproject.toml holds the metadata; this file adds what it cannot say:

- build_ext runs CMake: it configures a tree, builds the targets the package
  needs (shoal, shoal_torch, shoalrun) and installs the components
  shoal_runtime and shoal_python (cmake/install.cmake) with the package folder
  as the prefix, so that the wheel's shoal/ holds _C.<abi>.so,
  _build_info.py, lib/libshoal.so, bin/shoalrun and share/shoalrun/;
- the wheel is platform-specific, and requires exactly the torch it was built
  against (shoal._C is compiled against that torch's C++ ABI);
- torch is the target environment's: the build never installs one. Under
  pip's build isolation, PYTHONPATH hides the target environment's packages
  from the interpreter (which is the target's own), so torch is looked for
  with it and, failing that, without it.

An editable install (`pip install --no-build-isolation --no-deps -e .`, the
development flow) runs no CMake: it uses the python/shoal/_C*.so that
`make build` puts there.

Build settings, from the environment (docs/install.md):
  CMAKE_ARGS                  more arguments for the configure step
  CMAKE_BUILD_PARALLEL_LEVEL  parallel jobs (CMake reads it)
  SHOAL_CMAKE_BUILD_DIR       build and install from this tree, configured
                              already with SHOAL_BUILD_TORCH=ON against this
                              environment's torch (`make test-package` passes
                              the development build), instead of the wheel's
                              own tree build/pip/cmake-<python abi>-<environment>
"""
import hashlib
import os
import shlex
import shutil
import subprocess
import sys
import sysconfig
from pathlib import Path

from setuptools import Distribution, setup
from setuptools.command.build_ext import build_ext

ROOT = Path(__file__).resolve().parent
# Targets the package needs, and the install components that hold them.
TARGETS = ["shoal", "shoal_torch", "shoalrun"]
COMPONENTS = ["shoal_runtime", "shoal_python"]
TORCH_QUERY = "import torch; print(torch.__version__); print(torch.utils.cmake_prefix_path)"


def find_torch():
    """(environment in which this interpreter imports torch, torch's version, its CMake prefix path),
    or (None, None, None)."""
    outside = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PYTHONNOUSERSITE")}
    for env in (dict(os.environ), outside):
        r = subprocess.run([sys.executable, "-c", TORCH_QUERY], env=env, capture_output=True, text=True)
        if r.returncode == 0:
            version, cmake_prefix = r.stdout.strip().splitlines()[-2:]
            return env, version, cmake_prefix
    return None, None, None


def cache_value(tree, name):
    """A CMakeCache.txt entry of `tree`, or None."""
    try:
        for line in (tree / "CMakeCache.txt").read_text().splitlines():
            if line.startswith(name + ":"):
                return line.split("=", 1)[1]
    except OSError:
        pass
    return None


class BinaryDistribution(Distribution):
    def has_ext_modules(self):
        return True


class CMakeBuild(build_ext):
    """Builds and installs shoal's native parts with CMake (see the module's docstring)."""

    def run(self):
        if self.editable_mode or self.inplace:
            return  # the development build (make build) provides them in python/shoal
        env, torch_version, torch_cmake_prefix = find_torch()
        if env is None:
            sys.exit(f"shoal: {sys.executable} cannot import torch. shoal builds against the torch already "
                     "installed in the target environment and never installs one: install torch first "
                     "(a build isolation other than pip's hides it: use --no-build-isolation).")
        given = os.environ.get("SHOAL_CMAKE_BUILD_DIR")
        tree = Path(given).resolve() if given else self.own_tree()
        if not given:
            self.configure(tree, env)
        targets = TARGETS + (["shoal_tf"] if cache_value(tree, "SHOAL_TF_BUILT") == "ON" else [])
        self.spawn_env(["cmake", "--build", str(tree), "--target", *targets], env)
        if given and cache_value(tree, "SHOAL_TORCH_BUILT_WITH") != torch_cmake_prefix:
            sys.exit(f"shoal: SHOAL_CMAKE_BUILD_DIR={tree} is not built against this environment's torch "
                     f"({torch_cmake_prefix}); its CMakeCache.txt says "
                     f"{cache_value(tree, 'SHOAL_TORCH_BUILT_WITH') or 'no torch (SHOAL_BUILD_TORCH=OFF)'}")
        prefix = Path(self.build_lib).resolve() / "shoal"
        for component in COMPONENTS:
            self.spawn_env(["cmake", "--install", str(tree), "--prefix", str(prefix), "--component", component], env)
        print(f"shoal: built against torch {torch_version} in {tree}")

    def own_tree(self):
        """One tree per target environment (torch's CMake config caches its paths)."""
        tag = sysconfig.get_config_var("SOABI") or f"py{sys.version_info[0]}{sys.version_info[1]}"
        env = hashlib.sha1(str(Path(sys.prefix).resolve()).encode()).hexdigest()[:8]
        return ROOT / "build" / "pip" / f"cmake-{tag}-{env}"

    def configure(self, tree, env):
        args = ["cmake", "-S", str(ROOT), "-B", str(tree)]
        if shutil.which("ninja") and not (tree / "CMakeCache.txt").exists():
            args += ["-G", "Ninja"]
        args += [
            "-DCMAKE_BUILD_TYPE=Release",
            "-DCMAKE_INSTALL_LIBDIR=lib",
            "-DSHOAL_BUILD_TORCH=ON",
            "-DSHOAL_PYTHON_INPLACE=OFF",
            "-DSHOAL_BUILD_TESTS=OFF",
            "-DSHOAL_BUILD_BENCH=OFF",
            f"-DPython3_EXECUTABLE={sys.executable}",
            *shlex.split(os.environ.get("CMAKE_ARGS", "")),
        ]
        self.spawn_env(args, env)

    def spawn_env(self, args, env):
        print(" ".join(shlex.quote(a) for a in args), flush=True)
        subprocess.run(args, env=env, check=True)


def torch_requirement():
    """The torch this build compiles against, pinned (without its local label: 2.13.0+cpu -> 2.13.0)."""
    _, version, _ = find_torch()
    return [f"torch=={version.split('+')[0]}"] if version else ["torch>=2.1"]


setup(
    distclass=BinaryDistribution,
    cmdclass={"build_ext": CMakeBuild},
    install_requires=torch_requirement(),
    # The extras (tensorflow, torchft) are pyproject.toml's [project.optional-dependencies].
    # setuptools' own folders stay out of the CMake tree's build/lib.
    options={"build": {"build_base": "build/pip"}},
)
