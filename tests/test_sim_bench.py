"""`sim2real bench sim` (sim/bench.py): interleaved rounds, per-round ratios, the EnvPool
peer in its own interpreter, and the idle-machine rule for docs/."""

from __future__ import annotations

import json
import sys

import pytest

from sim import bench
from sim.machine_load import LoadMonitor, Sample


def test_rounds_interleave_and_rows_hold_every_round():
    monitor = LoadMonitor(own_threads=2)
    rows = bench.run(
        ["cartpole"], [1, 3], seconds=0.02, async_max_envs=0, progress=lambda s: None,
        rounds=2, monitor=monitor,
    )  # fmt: skip
    one, three = rows
    assert set(one.rounds) == {"hw_limit", "ours", "engine", "gym_single", "gym_sync"}
    assert "gym_single" not in three.rounds  # one Gymnasium env is the peer at 1 env only
    for r in rows:
        assert all(len(v) == 2 for v in r.rounds.values())
        assert r.ours == pytest.approx(
            sorted(r.rounds["ours"])[0] / 2 + sorted(r.rounds["ours"])[1] / 2
        )
        per_round = [o / h for o, h in zip(r.rounds["ours"], r.rounds["hw_limit"], strict=True)]
        assert r.frac_of_limit == pytest.approx(sum(per_round) / 2)
        assert r.ours > 0 and r.hw_limit > 0
        # the engine alone is the floor under ours: the same physics without the task's
        # Python (cartpole's physics is a few us, its Python far more). Each round's engine
        # time is a part of that round's own run, so the ratio is read per round; in a
        # 20 ms window one preemption inside the physics calls can halve a round's engine
        # figure on a loaded machine, so the best round decides. At 3 envs the batch's
        # dispatch to its threads is part of the engine's time: 2.2-3.4x on a loaded
        # machine (CI failed a 2x bound on the medians with 1.99x); the Python-free floor
        # must still be well clear of ours, which 1.5x says
        ratios = [e / o for e, o in zip(r.rounds["engine"], r.rounds["ours"], strict=True)]
        assert max(ratios) > 1.5, ratios
        per_round = [e / h for e, h in zip(r.rounds["engine"], r.rounds["hw_limit"], strict=True)]
        assert r.engine_frac_of_limit == pytest.approx(sum(per_round) / 2)
    # ours over the fastest Gymnasium figure of each round
    best = [
        max(s, g) for s, g in zip(one.rounds["gym_single"], one.rounds["gym_sync"], strict=True)
    ]
    want = sorted(o / b for o, b in zip(one.rounds["ours"], best, strict=True))
    assert bench.best_gym_ratio(one) == pytest.approx(sum(want) / 2)
    assert len(monitor.samples) == 2 * 4 + 2 * 3  # a reading after every measurement


def test_envpool_peer_runs_in_its_own_interpreter(tmp_path, monkeypatch):
    """A stand-in interpreter that prints the peer's JSON line: the figure goes into the
    row; a failing one is an error that names the command."""
    fake = tmp_path / "python"
    fake.write_text(
        "#!/bin/sh\n"
        f'{sys.executable} -c \'import json,sys; print(json.dumps({{"rate": 1234.0, '
        '"envpool": "fake"}))\'\n'
    )
    fake.chmod(0o755)
    rows = bench.run(
        ["cartpole"], [2], seconds=0.02, async_max_envs=0, sync_max_envs=0,
        progress=lambda s: None, rounds=2, envpool=fake,
    )  # fmt: skip
    assert rows[0].envpool == 1234.0 and rows[0].rounds["envpool"] == [1234.0, 1234.0]
    assert rows[0].ratio("envpool") == pytest.approx(rows[0].ours / 1234.0, rel=0.5)
    # the quadruped has no EnvPool counterpart: not measured, not an error
    (quad,) = bench.run(
        ["quadruped"], [2], seconds=0.01, async_max_envs=0, sync_max_envs=0,
        progress=lambda s: None, rounds=1, envpool=fake,
    )  # fmt: skip
    assert quad.envpool is None and quad.ratio("envpool") is None
    bad = tmp_path / "bad"
    bad.write_text("#!/bin/sh\necho boom >&2\nexit 2\n")
    bad.chmod(0o755)
    with pytest.raises(RuntimeError, match="(?s)EnvPool peer failed.*boom"):
        bench.run(["cartpole"], [1], seconds=0.01, async_max_envs=0, progress=lambda s: None,
                  rounds=1, envpool=bad)  # fmt: skip
    with pytest.raises(FileNotFoundError, match="setup_envpool"):
        bench.envpool_python(str(tmp_path / "missing"))


def test_docs_are_not_written_on_a_busy_machine(tmp_path, monkeypatch, capsys):
    class Busy(LoadMonitor):
        def __init__(self, own_threads: int = 1) -> None:
            super().__init__(own_threads=own_threads, before=Sample(3.0, 3.0, 3.0, 5))

    monkeypatch.setattr(bench, "LoadMonitor", Busy)
    doc, js = tmp_path / "table.md", tmp_path / "rows.json"
    args = dict(seconds=0.02, async_max_envs=0, rounds=1, no_envpool=True, wait_s=0)
    assert bench.report(["cartpole"], [2], json_out=str(js), doc=str(doc), **args) == 3
    assert not doc.exists() and "not written to docs/" in capsys.readouterr().out
    assert json.loads(js.read_text())["busy"] is True  # the raw rows are still kept
    assert bench.report(["cartpole"], [2], doc=str(doc), allow_busy=True, **args) == 0
    text = doc.read_text()
    assert "**BUSY machine" in text and "| cartpole | 2 |" in text


def test_bad_rounds():
    with pytest.raises(ValueError, match="rounds must be >= 1"):
        bench.run(["cartpole"], [1], rounds=0)
