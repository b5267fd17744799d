"""Rehearse the robot launch against the simulated robot.

    ros2 launch sim2real_ros sim.launch.py policy:=/path/policy.onnx
    ros2 topic pub -r 10 /cmd_vel geometry_msgs/msg/Twist "{linear: {x: 0.5}}"

Runs policy.launch.py unchanged (same node, same config/policy.yaml) with
`autostart:=activate`, and sim_robot_node with config/sim.yaml: our MuJoCo model of the
policy's robot, stepped in real time, publishing JointState and Imu and taking the
joint position targets, on the same topics as the robot. `randomize:=true` turns on the
training's sim-to-real randomization and latency.
"""

from launch import LaunchDescription
from launch.actions import DeclareLaunchArgument, IncludeLaunchDescription
from launch.launch_description_sources import PythonLaunchDescriptionSource
from launch.substitutions import LaunchConfiguration, PathJoinSubstitution
from launch_ros.actions import Node
from launch_ros.parameter_descriptions import ParameterValue
from launch_ros.substitutions import FindPackageShare


def generate_launch_description() -> LaunchDescription:
    share = FindPackageShare("sim2real_ros")
    return LaunchDescription(
        [
            DeclareLaunchArgument("policy", description="the exported .onnx policy file"),
            DeclareLaunchArgument(
                "params_file",
                default_value=PathJoinSubstitution([share, "config", "policy.yaml"]),
                description="policy node parameters (the robot's file)",
            ),
            DeclareLaunchArgument(
                "sim_params_file",
                default_value=PathJoinSubstitution([share, "config", "sim.yaml"]),
                description="simulated robot parameters",
            ),
            DeclareLaunchArgument(
                "randomize",
                default_value="false",
                choices=["true", "false"],
                description="the training's sim-to-real randomization, noise and latency",
            ),
            DeclareLaunchArgument("namespace", default_value="", description="namespace"),
            Node(
                package="sim2real_ros",
                executable="sim_robot_node",
                name="sim_robot",
                namespace=LaunchConfiguration("namespace"),
                parameters=[
                    LaunchConfiguration("sim_params_file"),
                    {
                        "randomize": ParameterValue(
                            LaunchConfiguration("randomize"), value_type=bool
                        )
                    },
                ],
                output="screen",
                emulate_tty=True,
            ),
            IncludeLaunchDescription(
                PythonLaunchDescriptionSource(
                    PathJoinSubstitution([share, "launch", "policy.launch.py"])
                ),
                launch_arguments={
                    "policy": LaunchConfiguration("policy"),
                    "params_file": LaunchConfiguration("params_file"),
                    "namespace": LaunchConfiguration("namespace"),
                    "autostart": "activate",
                }.items(),
            ),
        ]
    )
