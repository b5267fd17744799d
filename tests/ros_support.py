"""Test helpers of the ROS package's tests and of benchmarks/ros_loop.py.

They live here, not in ``sim2real_ros``, because they need torch and ``sim``, which the
package's nodes must never reach. The package's tests (ros_ws/src/sim2real_ros/test) get
tests/ on ``sys.path`` from their conftest.py, under ``colcon test`` and the repository's
pytest alike; benchmarks/ros_loop.py puts it there itself.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from pathlib import Path

__all__ = ["export_test_policy"]


def export_test_policy(
    path: str | os.PathLike[str],
    *,
    task: str = "quadruped",
    gain: float = 0.0,
    hidden: Sequence[int] = (256, 128, 64),
    obs_terms: Sequence[tuple[str, int]] | None = None,
    seed: int = 0,
) -> Path:
    """Export an untrained policy shaped like ``task``'s (tests and benchmarks only).

    Metadata from the task's robot description, as a trained export would carry; the
    network is an ELU MLP of the trained size whose output layer is scaled by ``gain``
    (0: always the default pose, i.e. stand still). ``obs_terms`` overrides the
    observation terms (to test refusals).
    """
    # imported here: benchmarks/ros_loop.py imports this module in its fake-robot
    # process too, which must stay as light as a robot's driver
    import torch

    from deploy.export import export_policy
    from deploy.metadata import PolicyMetadata
    from sim.randomization import SimToRealConfig
    from sim.registry import make

    env = make(task, 1, seed=0, s2r=SimToRealConfig())
    try:
        r = env.robot
        terms = [(t.name, t.size) for t in env.observation_spec.policy.terms]
    finally:
        env.close()
    terms = list(obs_terms) if obs_terms is not None else terms
    meta = PolicyMetadata(
        policy_family="gaussian_mlp",
        obs_terms=terms,
        action_joint_names=list(r.joint_names),
        action_scale=r.action_scale,
        action_offset=r.action_offset,
        default_joint_pos=r.default_joint_pos,
        kp=r.kp,
        kd=r.kd,
        joint_pos_lower=r.joint_pos_lower,
        joint_pos_upper=r.joint_pos_upper,
        control_period_s=r.control_dt,
        task=task,
        run_id=f"untrained-{task}-gain{gain:g}",
        extra={"control_mode": r.control_mode},
    )
    torch.manual_seed(seed)
    sizes = [sum(s for _, s in terms), *hidden]
    layers: list[torch.nn.Module] = []
    for a, b in zip(sizes[:-1], sizes[1:]):
        layers += [torch.nn.Linear(a, b), torch.nn.ELU()]
    head = torch.nn.Linear(sizes[-1], len(r.joint_names))
    with torch.no_grad():
        head.weight.mul_(gain)
        head.bias.mul_(gain)
    module = torch.nn.Sequential(*layers, head)
    return export_policy(module, meta, path)
