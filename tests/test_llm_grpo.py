"""The GRPO-family trainer: configs onto the core presets, bad prompts files, failing
reward functions, dynamic sampling, the curriculum, several iterations against stored
log-probabilities, exact resume, the command line."""

import json
import math

import numpy as np
import pytest
import torch

pytest.importorskip("transformers")

from training.checkpoint import load_checkpoint  # noqa: E402
from training.cli import main as sim2real  # noqa: E402
from training.config import ConfigError, apply_overrides  # noqa: E402
from training.core import get_loss_config  # noqa: E402
from training.grpo import (  # noqa: E402
    AlgoConfig,
    GRPOTrainConfig,
    GRPOTrainer,
    PromptDataError,
    PromptSampler,
    load_prompts,
    loss_config,
)
from training.grpo.tiny import addition_rows, build_tiny_model, write_jsonl  # noqa: E402
from training.metrics import read_metrics  # noqa: E402
from training.rewards import RewardError, exact_match  # noqa: E402


@pytest.fixture(autouse=True)
def one_thread():
    n = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(n)


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    return build_tiny_model(tmp_path_factory.mktemp("tiny") / "model", chars="0123456789+=", seed=0)


@pytest.fixture(scope="module")
def data_file(tmp_path_factory):
    return write_jsonl(tmp_path_factory.mktemp("data") / "add.jsonl", addition_rows(9))


def make_cfg(model_dir, data_file, *overrides):
    base = [
        f"model.path={model_dir}",
        f"data={data_file}",
        "sampling.prompts_per_step=4",
        "sampling.group_size=4",
        "sampling.max_new_tokens=3",
        "algo.lr=1e-3",
        "run.progress=false",
        "run.tensorboard=false",
        "run.steps=3",
    ]
    return apply_overrides(GRPOTrainConfig(), base + list(overrides))


# ---------------------------------------------------------------------- configs
def test_loss_configs_are_the_core_presets():
    assert loss_config(AlgoConfig(loss="grpo"), 64) == get_loss_config("grpo")
    assert loss_config(AlgoConfig(loss="dapo"), 64) == get_loss_config("dapo")
    assert loss_config(AlgoConfig(loss="gspo"), 64) == get_loss_config("gspo")
    dr = loss_config(AlgoConfig(loss="dr_grpo"), 64)
    assert dr == get_loss_config("dr_grpo", norm_constant=64.0)
    tuned = loss_config(AlgoConfig(loss="grpo", eps_high=0.28, kl_coef=0.0, kl_estimator="k2"), 8)
    assert (tuned.eps_low, tuned.eps_high, tuned.kl_coef, tuned.kl_estimator) == (
        0.2,
        0.28,
        0.0,
        "k2",
    )
    assert AlgoConfig(loss="dr_grpo").advantage_estimator == "dr_grpo"
    assert AlgoConfig(loss="grpo", advantage="rloo").advantage_estimator == "rloo"
    assert GRPOTrainConfig(algo=AlgoConfig(loss="dapo")).dynamic_sampling_enabled
    assert not GRPOTrainConfig().dynamic_sampling_enabled


def test_overrides_are_checked():
    with pytest.raises(ConfigError, match="algo.loss"):
        apply_overrides(GRPOTrainConfig(), ["algo.loss=ppo2"])
    with pytest.raises(ConfigError, match="group_size"):
        apply_overrides(GRPOTrainConfig(), ["sampling.group_size=1"])
    with pytest.raises(ConfigError, match="did you mean"):
        apply_overrides(GRPOTrainConfig(), ["sampling.grup_size=4"])
    cfg = apply_overrides(
        GRPOTrainConfig(), ["reward.functions=numeric,format", "reward.weights=1,0.2"]
    )
    assert cfg.reward.functions == ("numeric", "format") and cfg.reward.weights == (1.0, 0.2)


# ---------------------------------------------------------------------- prompts files
@pytest.mark.parametrize(
    "lines, message",
    [
        (
            ['{"prompt": "1+1=", "answer": "2"}', '{"prompt": "2+2="}'],
            "line 2: missing field 'answer'",
        ),
        (['{"answer": "2"}'], "line 1: missing field 'prompt'"),
        (['{"prompt": "", "answer": "2"}'], "line 1: field 'prompt' must be a non-empty string"),
        (['{"prompt": "1+1=", "answer": null}'], "line 1: field 'answer' must be a string"),
        (['{"prompt": "1+1=", "answer": "2"}', "", "{not json"], "line 3: not valid JSON"),
        (['["1+1=", "2"]'], "line 1: expected a JSON object"),
        (["", "  "], "no prompts"),
        (
            ['{"prompt": "a", "answer": "1"}', '{"prompt": "b", "answer": "2", "level": 3}'],
            "same fields",
        ),
    ],
)
def test_bad_prompts_files_name_line_and_field(tmp_path, lines, message):
    path = tmp_path / "p.jsonl"
    path.write_text("\n".join(lines) + "\n")
    with pytest.raises(PromptDataError, match=message):
        load_prompts(path)


def test_prompts_file_numbers_as_answers_and_missing_file(tmp_path):
    path = tmp_path / "p.jsonl"
    path.write_text('{"prompt": "1+1=", "answer": 2, "level": "easy"}\n')
    assert load_prompts(path) == [{"prompt": "1+1=", "answer": "2", "level": "easy"}]
    with pytest.raises(FileNotFoundError):
        load_prompts(tmp_path / "missing.jsonl")


def test_cli_bad_prompts_file_is_an_error_not_a_run(tmp_path, model_dir, capsys):
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"prompt": "1+1="}\n')
    rc = sim2real(
        [
            "train",
            "grpo",
            "--model",
            str(model_dir),
            "--data",
            str(bad),
            "--run-dir",
            str(tmp_path / "r"),
            "run.progress=false",
        ]
    )
    assert rc == 2
    assert "line 1: missing field 'answer'" in capsys.readouterr().err
    assert not (tmp_path / "r" / "checkpoints" / "latest.pt").exists()


# ---------------------------------------------------------------------- rewards that fail
def flaky_reward(prompts, completions, **kw):
    """Raises for prompt "0+0=", NaN for "1+1=", else a reward that varies within groups."""
    out = []
    for p, c in zip(prompts, completions):
        if p == "0+0=":
            raise RuntimeError("scorer crashed")
        out.append(float("nan") if p == "1+1=" else float(len(c) % 2 == 0 or c[:1] in "13579"))
    return out


def flaky_rows():
    return [
        {"prompt": p, "answer": a}
        for p, a in [("0+0=", "0"), ("1+1=", "2"), ("1+2=", "3"), ("2+2=", "4")]
    ]


def test_failing_rewards_skip_their_groups_and_are_counted(tmp_path, model_dir, data_file):
    cfg = make_cfg(model_dir, data_file, "run.steps=2", "reward.max_invalid_fraction=0.9")
    tr = GRPOTrainer(cfg, rows=flaky_rows(), reward_fns=[flaky_reward], run_dir=tmp_path / "run")
    before = {n: p.clone() for n, p in tr.policy.trainable_named_parameters()}
    out = tr.train()
    rows = read_metrics(tmp_path / "run" / "metrics.jsonl")
    for r in rows:
        # all 4 prompts each step: two groups are skipped, 2*4 samples invalid
        assert r["groups/skipped_invalid"] == 2 and r["reward/invalid_samples"] == 8
        assert r["groups/trained"] == 2
        assert math.isfinite(r["loss"]) and math.isfinite(r["reward/mean"])
    assert out["reward_invalid"] == 16 and out["groups_skipped_invalid"] == 4
    errors = [
        json.loads(x) for x in (tmp_path / "run" / "reward_errors.jsonl").read_text().splitlines()
    ]
    assert any("scorer crashed" in e["error"] and e.get("prompt") == "0+0=" for e in errors)
    assert any("not a finite number" in e["error"] and e.get("prompt") == "1+1=" for e in errors)
    for n, p in tr.policy.trainable_named_parameters():
        assert torch.isfinite(p).all(), n
    assert any(not torch.equal(before[n], p) for n, p in tr.policy.trainable_named_parameters())


def test_failing_rewards_zero_policy_and_raise_policy(model_dir, data_file):
    cfg = make_cfg(
        model_dir,
        data_file,
        "run.steps=1",
        "reward.on_error=zero",
        "reward.max_invalid_fraction=0.9",
    )
    out = GRPOTrainer(cfg, rows=flaky_rows(), reward_fns=[flaky_reward]).train()
    h = out["history"][0]
    assert (
        h["groups/trained"] == 4
        and h["reward/invalid_samples"] == 8
        and h["groups/skipped_invalid"] == 0
    )
    cfg = make_cfg(model_dir, data_file, "run.steps=1", "reward.on_error=raise")
    with pytest.raises(RewardError, match="scorer crashed|not a finite number"):
        GRPOTrainer(cfg, rows=flaky_rows(), reward_fns=[flaky_reward]).train()


def test_a_reward_that_always_fails_stops_the_run(model_dir, data_file):
    def broken(prompts, completions, **kw):
        raise KeyError("gold")

    tr = GRPOTrainer(make_cfg(model_dir, data_file), reward_fns=[broken])
    with pytest.raises(RewardError, match="rewards failed"):
        tr.train()


# ---------------------------------------------------------------------- dynamic sampling
def varied_reward(prompts, completions, **kw):
    """Differs within most groups of the random model's completions."""
    return [float(len(c) % 2 == 0 or c[:1] in "13579") + 0.1 * c.count("+") for c in completions]


def by_prompt_reward(prompts, completions, **kw):
    """Prompts starting with 0..4 get a constant reward (zero variance); others a random-ish one."""
    return [
        1.0 if int(p[0]) < 5 else float(len(c) % 2 == 0 or c[:1] in "13579")
        for p, c in zip(prompts, completions)
    ]


def test_dynamic_sampling_drops_zero_variance_groups_and_refills(model_dir, data_file):
    cfg = make_cfg(
        model_dir,
        data_file,
        "algo.loss=dapo",
        "dynamic_sampling.max_rounds=6",
        "run.steps=3",
        "sampling.max_new_tokens=4",
    )
    tr = GRPOTrainer(cfg, reward_fns=[by_prompt_reward])
    seen = []
    orig = tr.update

    def spy(batch, adv):
        seen.append(adv.reshape(-1, cfg.sampling.group_size))
        return orig(batch, adv)

    tr.update = spy
    out = tr.train()
    for h, adv in zip(out["history"], seen):
        assert h["groups/trained"] == len(adv) <= cfg.sampling.prompts_per_step
        assert (adv.abs().sum(1) > 0).all()  # no zero-variance group was kept
        assert h["sampling/rounds"] >= 1
        zv = h["groups/zero_variance_fraction"]
        assert 0.0 <= zv <= 1.0
    assert any(h["sampling/rounds"] > 1 for h in out["history"])
    assert any(h["groups/zero_variance_fraction"] > 0 for h in out["history"])


def test_without_dynamic_sampling_zero_variance_groups_stay_and_are_counted(model_dir, data_file):
    cfg = make_cfg(model_dir, data_file, "run.steps=2")
    out = GRPOTrainer(
        cfg, reward_fns=[lambda prompts, completions, **kw: [1.0] * len(completions)]
    ).train()
    for h in out["history"]:
        assert h["groups/zero_variance_fraction"] == 1.0 and h["groups/trained"] == 4
        assert h["sampling/rounds"] == 1


# ---------------------------------------------------------------------- curriculum
def test_prompt_sampler_epochs_and_curriculum_prefers_high_variance():
    s = PromptSampler(5, seed=0)
    drawn = np.concatenate([s.next(2) for _ in range(5)])
    assert sorted(drawn[:5].tolist()) == [0, 1, 2, 3, 4]  # one epoch: each prompt once
    assert sorted(drawn[5:].tolist()) == [0, 1, 2, 3, 4]
    c = PromptSampler(4, seed=0, curriculum=True, history=4, temperature=0.2, floor=0.05)
    for i in range(4):
        c.record(i, np.array([0.0, 0.0, 1.0, 1.0]) if i == 2 else np.zeros(4))
    w = c.weights()
    assert int(torch.argmax(w)) == 2 and w[2] > 0.5
    counts = np.bincount(np.concatenate([c.next(1) for _ in range(200)]), minlength=4)
    assert counts[2] == counts.max()
    state = c.state_dict()
    a = c.next(3)
    c.load_state_dict(state)
    assert np.array_equal(c.next(3), a)


# ---------------------------------------------------------------------- updates
@pytest.mark.parametrize("loss", ["grpo", "dapo", "dr_grpo", "gspo"])
def test_each_loss_trains_with_several_iterations_against_stored_logprobs(
    model_dir, data_file, loss
):
    cfg = make_cfg(
        model_dir,
        data_file,
        f"algo.loss={loss}",
        "algo.num_iterations=3",
        "algo.num_minibatches=2",
        "run.steps=2",
        "algo.lr=5e-3",
    )
    tr = GRPOTrainer(cfg, reward_fns=[varied_reward])
    out = tr.train()
    for h in out["history"]:
        if h["groups/trained"]:
            assert h["optimizer_steps"] == 6
            # later passes see a moved policy: ratios leave 1
            assert h["ratio_max"] > 1.0 or h["approx_kl"] > 0
            for k in ("loss", "clip_frac", "entropy", "approx_kl", "grad_norm"):
                assert math.isfinite(h[k]), k
    if loss == "grpo":
        assert all("kl" in h for h in out["history"] if h["groups/trained"])


def test_metrics_file_has_the_promised_figures(tmp_path, model_dir, data_file):
    cfg = make_cfg(model_dir, data_file, "run.steps=2")
    GRPOTrainer(cfg, run_dir=tmp_path / "run").train()
    rows = read_metrics(tmp_path / "run" / "metrics.jsonl")
    assert [r["step"] for r in rows] == [1, 2]
    for key in (
        "reward/mean",
        "groups/zero_variance_fraction",
        "kl",
        "clip_frac",
        "entropy",
        "response_length/mean",
        "perf/generated_tokens_per_second",
        "lr",
        "loss",
    ):
        assert key in rows[0], key
    assert (tmp_path / "run" / "config.json").exists()
    assert (tmp_path / "run" / "final" / "config.json").exists()
    assert (tmp_path / "run" / "samples.jsonl").exists()


# ---------------------------------------------------------------------- exact resume
@pytest.mark.parametrize("extra", [[], ["model.lora_r=4", "algo.lr=1e-2"]], ids=["full", "lora"])
def test_resume_is_exact(tmp_path, model_dir, data_file, extra):
    if extra:
        pytest.importorskip("peft")
    over = [
        "run.steps=4",
        "algo.num_iterations=2",
        "algo.num_minibatches=2",
        "curriculum.enabled=true",
        "algo.loss=dapo",
        "dynamic_sampling.max_rounds=2",
        "algo.lr_schedule=cosine",
        *extra,
    ]
    cfg = make_cfg(model_dir, data_file, *over)
    whole = GRPOTrainer(cfg, run_dir=tmp_path / "whole", reward_fns=[varied_reward])
    start = whole.policy.trainable_state_dict()
    whole.train()
    assert any(not torch.equal(v, whole.policy.trainable_state_dict()[k]) for k, v in start.items())
    half = GRPOTrainer(cfg, run_dir=tmp_path / "half", reward_fns=[varied_reward])
    half.train(2)
    del half
    resumed = GRPOTrainer(
        cfg, run_dir=tmp_path / "half", reward_fns=[varied_reward], resume=tmp_path / "half"
    )
    assert resumed.step == 2
    resumed.train()
    a, b = whole.policy.trainable_state_dict(), resumed.policy.trainable_state_dict()
    assert a.keys() == b.keys()
    for k in a:
        assert torch.equal(a[k], b[k]), k
    ma = read_metrics(tmp_path / "whole" / "metrics.jsonl")
    mb = read_metrics(tmp_path / "half" / "metrics.jsonl")
    assert [r["step"] for r in mb] == [1, 2, 3, 4]
    for ra, rb in zip(ma, mb):
        assert ra["groups/trained"] > 0
        for key in ("reward/mean", "loss", "groups/trained", "response_length/mean", "clip_frac"):
            assert ra[key] == rb[key], key
    ck = load_checkpoint(tmp_path / "half" / "checkpoints" / "latest.pt")
    assert ck["kind"] == "grpo" and ck["step"] == 4
    np.testing.assert_array_equal(ck["sampler"]["history"], resumed.sampler.history)


def test_resume_refuses_another_prompts_file(tmp_path, model_dir, data_file):
    cfg = make_cfg(model_dir, data_file, "run.steps=1")
    GRPOTrainer(cfg, run_dir=tmp_path / "run").train()
    other = write_jsonl(tmp_path / "other.jsonl", addition_rows(5))
    from training.checkpoint import CheckpointError

    with pytest.raises(CheckpointError, match="prompts"):
        GRPOTrainer(apply_overrides(cfg, [f"data={other}"]), resume=tmp_path / "run")


# ---------------------------------------------------------------------- command line
def test_cli_train_then_resume(tmp_path, model_dir, data_file, capsys):
    run = tmp_path / "run"
    args = [
        "--model",
        str(model_dir),
        "--data",
        str(data_file),
        "--run-dir",
        str(run),
        "--steps",
        "2",
        "--seed",
        "3",
        "sampling.prompts_per_step=2",
        "sampling.group_size=2",
        "sampling.max_new_tokens=2",
        "run.progress=false",
        "run.tensorboard=false",
    ]
    assert sim2real(["train", "grpo", *args]) == 0
    summary = json.loads(capsys.readouterr().out)
    assert summary["steps"] == 2
    assert sim2real(["train", "grpo", "--resume", str(run), "--steps", "3"]) == 0
    rows = read_metrics(run / "metrics.jsonl")
    assert [r["step"] for r in rows] == [1, 2, 3]
    cfg = json.loads((run / "config.json").read_text())
    assert cfg["run"]["seed"] == 3 and cfg["run"]["steps"] == 3
    assert sim2real(["train", "grpo", "--data", str(data_file)]) == 2  # no --model
    assert "--model is required" in capsys.readouterr().err


def test_trainer_refuses_kl_without_reference(model_dir, data_file):
    from policies.language_model import LanguageModelConfig, LanguageModelPolicy

    pol = LanguageModelPolicy.from_pretrained(
        model_dir, LanguageModelConfig(), need_reference=False
    )
    with pytest.raises(ValueError, match="reference"):
        GRPOTrainer(make_cfg(model_dir, data_file, "algo.kl_coef=0.1"), policy=pol)


def test_library_reward_by_name(model_dir, data_file):
    cfg = make_cfg(
        model_dir,
        data_file,
        "run.steps=1",
        "reward.functions=exact_match,numeric,format",
        "reward.format_pattern=\\d+",
    )
    h = GRPOTrainer(cfg).train()["history"][0]
    for k in ("reward/exact_match", "reward/numeric_match", "reward/format_match"):
        assert k in h
    assert exact_match(["q"], ["3"], answer=["3"]) == [1.0]


@pytest.mark.parametrize("loss", ["grpo", "dapo", "dr_grpo", "gspo"])
def test_micro_batches_give_the_minibatch_gradient(model_dir, data_file, loss):
    over = [
        f"algo.loss={loss}",
        "run.steps=2",
        "algo.lr=1e-2",
        "sampling.max_new_tokens=6",
        "algo.num_iterations=2",
    ]  # the second pass has ratios away from 1: clipping acts
    runs = []
    # one pass of all 16 rows, against passes of 3 rows sorted by length
    for extra in (["algo.micro_batch_size=1000"], ["algo.micro_batch_size=3"]):
        tr = GRPOTrainer(make_cfg(model_dir, data_file, *over, *extra), reward_fns=[varied_reward])
        grads: list[list[torch.Tensor]] = []
        step = tr.optimizer.step

        def spy(*args, _step=step, _tr=tr, _g=grads, **kwargs):
            _g.append([p.grad.clone() for p in _tr.params])
            return _step(*args, **kwargs)

        tr.optimizer.step = spy
        runs.append((tr.train()["history"], grads))
    (ha, ga), (hb, gb) = runs
    assert len(ga) == len(gb) == 4
    for ra, rb in zip(ha, hb):
        assert ra["loss"] == pytest.approx(rb["loss"], rel=1e-4, abs=1e-7)
        assert ra["clip_frac"] == pytest.approx(rb["clip_frac"], abs=1e-6)
    for step_a, step_b in zip(ga, gb):
        scale = max(float(g.abs().max()) for g in step_a)
        assert scale > 0
        for x, y in zip(step_a, step_b):
            torch.testing.assert_close(x, y, atol=1e-5 * scale, rtol=1e-4)


def test_a_fresh_run_does_not_overwrite_an_existing_one(tmp_path, model_dir, data_file):
    cfg = make_cfg(model_dir, data_file, "run.steps=1")
    GRPOTrainer(cfg, run_dir=tmp_path / "run").train()
    with pytest.raises(ValueError, match="already holds a run"):
        GRPOTrainer(cfg, run_dir=tmp_path / "run")


def test_automatic_micro_batches_follow_the_lengths(model_dir, data_file):
    from policies.language_model import Rollout

    tr = GRPOTrainer(make_cfg(model_dir, data_file))
    n, T = 32, 100

    def batch(lengths):
        cm = (torch.arange(T)[None, :] < torch.tensor(lengths)[:, None]).long()
        return Rollout(
            torch.ones(n, 4, dtype=torch.long),
            torch.ones(n, 4, dtype=torch.long),
            torch.ones(n, T, dtype=torch.long),
            cm,
            torch.zeros(n, dtype=torch.bool),
            None,
            torch.arange(n),
        )

    rows = torch.arange(n)
    even = batch([T] * n)
    assert len(tr._micro_batches(rows, even)) == 1  # nothing to gain from splitting
    uneven = batch([T] * 4 + [5] * (n - 4))
    parts = tr._micro_batches(rows, uneven)
    assert len(parts) > 1 and torch.equal(torch.cat(parts), rows)
