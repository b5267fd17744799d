"""Walker2d-v5: walk forward on two legs; ends when the torso leaves the healthy ranges."""

from __future__ import annotations

from sim.tasks.hopper import Hopper


class Walker2d(Hopper):
    """Hopper's observation, reward and reset; v5's Walker2d checks only z and angle."""

    name = "walker2d"
    xml = "walker2d_v5.xml"
    frame_skip = 4
    forward_reward_weight = 1.0
    ctrl_cost_weight = 1e-3
    healthy_reward = 1.0
    terminate_when_unhealthy = True
    healthy_state_range = None
    healthy_z_range = (0.8, 2.0)
    healthy_angle_range = (-1.0, 1.0)
    reset_noise_scale = 5e-3
