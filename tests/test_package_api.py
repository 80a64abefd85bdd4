"""The package's public names (issue 21): ``import gpusim`` loads none of the pipeline until a
name is used, and ``gpusim.estimate`` is the function whichever module was imported first."""

from __future__ import annotations

import subprocess
import sys


def _run(code: str) -> str:
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          check=True)
    return done.stdout.strip()


def test_import_gpusim_loads_no_pipeline_until_a_name_is_used() -> None:
    out = _run("import sys, gpusim; print('gpusim.estimation' in sys.modules, "
               "'pydantic' in sys.modules); gpusim.load_gpu('h100-sxm'); "
               "print('gpusim.hardware.catalog' in sys.modules)")
    assert out.split() == ["False", "False", "True"]


def test_estimate_is_the_function_after_the_cli_imported_its_module() -> None:
    out = _run("from gpusim.estimation import build_job\nimport gpusim.cli\nimport gpusim\n"
               "print(callable(gpusim.estimate), gpusim.estimate.__module__)")
    assert out == "True gpusim.estimation"


def test_every_public_name_resolves() -> None:
    import gpusim

    for name in gpusim.__all__:
        assert getattr(gpusim, name) is not None, name
