"""Hardware profiles: every shipped file loads, names resolve, bad files are refused."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import yaml

from gpusim.errors import InvalidProfile, UnknownHardware
from gpusim.hardware.calibration import calibration_for, load_calibration_file
from gpusim.hardware.catalog import (
    Catalog,
    catalog,
    load_device,
    load_gpu,
    load_profile_file,
    profiles_dir,
)
from gpusim.hardware.profile import CPUProfile, GPUProfile, LinkProfile, SystemProfile

SHIPPED = sorted(p for folder in ("gpus", "cpus", "links", "systems")
                 for p in (profiles_dir() / folder).glob("*.yaml"))


@pytest.mark.parametrize("path", SHIPPED, ids=lambda p: f"{p.parent.name}/{p.stem}")
def test_every_shipped_profile_loads(path: Path) -> None:
    profile = load_profile_file(path)
    assert profile.name == path.stem
    assert profile.sources, "every profile cites its sources"


@pytest.mark.parametrize("path", sorted((profiles_dir() / "calibration").glob("*.yaml")),
                         ids=lambda p: p.stem)
def test_every_calibration_loads(path: Path) -> None:
    cal = load_calibration_file(path)
    assert cal.rationale or cal.fitted_on


def test_catalog_has_no_name_clashes() -> None:
    Catalog.from_dir(profiles_dir())  # raises on a duplicate name or alias


def test_systems_name_existing_profiles() -> None:
    cat = catalog()
    for system in cat.all(SystemProfile):
        cat.get(system.gpu, GPUProfile)
        cat.get(system.intra_node_link, LinkProfile)
        cat.get(system.host_link, LinkProfile)
        if system.inter_node_link:
            cat.get(system.inter_node_link, LinkProfile)
        if system.cpu:
            cat.get(system.cpu, CPUProfile)


def test_every_device_has_a_calibration() -> None:
    for device in [*catalog().all(GPUProfile), *catalog().all(CPUProfile)]:
        assert calibration_for(device).gemm.max_efficiency


@pytest.mark.parametrize("name", ["h100", "h100-sxm", "H100 SXM5 80GB", "h100_sxm"])
def test_aliases_resolve(name: str) -> None:
    assert load_gpu(name).name == "h100-sxm"


def test_unknown_name_suggests_the_closest() -> None:
    with pytest.raises(UnknownHardware, match="did you mean h100-sxm"):
        load_device("h100-sxn")


def _h100_data() -> dict[str, object]:
    return dict(yaml.safe_load((profiles_dir() / "gpus" / "h100-sxm.yaml").read_text()))


def test_a_figure_without_a_source_is_refused(tmp_path: Path) -> None:
    data = _h100_data()
    sources = dict(data["sources"])  # type: ignore[call-overload]
    del sources["tdp_w"]
    data["sources"] = sources
    path = tmp_path / "h100-sxm.yaml"
    path.write_text(yaml.safe_dump(data))
    with pytest.raises(InvalidProfile, match="1 field without a source: tdp_w"):
        load_profile_file(path)
    # Every missing source at once, not one per run (issue 18: nine runs to learn them).
    for key in ("compute_units", "memory_bandwidth_gb_s"):
        del sources[key]
    path.write_text(yaml.safe_dump({**data, "sources": sources}))
    with pytest.raises(InvalidProfile, match="3 fields without a source: compute_units, "
                                             "memory_bandwidth_gb_s, tdp_w"):
        load_profile_file(path)


@pytest.mark.parametrize(
    ("field", "value", "message"),
    [
        ("memory_bandwidth_gb_s", -5, "memory_bandwidth_gb_s"),
        ("compute_units", 0, "compute_units"),
        ("tdp_watts", 700, "tdp_watts: Extra inputs are not permitted"),
        ("vector_tflops", {"fp16": 10.0}, "must state fp32"),
    ],
)
def test_malformed_profiles_name_the_field(tmp_path: Path, field: str, value: object,
                                           message: str) -> None:
    data = _h100_data()
    data[field] = value
    path = tmp_path / "h100-sxm.yaml"
    path.write_text(yaml.safe_dump(data))
    with pytest.raises(InvalidProfile, match=message):
        load_profile_file(path)


def test_a_file_that_is_not_yaml_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "broken.yaml"
    path.write_text("name: [unclosed\n")
    with pytest.raises(InvalidProfile, match="not valid YAML"):
        load_profile_file(path)


def test_peak_falls_back_to_vector_units_without_tensor_cores(h100: GPUProfile) -> None:
    flops, unit = h100.peak_flops("fp32", matrix=True)
    assert unit == "vector" and flops == pytest.approx(66.9e12)
    flops, unit = h100.peak_flops("bf16", matrix=True)
    assert unit == "matrix" and flops == pytest.approx(989.4e12)


# Best bf16 matmul a shape search found, as a fraction of the dense peak (S. Bekman,
# ml-engineering, "Maximum Achievable Matmul FLOPS comparison table"; MI250X per die). H100:
# 794.5 of 989.4 TFLOP/s, the table's torch 2.7 row, as measurements/published/h100-sxm
# transcribes it and the hopper fit is bounded by (an older row read 792.1).
PUBLISHED_MATMUL_CEILINGS = {"a100-80gb": 0.859, "h100-sxm": 0.803, "mi250x": 0.767,
                             "mi300x": 0.601}


@pytest.mark.parametrize("gpu, ceiling", PUBLISHED_MATMUL_CEILINGS.items())
def test_no_gemm_shape_runs_above_the_measured_ceiling(gpu: str, ceiling: float) -> None:
    """A stated default (or a fit) above the best any shape reached on the real device
    would make GEMMs faster than the hardware has been seen to run: over a grid of shapes
    like the search's, none is predicted above its best."""
    from gpusim.calibrate.gemm_maxima import fastest_shape

    device = load_gpu(gpu)
    best = fastest_shape("bf16", device, calibration_for(device)) / (
        device.matrix_tflops["bf16"] * 1e12)
    assert best < ceiling


def test_bad_files_are_refused_before_they_are_read(tmp_path: Path,
                                                   capsys: pytest.CaptureFixture[str]) -> None:
    """A folder, a FIFO (reading would block), a device (reading would never end), non-UTF-8
    bytes, a key given twice, an infinite bandwidth and a bool for a count (issue 17)."""
    import os

    from gpusim.cli import main

    source = (Path(__file__).resolve().parents[1] / "hardware_profiles" / "gpus"
              / "h100-sxm.yaml").read_text()
    fifo = tmp_path / "fifo.yaml"
    os.mkfifo(fifo)
    device = tmp_path / "zero.yaml"
    device.symlink_to("/dev/zero")
    latin = tmp_path / "latin.yaml"
    latin.write_bytes(b"name: x\n\xe9\n")
    twice = tmp_path / "twice.yaml"
    twice.write_text(source + "memory_gib: 80\n")
    infinite = tmp_path / "inf.yaml"
    infinite.write_text(source.replace("memory_bandwidth_gb_s: 3352",
                                       "memory_bandwidth_gb_s: .inf"))
    flag = tmp_path / "bool.yaml"
    flag.write_text(source.replace("compute_units: 132", "compute_units: true"))
    cases = [(tmp_path, "not a regular file"), (fifo, "not a regular file"),
             (device, "not a regular file"), (latin, "not UTF-8"),
             (twice, "more than once"), (infinite, "finite"), (flag, "integer")]
    for path, message in cases:
        assert main(["profiles", "check", str(path)]) == 2, path
        err = capsys.readouterr().err
        assert message in err and "Traceback" not in err, (path, err)


def test_a_systems_nvlink_agrees_with_its_gpus_own_figure() -> None:
    """Topologies take a GPU's intra-node bandwidth from its nvlink_bandwidth_gb_s (so a
    what-if value of it takes effect); every shipped system's links come to the same."""
    from gpusim.hardware.catalog import catalog, load_gpu, load_link
    from gpusim.hardware.profile import SystemProfile

    for system in catalog().all(SystemProfile):
        link, gpu = load_link(system.intra_node_link), load_gpu(system.gpu)
        if link.family == "pcie":
            continue
        assert gpu.nvlink_bandwidth_gb_s is not None, system.name
        links = system.intra_node_links_per_gpu * link.bandwidth
        assert links == pytest.approx(gpu.nvlink_bandwidth_gb_s * 1e9 / 2), system.name


def test_profile_files_work_wherever_names_do(tmp_path: Path) -> None:
    """A system, GPU or link YAML file is taken by --system, --gpu and the load functions,
    as names are; a file of the wrong kind says so."""
    import gpusim
    from gpusim.errors import InvalidProfile
    from gpusim.estimation import estimate
    from gpusim.hardware.catalog import load_link, load_system

    system = tmp_path / "my-system.yaml"
    text = (profiles_dir() / "systems" / "dgx-h100.yaml").read_text()
    system.write_text(text.replace("name: dgx-h100", "name: my-system", 1))
    assert load_system(str(system)).name == "my-system"
    mine = estimate("gpt2", None, 64, precision="bf16", system=str(system), num_gpus=8)
    named = estimate("gpt2", None, 64, precision="bf16", system="dgx-h100", num_gpus=8)
    assert mine.step.step_time_s == pytest.approx(named.step.step_time_s)
    gpu_file = str(profiles_dir() / "gpus" / "h100-sxm.yaml")
    assert gpusim.load_gpu(gpu_file).name == "h100-sxm"
    assert load_link(str(profiles_dir() / "links" / "nvlink4.yaml")).name == "nvlink4"
    with pytest.raises(InvalidProfile, match="is a gpu profile, not a system"):
        load_system(gpu_file)


def test_profiles_new_starts_a_profile_that_checks_and_runs(tmp_path: Path,
                                                           capsys: pytest.CaptureFixture[str]
                                                           ) -> None:
    from gpusim.cli import main

    path = tmp_path / "my-gpu.yaml"
    assert main(["profiles", "new", "--from", "h100-sxm", str(path)]) == 0
    text = path.read_text()
    assert "TODO: where your memory_bandwidth_gb_s comes from" in text
    assert "cloud_prices" not in text  # your device's prices are not the H100's
    assert main(["profiles", "check", str(path)]) == 0
    assert main(["estimate", "--model", "gpt2", "--gpu", str(path), "--batch-size", "8",
                 "--precision", "bf16"]) == 0
    capsys.readouterr()
    assert main(["profiles", "new", "--from", "h100-sxm", str(path)]) == 2
    assert "exists" in capsys.readouterr().err


def test_check_warns_of_a_likely_unit_slip(tmp_path: Path,
                                           capsys: pytest.CaptureFixture[str]) -> None:
    from gpusim.cli import main

    path = tmp_path / "my-gpu.yaml"
    assert main(["profiles", "new", "--from", "h100-sxm", str(path)]) == 0
    text = path.read_text()
    text, slipped = re.subn(r"^memory_bandwidth_gb_s: .*$", "memory_bandwidth_gb_s: 2", text,
                            flags=re.MULTILINE)
    assert slipped == 1
    path.write_text(text)
    capsys.readouterr()
    assert main(["profiles", "check", str(path)]) == 0
    captured = capsys.readouterr()
    assert "1 warning" in captured.out
    assert "memory_bandwidth_gb_s 2 GB/s" in captured.err and "TB/s" in captured.err
