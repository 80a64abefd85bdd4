"""Builds copy the top-level data folders into the package (see gpusim/data.py), so a wheel
installed anywhere knows its hardware; pyproject.toml holds everything else."""

import shutil
from pathlib import Path

from setuptools import setup
from setuptools.command.build_py import build_py

ROOT = Path(__file__).resolve().parent
SHIPPED = ("hardware_profiles", "stacks", "measurements", "published", "models")  # gpusim/data.py


class BuildWithData(build_py):
    def run(self) -> None:
        super().run()
        if getattr(self, "editable_mode", False):
            return  # an editable install reads the folders in place
        for name in SHIPPED:
            shutil.copytree(ROOT / name, Path(self.build_lib) / "gpusim" / "_data" / name,
                            dirs_exist_ok=True)


setup(cmdclass={"build_py": BuildWithData})
