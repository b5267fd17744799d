"""The MuJoCo Warp backend (sim/warp_engine.py) against the C backend, on Warp's CPU
device: the same tasks from the same state and actions, randomization, partial resets,
checkpoints, and PPO training on it.

Warp compiles its kernels on first use (about a minute per task model on a CPU) into
$SIM2REAL_WARP_CACHE; later runs load them. SIM2REAL_TEST_WARP_DEVICE=cuda runs the
parity tests with Warp on a GPU (the C backend stays on the CPU).
"""

from __future__ import annotations

import math
import os

import mujoco
import numpy as np
import pytest
import torch

pytest.importorskip("mujoco_warp")

from sim.randomization import SimToRealConfig  # noqa: E402
from sim.registry import make  # noqa: E402
from sim.warp_engine import WarpEngine, warp_device  # noqa: E402

PHYSICS_STEPS = 100
DEVICE = os.environ.get("SIM2REAL_TEST_WARP_DEVICE", "cpu")


def _actions(env, step: int) -> torch.Tensor:
    """Smooth, different per env and joint: the same sequence for both backends."""
    n, a = env.num_envs, env.action_spec.size
    phase = np.arange(n)[:, None] * 0.7 + np.arange(a)[None, :] * 1.3
    low, high = env.action_spec.low, env.action_spec.high
    mid, half = (high + low) / 2, (high - low) / 2
    return torch.as_tensor(mid + 0.6 * half * np.sin(0.3 * step + phase), dtype=torch.float32)


def _pair(task: str, num_envs: int = 4, s2r=None, **kwargs):
    s2r = SimToRealConfig() if s2r is None else s2r
    c = make(task, num_envs, seed=7, s2r=s2r, **kwargs)
    w = make(task, num_envs, seed=7, s2r=s2r, backend="warp", device=DEVICE, **kwargs)
    return c, w


def _run_both(c, w, control_steps: int):
    """Step both envs with the same actions; the largest differences seen."""
    oc, ow = c.reset(), w.reset()
    worst = {"obs": float((oc["policy"] - ow["policy"].cpu()).abs().max()), "reward": 0.0}
    for t in range(control_steps):
        a = _actions(c, t)
        oc, rc, tc, truc, _ = c.step(a)
        ow, rw, tw, truw, _ = w.step(a.to(w.device))
        tw, truw = tw.cpu(), truw.cpu()
        assert torch.equal(tc, tw) and torch.equal(truc, truw), f"episode ends differ at step {t}"
        worst["obs"] = max(worst["obs"], float((oc["policy"] - ow["policy"].cpu()).abs().max()))
        worst["reward"] = max(worst["reward"], float((rc - rw.cpu()).abs().max()))
    for f in ("qpos", "qvel"):
        worst[f] = float(np.abs(c.engine.get(f) - w.engine.get(f)).max())
    return worst


@pytest.mark.parametrize("task", ["cartpole", "halfcheetah", "hopper", "walker2d", "quadruped"])
def test_warp_follows_the_c_backend_from_the_same_state_and_actions(task):
    c, w = _pair(task)
    try:
        worst = _run_both(c, w, math.ceil(PHYSICS_STEPS / c.frame_skip))
    finally:
        c.close(), w.close()
    # float32 against float64 physics over 100 physics steps
    assert worst["qpos"] < 2e-3, worst
    assert worst["qvel"] < 2e-2, worst
    assert worst["obs"] < 2e-2 and worst["reward"] < 2e-2, worst


def test_warp_ant_with_elliptic_cones_follows_the_c_backend(monkeypatch):
    """Gymnasium's ant uses pyramidal friction cones. MuJoCo Warp builds a capsule-plane
    contact's tangent frame differently from C MuJoCo (a fixed axis, not the capsule's),
    and a pyramid is not symmetric about the normal, so the two engines' friction forces
    differ from the first foot contact on (docs/benchmarks_gpu.md measures it). With
    elliptic cones, which are, the backends agree: what this tests is our engine (its
    cfrc_ext after every step, resets, observations), not that difference."""
    from sim.tasks.ant import Ant

    plain = Ant._task_model

    def elliptic(self):
        m = plain(self)
        m.opt.cone = mujoco.mjtCone.mjCONE_ELLIPTIC
        return m

    monkeypatch.setattr(Ant, "_task_model", elliptic)
    c, w = _pair("ant")
    try:
        worst = _run_both(c, w, math.ceil(PHYSICS_STEPS / c.frame_skip))
    finally:
        c.close(), w.close()
    assert worst["qpos"] < 2e-3 and worst["obs"] < 2e-2, worst


def test_warp_randomizes_the_model_as_the_c_backend_does():
    """Masses, inertias, friction and PD gains drawn per env by the same generator are
    written into Warp's per-world model fields, and the physics follows them."""
    c = make("quadruped", 4, seed=7)
    w = make("quadruped", 4, seed=7, backend="warp")
    try:
        c.reset(), w.reset()
        assert c.engine.written_model_fields == w.engine.written_model_fields
        assert {"body_mass", "geom_friction"} <= w.engine.written_model_fields
        for name in w.engine.written_model_fields:
            mc, mw = c.engine.model_field(name), w.engine.model_field(name)
            np.testing.assert_allclose(mw.reshape(mc.shape), mc, rtol=1e-6, atol=1e-6)
        # the envs really differ from each other, and from the nominal model
        mass = w.engine.model_field("body_mass")
        assert np.ptp(mass[:, w._base_id]) > 0
        # the derived constants (mj_setConst) are per env too
        sub = w.engine.model_field("body_subtreemass")
        np.testing.assert_allclose(
            sub[:, 0], c.engine.model_field("body_subtreemass")[:, 0], rtol=1e-5
        )
        # observation noise and latency come from the same generator: compare the state
        for t in range(10):
            a = _actions(c, t)
            c.step(a), w.step(a)
        dq = np.abs(c.engine.get("qpos") - w.engine.get("qpos")).max()
        assert dq < 2e-3, dq
    finally:
        c.close(), w.close()


def test_forward_of_some_envs_leaves_what_the_others_read_untouched():
    """A batch forward pass runs on every world; the envs outside `ids` must keep the
    values of their last step, as with the C engines (the task reads them next)."""
    w = make("quadruped", 3, seed=1, backend="warp")
    try:
        w.reset()
        for t in range(3):
            w.step(_actions(w, t))
        eng = w.engine
        before = {f: eng.get(f).copy() for f in ("xpos", "sensordata", "qacc_warmstart")}
        qpos = eng.get("qpos").copy()
        qpos[0, 2] += 0.05  # move env 0 only
        eng.set("qpos", qpos[:1], np.array([0]))
        eng.forward(np.array([0]))
        after = {f: eng.get(f) for f in before}
        for f in before:
            np.testing.assert_array_equal(after[f][1:], before[f][1:], err_msg=f)
        assert not np.allclose(after["xpos"][0], before["xpos"][0])  # env 0 was recomputed
    finally:
        w.close()


def test_a_warp_env_resumes_exactly_from_its_state_dict():
    w = make("hopper", 3, seed=2, backend="warp")
    try:
        w.reset()
        for t in range(5):
            w.step(_actions(w, t))
        state = w.state_dict()
        ref = [w.step(_actions(w, t))[0]["policy"].clone() for t in range(5, 10)]
        w.load_state_dict(state)
        again = [w.step(_actions(w, t))[0]["policy"] for t in range(5, 10)]
        for x, y in zip(ref, again):
            torch.testing.assert_close(x, y, rtol=0, atol=0)
    finally:
        w.close()


def test_one_env_of_a_warp_batch_renders_from_a_c_copy_of_its_state():
    w = make("halfcheetah", 2, seed=0, backend="warp")
    try:
        w.reset()
        w.step(_actions(w, 0))
        d = w.engine.get_data(1)
        np.testing.assert_allclose(d.qpos, w.engine.get("qpos")[1], atol=1e-6)
        assert d.xpos.any()  # forwarded
    finally:
        w.close()


def test_ppo_trains_on_the_warp_backend_as_on_the_c_backend(tmp_path):
    """Two PPO iterations from the same seed: the rollouts agree to float32 precision,
    so the updated weights do too."""
    from training.runner import OnPolicyRunner
    from training.train_configs import build_ppo_config

    weights = {}
    for backend in ("c", "warp"):
        over = ["run.progress=false", "run.tensorboard=false", "env.num_envs=4"]
        over += ["ppo.num_steps=16", "run.total_steps=128", "run.seed=0", f"env.backend={backend}"]
        runner = OnPolicyRunner(build_ppo_config("cartpole", over), tmp_path / backend)
        try:
            summary = runner.train()
            assert summary["iterations"] == 2 and summary["env_steps"] == 128
            assert isinstance(runner.env.engine, WarpEngine) == (backend == "warp")
            weights[backend] = {k: v.clone() for k, v in runner.policy.state_dict().items()}
        finally:
            runner.close()
    for k, v in weights["c"].items():
        torch.testing.assert_close(weights["warp"][k], v, rtol=0, atol=1e-4, msg=k)
    start = OnPolicyRunner(
        build_ppo_config("cartpole", ["run.seed=0", "env.num_envs=4", "run.tensorboard=false"]),
        tmp_path / "untrained",
    )
    moved = max(float((start.policy.state_dict()[k] - v).abs().max()) for k, v in weights["c"].items())
    start.close()
    assert moved > 1e-3  # the updates did something the comparison could miss


def test_bad_backends_and_devices_are_named():
    with pytest.raises(ValueError, match="unknown simulator backend 'vulkan'"):
        make("cartpole", 2, backend="vulkan")
    with pytest.raises(ValueError, match="runs on 'cpu' or 'cuda'"):
        warp_device(torch.device("meta"))
    from training.train_configs import build_ppo_config

    with pytest.raises(ValueError, match="env.backend must be one of"):
        build_ppo_config("cartpole", ["env.backend=gpu"])
    with pytest.raises(ValueError, match="env.backend"):
        build_ppo_config("cartpole", ['env.task_args={"backend": "warp"}'])
