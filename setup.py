"""`pip install .`: the Python package attn, its compiled part built by CMake (python/CMakeLists.txt).

    /usr/bin/python3 -m pip install --no-build-isolation .    (in a virtual environment, or with
                                                               --break-system-packages on Debian)
    /usr/bin/python3 -m pip uninstall attn

setuptools drives CMake as pybind11's cmake_example does (scikit-build-core is not in Debian): the
extension attn._attn is CMake's target attn_python, built in a lean configuration (no tests, benchmarks
or examples) in setuptools' temporary directory, or in an existing build directory named by
ATTN_BUILD_DIR (then nothing is reconfigured: only the target is brought up to date). The version is
read from CMakeLists.txt's project(attn VERSION ...), its one home.
"""
import os
import pathlib
import re
import shutil
import subprocess
import sys

from setuptools import Extension, setup
from setuptools.command.build_ext import build_ext

ROOT = pathlib.Path(__file__).resolve().parent


def version():
    match = re.search(r"project\(attn VERSION (\d+\.\d+\.\d+)", (ROOT / "CMakeLists.txt").read_text())
    if not match:
        raise RuntimeError("setup.py: CMakeLists.txt has no project(attn VERSION x.y.z)")
    return match.group(1)


# The CMake target of each compiled module (python/CMakeLists.txt). attn._distributed (attn.distributed)
# is built where MPI is (libopenmpi-dev's mpicxx).
TARGETS = {"attn._attn": "attn_python", "attn._distributed": "attn_python_distributed"}
MODULES = ["attn._attn"] + (["attn._distributed"] if shutil.which("mpicxx") else [])


class CMakeExtension(Extension):
    def __init__(self, name):
        super().__init__(name, sources=[])


class CMakeBuild(build_ext):
    def build_extension(self, ext):
        target = pathlib.Path(self.get_ext_fullpath(ext.name)).resolve()
        build_dir = os.environ.get("ATTN_BUILD_DIR")
        if build_dir:
            build_dir = pathlib.Path(build_dir).resolve()
        else:
            build_dir = pathlib.Path(self.build_temp).resolve() / "cmake"
            subprocess.run(["cmake", "-S", str(ROOT), "-B", str(build_dir), "-G", "Ninja", "-DCMAKE_BUILD_TYPE=Release",
                            "-DATTN_BUILD_TESTS=OFF", "-DATTN_BUILD_EXAMPLES=OFF", "-DATTN_BUILD_BENCH=OFF",
                            f"-DPython3_EXECUTABLE={sys.executable}"], check=True)
        module = ext.name.split(".")[-1]
        subprocess.run(["cmake", "--build", str(build_dir), "--target", TARGETS[ext.name], "-j", str(os.cpu_count() or 1)],
                       check=True)
        built = sorted((build_dir / "python" / "attn").glob(f"{module}.*.so"))
        if not built:
            raise RuntimeError(f"setup.py: CMake built no attn/{module}.*.so in {build_dir / 'python' / 'attn'}")
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(built[0], target)


setup(
    name="attn",
    version=version(),
    description="Attention scoring functions: fused scaled dot-product, additive and Nadaraya-Watson attention, "
                "forward and backward, for NumPy and PyTorch",
    long_description=(ROOT / "README.md").read_text(),
    long_description_content_type="text/markdown",
    python_requires=">=3.9",
    install_requires=["numpy"],
    extras_require={"torch": ["torch"], "mpi": ["mpi4py"]},
    packages=["attn"],
    package_dir={"": "python"},
    ext_modules=[CMakeExtension(name) for name in MODULES],
    cmdclass={"build_ext": CMakeBuild},
    zip_safe=False,
    # setuptools' intermediate files under build/ (ignored by git), not beside the sources
    options={"egg_info": {"egg_base": "build"}, "build": {"build_base": "build/setuptools"}},
)
