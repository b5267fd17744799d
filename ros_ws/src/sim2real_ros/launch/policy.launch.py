"""Run an exported policy on the robot.

    ros2 launch sim2real_ros policy.launch.py policy:=/path/policy.onnx
    ros2 lifecycle set /sim2real_policy activate      # start walking (ramps in)
    ros2 lifecycle set /sim2real_policy deactivate    # back to the safe posture

The node configures itself at start (loads and checks the policy, subscribes to the
sensors); it sends nothing until activated. `autostart:=activate` activates it as soon
as fresh sensor data arrives (sim.launch.py does that). Topics and safety settings are in
config/policy.yaml (`params_file:=` for another file); remap the topics to the robot's
with the usual `--ros-args -r` or edit the file.
"""

from launch import LaunchDescription
from launch.actions import DeclareLaunchArgument
from launch.substitutions import LaunchConfiguration, PathJoinSubstitution
from launch_ros.actions import LifecycleNode
from launch_ros.parameter_descriptions import ParameterValue
from launch_ros.substitutions import FindPackageShare


def generate_launch_description() -> LaunchDescription:
    default_params = PathJoinSubstitution(
        [FindPackageShare("sim2real_ros"), "config", "policy.yaml"]
    )
    return LaunchDescription(
        [
            DeclareLaunchArgument("policy", description="the exported .onnx policy file"),
            DeclareLaunchArgument(
                "params_file", default_value=default_params, description="node parameters"
            ),
            DeclareLaunchArgument(
                "autostart",
                default_value="configure",
                choices=["none", "configure", "activate"],
                description="lifecycle transitions the node makes by itself at start",
            ),
            DeclareLaunchArgument("namespace", default_value="", description="node namespace"),
            LifecycleNode(
                package="sim2real_ros",
                executable="policy_node",
                name="sim2real_policy",
                namespace=LaunchConfiguration("namespace"),
                parameters=[
                    LaunchConfiguration("params_file"),
                    {
                        "policy_path": ParameterValue(
                            LaunchConfiguration("policy"), value_type=str
                        ),
                        "autostart": ParameterValue(
                            LaunchConfiguration("autostart"), value_type=str
                        ),
                    },
                ],
                output="screen",
                emulate_tty=True,
            ),
        ]
    )
