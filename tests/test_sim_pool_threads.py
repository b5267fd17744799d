"""The per-env engine's threads (sim.native, sim.engine.PoolEngine) do their work and
nothing else: a one-thread engine never starts numba's pool, and a pool's idle threads
sleep between steps instead of spinning on cores the learner needs."""

from __future__ import annotations

import subprocess
import sys
import textwrap

import numpy as np
import pytest

from sim.registry import make

# humanoid keeps one MjData per env (PoolEngine): Gymnasium's cfrc_ext needs it
_PROBE = textwrap.dedent(
    """
    import sys, time
    import torch  # first, as in a training: torch's libgomp is then already loaded
    from numba.np.ufunc import parallel
    from sim.registry import make

    threads = int(sys.argv[1])
    env = make("humanoid", 4, seed=0, num_threads=threads)
    env.reset()
    a = torch.zeros(4, env.action_spec.size)
    for _ in range(5):
        env.step(a)
    cpu, main = time.process_time(), time.thread_time()
    for _ in range(20):
        env.step(a)
        time.sleep(0.01)  # the learner's turn: the simulator should cost nothing now
    main = time.thread_time() - main
    others = time.process_time() - cpu - main
    print(parallel._is_initialized, f"{main:.4f}", f"{others:.4f}")
    """
)


def _probe(threads: int) -> tuple[bool, float, float]:
    out = subprocess.run(
        [sys.executable, "-c", _PROBE, str(threads)], capture_output=True, text=True, timeout=300
    )
    assert out.returncode == 0, out.stderr[-2000:]
    started, main, others = out.stdout.split()[-3:]
    return started == "True", float(main), float(others)


def test_one_thread_engine_runs_on_the_caller_and_never_starts_the_pool():
    started, _, others = _probe(1)
    assert not started
    assert others < 0.005


def test_idle_pool_threads_do_not_spin_between_steps():
    # 20 pauses of 10 ms: a spin-waiting pool (numba's OpenMP layer) burned most of them
    # (0.12 s of CPU in 0.1 s of pauses); sleeping workers use what the physics needs
    started, main, others = _probe(2)
    assert started
    assert main + others < 0.1, (main, others)


@pytest.mark.parametrize("threads", [1, 2])
def test_serial_and_pooled_engines_step_bit_identically(threads):
    ref = make("humanoid", 5, seed=3, num_threads=3)
    env = make("humanoid", 5, seed=3, num_threads=threads)
    rng = np.random.default_rng(0)
    ref.reset(), env.reset()
    for _ in range(30):
        a = rng.uniform(-0.4, 0.4, size=(5, ref.action_spec.size))
        o1, r1, *_ = ref.step(a)
        o2, r2, *_ = env.step(a)
        assert np.array_equal(o1["policy"].numpy(), o2["policy"].numpy())
        assert np.array_equal(r1.numpy(), r2.numpy())
