"""Isaac Lab 3.0's flat velocity-tracking task with the project's quadruped.

`sim.make("isaac:Isaac-Velocity-Flat-Sim2real-Quadruped", n)` builds Isaac Lab's own
locomotion velocity env (`isaaclab_tasks.core.velocity`: its command, observation,
reward, termination and event terms) with our 12-joint quadruped (`sim/assets/
quadruped.xml`, the robot of the `quadruped` task) in place of NVIDIA's robots, whose USD
files live on an asset server this project cannot reach. The robot's USD is written by
`sim.isaac_assets` from the compiled MJCF, and so is everything here that describes it
(joint names, standing pose, PD gains, force limits, armature, friction), so that the
Isaac Lab task, the MuJoCo task and the exported metadata agree.

The config is Isaac Lab's rough-terrain base made flat the way its own flat tasks do it
(Go2 and ANYmal-D in 3.0): a plane, no height scan, no terrain curriculum, MuJoCo Warp
(Newton) physics with a small contact budget. What is ours: the articulation; the
action scale (0.25, the quadruped task's); the contact bodies (the MJCF has no foot
bodies, its feet are spheres on the calves: the feet-air-time term reads the calves);
the solver's friction cones (elliptic, impratio 100, the MJCF's, against the base's
pyramidal ones); and the rsl_rl settings (Isaac Lab's Go2 flat ones).

This module imports Isaac Lab: `sim.isaac_env` imports it, in `.venv-isaac`, after the
asset root is set, and calls `register()`.
"""

from __future__ import annotations

import gymnasium as gym
import isaaclab.sim as sim_utils
from isaaclab.actuators import ImplicitActuatorCfg
from isaaclab.assets import ArticulationCfg
from isaaclab.utils import configclass
from isaaclab_newton.sim.schemas import NewtonArticulationCfg
from isaaclab_rl.rsl_rl import RslRlMLPModelCfg, RslRlOnPolicyRunnerCfg, RslRlPpoAlgorithmCfg
from isaaclab_tasks.core.velocity.velocity_env_cfg import LocomotionVelocityRoughEnvCfg

from sim.isaac_assets import QuadrupedModel, quadruped_model, quadruped_usd

__all__ = ["TASK_ID", "QuadrupedFlatEnvCfg", "QuadrupedFlatPPORunnerCfg", "register"]

TASK_ID = "Isaac-Velocity-Flat-Sim2real-Quadruped"
BASE = "base"
FEET = ".*_calf"  # the foot spheres sit on the calves
THIGHS = ".*_thigh"
# the quadruped task's action scale (sim/tasks/quadruped.py): target = default + 0.25 a
ACTION_SCALE = 0.25
# clearance under the feet at the first step: at the MJCF's standing height (0.325 m)
# the front feet reach ~7 mm into the floor, which MuJoCo's soft contacts absorb
DROP = 0.01


def robot_cfg(model: QuadrupedModel | None = None) -> ArticulationCfg:
    """Our quadruped as an Isaac Lab articulation: the stand-in USD, the standing pose
    of the MJCF's "home" keyframe, and one implicit PD actuator group (the physics
    engine's PD, as the MJCF's position actuators are MuJoCo's) with the MJCF's gains."""
    model = model or quadruped_model()
    joints = model.joints

    def per_joint(field: str) -> dict[str, float]:
        return {j.name: getattr(j, field) for j in joints}

    return ArticulationCfg(
        prim_path="{ENV_REGEX_NS}/Robot",
        spawn=sim_utils.UsdFileCfg(
            usd_path=str(quadruped_usd()),
            activate_contact_sensors=True,
            # the MJCF's geoms collide with the floor only
            articulation_props=NewtonArticulationCfg(self_collision_enabled=False),
        ),
        init_state=ArticulationCfg.InitialStateCfg(
            pos=(0.0, 0.0, model.standing_height + DROP),
            joint_pos=per_joint("default"),
            joint_vel={".*": 0.0},
        ),
        actuators={
            "legs": ImplicitActuatorCfg(
                joint_names_expr=[j.name for j in joints],
                stiffness=per_joint("kp"),
                damping=per_joint("kd"),
                joint_effort_limit=per_joint("effort"),
                armature=per_joint("armature"),
                friction=per_joint("friction"),
                viscous_friction=per_joint("damping"),
            ),
        },
    )


@configclass
class QuadrupedFlatEnvCfg(LocomotionVelocityRoughEnvCfg):
    """Isaac Lab's velocity-tracking task on flat ground with our quadruped."""

    def __post_init__(self):
        super().__post_init__()
        model = quadruped_model()
        self.scene.robot = robot_cfg(model)
        # flat ground, as Isaac Lab's flat velocity tasks make it
        physics = self.sim.physics.newton_mjwarp
        # ~13 colliders against the floor: Go2's flat budget with room for a fallen trunk
        physics.solver_cfg.njmax = 100
        physics.solver_cfg.nconmax = 40
        physics.solver_cfg.cone = "elliptic"
        physics.solver_cfg.impratio = 100.0
        self.sim.physics.default = physics
        self.scene.terrain.terrain_type = "plane"
        self.scene.terrain.terrain_generator = None
        self.scene.height_scanner = None
        self.observations.policy.height_scan = None
        self.curriculum.terrain_levels = None
        # actions: our joint order (the quadruped task's), our scale
        self.actions.joint_pos.joint_names = [j.name for j in model.joints]
        self.actions.joint_pos.preserve_order = True
        self.actions.joint_pos.scale = ACTION_SCALE
        # rewards: Isaac Lab's small-quadruped weights (Go1 / Go2), flat-ground terms
        self.rewards.feet_air_time.params["sensor_cfg"].body_names = FEET
        self.rewards.feet_air_time.weight = 0.25
        self.rewards.undesired_contacts.params["sensor_cfg"].body_names = THIGHS
        self.rewards.flat_orientation_l2.weight = -2.5
        self.rewards.dof_torques_l2.weight = -0.0002
        self.rewards.track_lin_vel_xy_exp.weight = 1.5
        self.rewards.track_ang_vel_z_exp.weight = 0.75
        # the trunk touching the floor ends an episode; randomization acts on the trunk
        self.terminations.base_contact.params["sensor_cfg"].body_names = BASE
        self.events.add_base_mass.params["asset_cfg"].body_names = BASE
        self.events.base_com.params["asset_cfg"].body_names = BASE
        self.events.base_external_force_torque.params["asset_cfg"].body_names = BASE


@configclass
class QuadrupedFlatPPORunnerCfg(RslRlOnPolicyRunnerCfg):
    """Isaac Lab's rsl_rl settings for its Go2 flat task (128-128-128 ELU, std 1, 24
    steps, 5 x 4 minibatches, adaptive rate from 1e-3, entropy 0.01)."""

    num_steps_per_env = 24
    max_iterations = 300
    save_interval = 50
    experiment_name = "sim2real_quadruped_flat"
    obs_groups = {"actor": ["policy"], "critic": ["policy"]}
    actor = RslRlMLPModelCfg(
        hidden_dims=[128, 128, 128],
        activation="elu",
        obs_normalization=False,
        distribution_cfg=RslRlMLPModelCfg.GaussianDistributionCfg(init_std=1.0),
    )
    critic = RslRlMLPModelCfg(
        hidden_dims=[128, 128, 128], activation="elu", obs_normalization=False
    )
    algorithm = RslRlPpoAlgorithmCfg(
        value_loss_coef=1.0,
        use_clipped_value_loss=True,
        clip_param=0.2,
        entropy_coef=0.01,
        num_learning_epochs=5,
        num_mini_batches=4,
        learning_rate=1.0e-3,
        schedule="adaptive",
        gamma=0.99,
        lam=0.95,
        desired_kl=0.01,
        max_grad_norm=1.0,
    )


def register() -> None:
    """Register the task with gymnasium, where Isaac Lab's resolver finds its tasks."""
    if TASK_ID in gym.registry:
        return
    gym.register(
        id=TASK_ID,
        entry_point="isaaclab.envs:ManagerBasedRLEnv",
        disable_env_checker=True,
        kwargs={
            "env_cfg_entry_point": f"{__name__}:QuadrupedFlatEnvCfg",
            "rsl_rl_cfg_entry_point": f"{__name__}:QuadrupedFlatPPORunnerCfg",
        },
    )
