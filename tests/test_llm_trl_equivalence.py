"""Our GRPO-family losses equal TRL's GRPOTrainer's on the same batch.

For each of GRPO, DAPO, Dr. GRPO and GSPO, a real ``trl.GRPOTrainer`` on the tiny model
generates and scores a batch; then on that batch (same token ids, masks, rewards, old
and reference log-probabilities):
- our group advantages equal the ones TRL computed from the same rewards;
- our per-token log-probabilities and entropies equal TRL's;
- our loss (the shared core, through training.grpo.grpo_loss) equals TRL's
  ``_compute_loss``, and so do the gradients with respect to every model weight.

Matching settings: TRL in float32 (``bf16=False``; TRL's default is bf16 autocast even on
CPU) and, for GRPO's KL term, ``use_bias_correction_kl=False`` (TRL multiplies the k3 term
by the importance ratio by default, which changes the gradient, not the value, on-policy;
the core's KL term is the plain k3 estimate of DeepSeekMath GRPO). Dr. GRPO's constant is
the completion limit in both. Prompts have equal lengths because TRL's scoring forward
passes no position ids (a left-padded row's positions then count the padding), while
ours count real tokens only.
"""

import os

import pytest
import torch

# nothing leaves the machine: no hub look-ups, no telemetry
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("HF_HUB_DISABLE_TELEMETRY", "1")

pytest.importorskip("transformers")
trl = pytest.importorskip("trl")
pytest.importorskip("datasets")

from policies.language_model import LanguageModelConfig, LanguageModelPolicy, Rollout  # noqa: E402
from training.grpo import AlgoConfig, advantages, grpo_loss, loss_config  # noqa: E402
from training.grpo.tiny import build_tiny_model  # noqa: E402

G, P, T, TEMP = 4, 3, 10, 0.7

VARIANTS = {
    # ours: algo.loss; TRL: the GRPOConfig fields that select the same objective
    "grpo": dict(loss_type="grpo", beta=0.04, epsilon=0.2, use_bias_correction_kl=False),
    "dapo": dict(loss_type="dapo", beta=0.0, epsilon=0.2, epsilon_high=0.28),
    "dr_grpo": dict(loss_type="dr_grpo", beta=0.0, epsilon=0.2, scale_rewards="none"),
    "gspo": dict(
        loss_type="grpo",
        beta=0.0,
        importance_sampling_level="sequence",
        epsilon=3e-4,
        epsilon_high=4e-4,
    ),
}


@pytest.fixture(autouse=True)
def one_thread():
    n = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(n)


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    return build_tiny_model(tmp_path_factory.mktemp("tiny") / "model", seed=0)


def make_trl(model_dir, tmp_path, name, reward):
    from datasets import Dataset
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tok = AutoTokenizer.from_pretrained(str(model_dir), local_files_only=True)
    model = AutoModelForCausalLM.from_pretrained(str(model_dir), local_files_only=True)
    rows = [{"prompt": f"{a}+{b}=", "answer": str(a + b)} for a in range(3) for b in range(3)]
    settings = dict(VARIANTS[name])
    if "use_bias_correction_kl" not in trl.GRPOConfig.__dataclass_fields__:
        settings.pop("use_bias_correction_kl", None)  # older TRL: the plain k3 term already
    args = trl.GRPOConfig(
        output_dir=str(tmp_path / "trl"),
        per_device_train_batch_size=P * G,
        num_generations=G,
        max_completion_length=T,
        temperature=TEMP,
        use_cpu=True,
        bf16=False,
        report_to="none",
        save_strategy="no",
        disable_tqdm=True,
        seed=0,
        **settings,
    )
    trainer = trl.GRPOTrainer(
        model=model,
        reward_funcs=[reward],
        args=args,
        train_dataset=Dataset.from_list(rows),
        processing_class=tok,
    )
    trainer.model.train()
    trainer.current_gradient_accumulation_steps = 1  # set by Trainer's loop; one step here
    return trainer, rows, tok


@pytest.mark.parametrize("name", list(VARIANTS))
def test_loss_and_gradients_equal_trl(model_dir, tmp_path, name):
    seen: list[float] = []

    def reward(prompts, completions, **kw):  # varies within groups; recorded for the check
        r = [
            float(len(c) % 3) + 0.5 * (c[:1] in "13579") + 0.25 * c.count("+") for c in completions
        ]
        seen.extend(r)
        return r

    trainer, rows, tok = make_trl(model_dir, tmp_path, name, reward)
    batch = [rows[i] for i in (0, 4, 8) for _ in range(G)]
    inputs = trainer._generate_and_score_completions(batch)

    # advantages from the same rewards
    algo = AlgoConfig(loss=name)
    rewards = torch.tensor(seen, dtype=torch.float32).view(P, G)
    ours_adv = advantages(rewards, algo.advantage_estimator, algo.adv_eps).reshape(-1)
    torch.testing.assert_close(ours_adv, inputs["advantages"].float(), atol=1e-6, rtol=1e-6)
    assert ours_adv.abs().sum() > 0

    # completions of different lengths: cut rows short (EOS-terminated rows already are)
    cmask = inputs["completion_mask"].clone()
    cut = torch.tensor([T, 1, 3, 7, T, 2, 5, T, 9, 4, 6, 8])
    cols = torch.arange(cmask.shape[1])
    cmask = cmask * (cols[None, :] < cut[:, None]).to(cmask.dtype)
    cids = inputs["completion_ids"].masked_fill(cmask == 0, tok.pad_token_id)
    inputs["completion_mask"], inputs["completion_ids"] = cmask, cids
    inputs["num_items_in_batch"] = cmask.sum()
    assert cmask.sum(1).min() >= 1 and len(set(cmask.sum(1).tolist())) > 3

    policy = LanguageModelPolicy(
        trainer.model, tok, LanguageModelConfig(reference="none", disable_dropout=False)
    )
    ro = Rollout(
        inputs["prompt_ids"],
        inputs["prompt_mask"],
        cids,
        cmask,
        torch.zeros(P * G, dtype=torch.bool),
        torch.zeros(cids.shape),
        torch.arange(P).repeat_interleave(G),
    )
    logp, ent = policy.logprobs(ro, temperature=TEMP, with_entropy=True, entropy_grad=False)
    trl_logp, trl_ent = trainer._get_per_token_logps_and_entropies(
        trainer.model,
        torch.cat([ro.prompt_ids, cids], 1),
        torch.cat([ro.prompt_mask, cmask], 1),
        cids.shape[1],
        compute_entropy=True,
    )[:2]
    m = cmask.bool()
    torch.testing.assert_close(logp[m], trl_logp[m], atol=2e-6, rtol=0)
    torch.testing.assert_close(ent[m], trl_ent[m], atol=2e-6, rtol=0)

    # stored old and reference log-probabilities away from the current ones, so that the
    # clip (token or sequence level) and the KL term are active
    g = torch.Generator().manual_seed(1)
    base = logp.detach()
    if name == "gspo":
        shift = torch.linspace(-1.2e-3, 1.2e-3, P * G)[torch.randperm(P * G, generator=g)]
        old = base - shift[:, None]
    else:
        old = base + 0.3 * torch.randn(base.shape, generator=g)
    ref = base + 0.5 * torch.randn(base.shape, generator=g)
    old, ref = old * m, ref * m
    inputs["old_per_token_logps"], inputs["ref_per_token_logps"] = old, ref

    params = [p for p in trainer.model.parameters() if p.requires_grad]
    trl_loss = trainer._compute_loss(trainer.model, inputs)
    trl_grads = torch.autograd.grad(trl_loss, params)

    cfg = loss_config(algo, T)
    logp, ent = policy.logprobs(ro, temperature=TEMP, with_entropy=True, entropy_grad=False)
    loss, stats = grpo_loss(
        logp, old, ours_adv, cmask, cfg, logp_ref=ref if cfg.kl_coef > 0 else None, entropy=ent
    )
    grads = torch.autograd.grad(loss, params)

    assert 0.0 < float(stats["clip_frac"]) < 1.0  # both sides of the clip are exercised
    torch.testing.assert_close(loss.detach(), trl_loss.detach(), atol=1e-7, rtol=1e-5)
    for a, b in zip(grads, trl_grads):
        torch.testing.assert_close(a, b, atol=1e-7, rtol=1e-4)
    assert max(float(b.abs().max()) for b in trl_grads) > 1e-3  # not a vacuous zero
