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
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from deploy.metadata import PolicyMetadata

__all__ = ["export_test_flow_policy", "export_test_policy"]


def _task_metadata(
    task: str, obs_terms: Sequence[tuple[str, int]] | None, run_id: str
) -> PolicyMetadata:
    """The Gaussian deployment metadata of an untrained ``task`` policy: what a trained
    export of ``task`` carries."""
    from deploy.metadata import PolicyMetadata
    from sim.randomization import SimToRealConfig
    from sim.registry import make

    env = make(task, 1, seed=0, s2r=SimToRealConfig())
    try:
        r = env.robot
        terms = [(t.name, t.size) for t in env.observation_spec.policy.terms]
    finally:
        env.close()
    meta = PolicyMetadata(
        policy_family="gaussian_mlp",
        obs_terms=list(obs_terms) if obs_terms is not None else terms,
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
        run_id=run_id,
        extra={"control_mode": r.control_mode},
    )
    return meta


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

    meta = _task_metadata(task, obs_terms, f"untrained-{task}-gain{gain:g}")
    torch.manual_seed(seed)
    sizes = [meta.obs_frame_size, *hidden]
    layers: list[torch.nn.Module] = []
    for a, b in zip(sizes[:-1], sizes[1:]):
        layers += [torch.nn.Linear(a, b), torch.nn.ELU()]
    head = torch.nn.Linear(sizes[-1], meta.num_joints)
    with torch.no_grad():
        head.weight.mul_(gain)
        head.bias.mul_(gain)
    module = torch.nn.Sequential(*layers, head)
    return export_policy(module, meta, path)


def export_test_flow_policy(
    path: str | os.PathLike[str],
    *,
    task: str = "quadruped",
    horizon: int = 4,
    act_steps: int = 2,
    steps: int = 4,
    action_range: float = 0.5,
    seed: int = 0,
) -> Path:
    """Export an untrained flow policy shaped like ``task``'s: chunks of ``horizon``
    actions of which ``act_steps`` run, ``steps`` Euler steps from the noise input, the
    metadata a trained flow export carries (family "flow", noise shape, chunk state).
    Its actions span [-action_range, action_range] (raw units) around the default pose.
    """
    import numpy as np
    import torch

    import training.export  # noqa: F401  registers the flow exporter
    from deploy.export import export_policy
    from policies.flow import FlowConfig, FlowPolicy
    from training.metadata import as_flow

    meta = _task_metadata(task, None, f"untrained-{task}-flow{steps}")
    torch.manual_seed(seed)
    cfg = FlowConfig(
        horizon=horizon, act_steps=act_steps, sample_steps=steps, hidden=(64, 64), time_dim=8
    )
    n = meta.num_joints
    r = np.full(n, action_range)
    policy = FlowPolicy(meta.obs_frame_size, n, cfg, -r, r)
    return export_policy(policy.inference_module().eval(), as_flow(meta, policy), path)
