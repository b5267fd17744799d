"""GRPO teaches a tiny randomly initialised LM single-digit addition from reward alone.

The task, named honestly: prompts "a+b=" for single digits with a + b <= 9 (55 prompts),
reference answer str(a + b), reward exact_match (1 when the completion, normalized, is
the answer). Completions may have 2 tokens, so the answer digit must come first and be
followed by EOS or a non-digit. The model (Llama architecture, hidden 64, 2 layers,
16-token character vocabulary) starts at chance (about 4% reward) and has never seen
addition: everything it learns comes through the GRPO loss of the shared core, with the
GRPO preset's k3 KL to a frozen copy of the starting weights.

About 10 s on one CPU core when the machine is quiet; marked slow for busy machines.
"""

import numpy as np
import pytest
import torch

pytest.importorskip("transformers")

from training.config import apply_overrides  # noqa: E402
from training.grpo import GRPOTrainConfig, GRPOTrainer  # noqa: E402
from training.grpo.tiny import addition_rows, build_tiny_model  # noqa: E402


@pytest.fixture(autouse=True)
def one_thread():
    # the model is far too small for threads to help; on a shared machine they hurt
    n = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(n)


@pytest.mark.slow
def test_grpo_learns_single_digit_addition(tmp_path):
    model_dir = build_tiny_model(tmp_path / "model", chars="0123456789+=", seed=0)
    cfg = apply_overrides(
        GRPOTrainConfig(),
        [
            f"model.path={model_dir}",
            "algo.loss=grpo",
            "algo.lr=1e-3",
            "sampling.prompts_per_step=16",
            "sampling.group_size=8",
            "sampling.max_new_tokens=2",
            "reward.functions=exact_match",
            "run.steps=250",
            "run.seed=0",
            "run.progress=false",
            "run.tensorboard=false",
        ],
    )
    trainer = GRPOTrainer(cfg, rows=addition_rows(9), run_dir=tmp_path / "run")
    history = trainer.train()["history"]
    reward = np.array([h["reward/mean"] for h in history])
    first, last = reward[:10].mean(), reward[-10:].mean()
    print(f"reward: first 10 steps {first:.3f}, last 10 steps {last:.3f}")
    assert first < 0.15
    assert last > 0.4 and last - first > 0.3
    # it answers held-in prompts greedily better than chance
    pol = trainer.policy
    rows = addition_rows(9)
    r = pol.generate(
        pol.encode_prompts([x["prompt"] for x in rows]), 1, max_new_tokens=2, temperature=0.0
    )
    texts = pol.decode_completions(r)
    correct = np.mean([t[:1] == x["answer"] for t, x in zip(texts, rows)])
    assert correct > 0.4
