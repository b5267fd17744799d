"""The ROS package's launch files, parameter files and entry points agree (no ROS needed).

``ros2 launch`` cannot be installed from PyPI, so the launch files are checked by
reading them: every executable they start is an entry point of setup.py, every
parameter file and included launch file they name is in the package and installed by
setup.py, and every key of the parameter files is a parameter the node declares. The
DDS tests (test_ros_nodes.py, beside this file) start the same executables with the same files.
"""

from __future__ import annotations

import ast
import re
import sys
from pathlib import Path

import pytest

PKG = Path(__file__).resolve().parent.parent  # ros_ws/src/sim2real_ros
LAUNCH_FILES = sorted((PKG / "launch").glob("*.launch.py"))
NODE_MODULES = {
    "policy_node": "policy_node.py",
    "sim_robot_node": "sim_robot_node.py",
    "vla_policy_node": "vla_policy_node.py",
    "vla_sim_robot_node": "vla_sim_robot_node.py",
}


def _calls(tree: ast.AST, names: set[str]) -> list[ast.Call]:
    out = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Call):
            f = node.func
            name = f.id if isinstance(f, ast.Name) else getattr(f, "attr", None)
            if name in names:
                out.append(node)
    return out


def _kw(call: ast.Call, name: str) -> ast.AST | None:
    return next((k.value for k in call.keywords if k.arg == name), None)


def _entry_points() -> dict[str, str]:
    tree = ast.parse((PKG / "setup.py").read_text())
    scripts: dict[str, str] = {}
    for node in ast.walk(tree):
        if isinstance(node, ast.Dict):
            for k, v in zip(node.keys, node.values):
                if isinstance(k, ast.Constant) and k.value == "console_scripts":
                    for item in v.elts:
                        text = item.value if isinstance(item, ast.Constant) else None
                        if text is None:  # an f-string: f"name = {PACKAGE}.module:main"
                            text = "".join(
                                p.value if isinstance(p, ast.Constant) else "sim2real_ros"
                                for p in item.values
                            )
                        name, target = (s.strip() for s in text.split("="))
                        scripts[name] = target
    return scripts


def _strings(node: ast.AST) -> list[str]:
    return [
        n.value for n in ast.walk(node) if isinstance(n, ast.Constant) and isinstance(n.value, str)
    ]


def _declared_parameters(module_file: str) -> set[str]:
    tree = ast.parse((PKG / "sim2real_ros" / module_file).read_text())
    for node in ast.walk(tree):
        if isinstance(node, (ast.Assign, ast.AnnAssign)):
            target = node.targets[0] if isinstance(node, ast.Assign) else node.target
            if isinstance(target, ast.Name) and target.id == "PARAMETERS":
                return {k.value for k in node.value.keys}
    raise AssertionError(f"{module_file} has no PARAMETERS table")


def _yaml_keys(path: Path, commented: bool = False) -> set[str]:
    # the files are flat: `/**:` / `ros__parameters:` / `name: value` (PyYAML-free parse);
    # commented: the list parameters documented as `# name: [example]` (unset by default)
    pattern = r"^ {4}# ([A-Za-z_][A-Za-z0-9_]*): \[" if commented else r"^ {4}([A-Za-z_]\w*):"
    keys = set()
    for line in path.read_text().splitlines():
        m = re.match(pattern, line)
        if m:
            keys.add(m.group(1))
    return keys


def test_package_layout():
    for rel in (
        "package.xml",
        "setup.py",
        "setup.cfg",
        "resource/sim2real_ros",
        "sim2real_ros/__init__.py",
        "launch/policy.launch.py",
        "launch/sim.launch.py",
        "config/policy.yaml",
        "config/sim.yaml",
        "launch/vla_policy.launch.py",
        "launch/vla_sim.launch.py",
        "config/vla_policy.yaml",
        "config/vla_sim.yaml",
    ):
        assert (PKG / rel).exists(), rel
    xml = (PKG / "package.xml").read_text()
    assert "<build_type>ament_python</build_type>" in xml
    for dep in (
        "rclpy",
        "sensor_msgs",
        "std_msgs",
        "geometry_msgs",
        "trajectory_msgs",
        "diagnostic_msgs",
        "lifecycle_msgs",
        "launch_ros",
    ):
        assert f"<exec_depend>{dep}</exec_depend>" in xml, dep
    cfg = (PKG / "setup.cfg").read_text()
    assert "$base/lib/sim2real_ros" in cfg  # where `ros2 run/launch` look for executables


def test_entry_points_resolve_to_main_functions():
    scripts = _entry_points()
    assert set(scripts) == set(NODE_MODULES)
    for name, target in scripts.items():
        module, func = target.split(":")
        assert module == f"sim2real_ros.{name}"
        tree = ast.parse((PKG / "sim2real_ros" / NODE_MODULES[name]).read_text())
        assert any(isinstance(n, ast.FunctionDef) and n.name == func for n in tree.body), target


def test_setup_installs_launch_and_config_files():
    text = (PKG / "setup.py").read_text()
    assert 'glob("launch/*.launch.py")' in text and 'glob("config/*.yaml")' in text
    assert "share/ament_index/resource_index/packages" in text


@pytest.mark.parametrize("launch_file", LAUNCH_FILES, ids=lambda p: p.name)
def test_launch_file_names_only_existing_things(launch_file):
    tree = ast.parse(launch_file.read_text())
    assert any(
        isinstance(n, ast.FunctionDef) and n.name == "generate_launch_description"
        for n in tree.body
    )
    scripts = _entry_points()
    nodes = _calls(tree, {"Node", "LifecycleNode"})
    assert nodes, "the launch file starts no node"
    for call in nodes:
        package = _kw(call, "package")
        executable = _kw(call, "executable")
        assert isinstance(package, ast.Constant) and package.value == "sim2real_ros"
        assert isinstance(executable, ast.Constant), "executable must be a literal"
        assert executable.value in scripts, f"{executable.value} is not an entry point"
        assert _kw(call, "name") is not None
        assert _kw(call, "parameters") is not None
    # every file it names: config/*.yaml and launch/*.launch.py inside the package
    for call in _calls(tree, {"PathJoinSubstitution"}):
        parts = _strings(call)
        if "config" in parts:
            name = parts[parts.index("config") + 1]
            assert (PKG / "config" / name).is_file(), name
        if "launch" in parts:
            name = parts[parts.index("launch") + 1]
            assert (PKG / "launch" / name).is_file(), name
    shares = _calls(tree, {"FindPackageShare"})
    assert shares and all(_strings(c) == ["sim2real_ros"] for c in shares)
    for s in _strings(tree):
        if s.endswith((".yaml", ".launch.py")) and "/" not in s:
            assert (PKG / "config" / s).is_file() or (PKG / "launch" / s).is_file(), s


@pytest.mark.parametrize("prefix", ["", "vla_"])
def test_policy_launch_takes_the_policy_argument(prefix):
    tree = ast.parse((PKG / "launch" / f"{prefix}policy.launch.py").read_text())
    args = {_strings(c)[0] for c in _calls(tree, {"DeclareLaunchArgument"})}
    assert {"policy", "params_file", "autostart"} <= args
    (node,) = _calls(tree, {"LifecycleNode"})
    params = _strings(_kw(node, "parameters"))
    assert "policy_path" in params and "policy" in params
    assert _kw(node, "executable").value == f"{prefix}policy_node"


@pytest.mark.parametrize("prefix", ["", "vla_"])
def test_sim_launch_runs_the_robot_launch_unchanged_plus_the_simulated_robot(prefix):
    tree = ast.parse((PKG / "launch" / f"{prefix}sim.launch.py").read_text())
    (include,) = _calls(tree, {"IncludeLaunchDescription"})
    assert f"{prefix}policy.launch.py" in _strings(include)
    (sim,) = _calls(tree, {"Node"})
    assert _kw(sim, "executable").value == f"{prefix}sim_robot_node"
    strings = _strings(tree)
    assert f"{prefix}policy.yaml" in strings and f"{prefix}sim.yaml" in strings
    assert "activate" in strings  # autostart:=activate for the rehearsal


@pytest.mark.parametrize(
    "config, module",
    [
        ("policy.yaml", "policy_node.py"),
        ("sim.yaml", "sim_robot_node.py"),
        ("vla_policy.yaml", "vla_policy_node.py"),
        ("vla_sim.yaml", "vla_sim_robot_node.py"),
    ],
)
def test_parameter_files_set_only_declared_parameters(config, module):
    text = (PKG / "config" / config).read_text()
    assert text.lstrip("# \n").count("ros__parameters:") == 1
    assert re.search(r"^/\*\*:\s*$", text, re.M), "parameters apply to any node name (/**)"
    keys = _yaml_keys(PKG / "config" / config)
    declared = _declared_parameters(module)
    assert keys, config
    assert keys <= declared, f"undeclared parameters in {config}: {sorted(keys - declared)}"
    if config == "policy.yaml":
        unset = _yaml_keys(PKG / "config" / config, commented=True)
        assert unset == {"kp", "kd"}  # unset: the policy's trained gains
        documented = keys | unset
        assert documented == declared, f"undocumented parameters: {sorted(declared - documented)}"
    if config == "vla_policy.yaml":
        unset = _yaml_keys(PKG / "config" / config, commented=True)
        assert unset == {"instructions"}  # unset: the sentences the export recorded
        documented = keys | unset
        assert documented == declared, f"undocumented parameters: {sorted(declared - documented)}"
    if config == "vla_sim.yaml":
        assert keys == declared, f"undocumented parameters: {sorted(declared - keys)}"


def test_topics_of_the_two_nodes_meet():
    policy = (PKG / "config" / "policy.yaml").read_text()
    sim = (PKG / "config" / "sim.yaml").read_text()

    def value(text, key):
        return re.search(rf"^\s+{key}:\s*(\S+)", text, re.M).group(1)

    for key in ("joint_states_topic", "imu_topic", "command_topic"):
        assert value(policy, key) == value(sim, key), key
    vla_policy = (PKG / "config" / "vla_policy.yaml").read_text()
    vla_sim = (PKG / "config" / "vla_sim.yaml").read_text()
    for key in ("joint_states_topic", "fingertip_topic", "instruction_topic", "image_topic"):
        assert value(vla_policy, key) == value(vla_sim, key), key
    # "" on the policy side: the effort topic, as the policy is torque-controlled
    assert value(vla_policy, "command_topic") == '""'
    assert value(vla_sim, "command_topic") == "forward_effort_controller/commands"


def test_package_imports_without_ros():
    # the non-node modules need no rclpy (checked by reading their imports)
    for module in (
        "__init__.py",
        "observation.py",
        "controller.py",
        "node_runtime.py",
        "ros_env.py",
        "gains.py",
        "vla_observation.py",
        "vla_controller.py",
    ):
        tree = ast.parse((PKG / "sim2real_ros" / module).read_text())
        top = [n for n in tree.body if isinstance(n, (ast.Import, ast.ImportFrom))]
        names = [a.name for n in top for a in n.names] + [
            n.module for n in top if isinstance(n, ast.ImportFrom) and n.module
        ]
        assert not any(name.split(".")[0] in ("rclpy", "sensor_msgs", "std_msgs") for name in names)


# what a robot computer has: the policy node may import nothing else, not even lazily
ROBOT_DEPLOY_MODULES = {"deploy.runtime", "deploy.safety", "deploy.metadata", "deploy.arrays"}
ROBOT_ROOTS = {"numpy", "rclpy", "builtin_interfaces", "rcl_interfaces"}


def _module_file(module: str) -> Path:
    path = PKG / (module.replace(".", "/") + ".py")
    return path if path.exists() else PKG / module.replace(".", "/") / "__init__.py"


def _imports(path: Path) -> list[str]:
    """Every module that ``path`` imports, at the top or inside functions, absolute."""
    names = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            names += [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = "sim2real_ros" if node.level else ""
            module = ".".join(p for p in (base, node.module or "") if p)
            if node.module is None or module in ("sim2real_ros", "deploy"):
                # `from pkg import mod` imports the module pkg.mod (or a name of pkg)
                names += [f"{module}.{a.name}" for a in node.names]
            names.append(module)
    return names


# the VLA node also has the VLA runtime (onnxruntime and `tokenizers`, no torch)
VLA_DEPLOY_MODULES = ROBOT_DEPLOY_MODULES | {"deploy.vla_runtime"}


@pytest.mark.parametrize("node", ["policy_node", "vla_policy_node"])
def test_policy_node_imports_only_what_a_robot_has(node):
    deploy_modules = VLA_DEPLOY_MODULES if node == "vla_policy_node" else ROBOT_DEPLOY_MODULES
    seen: set[str] = set()
    todo = ["sim2real_ros", f"sim2real_ros.{node}"]
    while todo:
        module = todo.pop()
        if module in seen:
            continue
        seen.add(module)
        for name in _imports(_module_file(module)):
            root = name.split(".")[0]
            if root == "sim2real_ros":
                if _module_file(name).exists():
                    todo.append(name)
            elif root == "deploy":
                assert name == "deploy" or name in deploy_modules, f"{module} imports {name}"
            else:
                allowed = (
                    root in sys.stdlib_module_names
                    or root in ROBOT_ROOTS
                    or root.endswith(("_msgs", "_srvs"))
                )
                assert allowed, f"{module} imports {name}"
    # the walk really followed the node's own modules
    own = {"sim2real_ros.controller", "sim2real_ros.observation"}
    own |= (
        {"sim2real_ros.vla_controller", "sim2real_ros.vla_observation"}
        if "vla" in node
        else {"sim2real_ros.gains"}
    )
    assert own <= seen
    assert "sim2real_ros.node_runtime" in seen
    assert "sim2real_ros.ros_env" not in seen


def test_package_reads_no_private_attribute_of_other_objects():
    # the simulated robot reads the simulator through its public API (joint_indices...)
    for path in sorted((PKG / "sim2real_ros").glob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if not isinstance(node, ast.Attribute):
                continue
            name = node.attr
            if not name.startswith("_") or (name.startswith("__") and name.endswith("__")):
                continue
            owner = node.value
            assert isinstance(owner, ast.Name) and owner.id in ("self", "cls"), (
                f"{path.name}:{node.lineno} reads {ast.unparse(node)}"
            )
