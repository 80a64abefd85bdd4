"""Shared fixtures: a few devices and models used across the tests."""

from __future__ import annotations

import pytest

from gpusim.hardware.catalog import load_device
from gpusim.hardware.profile import DeviceProfile


@pytest.fixture(scope="session")
def h100() -> DeviceProfile:
    return load_device("h100-sxm")
