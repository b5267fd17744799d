"""`VecEnv.joint_indices`: where each action joint lives in the model, for code that steps
its own copy of a task's model (the ROS simulated robot) without reading private state."""

from __future__ import annotations

import mujoco
import numpy as np
import pytest
import torch

import sim
from sim.randomization import SimToRealConfig
from sim.spec import JointIndices
from sim.tasks.quadruped import DEFAULT_MODEL, JOINTS
from sim.vec_env import joint_indices_of

NOMINAL = SimToRealConfig()  # no noise, bias, latency or pushes: observations are the state


def _env(task: str, n: int = 2, **kw):
    env = sim.make(task, n, seed=0, s2r=NOMINAL, num_threads=1, dtype=torch.float64, **kw)
    env.reset(seed=0)
    return env


def _joint_name(model: mujoco.MjModel, jid: int) -> str:
    return mujoco.mj_id2name(model, mujoco.mjtObj.mjOBJ_JOINT, int(jid))


def _assert_points_at_action_joints(env) -> JointIndices:
    ji = env.joint_indices
    m = env.model
    assert isinstance(ji, JointIndices)
    assert ji.joint_names == tuple(env.action_spec.joint_names)
    for i, name in enumerate(ji.joint_names):
        jid = mujoco.mj_name2id(m, mujoco.mjtObj.mjOBJ_JOINT, name)
        assert m.actuator_trntype[ji.actuator_ids[i]] == mujoco.mjtTrn.mjTRN_JOINT
        assert _joint_name(m, m.actuator_trnid[ji.actuator_ids[i], 0]) == name
        assert ji.qpos_adr[i] == m.jnt_qposadr[jid]
        assert ji.dof_adr[i] == m.jnt_dofadr[jid]
    for field in ("actuator_ids", "qpos_adr", "dof_adr"):
        a = getattr(ji, field)
        assert a.dtype == np.int64 and a.shape == (env.action_spec.size,)
        with pytest.raises(ValueError, match="read-only"):
            a[0] = 0  # no reader can move the task's indices
    return ji


@pytest.mark.parametrize("task", sim.task_names())
def test_every_task_has_joint_indices(task):
    env = _env(task, 1)
    try:
        _assert_points_at_action_joints(env)
    finally:
        env.close()


def test_hopper_indices_read_the_state_the_task_reports():
    env = _env("hopper")
    ji = _assert_points_at_action_joints(env)
    # Gymnasium's hopper: each action is the control of the actuator of the same index
    np.testing.assert_array_equal(ji.actuator_ids, np.arange(env.model.nu))
    actions = torch.tensor([[0.3, -0.2, 0.1], [-0.5, 0.4, 0.0]], dtype=torch.float64)
    obs, *_ = env.step(actions)
    qpos, qvel = env.engine.get("qpos"), env.engine.get("qvel")
    terms = env.observation_spec.policy.slices()
    # the policy's "qpos" term is qpos[1:], its "qvel" term the clipped qvel
    seen_qpos = obs["policy"][:, terms["qpos"]].numpy()
    seen_qvel = obs["policy"][:, terms["qvel"]].numpy()
    np.testing.assert_array_equal(seen_qpos[:, ji.qpos_adr - 1], qpos[:, ji.qpos_adr])
    np.testing.assert_array_equal(
        seen_qvel[:, ji.dof_adr], np.clip(qvel[:, ji.dof_adr], -env.qvel_clip, env.qvel_clip)
    )
    np.testing.assert_array_equal(env.engine.get("ctrl")[:, ji.actuator_ids], actions.numpy())
    data = env.engine.get_data(1)  # one env's MjData, as the simulated robot reads it
    np.testing.assert_array_equal(data.qpos[ji.qpos_adr], qpos[1, ji.qpos_adr])


def test_quadruped_indices_read_the_state_the_task_reports():
    env = _env("quadruped")
    ji = _assert_points_at_action_joints(env)
    assert ji.joint_names == JOINTS == env.robot.joint_names
    # the task's own indexing and the model-derived one agree
    derived = joint_indices_of(env.model, env.action_spec.joint_names)
    for field in ("actuator_ids", "qpos_adr", "dof_adr"):
        np.testing.assert_array_equal(getattr(ji, field), getattr(derived, field))
    actions = torch.full((2, 12), 0.2, dtype=torch.float64)
    actions[1] *= -1
    obs, *_ = env.step(actions)
    qpos, qvel = env.engine.get("qpos"), env.engine.get("qvel")
    terms = env.observation_spec.policy.slices()
    policy = obs["policy"].numpy()
    np.testing.assert_array_equal(
        policy[:, terms["joint_pos"]], qpos[:, ji.qpos_adr] - env.robot.default_joint_pos
    )
    np.testing.assert_array_equal(policy[:, terms["joint_vel"]], qvel[:, ji.dof_adr])
    r = env.robot
    target = np.clip(
        r.default_joint_pos + r.action_scale * actions.numpy(),
        r.joint_pos_lower,
        r.joint_pos_upper,
    )
    np.testing.assert_array_equal(env.engine.get("ctrl")[:, ji.actuator_ids], target)


def test_quadruped_indices_follow_the_models_actuator_order(tmp_path):
    # a robot whose MJCF lists the FL hip actuator last: the indices come from the model
    text = open(DEFAULT_MODEL).read()
    line = '<position name="FL_hip" joint="FL_hip_joint" class="hip"/>'
    assert line in text
    text = text.replace(line, "").replace("</actuator>", f"  {line}\n  </actuator>")
    text = text.replace('ctrl="0.1 0.8 -1.5   -0.1 0.8 -1.5   0.1 1.0 -1.5   -0.1 1.0 -1.5"', "")
    path = tmp_path / "reordered.xml"
    path.write_text(text)
    env = _env("quadruped", model_path=str(path))
    ji = _assert_points_at_action_joints(env)
    np.testing.assert_array_equal(ji.actuator_ids, [11, *range(11)])
    env.step(torch.zeros(2, 12, dtype=torch.float64))
    np.testing.assert_array_equal(
        env.engine.get("ctrl")[:, ji.actuator_ids],
        np.broadcast_to(env.robot.default_joint_pos, (2, 12)),
    )


_TWO_MOTORS = """
<mujoco>
  <worldbody>
    <body>
      <joint name="a" type="hinge"/>
      <geom size="0.1"/>
      <body pos="0 0 1">
        <joint name="b" type="slide"/>
        <geom size="0.1"/>
      </body>
    </body>
  </worldbody>
  <actuator>
    <motor joint="a"/>
    <motor joint="a"/>
  </actuator>
</mujoco>
"""


def test_joints_without_a_single_actuator_are_refused():
    m = mujoco.MjModel.from_xml_string(_TWO_MOTORS)
    with pytest.raises(ValueError, match="'a' is driven by 2 actuators"):
        joint_indices_of(m, ("a",))
    with pytest.raises(ValueError, match="'b' is driven by 0 actuators"):
        joint_indices_of(m, ("b",))
    with pytest.raises(ValueError, match="no joint named 'c'"):
        joint_indices_of(m, ("c",))


def test_joint_indices_copies_and_checks_its_arrays():
    src = np.array([3, 4])
    ji = JointIndices(("x", "y"), src, [7, 8], np.array([6, 7], dtype=np.int32))
    src[0] = 99
    assert ji.actuator_ids.tolist() == [3, 4]  # a copy: the caller's array stays theirs
    assert ji.dof_adr.dtype == np.int64
    with pytest.raises(ValueError, match="one index per joint"):
        JointIndices(("x", "y"), [1], [1, 2], [1, 2])
    with pytest.raises(AttributeError):
        ji.qpos_adr = np.array([0, 1])  # frozen
