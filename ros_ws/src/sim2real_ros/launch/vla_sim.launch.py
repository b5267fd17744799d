"""Rehearse the VLA robot launch against the simulated arm and its camera.

    ros2 launch sim2real_ros vla_sim.launch.py policy:=/path/policy.onnx
    ros2 topic pub --once /instruction std_msgs/msg/String "{data: 'reach the blue ball'}"

Runs vla_policy.launch.py unchanged (same node, same config/vla_policy.yaml) with
`autostart:=activate`, and vla_sim_robot_node with config/vla_sim.yaml: the task's env
stepped in real time, publishing camera images, joint states and the fingertip, taking
the effort commands and the instruction, on the same topics as the robot.
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
            DeclareLaunchArgument("policy", description="the exported VLA .onnx file"),
            DeclareLaunchArgument(
                "params_file",
                default_value=PathJoinSubstitution([share, "config", "vla_policy.yaml"]),
                description="VLA policy node parameters (the robot's file)",
            ),
            DeclareLaunchArgument(
                "sim_params_file",
                default_value=PathJoinSubstitution([share, "config", "vla_sim.yaml"]),
                description="simulated arm parameters",
            ),
            DeclareLaunchArgument(
                "image_size", default_value="64", description="camera frames (the policy's)"
            ),
            DeclareLaunchArgument(
                "instruction",
                default_value="reach the red ball",
                description="the first instruction",
            ),
            DeclareLaunchArgument("namespace", default_value="", description="namespace"),
            Node(
                package="sim2real_ros",
                executable="vla_sim_robot_node",
                name="sim_vla_robot",
                namespace=LaunchConfiguration("namespace"),
                parameters=[
                    LaunchConfiguration("sim_params_file"),
                    {
                        "image_size": ParameterValue(
                            LaunchConfiguration("image_size"), value_type=int
                        ),
                        "instruction": ParameterValue(
                            LaunchConfiguration("instruction"), value_type=str
                        ),
                    },
                ],
                output="screen",
                emulate_tty=True,
            ),
            IncludeLaunchDescription(
                PythonLaunchDescriptionSource(
                    PathJoinSubstitution([share, "launch", "vla_policy.launch.py"])
                ),
                launch_arguments={
                    "policy": LaunchConfiguration("policy"),
                    "params_file": LaunchConfiguration("params_file"),
                    "instruction": LaunchConfiguration("instruction"),
                    "namespace": LaunchConfiguration("namespace"),
                    "autostart": "activate",
                }.items(),
            ),
        ]
    )
