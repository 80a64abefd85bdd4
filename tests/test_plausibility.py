"""Plausibility warnings and did-you-mean errors for hardware profiles (issue 18).

Warnings catch figures no real device of the kind has (a unit slip: 2 GB/s for 2 TB/s) and
names a shipped profile already has; errors for unknown keys name the closest field, and one
run reports every problem of a file.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml

from gpusim.errors import InvalidProfile
from gpusim.hardware.catalog import catalog, load_profile_file, profiles_dir
from gpusim.hardware.plausibility import WIDEN, plausibility_warnings
from gpusim.hardware.profile import (
    CPUProfile,
    GPUProfile,
    HardwareProfile,
    LinkProfile,
    SystemProfile,
)
from gpusim.hardware.template import profile_template

SHIPPED = sorted(p for folder in ("gpus", "cpus", "links", "systems")
                 for p in (profiles_dir() / folder).glob("*.yaml"))


def _shipped() -> list[HardwareProfile]:
    cat = catalog()
    return [*cat.all(GPUProfile), *cat.all(CPUProfile), *cat.all(LinkProfile),
            *cat.all(SystemProfile)]


def _num(x: float) -> str:
    return f"{x:,.0f}" if abs(x) >= 1000 else f"{x:.4g}"


@pytest.mark.parametrize("path", SHIPPED, ids=lambda p: f"{p.parent.name}/{p.stem}")
def test_every_shipped_profile_draws_no_warning(path: Path) -> None:
    assert plausibility_warnings(load_profile_file(path)) == []


# Three shipped CPUs state matrix peaks, too few for either end to be judged by the rest:
# without the Xeon 8480, its 229.4 TOPS int8 is 14x the largest other (a 2-vCPU Xeon 6's
# AMX); without the EPYC VM, its 0.474 TFLOP/s (AVX-512 BF16 dot products on two cores, no
# matrix engine) is 17x below the smallest.
_UNIQUE = {"xeon-8480", "epyc-zen4-2vcpu"}


@pytest.mark.parametrize("path", [p for p in SHIPPED if p.stem not in _UNIQUE],
                         ids=lambda p: f"{p.parent.name}/{p.stem}")
def test_ranges_admit_each_shipped_profile_without_it(path: Path) -> None:
    """The ranges generalize: each shipped profile passes against the others alone (so a
    real device like them, not yet shipped, draws no warning)."""
    profile = load_profile_file(path)
    others = [p for p in _shipped() if p.name != profile.name]
    assert plausibility_warnings(profile, others) == []


def _h100(**changes: Any) -> GPUProfile:
    """The shipped H100 renamed (so only the change under test can draw a warning)."""
    h100 = catalog().get("h100-sxm", GPUProfile)
    return h100.model_copy(update={"name": "my-gpu", "full_name": "My GPU", "aliases": [],
                                   **changes})


def _gpu_range(field: str) -> tuple[float, float]:
    values = [getattr(g, field) for g in catalog().all(GPUProfile)]
    return min(values), max(values)


def test_two_gb_s_of_memory_bandwidth_is_a_tb_s_slip() -> None:
    (warning,) = plausibility_warnings(_h100(memory_bandwidth_gb_s=2))
    smallest, largest = _gpu_range("memory_bandwidth_gb_s")
    assert warning.startswith("memory_bandwidth_gb_s 2 GB/s is below any GPU's: shipped GPUs "
                              f"span {_num(smallest)} GB/s (")
    assert f"so {_num(smallest / WIDEN)} to {_num(largest * WIDEN)} GB/s is plausible" in warning
    assert warning.endswith("; was TB/s meant?")


def test_four_hundred_thousand_tflops_is_a_gflops_slip() -> None:
    h100 = catalog().get("h100-sxm", GPUProfile)
    (warning,) = plausibility_warnings(_h100(matrix_tflops={**h100.matrix_tflops,
                                                            "bf16": 400_000}))
    largest = max(g.matrix_tflops["bf16"] for g in catalog().all(GPUProfile)
                  if "bf16" in g.matrix_tflops)
    assert warning.startswith("matrix_tflops.bf16 400,000 TFLOP/s is above any GPU's")
    assert f"to {_num(largest * WIDEN)} TFLOP/s is plausible" in warning
    assert warning.endswith("; was GFLOP/s meant?")


def test_a_one_watt_tdp_is_a_kw_slip() -> None:
    (warning,) = plausibility_warnings(_h100(tdp_w=1))
    smallest, _ = _gpu_range("tdp_w")
    assert warning.startswith("tdp_w 1 W is below any GPU's")
    assert f"so {_num(smallest / WIDEN)} to" in warning
    assert warning.endswith("; was kW meant?")


def test_a_shipped_name_is_warned() -> None:
    """A file named like a shipped profile but not it (here a faster H100) would be taken
    for the shipped one."""
    (warning,) = plausibility_warnings(_h100(name="h100-sxm", memory_bandwidth_gb_s=4000))
    assert warning == ("name 'h100-sxm' is the shipped gpu profile's (NVIDIA H100 SXM5 80GB): "
                       "this file would be taken for it (results read as the shipped h100-sxm, "
                       "and the two cannot share a profiles folder); give it a name of its own")
    (alias,) = plausibility_warnings(_h100(aliases=["H100"]))
    assert alias.startswith("alias 'H100' is also the shipped gpu profile h100-sxm's")


def test_several_slips_are_warned_together() -> None:
    warnings = plausibility_warnings(_h100(memory_bandwidth_gb_s=2, tdp_w=1, boost_clock_mhz=1.98,
                                           base_clock_mhz=1.665, compute_units=16896))
    fields = [w.split(" ")[0] for w in warnings]
    assert fields == ["compute_units", "boost_clock_mhz", "memory_bandwidth_gb_s", "tdp_w",
                      "base_clock_mhz", "vector_tflops.fp32"]
    assert "was GHz meant?" in warnings[1]
    assert "not the CUDA cores inside them (cuda_cores)" in warnings[0]
    # 1.98 MHz makes the stated FP32 peak 1000 times lanes x 2 x clock
    assert "is 999.9 times cuda_cores x 2 x boost_clock_mhz" in warnings[-1]


def test_links_systems_and_prices_are_checked() -> None:
    cat = catalog()
    link = cat.get("ethernet-400g", LinkProfile).model_copy(
        update={"name": "my-nic", "full_name": "My NIC", "aliases": [], "bandwidth_gb_s": 400})
    warnings = plausibility_warnings(link)
    assert any(w.startswith("bandwidth_gb_s 400 GB/s is the 400 Gb/s that generation "
                            "'400GbE' names, in bits: a 400 Gb/s port carries 50 GB/s")
               for w in warnings)
    node = cat.get("dgx-h100", SystemProfile).model_copy(
        update={"name": "my-node", "full_name": "My node", "aliases": [], "power_w": 10.2})
    (warning,) = plausibility_warnings(node)
    assert warning.startswith("power_w 1.275 W per GPU (10.2 W over 8 GPUs) is below any "
                              "GPU's tdp_w")
    assert warning.endswith("was kW meant?")
    h100 = cat.get("h100-sxm", GPUProfile)
    whole_instance = h100.cloud_prices[0].model_copy(update={"usd_per_hour": 98.32})
    (price,) = plausibility_warnings(_h100(cloud_prices=[whole_instance]))
    assert price.startswith("cloud_prices[0].usd_per_hour 98.32 USD/h is above any GPU's "
                            "cloud price per device-hour")


def test_a_template_from_a_shipped_profile_draws_no_warning(tmp_path: Path) -> None:
    path = tmp_path / "my-gpu.yaml"
    path.write_text(profile_template(catalog().get("h100-sxm", GPUProfile), path))
    assert plausibility_warnings(load_profile_file(path)) == []


def _h100_data() -> dict[str, Any]:
    return dict(yaml.safe_load((profiles_dir() / "gpus" / "h100-sxm.yaml").read_text()))


def _check(tmp_path: Path, data: dict[str, Any], name: str = "my-gpu.yaml") -> str:
    path = tmp_path / name
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    with pytest.raises(InvalidProfile) as info:
        load_profile_file(path)
    return str(info.value)


def test_a_misspelt_key_names_the_field_it_meant(tmp_path: Path) -> None:
    data = _h100_data()
    data["memory_bandwith_gb_s"] = data.pop("memory_bandwidth_gb_s")
    message = _check(tmp_path, data)
    assert message == (f"{tmp_path / 'my-gpu.yaml'}: memory_bandwith_gb_s: Extra inputs are "
                       f"not permitted (did you mean memory_bandwidth_gb_s?)")
    # the "Field required" of memory_bandwidth_gb_s is the same slip, not a second problem
    assert "Field required" not in message


def test_every_problem_of_a_file_is_reported_in_one_run(tmp_path: Path) -> None:
    data = _h100_data()
    data["memory_bandwith_gb_s"] = data.pop("memory_bandwidth_gb_s")
    data["tdp_watts"] = data.pop("tdp_w")
    data["compute_units"] = 0
    data["vector_tflops"] = {**data["vector_tflops"], "bf61": 133.8}
    data["cloud_prices"][0]["usd_per_hr"] = data["cloud_prices"][0].pop("usd_per_hour")
    sources = dict(data["sources"])
    sources["l2_cahe_mib"] = sources.pop("l2_cache_mib")
    data["sources"] = sources
    data["name"] = "my-gpu"
    folder = tmp_path / "gpus"  # in a profiles folder the file name must match the name
    folder.mkdir()
    message = _check(folder, data, "mine.yaml")
    assert message.startswith(f"{folder / 'mine.yaml'}: ")
    problems = message.split(": ", 1)[1].split("; ")
    assert problems == [
        "compute_units: Input should be greater than 0",
        "vector_tflops.bf61.[key]: Input should be 'fp64', 'fp32', 'tf32', 'fp16', 'bf16', "
        "'fp8' or 'int8' (did you mean bf16?)",
        "cloud_prices.0.usd_per_hr: Extra inputs are not permitted (did you mean "
        "usd_per_hour?)",
        "memory_bandwith_gb_s: Extra inputs are not permitted (did you mean "
        "memory_bandwidth_gb_s?)",
        "tdp_watts: Extra inputs are not permitted (did you mean tdp_w?)",
        # the sources rule runs although fields are broken, and names the misspelt source key
        "1 field without a source: l2_cache_mib",
        "add sources.<field> for each (or sources.<field>.<key> for one entry of a table)",
        "sources.l2_cahe_mib names no figure (a gpu profile has no field l2_cahe_mib): did "
        "you mean sources.l2_cache_mib?",
        "file name must match name 'my-gpu'",
    ]


def test_a_misspelt_source_of_an_absent_field_is_warned() -> None:
    h100 = catalog().get("h100-sxm", GPUProfile)
    sources = {**h100.sources, "l3_cache_mib": "a datasheet"}
    (warning,) = plausibility_warnings(_h100(l2_cache_mib=None, sources=sources))
    assert warning == ("sources.l3_cache_mib names no figure (a gpu profile has no field "
                       "l3_cache_mib); did you mean sources.l2_cache_mib?")


def test_a_bad_name_and_a_missing_source_are_reported_together(tmp_path: Path) -> None:
    data = _h100_data()
    data["name"] = "My GPU"
    data["sources"] = {k: v for k, v in data["sources"].items() if k != "tdp_w"}
    message = _check(tmp_path, data)
    assert "name 'My GPU' must be lowercase" in message
    assert "1 field without a source: tdp_w" in message
