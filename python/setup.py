"""Builds strata's C library with cargo and ships it inside the strata_torch package.

`pip install ./python` (from the repository root) runs `cargo build --release -p strata-ffi`
in the repository this folder belongs to and copies the library to
strata_torch/_lib/libstrata.so, so the installed package needs no checkout. The wheel is
tagged for this platform, since it carries a native library.
"""

import os
import pathlib
import shutil
import subprocess

from setuptools import setup
from setuptools.command.build_py import build_py
from setuptools.dist import Distribution

HERE = pathlib.Path(__file__).resolve().parent


class BuildWithLibrary(build_py):
    def run(self):
        super().run()
        repo = pathlib.Path(os.environ.get("STRATA_REPO", HERE.parent))
        if not (repo / "ffi" / "Cargo.toml").is_file():
            raise RuntimeError(f"strata-torch: {repo} is not the strata repository (set STRATA_REPO)")
        target = pathlib.Path(os.environ.get("CARGO_TARGET_DIR", repo / "target"))
        subprocess.run(["cargo", "build", "--release", "-p", "strata-ffi"], cwd=repo, check=True)
        out = pathlib.Path(self.build_lib) / "strata_torch" / "_lib"
        out.mkdir(parents=True, exist_ok=True)
        shutil.copy2(target / "release" / "libstrata_ffi.so", out / "libstrata.so")


class NativeDistribution(Distribution):
    def has_ext_modules(self):
        return True


setup(cmdclass={"build_py": BuildWithLibrary}, distclass=NativeDistribution)
