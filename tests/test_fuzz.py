"""Fuzzed command lines: every outcome is a sane result or a one-line domain error (exit 2),
never a traceback or nonsense. benchmarks/fuzz.py runs many more and counts them."""

from __future__ import annotations

from hypothesis import HealthCheck, given, settings

from tests.fuzz_cli import command_lines, explore_command_lines, run


@settings(max_examples=60, deadline=None, derandomize=True,
          suppress_health_check=[HealthCheck.too_slow])
@given(command_lines())
def test_a_fuzzed_command_line_gives_a_result_or_a_clean_error(argv: list[str]) -> None:
    outcome = run(argv)
    assert outcome.kind in ("result", "error"), (argv, outcome)


@settings(max_examples=40, deadline=None, derandomize=True,
          suppress_health_check=[HealthCheck.too_slow])
@given(explore_command_lines())
def test_a_fuzzed_sweep_search_compare_or_scaling_gives_a_result_or_a_clean_error(
        argv: list[str]) -> None:
    outcome = run(argv)
    assert outcome.kind in ("result", "error"), (argv, outcome)
