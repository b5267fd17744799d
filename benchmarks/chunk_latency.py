"""ONNX latency of the chunked samplers, as the robot calls them: the flow policy at 1 and
4 Euler steps against the diffusion policy's 5-step DDIM (issue 17's latency target).

One observation per ``OnnxPolicy.act`` call, one thread, the methods interleaved in
blocks (``benchmarks/dppo.py``'s ``_latency_rounds``) after a warm-up. A graph's cost
depends on its shapes, not on its weights, so the policies here are untrained (seeded),
with the default networks and the task's observation and action sizes; this measures
a change to the samplers or the exporter without training anything
(``benchmarks/flow.py`` measures the trained policies the same way).

``--save DIR`` keeps the exported files; ``--also DIR`` times files exported earlier
(by another commit, say) in the same rounds, as ``<name>@old``, so a change to the
graphs is measured against the graphs before it on the same machine at the same time.

    python benchmarks/chunk_latency.py --task hopper
    python benchmarks/chunk_latency.py --task hopper --also /tmp/before   # vs old exports
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
from pathlib import Path

import numpy as np
import torch

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(Path(__file__).resolve().parent))

TARGET_ONE_STEP_OVER_DDIM = 0.25


def _metadata(module, family: str, obs: int, low, high):
    from deploy.metadata import PolicyMetadata

    act = len(low)
    zeros = [0.0] * act
    return PolicyMetadata(
        policy_family=family,
        obs_terms=[("obs", obs)],
        action_joint_names=[f"joint{i}" for i in range(act)],
        action_scale=[1.0] * act,
        action_offset=zeros,
        default_joint_pos=zeros,
        kp=zeros,
        kd=zeros,
        joint_pos_lower=[float(v) for v in low],
        joint_pos_upper=[float(v) for v in high],
        control_period_s=0.02,
        recurrent_state=module.info.recurrent_state,
        noise_shape=list(module.info.noise_shape),
    )


def export_samplers(task: str, out: Path, seed: int = 0) -> dict[str, Path]:
    """flow_1step, flow_4step and dppo_ddim5 ONNX files of untrained policies at the
    task's shapes."""
    import sim
    import training.export  # noqa: F401  (registers the chunked families' exporters)
    from deploy.export import export_policy
    from policies.diffusion import DiffusionConfig, DiffusionPolicy
    from policies.flow import FlowConfig, FlowPolicy

    env = sim.make(task, num_envs=1, seed=seed)
    obs = int(env.observation_spec.policy.frame_size)
    low = np.asarray(env.action_spec.low, dtype=np.float32)
    high = np.asarray(env.action_spec.high, dtype=np.float32)
    env.close()
    torch.manual_seed(seed)
    flow = FlowPolicy(obs, len(low), FlowConfig(), action_low=low, action_high=high)
    diffusion = DiffusionPolicy(obs, len(low), DiffusionConfig(), action_low=low, action_high=high)
    out.mkdir(parents=True, exist_ok=True)
    files = {}
    for steps in (1, 4):
        m = flow.inference_module(steps)
        meta = _metadata(m, "flow", obs, low, high)
        files[f"flow_{steps}step"] = export_policy(m, meta, out / f"flow_{steps}step.onnx")
    m = diffusion.inference_module()
    meta = _metadata(m, "diffusion", obs, low, high)
    files["dppo_ddim5"] = export_policy(m, meta, out / "dppo_ddim5.onnx")
    return files


def main() -> None:
    p = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("--task", default="hopper", help="task whose shapes the policies take")
    p.add_argument("--calls", type=int, default=20_000, help="calls per method")
    p.add_argument("--save", type=Path, default=None, help="keep the exported files here")
    p.add_argument("--also", type=Path, default=None, help="time these earlier exports too")
    a = p.parse_args()
    if a.calls < 500:
        p.error(f"--calls {a.calls}: at least 500 (one block)")
    if a.also is not None and not a.also.is_dir():
        p.error(f"--also {a.also}: not a directory")

    import dppo as dppo_bench

    from deploy.runtime import OnnxPolicy
    from sim.machine_load import LoadMonitor

    out = a.save or Path(tempfile.mkdtemp(prefix="chunk-latency-"))
    files = export_samplers(a.task, out)
    if a.also is not None:
        for name in list(files):
            old = a.also / files[name].name
            if not old.is_file():
                p.error(f"--also {a.also}: no {old.name} there")
            files[f"{name}@old"] = old
    policies = {k: OnnxPolicy(v, seed=0) for k, v in files.items()}
    frame = policies["dppo_ddim5"].metadata.obs_frame_size
    monitor = LoadMonitor(own_threads=1)
    block, rounds = 500, []
    for _ in range(max(1, a.calls // (block * 4))):
        rounds.append(dppo_bench._latency_rounds(policies, frame, block * 4, block))
        monitor.sample()
    monitor.stop()
    pooled = {k: np.concatenate([r[k] for r in rounds]) * 1e3 for k in policies}  # us
    print(f"task {a.task}, {len(rounds)} rounds of {block * 4} calls per method")
    print(f"{'graph':18s} {'p50 us':>8s} {'p99 us':>8s}")
    for k, v in pooled.items():
        print(f"{k:18s} {np.percentile(v, 50):8.1f} {np.percentile(v, 99):8.1f}")
    for suffix in ("", "@old"):
        if f"flow_1step{suffix}" not in pooled:
            continue
        one, ddim = pooled[f"flow_1step{suffix}"], pooled[f"dppo_ddim5{suffix}"]
        per_round = statistics.median(
            np.percentile(r[f"flow_1step{suffix}"], 99)
            / np.percentile(r[f"dppo_ddim5{suffix}"], 99)
            for r in rounds
        )
        ratio = np.percentile(one, 99) / np.percentile(ddim, 99)
        verdict = "met" if ratio <= TARGET_ONE_STEP_OVER_DDIM else "MISSED"
        print(
            f"one-step p99 / DDIM-5 p99{suffix}: {ratio:.2f} pooled, {per_round:.2f} median of "
            f"rounds (target <= {TARGET_ONE_STEP_OVER_DDIM}: {verdict}); p50 "
            f"{np.percentile(one, 50) / np.percentile(ddim, 50):.2f}"
        )
    if a.also is not None:
        for name in ("flow_1step", "flow_4step", "dppo_ddim5"):
            new, old = pooled[name], pooled[f"{name}@old"]
            print(
                f"{name}: p50 {np.percentile(new, 50) / np.percentile(old, 50):.2f}x, p99 "
                f"{np.percentile(new, 99) / np.percentile(old, 99):.2f}x of the earlier export"
            )
    print(monitor.describe())


if __name__ == "__main__":
    main()
