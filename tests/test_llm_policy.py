"""The language-model policy: batched sampling, masked per-token log-probabilities that do
not depend on batching or padding, references (frozen copy, LoRA adapter disabled)."""

import pytest
import torch

pytest.importorskip("transformers")

from policies.language_model import LanguageModelConfig, LanguageModelPolicy, Rollout  # noqa: E402
from training.grpo.tiny import build_tiny_model, build_tokenizer  # noqa: E402


@pytest.fixture(autouse=True)
def one_thread():
    n = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(n)


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    return build_tiny_model(tmp_path_factory.mktemp("tiny") / "model", seed=0)


def load(model_dir, **kw):
    need_ref = kw.pop("need_reference", True)
    return LanguageModelPolicy.from_pretrained(
        model_dir, LanguageModelConfig(**kw), need_reference=need_ref
    )


def test_tokenizer_round_trip_and_special_tokens(model_dir):
    tok = build_tokenizer()
    ids = tok("3+4=7")["input_ids"]
    assert len(ids) == 5 and tok.decode(ids) == "3+4=7"
    pol = load(model_dir, need_reference=False)
    assert pol.pad_id == tok.pad_token_id
    assert pol.eos_ids.tolist() == [tok.eos_token_id]
    assert pol.reference == "none"


def test_generate_layout_masks_and_groups(model_dir):
    pol = load(model_dir, need_reference=False)
    prompts = pol.encode_prompts(["1+2=", "12+34=", "what is 5*6?"])
    g = torch.Generator().manual_seed(0)
    r = pol.generate(prompts, 4, max_new_tokens=40, temperature=1.0, generator=g)
    assert len(r) == 12
    assert r.group.tolist() == [0] * 4 + [1] * 4 + [2] * 4
    # prompts left-padded, their tokens at the right end
    for i, p in enumerate(prompts):
        for row in range(4 * i, 4 * i + 4):
            n = int(r.prompt_mask[row].sum())
            assert n == len(p)
            assert r.prompt_ids[row, -n:].tolist() == p
            assert r.prompt_mask[row, : r.prompt_mask.shape[1] - n].sum() == 0
    eos = pol.eos_ids.item()
    for row in range(len(r)):
        n = int(r.completion_mask[row].sum())
        assert r.completion_mask[row, :n].all() and not r.completion_mask[row, n:].any()
        toks = r.completion_ids[row, :n].tolist()
        if r.truncated[row]:
            assert n == 40 and eos not in toks
        else:
            assert toks[-1] == eos and eos not in toks[:-1]
        assert (r.completion_ids[row, n:] == pol.pad_id).all()
        assert (r.sample_logp[row, n:] == 0).all()
    # the random model ends some completions early and runs others to the limit
    assert r.truncated.any() and (~r.truncated).any()


def test_same_generator_state_same_completions(model_dir):
    pol = load(model_dir, need_reference=False)
    prompts = pol.encode_prompts(["1+2=", "3+4="])
    a = pol.generate(prompts, 3, max_new_tokens=10, generator=torch.Generator().manual_seed(5))
    b = pol.generate(prompts, 3, max_new_tokens=10, generator=torch.Generator().manual_seed(5))
    c = pol.generate(prompts, 3, max_new_tokens=10, generator=torch.Generator().manual_seed(6))
    assert torch.equal(a.completion_ids, b.completion_ids)
    assert not torch.equal(a.completion_ids, c.completion_ids)


def test_scored_logprobs_match_sampling_and_ignore_padding(model_dir):
    pol = load(model_dir, need_reference=False)
    prompts = pol.encode_prompts(["1+2=", "12+34=", "what is 5*6?"])
    r = pol.generate(
        prompts, 2, max_new_tokens=12, temperature=0.8, generator=torch.Generator().manual_seed(1)
    )
    logp, ent = pol.logprobs(r, temperature=0.8, with_entropy=True)
    m = r.completion_mask.bool()
    torch.testing.assert_close(logp[m], r.sample_logp[m], atol=1e-4, rtol=0)
    assert (logp[~m] == 0).all() and (ent[~m] == 0).all()
    assert (ent[m] > 0).all()
    # each row alone (no padding at all) gives the same log-probabilities
    for row in range(len(r)):
        one = r.select(torch.tensor([row]))
        alone, _ = pol.logprobs(one, temperature=0.8)
        T = one.completion_ids.shape[1]
        torch.testing.assert_close(alone[0], logp[row, :T], atol=1e-5, rtol=0)
    # against a plain forward of the unpadded sequence
    row = 2
    n_p = int(r.prompt_mask[row].sum())
    n_c = int(r.completion_mask[row].sum())
    ids = torch.cat([r.prompt_ids[row, -n_p:], r.completion_ids[row, :n_c]]).unsqueeze(0)
    with torch.no_grad():
        logits = pol.model(input_ids=ids).logits[0, n_p - 1 : -1] / 0.8
    want = torch.log_softmax(logits, -1).gather(-1, ids[0, n_p:].unsqueeze(-1)).squeeze(-1)
    torch.testing.assert_close(logp[row, :n_c].detach(), want, atol=1e-5, rtol=0)


def test_logprobs_have_gradients_and_chunking_agrees(model_dir):
    pol = load(model_dir, need_reference=False)
    r = pol.generate(
        pol.encode_prompts(["1+1=", "2+2=", "9+9="]),
        2,
        max_new_tokens=6,
        generator=torch.Generator().manual_seed(2),
    )
    logp, _ = pol.logprobs(r)
    logp.sum().backward()
    assert any(p.grad is not None and p.grad.abs().sum() > 0 for p in pol.model.parameters())
    chunked = load(model_dir, need_reference=False, logprob_batch_size=2)
    with torch.no_grad():
        a, _ = pol.logprobs(r)
        b, _ = chunked.logprobs(r)
    torch.testing.assert_close(a, b, atol=1e-6, rtol=0)


def test_greedy_top_k_top_p(model_dir):
    pol = load(model_dir, need_reference=False)
    prompts = pol.encode_prompts(["1+2="])
    greedy = pol.generate(prompts, 3, max_new_tokens=5, temperature=0.0)
    assert (greedy.completion_ids == greedy.completion_ids[0]).all()
    # top_k=1 is greedy whatever the temperature
    k1 = pol.generate(
        prompts,
        3,
        max_new_tokens=5,
        temperature=1.5,
        top_k=1,
        generator=torch.Generator().manual_seed(0),
    )
    assert torch.equal(k1.completion_ids, greedy.completion_ids)
    # a tiny top_p keeps only the most likely token
    p = pol.generate(
        prompts,
        3,
        max_new_tokens=5,
        temperature=1.0,
        top_p=1e-6,
        generator=torch.Generator().manual_seed(0),
    )
    assert torch.equal(p.completion_ids, greedy.completion_ids)
    with pytest.raises(ValueError):
        pol.generate(prompts, 2, max_new_tokens=5, top_p=0.0)
    with pytest.raises(ValueError):
        pol.generate(prompts, 0, max_new_tokens=5)


def test_reference_copy_is_frozen_and_starts_equal(model_dir):
    pol = load(model_dir)  # full fine-tuning: the reference is a frozen copy
    assert pol.reference == "copy"
    r = pol.generate(
        pol.encode_prompts(["1+2=", "3+3="]),
        2,
        max_new_tokens=6,
        generator=torch.Generator().manual_seed(3),
    )
    with torch.no_grad():
        logp, _ = pol.logprobs(r)
    ref = pol.reference_logprobs(r)
    torch.testing.assert_close(ref, logp, atol=0, rtol=0)
    with torch.no_grad():
        for p in pol.model.parameters():
            p.add_(0.05)
        moved, _ = pol.logprobs(r)
    assert not torch.allclose(moved, logp)
    torch.testing.assert_close(pol.reference_logprobs(r), ref, atol=0, rtol=0)
    # the copy is neither trained nor part of the trainable state
    assert all(not p.requires_grad for p in pol._ref[0].parameters())
    assert set(pol.trainable_state_dict()) == {n for n, _ in pol.model.named_parameters()}


def test_lora_reference_is_base_model_with_adapter_disabled(model_dir):
    pytest.importorskip("peft")
    pol = load(model_dir, lora_r=4, lora_alpha=8)
    assert pol.is_peft and pol.reference == "adapter_disabled"
    names = set(pol.trainable_state_dict())
    assert names and all("lora_" in n for n in names)
    r = pol.generate(
        pol.encode_prompts(["1+2="]),
        3,
        max_new_tokens=6,
        generator=torch.Generator().manual_seed(4),
    )
    with torch.no_grad():
        # LoRA B starts at zero: adapter on and off agree
        torch.testing.assert_close(pol.logprobs(r)[0], pol.reference_logprobs(r), atol=1e-6, rtol=0)
        for n, p in pol.model.named_parameters():
            if "lora_B" in n:
                p.add_(0.1)
        on = pol.logprobs(r)[0]
        off = pol.reference_logprobs(r)
    assert not torch.allclose(on, off)
    base = load(model_dir, need_reference=False)
    with torch.no_grad():
        torch.testing.assert_close(off, base.logprobs(r)[0], atol=1e-6, rtol=0)


def test_trainable_state_round_trip_and_mismatch(model_dir):
    pol = load(model_dir, need_reference=False)
    state = pol.trainable_state_dict()
    other = load(model_dir, need_reference=False)
    with torch.no_grad():
        for p in other.model.parameters():
            p.zero_()
    other.load_trainable_state_dict(state)
    for (n, a), (_, b) in zip(pol.model.named_parameters(), other.model.named_parameters()):
        assert torch.equal(a, b), n
    with pytest.raises(ValueError, match="missing"):
        other.load_trainable_state_dict({k: v for k, v in list(state.items())[1:]})


def test_rollout_concat_repads(model_dir):
    pol = load(model_dir, need_reference=False)
    a = pol.generate(
        pol.encode_prompts(["1+2="]),
        2,
        max_new_tokens=3,
        generator=torch.Generator().manual_seed(0),
    )
    b = pol.generate(
        pol.encode_prompts(["what is 12+34?"]),
        2,
        max_new_tokens=8,
        generator=torch.Generator().manual_seed(0),
    )
    c = Rollout.concat([a, b], pol.pad_id)
    assert len(c) == 4 and c.group.tolist() == [0, 0, 1, 1]
    with torch.no_grad():
        la, _ = pol.logprobs(a)
        lc, _ = pol.logprobs(c)
    torch.testing.assert_close(lc[:2, : la.shape[1]], la, atol=1e-5, rtol=0)


def test_missing_model_dir_is_clear(tmp_path):
    with pytest.raises(FileNotFoundError, match="does not exist"):
        LanguageModelPolicy.from_pretrained(tmp_path / "nope", need_reference=False)
    with pytest.raises(FileNotFoundError, match="config.json"):
        LanguageModelPolicy.from_pretrained(tmp_path, need_reference=False)
    with pytest.raises(ValueError, match="adapter_disabled"):
        LanguageModelConfig(reference="adapter_disabled")


def _save(tmp_path, name, config):
    from transformers import AutoModelForCausalLM

    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(config)
    path = tmp_path / name
    model.save_pretrained(str(path))
    build_tokenizer().save_pretrained(str(path))
    return path


def _arch(tmp_path, kind):
    import transformers

    tok = build_tokenizer()
    common = dict(
        vocab_size=len(tok),
        pad_token_id=tok.pad_token_id,
        bos_token_id=tok.bos_token_id,
        eos_token_id=tok.eos_token_id,
    )
    if kind == "llama_gqa":
        cfg = transformers.LlamaConfig(
            hidden_size=64,
            intermediate_size=96,
            num_hidden_layers=2,
            num_attention_heads=4,
            num_key_value_heads=2,
            **common,
        )
    elif kind == "qwen2_bias":
        cfg = transformers.Qwen2Config(
            hidden_size=64,
            intermediate_size=96,
            num_hidden_layers=2,
            num_attention_heads=4,
            num_key_value_heads=2,
            **common,
        )
    else:  # an architecture without the fast path
        cfg = transformers.GPT2Config(n_embd=64, n_layer=2, n_head=4, **common)
    return _save(tmp_path, kind, cfg)


@pytest.mark.parametrize("kind", ["tiny", "llama_gqa", "qwen2_bias", "gpt2"])
def test_fast_sampling_matches_the_model_forward(tmp_path, model_dir, kind):
    path = model_dir if kind == "tiny" else _arch(tmp_path, kind)
    fast = LanguageModelPolicy.from_pretrained(path, LanguageModelConfig(), need_reference=False)
    slow = LanguageModelPolicy.from_pretrained(
        path, LanguageModelConfig(fast_sampling=False), need_reference=False
    )
    prompts = fast.encode_prompts(["1+2=", "12+34=", "what is 5*6?"])  # left padding too
    a = fast.generate(prompts, 2, max_new_tokens=12, temperature=0.0)
    b = slow.generate(prompts, 2, max_new_tokens=12, temperature=0.0)
    assert torch.equal(a.completion_ids, b.completion_ids)
    uses_fast = fast._decoder not in (None, False) and fast._decoder.verified
    assert uses_fast == (kind != "gpt2")
    r = fast.generate(
        prompts, 3, max_new_tokens=12, temperature=1.0, generator=torch.Generator().manual_seed(0)
    )
    with torch.no_grad():
        lp, _ = fast.logprobs(r)
    m = r.completion_mask.bool()
    torch.testing.assert_close(lp[m], r.sample_logp[m], atol=1e-4, rtol=0)
    if kind == "qwen2_bias":
        assert fast.base_model.model.layers[0].self_attn.q_proj.bias is not None


def test_fast_sampling_with_lora_uses_the_adapter(model_dir):
    pytest.importorskip("peft")
    pol = load(model_dir, lora_r=4, need_reference=False)
    with torch.no_grad():
        for n, p in pol.model.named_parameters():
            if "lora_B" in n:
                p.normal_(0, 0.5)
    prompts = pol.encode_prompts(["1+2=", "3+4="])
    r = pol.generate(prompts, 3, max_new_tokens=10, generator=torch.Generator().manual_seed(0))
    assert pol._decoder.verified
    with torch.no_grad():
        lp, _ = pol.logprobs(r)
    m = r.completion_mask.bool()
    torch.testing.assert_close(lp[m], r.sample_logp[m], atol=1e-4, rtol=0)
