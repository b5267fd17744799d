"""sim2real's ROS 2 package: a policy node for the robot and a simulated robot node.

Importing the package (and :mod:`sim2real_ros.observation`, :mod:`sim2real_ros.controller`,
:mod:`sim2real_ros.node_runtime`, :mod:`sim2real_ros.ros_env`) needs no ROS; the node
modules need rclpy and the messages. The policy node and what it imports use only
``deploy``'s torch-free modules of sim2real; :mod:`sim2real_ros.ros_env` holds the
process helpers of tests and benchmarks, which the nodes do not import.
"""

__version__ = "0.1.0"
