"""The PD gains the policy node reports and sends: the trained ones, or checked overrides."""

from __future__ import annotations

import numpy as np
import pytest
from sim2real_ros.gains import GainsError, resolve_gains

JOINTS = ["hip", "thigh", "calf"]
KP, KD = [30.0, 30.0, 30.0], [0.8, 0.8, 0.8]


def test_unset_overrides_are_the_trained_gains():
    for unset in (None, []):
        g = resolve_gains(JOINTS, KP, KD, unset, unset)
        np.testing.assert_array_equal(g.kp, KP)
        np.testing.assert_array_equal(g.kd, KD)
        assert g.overrides() == {"kp": [], "kd": []}
        np.testing.assert_array_equal(g.as_array(), KP + KD)  # the message: kp then kd


def test_an_override_names_each_joint_that_differs_with_both_values():
    g = resolve_gains(JOINTS, KP, KD, kp=[30, 40, 30])  # integers, as YAML writes them
    np.testing.assert_array_equal(g.kp, [30.0, 40.0, 30.0])
    np.testing.assert_array_equal(g.kd, KD)
    assert g.overrides() == {"kp": [("thigh", 40.0, 30.0)], "kd": []}
    table = g.table().splitlines()
    assert [line.split()[1] for line in table] == JOINTS  # one line per joint, in order
    assert "kp 40 (trained 30)" in table[1] and "kd 0.8" in table[1]
    assert "trained" not in table[0]


@pytest.mark.parametrize(
    "kp, why",
    [
        ([30.0, 30.0], "has 2 values; the policy has 3 joints"),
        ([30.0, -1.0, 30.0], "finite and >= 0"),
        ([30.0, float("nan"), 30.0], "finite and >= 0"),
        (30.0, "has 1 values"),
        (["a", "b", "c"], "list of numbers"),
    ],
)
def test_unusable_overrides_are_refused_with_the_reason(kp, why):
    with pytest.raises(GainsError, match=why):
        resolve_gains(JOINTS, KP, KD, kp=kp)
