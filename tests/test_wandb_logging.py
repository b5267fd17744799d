"""Weights & Biases beside TensorBoard (run.wandb), and the hyperparameters in TensorBoard.

W&B runs offline here (WANDB_MODE=offline, WANDB_DIR in tmp_path, no network, no login):
an offline run is a directory ``wandb/offline-run-<time>-<id>/`` whose ``run-<id>.wandb``
file holds the run's records (config, history rows, summary) as W&B's protobuf
``Record`` messages in a leveldb-style log, read back below without any W&B service.
"""

from __future__ import annotations

import json
import struct
import time
from pathlib import Path

import pytest

pytest.importorskip("wandb")

from training.cli import main as cli_main  # noqa: E402
from training.logger import WANDB_ID_FILE, RunLogger, flatten_config, log_final_evaluation  # noqa: E402
from training.train_configs import build_ppo_config  # noqa: E402

TINY = [
    "env.num_envs=4",
    "ppo.num_steps=8",
    "policy.actor_hidden=16,16",
    "policy.critic_hidden=16,16",
]
QUIET = ["run.progress=false", "run.video=false", "run.eval_episodes=2"]
WANDB = ["run.wandb=true", "run.wandb_mode=offline", "run.wandb_project=sim2real-tests"]


@pytest.fixture
def offline_wandb(tmp_path, monkeypatch):
    """W&B with no network and no files outside tmp_path; returns WANDB_DIR."""
    home = tmp_path / "wandb_home"
    home.mkdir()
    monkeypatch.setenv("WANDB_MODE", "offline")
    monkeypatch.setenv("WANDB_DIR", str(home))
    monkeypatch.setenv("WANDB_SILENT", "true")
    for var in ("WANDB_CONFIG_DIR", "WANDB_CACHE_DIR", "WANDB_DATA_DIR", "WANDB_ARTIFACT_DIR"):
        monkeypatch.setenv(var, str(tmp_path / "wandb_state" / var.lower()))
    monkeypatch.delenv("WANDB_API_KEY", raising=False)
    monkeypatch.delenv("WANDB_RUN_ID", raising=False)
    monkeypatch.delenv("WANDB_RESUME", raising=False)
    return home


# ---------------------------------------------------------------------- reading what W&B wrote
def _wandb_records(path: Path):
    """The ``Record`` messages of a ``.wandb`` file (7-byte header, then 32 KiB blocks of
    chunks, each with a 7-byte header: crc32, length, type full/first/middle/last)."""
    from wandb.proto import wandb_internal_pb2 as pb

    data = path.read_bytes()
    assert data[:4] == b":W&B", f"{path} is not a W&B run file"
    pos, chunk = 7, b""
    while pos + 7 <= len(data):
        if 32768 - pos % 32768 < 7:  # a block's tail too short for a header is padding
            pos += 32768 - pos % 32768
            continue
        _crc, length, kind = struct.unpack("<IHB", data[pos : pos + 7])
        if kind == 0 or pos + 7 + length > len(data):  # the end, or a chunk still being written
            break
        chunk += data[pos + 7 : pos + 7 + length]
        pos += 7 + length
        if kind in (1, 4):  # full, or the last chunk of a record
            record = pb.Record()
            record.ParseFromString(chunk)
            chunk = b""
            yield record


def _item_key(item) -> str:
    return item.key or ".".join(item.nested_key)


def _closed_run_records(run_file: Path, timeout: float = 60.0) -> list:
    """The records of a run file once W&B has written its ``exit`` record.

    The file is written by W&B's service process, which may still be writing it when
    ``run.finish()`` has returned (seen on a loaded CI machine: a segment without its
    last history row); a run segment is complete only with its ``exit`` record.
    """
    deadline = time.monotonic() + timeout
    while True:
        records = list(_wandb_records(run_file))
        kinds = [r.WhichOneof("record_type") for r in records]
        if "exit" in kinds or time.monotonic() > deadline:
            assert "exit" in kinds, f"{run_file} has no exit record after {timeout} s: {kinds}"
            return records
        time.sleep(0.1)


def _read_offline_run(run_file: Path) -> dict:
    out: dict = {"config": {}, "history": [], "summary": {}, "run_id": None}
    for r in _closed_run_records(run_file):
        kind = r.WhichOneof("record_type")
        if kind == "run":
            out["run_id"], out["project"] = r.run.run_id, r.run.project
            out["config"].update(
                {_item_key(i): json.loads(i.value_json) for i in r.run.config.update}
            )
        elif kind == "history":
            out["history"].append({_item_key(i): json.loads(i.value_json) for i in r.history.item})
        elif kind == "summary":
            out["summary"].update(
                {_item_key(i): json.loads(i.value_json) for i in r.summary.update}
            )
    return out


def _offline_runs(wandb_dir: Path) -> list[Path]:
    """The run files of every offline W&B run segment, in the order they started
    (``offline-run-<time>-<id>``, with ``-1``, ``-2``... for more in the same second)."""
    return sorted(
        (wandb_dir / "wandb").glob("offline-run-*/run-*.wandb"), key=lambda p: p.parent.name
    )


def _tensorboard_events(tb_dir: Path):
    from tensorboard.backend.event_processing.event_file_loader import EventFileLoader

    for f in sorted(tb_dir.glob("events.out.tfevents.*")):
        yield from EventFileLoader(str(f)).Load()


def _tensorboard_hparams(tb_dir: Path) -> tuple[dict, dict[str, float]]:
    """(hyperparameters of the HParams session, ``final/*`` scalars) of a run's TB logs."""
    from tensorboard.plugins.hparams import plugin_data_pb2

    hparams: dict = {}
    scalars: dict[str, float] = {}
    for event in _tensorboard_events(tb_dir):
        for v in event.summary.value:
            if v.metadata.plugin_data.plugin_name == "hparams":
                data = plugin_data_pb2.HParamsPluginData.FromString(v.metadata.plugin_data.content)
                if data.HasField("session_start_info"):
                    for k, p in data.session_start_info.hparams.items():
                        hparams[k] = p.WhichOneof("kind") and getattr(p, p.WhichOneof("kind"))
            elif v.tag.startswith("final/"):
                scalars[v.tag] = (
                    float(v.tensor.float_val[0]) if v.HasField("tensor") else v.simple_value
                )
    return hparams, scalars


# ---------------------------------------------------------------------- the logger itself
def test_run_logger_writes_an_offline_wandb_run_with_config_rows_and_final_eval(
    tmp_path, offline_wandb
):
    cfg = build_ppo_config("cartpole", TINY + QUIET + WANDB)
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    logger = RunLogger(run_dir, progress=False, config=cfg)
    logger.log(32, {"train/return": 5.0, "ppo/kl": 0.01, "train/episode_length": float("nan")})
    logger.log(64, {"train/return": 7.0, "ppo/kl": 0.02, "train/episode_length": 9.0})
    logger.close()
    log_final_evaluation(run_dir, cfg, 64, {"return_mean": 8.5, "return_std": 0.5, "episodes": 2})

    run_id = (run_dir / WANDB_ID_FILE).read_text().strip()
    runs = _offline_runs(offline_wandb)
    # training and the final evaluation: two segments of one W&B run (the same id)
    assert [p.name for p in runs] == [f"run-{run_id}.wandb"] * 2, runs
    first = _read_offline_run(runs[0])
    assert first["run_id"] == run_id and first["project"] == "sim2real-tests"
    assert first["config"]["ppo.lr"] == cfg.ppo.lr and first["config"]["env.task"] == "cartpole"
    rows = [{k: v for k, v in h.items() if not k.startswith("_")} for h in first["history"]]
    assert rows == [
        {"step": 32, "train/return": 5.0, "ppo/kl": 0.01},  # NaN left out, as in TensorBoard
        {"step": 64, "train/return": 7.0, "ppo/kl": 0.02, "train/episode_length": 9.0},
    ]
    final = _read_offline_run(runs[1])
    assert any(h.get("eval/return") == 8.5 and h.get("step") == 64 for h in final["history"])
    assert final["summary"]["final/return_mean"] == 8.5
    assert final["summary"]["final/episodes"] == 2

    # TensorBoard: the flattened config as hyperparameters, the final evaluation beside them
    hparams, scalars = _tensorboard_hparams(run_dir / "tensorboard")
    assert hparams["ppo.lr"] == pytest.approx(cfg.ppo.lr)
    assert hparams["env.task"] == "cartpole" and hparams["run.wandb"] == 1.0  # bools as 0/1
    assert hparams["policy.actor_hidden"] == "(16, 16)"  # sequences as text
    assert scalars == {"final/return_mean": 8.5, "final/return_std": 0.5, "final/episodes": 2.0}
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").open()]
    assert rows[-1] == {"step": 64, "eval/return": 8.5}


def test_wandb_is_off_by_default_and_writes_nothing(tmp_path, offline_wandb):
    cfg = build_ppo_config("cartpole", TINY + QUIET)
    assert cfg.run.wandb is False
    logger = RunLogger(tmp_path, progress=False, config=cfg)
    logger.log(1, {"train/return": 1.0})
    logger.close()
    log_final_evaluation(tmp_path, cfg, 1, {"return_mean": 1.0})
    assert logger.wandb is None and not (tmp_path / WANDB_ID_FILE).exists()
    assert not (offline_wandb / "wandb").exists() and not (tmp_path / "wandb").exists()


def test_enabled_without_the_package_is_a_clear_error(tmp_path, monkeypatch):
    import sys

    from training.config import ConfigError

    monkeypatch.setitem(sys.modules, "wandb", None)  # what an environment without it has
    cfg = build_ppo_config("cartpole", TINY + QUIET + WANDB)
    with pytest.raises(ConfigError, match=r"pip install 'sim2real\[wandb\]'"):
        RunLogger(tmp_path, progress=False, config=cfg)


def test_bad_wandb_mode_is_refused():
    with pytest.raises(ValueError, match="wandb_mode"):
        build_ppo_config("cartpole", ["run.wandb_mode=sometimes"])


def test_flatten_config_names_every_field_by_its_override_path():
    cfg = build_ppo_config("cartpole", TINY)
    flat = flatten_config(cfg)
    assert flat["ppo.lr"] == cfg.ppo.lr and flat["run.seed"] == 0
    assert flat["env.num_envs"] == 4 and flat["algo"] == "ppo"
    assert all(isinstance(v, bool | int | float | str) for v in flat.values())


# ---------------------------------------------------------------------- a training run
def test_cartpole_ppo_run_logs_to_wandb_offline_and_resume_continues_the_same_run(
    tmp_path, offline_wandb
):
    run_dir = tmp_path / "run"
    overrides = [*TINY, *QUIET, *WANDB, "run.checkpoint_every=1"]
    train = ["train", "ppo", "--task", "cartpole"]
    argv = [*train, "--run-dir", str(run_dir), "--no-artifacts", *overrides, "run.total_steps=64"]
    assert cli_main(argv) == 0
    run_id = (run_dir / WANDB_ID_FILE).read_text().strip()
    # a resume with a larger budget, then the run's artifacts (the final evaluation)
    assert cli_main([*train, "--resume", str(run_dir), *overrides, "run.total_steps=128"]) == 0
    assert (run_dir / WANDB_ID_FILE).read_text().strip() == run_id

    runs = _offline_runs(offline_wandb)
    # first run, resume, final evaluation: three segments of one W&B run, no second run
    assert [p.name for p in runs] == [f"run-{run_id}.wandb"] * 3, runs
    logged = [_read_offline_run(p) for p in runs]
    assert {run["run_id"] for run in logged} == {run_id}
    rows = [h for run in logged for h in run["history"]]
    steps = sorted({h["step"] for h in rows if "train/return" in h})
    assert steps == [32, 64, 96, 128]  # 4 envs x 8 steps per iteration, both segments
    keys = set().union(*rows)
    assert {"train/return", "ppo/lr", "perf/steps_per_second", "eval/return"} <= keys
    summary = {k: v for run in logged for k, v in run["summary"].items()}
    assert "final/return_mean" in summary
    assert logged[0]["config"]["run.wandb"] is True

    hparams, scalars = _tensorboard_hparams(run_dir / "tensorboard")
    assert hparams["algo"] == "ppo" and hparams["run.total_steps"] == 128
    summary_json = json.loads((run_dir / "summary.json").read_text())
    assert scalars["final/return_mean"] == pytest.approx(summary_json["eval"]["return_mean"])
