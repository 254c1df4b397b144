"""Fuzzing (hypothesis), on a bounded budget: a few seconds per property, derandomized.

Longer runs: ``python benchmarks/fuzz.py --budget 600``.
"""

from __future__ import annotations

import fuzzing
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

CI = settings(
    derandomize=True,
    database=None,
    deadline=20_000,  # ms: a hang fails the property rather than the suite's timeout
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture],
)


@settings(CI, max_examples=12)
@given(fuzzing.graphs)
def test_random_graphs_and_pattern_subsets_match_eager(ex):
    fuzzing.check_graph(ex)


@settings(CI, max_examples=25)
@given(st.sampled_from(sorted(fuzzing.PATTERN_FILES)), fuzzing.mutations)
def test_corrupted_pdl_file_fails_cleanly_or_stays_correct(name, muts):
    fuzzing.check_pdl_corruption(name, muts)


@settings(CI, max_examples=25)
@given(fuzzing.mutations)
def test_corrupted_manifest_fails_cleanly_or_stays_correct(muts):
    fuzzing.check_manifest_corruption(muts)


@settings(CI, max_examples=25)
@given(fuzzing.mutations)
def test_corrupted_kernel_file_fails_cleanly(muts):
    fuzzing.check_kernel_corruption(muts, pinned=False)


@settings(CI, max_examples=25)
@given(fuzzing.mutations)
def test_corrupted_pinned_kernel_file_is_always_refused(muts):
    fuzzing.check_kernel_corruption(muts, pinned=True)


@pytest.mark.parametrize("pinned", [False, True])
def test_an_unchanged_kernel_file_loads(pinned):
    """The corruption properties' subject loads when nothing is corrupted (the ops it
    implements beside it), so their refusals are the corruption's doing."""
    what = "kernel files (pinned)" if pinned else "kernel files"
    before = fuzzing.CASES[f"{what}: loaded"]
    fuzzing.check_kernel_corruption([], pinned=pinned)
    assert fuzzing.CASES[f"{what}: loaded"] == before + 1


@settings(CI, max_examples=200)
@given(fuzzing.descriptors)
def test_random_native_descriptor_is_validated_or_refused_naming_the_library(d):
    fuzzing.check_descriptor(d)


@pytest.mark.parametrize(
    "muts,expect",
    [
        ([("set", 0.5, 0xFF)], b"\xff"),  # not UTF-8
        ([("set", 0.1, 0)], b"\x00"),  # a NUL byte
        ([("truncate", 0.3, 0)], None),
    ],
)
def test_corrupt_helper_applies_mutations(muts, expect):
    data = b"abcdefghij"
    out = fuzzing.corrupt(data, muts)
    if expect is None:
        assert out == data[:3]
    else:
        assert expect in out and len(out) == len(data)
