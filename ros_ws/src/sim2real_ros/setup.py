"""ament_python package: `colcon build --packages-select sim2real_ros` on the robot."""

from glob import glob

from setuptools import find_packages, setup

PACKAGE = "sim2real_ros"

setup(
    name=PACKAGE,
    version="0.1.0",
    packages=find_packages(exclude=["test", "test.*"]),
    data_files=[
        ("share/ament_index/resource_index/packages", [f"resource/{PACKAGE}"]),
        (f"share/{PACKAGE}", ["package.xml"]),
        (f"share/{PACKAGE}/launch", glob("launch/*.launch.py")),
        (f"share/{PACKAGE}/config", glob("config/*.yaml")),
    ],
    install_requires=["setuptools"],
    # `colcon test` runs pytest on test/ when the package declares it as its test
    # dependency (colcon reads both spellings: tests_require, and extras_require["test"]
    # that newer setuptools and `ros2 pkg create` use)
    tests_require=["pytest"],
    extras_require={"test": ["pytest"]},
    zip_safe=True,
    maintainer="sim2real",
    maintainer_email="sim2real@example.com",
    description="ROS 2 policy node and simulated robot for sim2real ONNX policies",
    license="Apache-2.0",
    entry_points={
        "console_scripts": [
            f"policy_node = {PACKAGE}.policy_node:main",
            f"sim_robot_node = {PACKAGE}.sim_robot_node:main",
            f"vla_policy_node = {PACKAGE}.vla_policy_node:main",
            f"vla_sim_robot_node = {PACKAGE}.vla_sim_robot_node:main",
        ],
    },
)
