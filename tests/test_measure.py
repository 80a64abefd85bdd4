"""The measurement runner: the PyTorch network it builds is gpusim's workload, and the suites
write files with the schema, provenance and cases that calibration and validation read."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")

from gpusim.errors import InvalidConfig  # noqa: E402
from gpusim.measure import results, runner  # noqa: E402
from gpusim.measure.torch_model import Network, trainable_parameters  # noqa: E402
from gpusim.workload.formats import model_from_spec  # noqa: E402

SMALL = [
    {"zoo": "mnist-mlp"},
    {"zoo": "mnist-cnn"},
    {"zoo": "resnet50", "image_size": 64},
    {"zoo": "vgg16", "image_size": 32},
    {"zoo": "bert-base", "seq_len": 16},
    {"zoo": "gpt2", "seq_len": 16},
    {"name": "llama-tiny", "seq_len": 16, "transformer": {
        "layers": 2, "hidden": 128, "heads": 4, "kv_heads": 2, "ffn_hidden": 352,
        "vocab": 1000, "norm": "rmsnorm", "activation": "swiglu", "positions": "rotary",
        "tied_embeddings": False, "bias": False}},
    {"name": "moe-tiny", "seq_len": 16, "transformer": {
        "layers": 2, "hidden": 128, "heads": 4, "kv_heads": 2, "ffn_hidden": 352,
        "vocab": 1000, "norm": "rmsnorm", "activation": "swiglu", "positions": "rotary",
        "tied_embeddings": False, "bias": False, "experts": 4, "top_k": 2, "moe_ffn": 64,
        "shared_ffn": 64}},
]
CPU = torch.device("cpu")


@pytest.mark.parametrize("spec", SMALL, ids=lambda s: s.get("zoo") or s["name"])
def test_network_is_the_workload(spec: dict) -> None:
    """Same parameters as the model counts, every layer called once, a finite loss that
    backpropagates into every trainable tensor."""
    model = model_from_spec(spec)
    net = Network(model, 2, CPU)
    assert trainable_parameters(net) == model.parameters
    calls = net.record_calls(torch.autocast("cpu", enabled=False))
    assert [c.index for c in calls] == list(range(len(model.layers)))
    loss = net()
    assert torch.isfinite(loss)
    loss.backward()
    assert all(p.grad is not None for p in net.parameters())


def test_tied_head_shares_the_token_table() -> None:
    """GPT-2's head computes with the token table itself: the optimizer steps one tensor, as
    the model counts it (the runner once gave the head a copy, 38.6M parameters more)."""
    model = model_from_spec({"zoo": "gpt2", "seq_len": 16})
    net = Network(model, 2, CPU)
    assert sum(p.numel() for p in net.parameters()) == model.parameters
    untied = model.untied()
    assert untied.parameters == model.parameters + 50257 * 768
    assert sum(p.numel() for p in Network(untied, 2, CPU).parameters()) == untied.parameters


def test_resnet_downsample_reads_the_block_input() -> None:
    """A downsample convolution takes the shortcut (block input), not the main branch."""
    model = model_from_spec({"zoo": "resnet50", "image_size": 64})
    calls = Network(model, 1, CPU).record_calls(torch.autocast("cpu", enabled=False))
    roles = {model.layers[c.index].name: c.role for c in calls}
    assert roles["layer1.0.downsample"] == "skip"
    assert roles["layer1.0.downsample.bn"] == "skip"
    assert roles["layer1.0.add"] == "add"
    assert roles["layer1.0.conv1"] == "x"


def _no_machine_paths(path: Path, tmp_path: Path) -> None:
    assert str(tmp_path) not in path.read_text()


def test_micro_quick_suite_writes_a_checked_file(tmp_path: Path) -> None:
    path = runner.run("micro", tmp_path / "cpu", "epyc-zen4-2vcpu", repeats=3, quick=True)
    data = results.load(path, suite="micro")
    kinds = {c["kind"] for c in data["cases"]}
    assert {"dispatch", "gemm", "conv", "attention", "elementwise"} <= kinds
    timed = [c for c in data["cases"] if "median_s" in c]
    assert timed and all(0 < c["p10_s"] <= c["median_s"] <= c["p90_s"] for c in timed)
    assert all(c["repeats"] == 3 for c in timed if c["kind"] != "dispatch")
    prov = data["provenance"]
    for key in ("date", "command", "git_commit", "torch", "cpu", "seconds"):
        assert key in prov
    assert data["quick"] is True
    _no_machine_paths(path, tmp_path)


def test_models_quick_suite_times_steps_and_layers(tmp_path: Path) -> None:
    path = runner.run("models", tmp_path / "cpu", "epyc-zen4-2vcpu", repeats=3, quick=True)
    data = results.load(path, suite="models")
    case = data["cases"][0]
    assert case["model"] == {"zoo": "mnist-mlp"}
    assert case["step"]["median_s"] > 0
    model = model_from_spec(case["model"])
    assert [row["layer"] for row in case["layers"]] == [lay.name for lay in model.layers]
    # Backward is timed wherever gradients flow (the first layer's input takes none).
    assert all("backward" in row for row in case["layers"][1:])
    assert case["peak_memory_bytes"] is None  # CUDA only
    # On a CPU each phase of the timed steps is timed too, and they add up to the step.
    phases = case["phases"]
    assert list(phases) == ["zero_grad", "forward", "backward", "optimizer"]
    assert all(p["repeats"] == case["step"]["repeats"] for p in phases.values())
    # the undisturbed samples (p10) add up: medians of a few repeats move apart when another
    # process shares the two cores
    total = sum(p["p10_s"] for p in phases.values())
    assert 0.5 * case["step"]["p10_s"] < total < 2 * case["step"]["p10_s"]
    assert data["switches"]["tied_weights"] is True


def test_device_must_be_named_on_a_cpu_and_match_the_hardware() -> None:
    with pytest.raises(InvalidConfig, match="pass --device"):
        runner.resolve_device(None, CPU)
    with pytest.raises(InvalidConfig, match="GPU profile"):
        runner.resolve_device("h100-sxm", CPU)
    assert runner.resolve_device("ci-cpu", CPU).name == "epyc-zen4-2vcpu"


def test_results_refuse_the_wrong_suite(tmp_path: Path) -> None:
    path = tmp_path / "micro.json"
    path.write_text(json.dumps({"schema_version": 1, "suite": "micro", "device": "x",
                                "provenance": {}, "cases": []}))
    with pytest.raises(Exception, match="needs the models suite"):
        results.load(path, suite="models")


def test_kinds_keep_only_those_micro_cases_and_host_steps_time_each_phase(
        tmp_path: Path) -> None:
    path = runner.run("micro", tmp_path / "cpu", "epyc-zen4-2vcpu", repeats=3, quick=True,
                      kinds=["dispatch", "host_step"])
    data = results.load(path, suite="micro")
    assert data["kinds"] == ["dispatch", "host_step"]
    assert {c["kind"] for c in data["cases"]} == {"dispatch", "host_step"}
    steps = [c for c in data["cases"] if c["kind"] == "host_step"]
    # One tiny model (quick), its four phases, each a host time of its own.
    assert sorted(c["pass"] for c in steps) == ["backward", "forward", "optimizer",
                                                "zero_grad"]
    assert all(c["median_s"] > 0 and c["model"] == {"zoo": "mnist-mlp"} for c in steps)


def test_sustained_gemm_reports_its_windows_and_steady_state(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """The sustained case's steady state is the median of its second half's windows; the
    clock samples come from nvidia-smi's CSV lines (none where it is missing)."""
    from gpusim.measure import micro

    out = micro.time_sustained_gemm(64, 64, 64, "fp32", torch.device("cpu"), seconds=0.3,
                                    window_s=0.05)
    assert len(out.windows) >= 2 and out.first_window_s > 0  # fewer when the host is busy
    steady = sorted(w["per_call_s"] for w in out.windows[len(out.windows) // 2:])
    assert out.median_s == steady[len(steady) // 2] and out.repeats == len(steady)
    assert "windows" in out.to_dict() and "clocks" in out.to_dict()

    class FakeProc:
        def terminate(self) -> None: ...
        def communicate(self, timeout: float = 0.0) -> tuple[str, str]:
            return "1755, 699.12, 71\n[N/A], 650, 70\n1710, 700.3, 72\n", ""

    sampler = micro.ClockSampler()
    sampler._proc = FakeProc()  # type: ignore[assignment]
    assert sampler.stop() == [{"sm_mhz": 1755.0, "power_w": 699.12, "temperature_c": 71.0},
                              {"sm_mhz": 1710.0, "power_w": 700.3, "temperature_c": 72.0}]


def test_a_model_case_records_the_sdpa_backend_its_attention_ran() -> None:
    """The models suite records which SDPA kernel PyTorch picked for the tensors an
    attention layer really passes (views of the packed projection, with dropout where the
    model has it), not for the micro suite's contiguous inputs: the kernel decides the
    attention layers' time, and on a GPU it can differ between the two."""
    from gpusim.measure import models

    case = next(c for c in models.cpu_cases() if c.id.startswith("gpt2/"))
    row = models.measure_case(case, CPU, 1, layers=False)
    assert row["sdpa_backends"] and all(isinstance(b, str) for b in row["sdpa_backends"])


def test_provenance_places_a_masked_cpu_by_its_numbers_and_features() -> None:
    from gpusim.measure.provenance import CPU_FEATURES, cpu_identity

    text = ("processor\t: 0\nvendor_id\t: GenuineIntel\ncpu family\t: 6\nmodel\t\t: 143\n"
            "model name\t: Intel(R) Xeon(R) Processor\nstepping\t: 8\ncpu MHz\t\t: 2100.000\n"
            "cache size\t: 107520 KB\nflags\t\t: fpu avx2 avx512f avx512_bf16 amx_tile amx_bf16\n"
            "\nprocessor\t: 1\nvendor_id\t: Other\n")
    found = cpu_identity(text)
    assert found == {"vendor": "GenuineIntel", "family": "6", "model": "143", "stepping": "8",
                     "mhz": "2100.000", "cache": "107520 KB",
                     "features": ["amx_tile", "amx_bf16", "avx512_bf16", "avx512f", "avx2"]}
    assert set(cpu_identity().get("features", [])) <= set(CPU_FEATURES)


def test_written_out_attention_is_timed_and_predicted_as_unfused_attention() -> None:
    """The micro suite's "unfused" SDPA cases (CUDA only in the suite): attention written
    out in PyTorch, timed forward and backward, and predicted from the unfused layer's
    kernels, its score kernels at the calibration's unfused-attention rate."""
    import torch

    from gpusim.calibrate.micro_ops import case_ops, predict
    from gpusim.hardware.calibration import calibration_for
    from gpusim.hardware.catalog import load_gpu
    from gpusim.measure import micro_layers

    shape = {"batch": 2, "heads": 2, "kv_heads": 2, "seq": 64, "head_dim": 16, "causal": True}
    timed = micro_layers.time_unfused_attention(shape, torch.device("cpu"), 2)
    assert timed["forward"].median_s > 0 and timed["backward"].median_s > 0
    gpu = load_gpu("a100-80gb")
    case = {"id": "sdpa/unfused/x", "kind": "sdpa", "precision": "bf16", "backend": "unfused",
            **shape, "pass": "forward", "timed": "kernel"}
    names = [op.name.rsplit(".", 1)[1] for op in case_ops(case, gpu)]
    assert names == ["qk", "softmax", "av", "merge_heads", "causal_mask"]
    cal = calibration_for(gpu)
    plain = cal.model_copy(update={"memory": cal.memory.model_copy(
        update={"kernel_factors": {}})})
    assert predict(case, gpu, cal) > predict(case, gpu, plain)


def test_fp32_sdpa_is_timed_and_fitted_apart_from_the_16_bit_attention() -> None:
    """The micro suite times fp32 SDPA on a GPU (its memory-efficient kernel runs fp32
    products, not the 16-bit kernels' tensor-core ones): the case times in fp32, the 16-bit
    SDPA groups leave it out, and a group of its own fits it, SDPA's choice and the
    efficient backend alike (the one kernel SDPA has for fp32)."""
    import torch

    from gpusim.calibrate.groups import fit_groups
    from gpusim.cost.kernels import FP32_ATTENTION
    from gpusim.hardware.catalog import load_gpu
    from gpusim.measure import micro_layers

    shape = {"batch": 2, "heads": 2, "kv_heads": 2, "seq": 64, "head_dim": 16, "causal": True}
    timed = micro_layers.time_sdpa(shape, "math", torch.device("cpu"), 2, torch.float32)
    assert timed["forward"].median_s > 0 and timed["backward"].median_s > 0
    base = {"kind": "sdpa", **shape, "pass": "forward", "median_s": 1e-3}
    cases = [{**base, "id": f"sdpa/{p}/{b}", "precision": p, "backend": b}
             for p in ("bf16", "fp32") for b in ("efficient", "auto", "math")]
    groups = {name: ({c["id"] for c in group}, params)
              for name, group, params in fit_groups(cases, load_gpu("h100-sxm"))}
    sixteen = {i for name, (ids, _) in groups.items() if name != "attention fp32" for i in ids}
    assert sixteen == {"sdpa/bf16/efficient", "sdpa/bf16/auto"}
    ids, params = groups["attention fp32"]
    assert ids == {"sdpa/fp32/efficient", "sdpa/fp32/auto"}
    assert (("gemm", "attention_kernels", FP32_ATTENTION, "forward"), "factor") in params


def test_the_fsdp_reserve_probe_trains_plainly_and_under_fsdp2_on_the_cpu() -> None:
    """measurements/gpu_probes.py's fsdp_reserve probe, which a GPU lease runs for the
    caching allocator's reserve under FSDP2's extra streams (issue 14), runs end to end on
    the CPU (gloo on loopback, one rank), so the lease spends its minutes measuring: the
    plain run and both FSDP2 runs train their steps."""
    import importlib.util
    from pathlib import Path

    path = Path(__file__).resolve().parents[1] / "measurements" / "gpu_probes.py"
    spec = importlib.util.spec_from_file_location("gpu_probes", path)
    assert spec is not None and spec.loader is not None
    probes = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(probes)
    tiny = {"blocks": 2, "hidden": 64, "heads": 4, "kv_heads": 2, "ffn": 128, "batch": 1,
            "seq": 32}
    out = probes.probe_fsdp_reserve(tiny)
    assert out["config"] == tiny
    for run in ("plain_autocast", "fsdp2_reshard_true", "fsdp2_reshard_false"):
        assert out[run] == {"steps": 3}


def test_bf16_elementwise_cases_time_in_bf16_and_stay_out_of_the_fit() -> None:
    """The GPU suite also times copies and adds over bf16 elements (fit: False until the
    memory fit takes a type apart): the timer moves the case's bytes in bf16, gpusim
    predicts the case from half as many elements, and no fit group takes it."""
    import torch

    from gpusim.calibrate.groups import fit_groups
    from gpusim.calibrate.micro_ops import predict
    from gpusim.hardware.calibration import calibration_for
    from gpusim.hardware.catalog import load_gpu
    from gpusim.measure import micro

    timed = micro.time_elementwise("add", 2**16, torch.device("cpu"), 3, 0.0,
                                   dtype=torch.bfloat16)
    assert timed.median_s > 0
    h100 = load_gpu("h100-sxm")
    case = {"id": "elementwise/bf16/add/1073741824", "kind": "elementwise", "op": "add",
            "bytes": 2**30, "dtype": "bf16", "fit": False, "median_s": 1e-3}
    fp32 = {**case, "id": "elementwise/add/1073741824", "dtype": "fp32"}
    cal = calibration_for(h100)
    assert predict(case, h100, cal) == pytest.approx(predict(fp32, h100, cal), rel=1e-6)
    assert all(case["id"] not in {c["id"] for c in group}
               for _, group, _ in fit_groups([case, fp32], h100))
