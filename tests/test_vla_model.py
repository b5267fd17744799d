"""VLA policy: shapes, padding invariance, language decides the chunk after BC, the flow
head's learner interface on VLA features, checkpoints, pretrained towers and LoRA, ONNX
parity, and errors that name the problem."""

from __future__ import annotations

import io
import warnings

import numpy as np
import pytest
import torch

pytest.importorskip("transformers")
pytest.importorskip("tokenizers")

from policies.vla import VLAConfig, VLAPolicy  # noqa: E402
from policies.vla_tokenizer import (  # noqa: E402
    build_word_tokenizer,
    encode_instructions,
    instruction_vocabulary,
    load_tokenizer,
)

PROPRIO, ACT, HORIZON = 5, 2, 4
LOW, HIGH = [-1.0, -2.0], [1.0, 0.5]
INSTRUCTIONS = ["push the block left", "go right"]
# the two instructions' chunks in env units (different, inside the bounds)
TARGETS = torch.tensor(
    [[[0.6, -1.5], [0.3, -1.0], [0.0, -0.5], [-0.3, 0.0]], [[-0.6, 0.2], [-0.2, -0.2]] * 2]
)


@pytest.fixture(scope="module", autouse=True)
def one_torch_thread():
    # tiny towers: a thread pool only adds contention on a shared box
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


@pytest.fixture(scope="module")
def tokenizer():
    words = instruction_vocabulary([*INSTRUCTIONS, "pick up the red cube"])
    return build_word_tokenizer(words)


def _policy(seed: int = 0, **kw) -> VLAPolicy:
    torch.manual_seed(seed)
    p = VLAPolicy(PROPRIO, ACT, VLAConfig(**kw), action_low=LOW, action_high=HIGH)
    p.update_proprio_normalizer(torch.randn(64, PROPRIO) * 2 + 1)
    return p


def _images(n: int, seed: int, size: int = 64) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    return torch.randint(0, 256, (n, size, size, 3), dtype=torch.uint8, generator=g)


def _proprio(n: int, seed: int) -> torch.Tensor:
    return torch.randn(n, PROPRIO, generator=torch.Generator().manual_seed(seed))


def _ids(tokenizer, texts, max_tokens=16) -> torch.Tensor:
    return torch.from_numpy(encode_instructions(tokenizer, texts, max_tokens))


# ---------------------------------------------------------------------- shapes
@pytest.mark.parametrize("encoder", ["film_keypoints", "siglip"])
@pytest.mark.parametrize("image_size", [64, 128])
def test_shapes_of_every_output(tokenizer, image_size, encoder):
    p = _policy(image_size=image_size, vision_encoder=encoder, keypoints=8)
    tokens = 8 if encoder == "film_keypoints" else (image_size // 16) ** 2
    assert p.backbone.num_image_tokens == tokens
    b = 3
    ids = encode_instructions(tokenizer, ["go right"] * b, 16)  # numpy, as the tokenizer gives
    args = (_images(b, 0, image_size), ids, _proprio(b, 0))
    # film_keypoints: the summary, the 8 keypoints' (x, y) and the normalized proprio
    width = 64 + 2 * 8 + PROPRIO if encoder == "film_keypoints" else 64
    assert p.backbone.feature_size == width
    assert p.features(*args).shape == (b, width)
    s = p.sample(*args, steps=3, return_chain=True)
    assert s.actions.shape == (b, HORIZON, ACT)
    assert s.chain.shape == (b, 4, HORIZON, ACT)
    assert p.value(*args).shape == (b,)
    assert p.bc_loss(*args, TARGETS[[0, 1, 0]]).shape == ()
    tau, eps = torch.rand(b, 5), torch.randn(b, 5, HORIZON, ACT)
    assert p.cfm_loss(*args, s.chain[:, -1], tau, eps).shape == (b, 5)


def test_config_rejects_bad_values():
    with pytest.raises(ValueError, match="image_size .*multiple of patch_size"):
        VLAConfig(image_size=60)
    with pytest.raises(ValueError, match="attn_implementation"):
        VLAConfig(attn_implementation="flash_attention_2")
    with pytest.raises(ValueError, match="lm_kv_heads .*must divide lm_heads"):
        VLAConfig(lm_kv_heads=3)
    assert VLAConfig().head.normalize_obs is False  # features are already normalized
    with pytest.raises(ValueError, match="vision_encoder must be one of"):
        VLAConfig(vision_encoder="resnet")
    with pytest.raises(ValueError, match="vision_encoder must be 'siglip' to load"):
        VLAConfig(vision_path="/some/siglip")
    with pytest.raises(ValueError, match="attention must be one of"):
        VLAConfig(attention="bidirectional")
    with pytest.raises(ValueError, match="keypoints must be an integer >= 1"):
        VLAConfig(keypoints=0)


def test_configs_saved_before_a_field_existed_read_as_they_were_trained():
    from training.config import from_dict, to_dict

    old = to_dict(VLAConfig())
    del old["attention"], old["vision_encoder"]
    cfg = from_dict(VLAConfig, old)
    assert (cfg.attention, cfg.vision_encoder) == ("causal", "siglip")


# ---------------------------------------------------------------------- padding
@pytest.mark.parametrize(
    "encoder, attention",
    [("film_keypoints", "prefix"), ("siglip", "prefix"), ("film_keypoints", "causal")],
)
def test_a_rows_output_does_not_depend_on_its_padding(tokenizer, encoder, attention):
    p = _policy(vision_encoder=encoder, attention=attention)
    img, pro = _images(2, 1), _proprio(2, 1)
    # row 0 alone with 2 tokens (no padding), padded to 16, and batched with a longer row
    short = _ids(tokenizer, ["go right"], max_tokens=2)
    padded = _ids(tokenizer, ["go right", "pick up the red cube"], max_tokens=16)
    assert (padded[0] == 0).sum() == 14
    f_short = p.features(img[:1], short, pro[:1])
    f_padded = p.features(img, padded, pro)
    torch.testing.assert_close(f_padded[:1], f_short, atol=1e-5, rtol=0)
    zeros = torch.zeros(1, HORIZON, ACT)
    a_short = p.sample(img[:1], short, pro[:1], stochastic=False, noise=zeros).actions
    a_padded = p.sample(img, padded, pro, stochastic=False, noise=zeros.expand(2, -1, -1)).actions
    torch.testing.assert_close(a_padded[:1], a_short, atol=1e-5, rtol=0)


# ---------------------------------------------------------------------- learning
@pytest.fixture(scope="module")
def trained(tokenizer):
    """A tiny VLA after BC on two instructions with different chunks; the images and
    the proprio are shared by both, so only the words tell the chunks apart. The head is
    the smaller (128, 128) one: 150 updates fit it at one Euler step, which the default
    (256, 256, 256) needs more updates for."""
    import dataclasses

    p = _policy(seed=1, head=dataclasses.replace(VLAConfig().head, hidden=(128, 128)))
    n = 4
    img = _images(n, 2).repeat(2, 1, 1, 1)
    pro = _proprio(n, 2).repeat(2, 1)
    ids = _ids(tokenizer, [INSTRUCTIONS[0]] * n + [INSTRUCTIONS[1]] * n)
    chunks = TARGETS.repeat_interleave(n, dim=0)
    batch = (img, ids, pro, chunks)

    def eval_loss() -> float:
        with torch.no_grad():
            return float(p.bc_loss(*batch, generator=torch.Generator().manual_seed(123)))

    before = eval_loss()
    opt = torch.optim.Adam(p.parameters(), lr=3e-3)
    g = torch.Generator().manual_seed(0)
    for _ in range(150):
        loss = p.bc_loss(*batch, generator=g)
        opt.zero_grad()
        loss.backward()
        opt.step()
    return p, batch, before, eval_loss()


def test_bc_loss_falls_on_a_fixed_batch(trained):
    _, _, before, after = trained
    assert after < 0.35 * before, (before, after)


def test_language_selects_the_chunk(trained):
    """Same image and proprio, two instructions: each gets its own chunk, and swapping
    the instructions swaps the chunks (mean error to its own chunk under half the error
    to the other one: without the words both rows would get the same chunk, equally far
    from both)."""
    p, (img, ids, pro, _), _, _ = trained
    img, pro, ids = img[[0, 0]], pro[[0, 0]], ids[[0, 4]]
    feat = p.features(img, ids, pro)
    assert (feat[0] - feat[1]).abs().max() > 0.1
    zeros = torch.zeros(2, HORIZON, ACT)

    def errors(chunks: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        return (chunks - targets).abs().mean(dim=(1, 2))

    for steps in (1, 4):
        for order in (ids, ids.flip(0)):
            got = p.sample(img, order, pro, steps=steps, stochastic=False, noise=zeros).actions
            want = TARGETS if order is ids else TARGETS.flip(0)
            own, other = errors(got, want), errors(got, want.flip(0))
            assert (own < 0.3).all() and (own < other / 2).all(), (steps, own, other)


# ---------------------------------------------------------------------- learner interface
def test_head_terms_on_vla_features_equal_flow_policys_and_reach_the_backbone(tokenizer):
    p = _policy()
    b = 3
    args = (
        _images(b, 3),
        _ids(tokenizer, ["go right", "pick up the red cube", "go"]),
        _proprio(b, 3),
    )
    chain = p.sample(
        *args, steps=4, generator=torch.Generator().manual_seed(0), return_chain=True
    ).chain
    terms = p.chain_terms(*args, chain)
    feat = p.features(*args)
    ref = p.head.chain_terms(feat, chain)
    assert torch.isfinite(terms.log_prob).all() and terms.log_prob.shape == (b, 4, HORIZON)
    torch.testing.assert_close(terms.log_prob, ref.log_prob, atol=0, rtol=0)
    tau = torch.rand(b, 2, generator=torch.Generator().manual_seed(1))
    eps = torch.randn(b, 2, HORIZON, ACT, generator=torch.Generator().manual_seed(2))
    x1 = chain[:, -1].clamp(-1, 1)
    cfm = p.cfm_loss(*args, x1, tau, eps)
    torch.testing.assert_close(cfm, p.head.cfm_loss(feat, x1, tau, eps), atol=0, rtol=0)
    for loss in (terms.log_prob.sum(), cfm.sum(), p.value(*args).sum()):
        p.zero_grad()
        loss.backward()
        for name in ("projector", "proprio_proj", "language", "vision"):
            grads = [q.grad for n, q in p.backbone.named_parameters() if n.startswith(name)]
            assert any(gr is not None and gr.abs().sum() > 0 for gr in grads), name


# ---------------------------------------------------------------------- checkpoints
def test_state_dict_round_trip_gives_identical_outputs(tmp_path, tokenizer):
    p = _policy(seed=0)
    path = tmp_path / "vla.pt"
    torch.save(p.state_dict(), path)
    q = _policy(seed=5)
    args = (_images(2, 4), _ids(tokenizer, INSTRUCTIONS), _proprio(2, 4))
    assert not torch.equal(p.features(*args), q.features(*args))
    q.load_state_dict(torch.load(path, weights_only=True))
    noise = torch.randn(2, HORIZON, ACT)
    assert torch.equal(p.features(*args), q.features(*args))
    assert torch.equal(
        p.sample(*args, stochastic=False, noise=noise).actions,
        q.sample(*args, stochastic=False, noise=noise).actions,
    )


@pytest.fixture(scope="module")
def towers(tmp_path_factory):
    """A random policy and its towers saved as transformers directories: the vision
    tower as SiglipVisionModel, the decoder inside a LlamaForCausalLM (the layout of a
    downloaded checkpoint)."""
    import transformers

    p = _policy(seed=2, vision_encoder="siglip")
    root = tmp_path_factory.mktemp("towers")
    p.backbone.vision.save_pretrained(str(root / "vision"))
    causal = transformers.LlamaForCausalLM(p.backbone.language.config)
    causal.model.load_state_dict(p.backbone.language.state_dict())
    causal.save_pretrained(str(root / "language"))
    return p, str(root / "vision"), str(root / "language")


def test_from_pretrained_towers_load_the_saved_weights(towers, tokenizer):
    p, vision, language = towers
    q = _policy(seed=3, vision_encoder="siglip", vision_path=vision, language_path=language)
    for a, b in (
        (p.backbone.vision, q.backbone.vision),
        (p.backbone.language, q.backbone.language),
    ):
        sa, sb = a.state_dict(), b.state_dict()
        assert sorted(sa) == sorted(sb)
        assert all(torch.equal(sa[k], sb[k]) for k in sa)
    q.load_state_dict(p.state_dict())  # projectors and heads too: the same policy
    args = (_images(2, 5), _ids(tokenizer, INSTRUCTIONS), _proprio(2, 5))
    assert torch.equal(p.features(*args), q.features(*args))


def test_lora_trains_only_the_adapter_projectors_and_heads(towers, tokenizer):
    p, vision, language = towers
    q = _policy(
        seed=3, vision_encoder="siglip", vision_path=vision, language_path=language, lora_r=4
    )
    names = [n for n, _ in q.trainable_named_parameters()]
    lora = [n for n in names if ".lora_" in n]
    assert lora and all(n.startswith("backbone.language.") for n in lora)
    rest = {n.split(".")[0] + "." + n.split(".")[1] for n in names if n not in lora}
    assert rest == {
        "backbone.projector",
        "backbone.proprio_proj",
        "head.actor",
        "head.noise_net",
        "head.critic",
    }
    frozen = {n: t.detach().clone() for n, t in q.named_parameters() if not t.requires_grad}
    assert any(n.startswith("backbone.vision.") for n in frozen)
    assert any("layers.0.self_attn.q_proj.base_layer" in n for n in frozen)

    args = (_images(4, 6), _ids(tokenizer, INSTRUCTIONS * 2), _proprio(4, 6))
    opt = torch.optim.Adam([t for _, t in q.trainable_named_parameters()], lr=1e-2)
    for _ in range(2):
        opt.zero_grad()
        q.bc_loss(*args, TARGETS.repeat(2, 1, 1)).backward()
        opt.step()
    after = dict(q.named_parameters())
    assert all(torch.equal(frozen[n], after[n]) for n in frozen)
    assert any(after[n].abs().sum() > 0 for n in lora if "lora_B" in n)  # B starts at 0
    # the exported module merges the adapter into a plain decoder and computes the same
    m = q.inference_module(steps=2)
    assert not m.backbone.is_peft
    noise = torch.randn(4, HORIZON, ACT)
    torch.testing.assert_close(
        m(*args, noise),
        q.sample(*args, steps=2, stochastic=False, noise=noise).actions,
        atol=1e-5,
        rtol=0,
    )


# ---------------------------------------------------------------------- export
@pytest.mark.parametrize("steps", [1, 4])
def test_onnx_equals_torch(tokenizer, steps):
    ort = pytest.importorskip("onnxruntime")
    p = _policy(seed=4)
    m = p.inference_module(steps=steps)
    buf = io.BytesIO()
    names = (*m.input_names, *m.output_names)
    with warnings.catch_warnings():
        # the project's exporter choice (deploy/export.py): TorchScript, deprecated upstream
        warnings.simplefilter("ignore", DeprecationWarning)
        warnings.simplefilter("ignore", torch.jit.TracerWarning)
        torch.onnx.export(
            m,
            m.example_inputs(2),
            buf,
            dynamo=False,
            opset_version=17,
            input_names=list(m.input_names),
            output_names=list(m.output_names),
            dynamic_axes={n: {0: "batch"} for n in names},
        )
    sess = ort.InferenceSession(buf.getvalue(), providers=["CPUExecutionProvider"])
    b = 3  # not the traced batch size
    img = _images(b, 7)
    ids = _ids(tokenizer, ["go right", "pick up the red cube", "push the block left"])
    pro = _proprio(b, 7)
    noise = torch.randn(b, HORIZON, ACT, generator=torch.Generator().manual_seed(8))
    feeds = {"image": img, "instruction_ids": ids, "proprio": pro, "noise": noise}
    got = sess.run(None, {k: v.numpy() for k, v in feeds.items()})[0]
    want = m(img, ids, pro, noise)
    err = float(np.abs(got - want.numpy()).max())
    assert err < 1e-4, err
    ref = p.sample(img, ids, pro, steps=steps, stochastic=False, noise=noise).actions
    torch.testing.assert_close(want, ref, atol=1e-6, rtol=0)
    assert want.shape == (b, HORIZON, ACT)


# ---------------------------------------------------------------------- bad inputs
@pytest.mark.parametrize(
    ("images", "match"),
    [
        (torch.zeros(2, 32, 32, 3, dtype=torch.uint8), r"\[B, 64, 64, 3\].*got \[2, 32, 32, 3\]"),
        (torch.zeros(2, 64, 64, 4, dtype=torch.uint8), r"\[B, 64, 64, 3\].*got \[2, 64, 64, 4\]"),
        (
            torch.zeros(2, 3, 64, 64, dtype=torch.uint8),
            r"got \[2, 3, 64, 64\] \(channels go last\)",
        ),
        (torch.zeros(2, 64, 64, 3), r"uint8.*got dtype torch.float32"),
    ],
)
def test_bad_images_name_expected_and_got(tokenizer, images, match):
    p = _policy()
    with pytest.raises(ValueError, match=match):
        p.features(images, _ids(tokenizer, INSTRUCTIONS), _proprio(2, 0))


def test_bad_token_ids_and_proprio_are_named(tokenizer):
    p = _policy()
    img = _images(2, 0)
    with pytest.raises(ValueError, match=r"token_ids must be in \[0, 128\).*got \[0, 500\]"):
        p.features(img, torch.tensor([[500], [0]]), _proprio(2, 0))
    with pytest.raises(ValueError, match="max_instruction_tokens=16"):
        p.features(img, torch.ones(2, 17, dtype=torch.long), _proprio(2, 0))
    with pytest.raises(ValueError, match=r"proprio must be float \[B=2, 5\], got \[2, 4\]"):
        p.features(img, _ids(tokenizer, INSTRUCTIONS), torch.zeros(2, 4))


def test_unknown_word_and_too_long_instruction_are_named(tokenizer):
    with pytest.raises(ValueError, match=r"'pick up the blue cube'.*does not know: 'blue'"):
        encode_instructions(tokenizer, ["go right", "pick up the blue cube"], 16)
    with pytest.raises(
        ValueError, match=r"'push the block left' has 4 tokens, more than max_tokens=3"
    ):
        encode_instructions(tokenizer, ["push the block left"], 3)


def test_tokenizer_file_loads_without_and_with_transformers(tmp_path, tokenizer):
    import tokenizers
    import transformers

    build_word_tokenizer(instruction_vocabulary(INSTRUCTIONS), tmp_path)
    file = tmp_path / "tokenizer.json"
    plain = tokenizers.Tokenizer.from_file(str(file))
    fast = transformers.PreTrainedTokenizerFast(
        tokenizer_file=str(file), pad_token="[PAD]", unk_token="[UNK]"
    )
    texts = ["Go RIGHT", "push the block left"]
    ids = encode_instructions(plain, texts, 6)
    assert ids.dtype == np.int64 and ids.shape == (2, 6)
    np.testing.assert_array_equal(ids, encode_instructions(fast, texts, 6))
    np.testing.assert_array_equal(ids, encode_instructions(load_tokenizer(tmp_path), texts, 6))
    assert ids[0, 2:].tolist() == [0] * 4 and (ids[:, :2] > 1).all()  # padded, known words
    assert fast(texts[0])["input_ids"] == ids[0, :2].tolist()


def test_missing_files_are_named(tmp_path):
    with pytest.raises(FileNotFoundError, match=r"nope[/\\]tokenizer\.json does not exist"):
        load_tokenizer(tmp_path / "nope")
    with pytest.raises(FileNotFoundError, match=r"vision_path .*nowhere.*save_pretrained"):
        VLAPolicy(
            PROPRIO,
            ACT,
            VLAConfig(vision_encoder="siglip", vision_path=str(tmp_path / "nowhere")),
        )
