"""Per-rank simulation (every data-parallel replica, one slow GPU or link) and the slowdown
of kernels that share the GPU with communication."""

from __future__ import annotations

import json
from collections.abc import Generator
from pathlib import Path
from typing import Any

import pytest
import simpy

from gpusim.cli import main
from gpusim.comm.topology import Topology
from gpusim.errors import InvalidConfig
from gpusim.hardware.calibration import Calibration, calibration_for
from gpusim.plan.parallel import ParallelPlan, plan_parallel
from gpusim.plan.parallel_job import ParallelConfig, ParallelJob
from gpusim.sim.pipeline import simulate_pipeline
from gpusim.sim.ranks import RankCoords, Straggler, rank_coords
from gpusim.sim.shared_link import SharedLink
from gpusim.sim.trace import Trace, TraceEvent
from gpusim.workload.zoo.transformer import TransformerConfig, build_transformer

GPT = build_transformer(TransformerConfig(name="gpt-8l", layers=8, hidden=1024, heads=16,
                                          vocab=51200, seq_len=1024))


def plan(num_gpus: int = 16, batch: int = 64, calibration: Calibration | None = None,
         **split: object) -> ParallelPlan:
    config = ParallelConfig(**split)  # type: ignore[arg-type]
    return plan_parallel(ParallelJob(GPT, Topology.build("dgx-a100", num_gpus), batch, config,
                                     "bf16", "adam", "none"), calibration)


def without_host_costs() -> Calibration:
    """The A100's calibration with the host's per-layer Python costs set aside, so a small
    model's passes are paced by the device and its links."""
    cal = calibration_for(Topology.build("dgx-a100", 8).gpu)
    quiet = cal.overhead.model_copy(update={
        "layer_us": {}, "layer_backward_us": {}, "backward_call_us": 0.0, "cublas_us": 0.0,
        "cudnn_us": 0.0, "optimizer_us": 0.0, "optimizer_tensor_us": 0.0})
    return cal.model_copy(update={"overhead": quiet})


def test_ranks_are_numbered_tensor_innermost_then_data_then_pipeline() -> None:
    # TP 2 x DP 4 x PP 2: rank = stage x 8 + replica x 2 + tensor index.
    assert rank_coords(0, 2, 4, 2) == RankCoords(0, 0, 0)
    coords = rank_coords(13, 2, 4, 2)
    assert (coords.stage, coords.replica, coords.tensor) == (1, 2, 1)
    with pytest.raises(InvalidConfig, match="ranks 0 to 15"):
        rank_coords(16, 2, 4, 2)


@pytest.mark.parametrize("split", [
    {"tensor": 2, "pipeline": 2, "data": 4, "microbatch_size": 2},
    {"pipeline": 4, "data": 4, "microbatch_size": 2, "schedule": "interleaved",
     "virtual_stages": 2},
    {"data": 16, "microbatch_size": 4, "zero": 3},
    {"pipeline": 2, "data": 8, "microbatch_size": 2, "overlap_grad_reduce": False, "zero": 1},
])
def test_every_replica_of_a_symmetric_job_matches_the_representative(split: dict[str, object]
                                                                     ) -> None:
    p = plan(**split)
    one = simulate_pipeline(p, trace=False)
    every = simulate_pipeline(p, trace=False, per_rank=True)
    assert every.units == p.job.parallel.data * p.job.parallel.pipeline
    assert every.step_time_s == pytest.approx(one.step_time_s, rel=1e-9)
    assert every.breakdown_s == pytest.approx(one.breakdown_s, rel=1e-9)


def test_a_slow_gpu_holds_back_every_replica_at_the_gradient_reduction() -> None:
    p = plan(data=16, microbatch_size=4)
    base = simulate_pipeline(p, trace=False)
    slow = simulate_pipeline(p, trace=False, straggler=Straggler(5, compute=1.5))
    compute = base.breakdown_s["forward"] + base.breakdown_s["backward"]
    # The straggler's passes take half as long again, and the synchronous all-reduce makes
    # the whole step wait for them; a fast replica's extra time is all communication wait.
    assert slow.step_time_s >= base.step_time_s + 0.45 * compute
    assert slow.critical_replica == 5
    assert slow.breakdown_s["forward"] == pytest.approx(1.5 * base.breakdown_s["forward"])


def test_a_slow_link_slows_the_collectives_and_transfers_it_carries() -> None:
    p = plan(pipeline=2, data=8, microbatch_size=2)
    base = simulate_pipeline(p, trace=False)
    slow = simulate_pipeline(p, trace=False, straggler=Straggler(3, link=4.0))
    assert slow.step_time_s > base.step_time_s
    assert slow.breakdown_s["forward"] == pytest.approx(base.breakdown_s["forward"])


def test_straggler_options_parse_and_refuse_nonsense() -> None:
    assert Straggler.parse("17:1.25", "compute") == Straggler(17, compute=1.25)
    assert Straggler.parse("3:2", "link").merge(None) == Straggler(3, link=2.0)
    assert Straggler(3, compute=1.5).merge(Straggler(3, link=2.0)) == Straggler(3, 1.5, 2.0)
    for bad in ("17", "x:2", "4:-1"):
        with pytest.raises(InvalidConfig, match="RANK:FACTOR"):
            Straggler.parse(bad, "compute")
    with pytest.raises(InvalidConfig, match=r"at least 1\.0"):
        Straggler(1, compute=0.5)
    with pytest.raises(InvalidConfig, match="same rank"):
        Straggler(1, compute=1.5).merge(Straggler(2, link=2.0))


def test_estimate_names_the_straggler_and_draws_its_replica(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    trace = tmp_path / "trace.json"
    assert main(["estimate", "--model", "gpt2", "--system", "dgx-a100", "--num-gpus", "16",
                 "--pp", "2", "--batch-size", "64", "--microbatch-size", "2", "--precision",
                 "bf16", "--straggler", "9:1.3", "--slow-link", "9:2", "--trace", str(trace),
                 "--plot", str(tmp_path / "step.png"), "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert any("straggler rank 9 (stage 1, replica 1): kernels x1.3, transfers x2" in a
               for a in out["assumptions"])
    names = {row["args"]["name"] for row in json.loads(trace.read_text())["traceEvents"]
             if row.get("name") == "thread_name"}
    assert {"stage 0 dp 0 compute", "stage 1 dp 7 compute"} <= names
    assert (tmp_path / "step.png").stat().st_size > 0


def test_straggler_on_one_gpu_is_a_clear_error(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["estimate", "--model", "gpt2", "--gpu", "h100-sxm", "--batch-size", "8",
                 "--straggler", "0:1.5"]) == 2
    assert "multi-GPU" in capsys.readouterr().err


def test_trace_tracks_sort_numbers_as_numbers() -> None:
    names = ["stage 10 compute", "stage 2 dp 10 compute", "stage 2 dp 3 compute", "compute"]
    trace = Trace(tuple(TraceEvent(n, "x", 0.0, 1.0, "forward") for n in names))
    assert trace.tracks() == ["compute", "stage 2 dp 3 compute", "stage 2 dp 10 compute",
                              "stage 10 compute"]


def test_kernels_beside_a_collective_slow_down_by_the_fraction_given() -> None:
    p = plan(data=16, microbatch_size=4)
    base = simulate_pipeline(p, trace=False, comm_slowdown=0.0)
    slowed = simulate_pipeline(p, comm_slowdown=0.2)
    default = simulate_pipeline(p, trace=False)  # the published average, 18.9%
    assert "comm_slowdown" not in base.breakdown_s
    assert 0.0 < default.breakdown_s["comm_slowdown"] < slowed.breakdown_s["comm_slowdown"]
    extra = slowed.breakdown_s["comm_slowdown"]
    # At most a fifth of the time the gradient buckets were on the wire.
    reducing = sum(e.duration_s for e in slowed.trace.events
                   if e.category == "data_parallel_comm")
    assert 0.0 < extra <= 0.2 * reducing
    assert sum(slowed.breakdown_s.values()) == pytest.approx(slowed.step_time_s)
    # The step ends with the embedding's gradient all-reduce, after the backward pass, on a
    # stream still busy with the buckets before it: slower kernels take the place of some of
    # that exposed reduction, and the step is no shorter.
    assert slowed.step_time_s >= base.step_time_s
    assert slowed.breakdown_s.get("data_parallel_comm", 0.0) < base.breakdown_s.get(
        "data_parallel_comm", 0.0) or slowed.step_time_s > base.step_time_s
    with pytest.raises(InvalidConfig, match="fraction"):
        simulate_pipeline(p, trace=False, comm_slowdown=1.5)


def test_transfers_sharing_a_link_move_at_a_share_of_its_rate() -> None:
    env = simpy.Environment()
    link = SharedLink(env)
    ends: dict[str, float] = {}

    def flow(name: str, at: float, seconds: float) -> Generator[simpy.Event, Any, None]:
        yield env.timeout(at)
        yield from link.transfer(seconds)
        ends[name] = env.now

    # a runs alone for 0.5 s, then both at half rate until a is done at 1.5 s; b finishes
    # its last 0.5 s alone at 2.0 s: the pair takes as long as back to back.
    env.process(flow("a", 0.0, 1.0))
    env.process(flow("b", 0.5, 1.0))
    env.run()
    assert ends == pytest.approx({"a": 1.5, "b": 2.0})
    assert link.active == 0


def test_a_shared_link_finishes_late_in_a_long_simulation() -> None:
    """Past about 4,000 simulated seconds one tick of a float64 clock exceeds 1e-12 s, so a
    transfer whose leftover rounded above that never advanced time (issue 17: a 175B job on
    1024 GPUs with --straggler 17:10000 hung)."""
    env = simpy.Environment(initial_time=1e7)
    link = SharedLink(env)
    ends: list[float] = []

    def flow(at: float, seconds: float) -> Generator[simpy.Event, Any, None]:
        yield env.timeout(at)
        yield from link.transfer(seconds)
        ends.append(env.now)

    for i in range(5):
        env.process(flow(0.1 * i / 3, 0.7 + i / 7))
    env.run(until=1e7 + 100)  # a hang would never get here
    assert len(ends) == 5 and link.active == 0


def test_pipeline_and_data_parallel_traffic_share_the_nic_when_both_leave_the_node() -> None:
    p = plan(num_gpus=64, pipeline=2, data=32, microbatch_size=1)
    assert p.groups["pipeline"].spans_nodes and p.groups["data"].spans_nodes
    one = simulate_pipeline(p, comm_slowdown=0.0)  # links alone, no compute interference
    # A backward send that overlapped a gradient bucket on the wire took up to twice as long.
    sends = [e.duration_s / p.p2p_s for e in one.trace.events if e.track.endswith("p2p")]
    assert max(sends) > 1.5 and min(sends) == pytest.approx(1.0)
    every = simulate_pipeline(p, trace=False, per_rank=True, comm_slowdown=0.0)
    assert every.step_time_s == pytest.approx(one.step_time_s, rel=1e-9)


def test_tensor_and_data_parallel_traffic_share_a_gpus_switch_links_inside_a_node() -> None:
    def static_tp(p: ParallelPlan) -> float:
        chunk = p.stages[0].chunks[0]
        return p.microbatches * (chunk.forward.tp_comm_s + chunk.backward.tp_comm_s)

    # ZeRO-3 gathers and reduces during every pass, over the NVSwitch the TP all-reduces use.
    fsdp = plan(num_gpus=8, tensor=2, data=4, microbatch_size=2, zero=3,
                calibration=without_host_costs())
    assert not fsdp.groups["data"].spans_nodes
    shared = simulate_pipeline(fsdp, trace=False)
    assert shared.breakdown_s["tensor_parallel_comm"] > 1.01 * static_tp(fsdp)
    assert sum(shared.breakdown_s.values()) == pytest.approx(shared.step_time_s)
    # Gradients reduced after the backward pass overlap no pass: nothing is shared.
    after = plan(num_gpus=8, tensor=2, data=4, microbatch_size=2, overlap_grad_reduce=False)
    alone = simulate_pipeline(after, trace=False)
    assert alone.breakdown_s["tensor_parallel_comm"] == pytest.approx(static_tp(after))
    # Once the data-parallel group leaves the node its TP peers' traffic stays apart.
    wide = plan(num_gpus=64, tensor=8, data=8, microbatch_size=1, zero=3)
    assert wide.groups["data"].spans_nodes
    spread = simulate_pipeline(wide, trace=False)
    assert spread.breakdown_s["tensor_parallel_comm"] == pytest.approx(static_tp(wide))


def test_per_rank_beyond_a_minute_of_work_is_refused_up_front() -> None:
    """--per-rank at 98,304 GPUs with 128 microbatches per replica would simulate 3,145,728
    passes, twice the 1,572,864 that take 24 s over 4,096 units, over three times the units:
    refused before any work, with what to do instead."""
    from gpusim.errors import InvalidConfig
    from gpusim.estimation import estimate

    with pytest.raises(InvalidConfig, match=r"--per-rank would simulate 3,145,728 passes"):
        estimate("gpt3-175b", None, 98304, precision="bf16", system="dgx-a100",
                 num_gpus=98304, tp=8, pp=16, microbatch_size=1, per_rank=True)


def test_a_slow_gpu_under_fsdp_cpu_offload_still_meets_its_collectives() -> None:
    """Each rank issues its ZeRO-3 gathers in program order, holding their place on the
    stream while the offloaded shard comes up over PCIe: a slow rank's gathers and gradient
    buckets reach the stream in the same order as the others', and the step ends (it
    stopped with no events left, every rank waiting on another, before)."""
    job = ParallelJob(GPT, Topology.build("dgx-a100", 8), 64,
                      ParallelConfig(data=8, microbatch_size=2, zero=3), "bf16", "adam",
                      "none", offload="params")
    p = plan_parallel(job)
    even = simulate_pipeline(p, trace=False, per_rank=True)
    slow = simulate_pipeline(p, trace=False, straggler=Straggler(5, compute=1.5))
    assert slow.step_time_s > even.step_time_s
    assert slow.critical_replica == 5
