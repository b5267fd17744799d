"""Run an exported VLA policy on the robot (camera + instruction + joint states).

    ros2 launch sim2real_ros vla_policy.launch.py policy:=/path/policy.onnx \
        image_topic:=/camera/color/image_raw
    ros2 topic pub --once /instruction std_msgs/msg/String "{data: 'reach the red ball'}"
    ros2 lifecycle set /sim2real_vla_policy activate     # ramps in
    ros2 lifecycle set /sim2real_vla_policy deactivate   # the safe command

The node configures itself at start (loads and checks the policy and its tokenizer); it
sends nothing until activated, and the safe command until an instruction arrives. The
camera driver must publish rgb8 or bgr8 at the size the policy was trained at. Topics
and safety settings are in config/vla_policy.yaml (`params_file:=` for another file).
"""

from launch import LaunchDescription
from launch.actions import DeclareLaunchArgument
from launch.substitutions import LaunchConfiguration, PathJoinSubstitution
from launch_ros.actions import LifecycleNode
from launch_ros.parameter_descriptions import ParameterValue
from launch_ros.substitutions import FindPackageShare


def generate_launch_description() -> LaunchDescription:
    default_params = PathJoinSubstitution(
        [FindPackageShare("sim2real_ros"), "config", "vla_policy.yaml"]
    )
    return LaunchDescription(
        [
            DeclareLaunchArgument("policy", description="the exported VLA .onnx file"),
            DeclareLaunchArgument(
                "params_file", default_value=default_params, description="node parameters"
            ),
            DeclareLaunchArgument(
                "image_topic",
                default_value="",
                description="the camera's sensor_msgs/Image topic ('': <camera>/image_raw)",
            ),
            DeclareLaunchArgument(
                "instruction", default_value="", description="the first instruction"
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
                executable="vla_policy_node",
                name="sim2real_vla_policy",
                namespace=LaunchConfiguration("namespace"),
                parameters=[
                    LaunchConfiguration("params_file"),
                    {
                        "policy_path": ParameterValue(
                            LaunchConfiguration("policy"), value_type=str
                        ),
                        "image_topic": ParameterValue(
                            LaunchConfiguration("image_topic"), value_type=str
                        ),
                        "instruction": ParameterValue(
                            LaunchConfiguration("instruction"), value_type=str
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
