"""Env steps per second of the batched simulator vs Gymnasium's vector envs and the
hardware limit (same as `sim2real bench sim`).

    python benchmarks/sim_throughput.py --tasks halfcheetah quadruped --envs 1 16 64 256 1024
"""

import sys

from training.cli import main

if __name__ == "__main__":
    sys.exit(main(["bench", "sim", *sys.argv[1:]]))
