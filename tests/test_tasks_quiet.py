"""Building the tasks is quiet: no MuJoCo warning on stderr, no MUJOCO_LOG.TXT in the cwd.

Gymnasium's half_cheetah.xml sets the compiler attribute ``settotalmass``, which MuJoCo
deprecated; compiling it as written printed a warning and left ``MUJOCO_LOG.TXT`` in
whatever directory the user ran ``sim2real tasks`` from. ``sim.tasks.gym_base`` now
applies the total mass the way MuJoCo's migration note says, with the same model.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import mujoco
import numpy as np

ROOT = Path(__file__).resolve().parent.parent


def test_sim2real_tasks_prints_no_warning_and_leaves_no_mujoco_log(tmp_path):
    env = dict(
        os.environ, PYTHONPATH=os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])
    )
    out = subprocess.run(
        [sys.executable, "-m", "training.cli", "tasks"],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert out.returncode == 0, out.stderr
    assert "halfcheetah" in out.stdout  # the task whose model used to warn was built
    assert out.stderr.strip() == "", out.stderr
    assert sorted(p.name for p in tmp_path.iterdir()) == []
    # every row splits into its columns: a long name (instructed_reach) once ran into the
    # observation column ("instructed_reachpolicy=8")
    from sim.registry import task_names

    rows = {line.split()[0]: line.split() for line in out.stdout.splitlines()[1:]}
    assert sorted(rows) == sorted(task_names())
    for name, cols in rows.items():
        assert cols[1].startswith("policy="), (name, cols)


def test_halfcheetah_model_keeps_gymnasiums_total_mass():
    from sim.tasks.gym_base import load_gym_model

    model = load_gym_model("half_cheetah.xml")
    # the attribute's value in gymnasium's file; the scaled inertias follow the masses
    assert np.isclose(model.body_mass.sum(), 14.0)
    data = mujoco.MjData(model)
    mujoco.mj_forward(model, data)
    assert np.isclose(model.body_subtreemass[0], 14.0)  # derived constants recomputed
