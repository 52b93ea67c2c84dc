"""Property tests of the policy model: causality, cache equivalence, time-shift invariance, order
sensitivity, padding, overfitting, and the model card's parameter count. Tiny sizes throughout."""

import dataclasses
import types

import pytest
import torch

from vla.config import ConfigError, from_dict
from vla.model import ActionTransformer, DataSpec, ModelConfig
from vla.model.card import model_card

# The tiny network of these tests: the shipped architecture (conv stem with FiLM, instruction-conditioned
# keypoints) scaled down, one action per step; tests switch features one at a time.
TINY = dict(
    patch_size=8,  # 4 patches per camera
    conv_channels=8,
    keypoints=2,
    keypoint_channels=8,
    chunk=1,
    window=3,
    instruction_len=6,
    action_bins=16,
    d_model=32,
    n_layer=2,
    n_head=2,
    d_ff=64,
)
TINY_SPEC = dict(
    image_size=16, proprio_dim=3, action_dim=2, vocab_size=40, n_cameras=1, aux_dim=0, keypoint_targets=False
)


@pytest.fixture(autouse=True, scope="module")
def one_thread():
    """Tiny tensors: one intra-op thread. With two on a busy 2-core machine, OpenMP hand-offs between
    microsecond-sized ops made this file ~15x slower."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


def tiny(**kw) -> tuple[ModelConfig, DataSpec]:
    """The tiny (config, data spec) with `kw` replacing fields of either."""
    spec = {k: kw.pop(k) for k in list(kw) if k in TINY_SPEC}
    return ModelConfig(**{**TINY, **kw}), DataSpec(**{**TINY_SPEC, **spec})


def dims(model: ActionTransformer) -> types.SimpleNamespace:
    """Every size of a model in one namespace: config, data spec and token layout."""
    lay = model.layout
    derived = {k: getattr(lay, k) for k in ("grid", "keypoint_grid", "n_image_tokens", "n_obs_tokens",
                                            "n_action_tokens", "tokens_per_step", "n_tokens")}  # fmt: skip
    return types.SimpleNamespace(**dataclasses.asdict(model.cfg), **dataclasses.asdict(model.spec), **derived)


def make_model(seed=0, sharp=False, **kw) -> ActionTransformer:
    """A tiny model. `sharp`: query/key weights 15x the init scale, so attention is far from uniform and
    content-position interactions are large (at init they are ~1e-5: logits barely move)."""
    torch.manual_seed(seed)
    model = ActionTransformer(*tiny(**kw)).eval()
    if sharp:
        with torch.no_grad():
            for block in model.blocks:
                block.attn.c_attn.weight[: 2 * model.cfg.d_model] *= 15.0
    return model


def make_batch(cfg: types.SimpleNamespace, B=2, T=None, seed=0, t0=5) -> dict:
    g = torch.Generator().manual_seed(seed)
    T = cfg.window if T is None else T
    instruction = torch.randint(2, cfg.vocab_size, (B, cfg.instruction_len), generator=g)
    instruction[:, 0] = 1
    instruction[0, 4:] = 0  # padded tail on the first sample
    return {
        "instruction": instruction,
        "image": torch.randint(0, 256, (B, T, cfg.n_cameras, cfg.image_size, cfg.image_size, 3), generator=g).to(
            torch.uint8
        ),
        "proprio": torch.randn(B, T, cfg.proprio_dim, generator=g),
        "timestep": torch.arange(t0, t0 + T)[None].repeat(B, 1),
        "step_mask": torch.ones(B, T, dtype=torch.bool),
        "actions": torch.randint(0, cfg.action_bins, (B, T, cfg.n_action_tokens), generator=g),
    }


def test_forward_shapes_loss_accuracy():
    model = make_model(chunk=2)
    cfg = dims(model)
    out = model(make_batch(cfg))
    assert out["logits"].shape == (2, cfg.window, cfg.chunk * cfg.action_dim, cfg.action_bins)
    assert out["loss"].ndim == 0 and torch.isfinite(out["loss"])
    assert out["accuracy"].shape == (cfg.action_dim,) and ((out["accuracy"] >= 0) & (out["accuracy"] <= 1)).all()
    assert "loss" not in model({k: v for k, v in make_batch(cfg).items() if k != "actions"})


# ------------------------------------------------------------------------------------ causality


def test_causality_perturbing_any_token_changes_no_earlier_output():
    model = make_model()
    batch = make_batch(dims(model), B=1)
    batch["instruction"][:] = torch.arange(1, 7)  # no padding: every position is a real token
    x, _ = model.embed(batch)  # (1, N, d)
    mask = model.window_mask(batch)
    h, _ = model.trunk(x, mask)
    for p in range(x.shape[1]):
        x2 = x.clone()
        x2[:, p] += torch.randn(x.shape[-1])
        h2, _ = model.trunk(x2, mask)
        assert torch.allclose(h2[:, :p], h[:, :p], atol=1e-6), f"perturbing token {p} changed an earlier one"
        assert not torch.allclose(h2[:, p], h[:, p], atol=1e-4)


def test_causality_through_inputs():
    """Changing step k's image leaves all earlier predictions unchanged."""
    model = make_model()
    cfg, batch = dims(model), make_batch(dims(model))
    ref = model(batch)["logits"]  # (B, T, CA, bins)
    b2 = {k: v.clone() for k, v in batch.items()}
    b2["image"][:, 2] = 255 - b2["image"][:, 2]
    out = model(b2)["logits"]
    assert torch.allclose(out[:, :2], ref[:, :2], atol=1e-6) and not torch.allclose(out[:, 2], ref[:, 2], atol=1e-5)
    assert cfg.window == 3


@pytest.mark.parametrize("committed_actions", [False, True])
def test_parallel_slots_never_see_the_targets(committed_actions):
    """A parallel model predicts the whole chunk at once: the targets (batch["actions"]) are labels, not
    inputs, also when its slots can hold committed bins (those come only from batch["committed"])."""
    model = make_model(chunk=2, committed_actions=committed_actions)
    cfg = dims(model)
    A, batch = cfg.action_dim, make_batch(cfg)
    ref = model(batch)["logits"]
    other = dict(batch, actions=(batch["actions"] + 7) % cfg.action_bins)
    assert torch.equal(model(other)["logits"], ref)
    if committed_actions:  # the committed bins are read: the first row given changes the second row's logits
        committed = torch.full_like(batch["actions"], -1)
        committed[:, :, :A] = batch["actions"][:, :, :A]
        out = model(dict(batch, committed=committed))["logits"]
        assert not torch.allclose(out[:, :, A:], ref[:, :, A:], atol=1e-5)


def test_step_scope_observations_see_only_their_step_and_the_instruction():
    model = make_model()
    cfg, batch = dims(model), make_batch(dims(model), B=1)
    layout = model.token_layout()
    x, _ = model.embed(batch)
    mask = model.window_mask(batch)
    h, _ = model.trunk(x, mask)
    x2 = x.clone()
    x2[:, layout["step"] == 0] += torch.randn(x.shape[-1])  # change all of step 0 (observations and actions)
    h2, _ = model.trunk(x2, mask)
    later_obs = (layout["step"] > 0) & (layout["index"] < cfg.n_obs_tokens)
    later_act = (layout["step"] > 0) & (layout["index"] >= cfg.n_obs_tokens)
    assert torch.allclose(h2[:, later_obs], h[:, later_obs], atol=1e-6)
    assert not torch.allclose(h2[:, later_act], h[:, later_act], atol=1e-4)  # actions read past steps


# ------------------------------------------------------------------------------------ streaming


def stream_vs_recompute(model, n_steps, B=2, t0=3, seed=1):
    """Run an episode through the cache; at every step recompute the same window from scratch."""
    cfg = dims(model)
    ep = make_batch(cfg, B=B, T=n_steps, seed=seed, t0=t0)
    cache = model.new_cache(B)
    model.start(cache, ep["instruction"])
    ptr = cache.kv.data_ptr()
    diffs, same, tokens = [], [], []
    for t in range(n_steps):
        out = model.step(cache, ep["image"][:, t], ep["proprio"][:, t], ep["timestep"][:, t])
        tokens.append(out.tokens)
        lo = max(0, t - cfg.window + 1)
        ref = model.recompute(
            ep["instruction"],
            ep["image"][:, lo : t + 1],
            ep["proprio"][:, lo : t + 1],
            ep["timestep"][:, lo : t + 1],
        )
        assert out.logits.shape == (B, cfg.n_action_tokens, cfg.action_bins)
        diffs.append((out.logits - ref.logits).abs().max().item())
        same.append(bool((out.tokens == ref.tokens).all()))
    assert cache.kv.data_ptr() == ptr and cache.n_steps == n_steps  # constant memory, no reallocation
    return diffs, same


@pytest.mark.parametrize("chunk", [1, 2])
def test_cache_equivalence_over_a_long_episode(chunk):
    model = make_model(chunk=chunk)
    n = 3 * model.cfg.window + 2  # the window slides 8 times
    diffs, same = stream_vs_recompute(model, n)
    assert max(diffs) <= 1e-4, diffs
    assert all(same)


def test_cache_equivalence_conv_patches_two_cameras():
    model = make_model(n_cameras=2)
    diffs, same = stream_vs_recompute(model, 2 * model.cfg.window + 1)
    assert max(diffs) <= 1e-4 and all(same)


@pytest.mark.parametrize("stem, keypoints", [("conv", 0), ("conv", 4), ("linear", 4)])  # linear: keypoint FiLM only
def test_cache_equivalence_with_an_instruction_conditioned_stem(stem, keypoints):
    model = make_model(sharp=True, patch_embed=stem, film=True, keypoints=keypoints, aux_feed=bool(keypoints))
    diffs, same = stream_vs_recompute(model, 3 * model.cfg.window)
    assert max(diffs) <= 1e-4 and all(same)


def test_cache_equivalence_with_the_aux_prediction_fed_back():
    model = make_model(sharp=True, patch_embed="conv", film=True, keypoints=4, aux_dim=6, aux_feed=True)
    diffs, same = stream_vs_recompute(model, 3 * model.cfg.window)
    assert max(diffs) <= 1e-4 and all(same)


def test_aux_feed_puts_the_prediction_into_the_proprio_token_without_training_it():
    model = make_model(patch_embed="conv", keypoints=4, aux_dim=6, aux_feed=True).train()
    batch = make_batch(dims(model))
    batch["aux"] = torch.randn(*batch["timestep"].shape, 6)
    with torch.no_grad():
        context = model.instruction_context(batch["instruction"])
        fed = model.embed_steps(batch["image"], batch["proprio"], context).x  # (B, T, S, d)
        model.aux_embed.weight.zero_()  # the same pass without the feed
        plain = model.embed_steps(batch["image"], batch["proprio"], context).x
        torch.nn.init.normal_(model.aux_embed.weight)
    proprio_row = dims(model).n_image_tokens
    assert (fed[:, :, proprio_row] - plain[:, :, proprio_row]).abs().max() > 1e-3  # the proprio token moved
    assert torch.equal(fed[:, :, :proprio_row], plain[:, :, :proprio_row])  # and only it
    out = model(batch)
    out["loss"].backward()  # the action loss alone: the prediction is given, not trained through
    assert all(p.grad is None or p.grad.abs().sum() == 0 for p in model.aux_head.parameters())
    assert model.aux_embed.weight.grad.abs().sum() > 0
    with pytest.raises(ValueError, match="aux_feed=True needs keypoints"):
        tiny(aux_feed=True, keypoints=0, aux_dim=6)
    no_targets = ActionTransformer(*tiny(patch_embed="conv", keypoints=4, aux_feed=True))  # data without aux
    assert no_targets.aux_head is None and no_targets.aux_embed is None and not no_targets.layout.feeds_aux


def test_keypoint_tokens_locate_and_train_through_the_auxiliary_loss():
    model = make_model(patch_embed="conv", keypoints=4, film=True, aux_dim=6).train()
    cfg = dims(model)
    assert cfg.n_image_tokens == cfg.grid**2 + 4
    batch = make_batch(cfg)
    batch["aux"] = torch.randn(*batch["timestep"].shape, 6)
    out = model(batch)
    context = model.instruction_context(batch["instruction"])
    where = model.patch_embed(batch["image"], context).where  # (B, T, C, M, 2) soft-argmax coordinates in [-1, 1]
    assert where.shape[2:] == (1, 4, 2) and where.abs().max() <= 1.0
    out["aux_loss"].backward()
    grad = model.patch_embed.kp_convs[0].weight.grad
    assert grad is not None and grad.abs().sum() > 0  # the localization signal reaches the keypoint net


@pytest.mark.parametrize("keypoint_targets", [True, False])
def test_what_trains_the_keypoint_maps_picks_their_net(keypoint_targets):
    """With heat-map targets the keypoint net also sees coordinate channels and its auxiliary head reads
    keypoints and proprio only; without them it sees colours only (a flat image gives a flat map away from
    the padded border) and the head also reads the instruction's conditioning."""
    model = make_model(patch_embed="conv", keypoints=4, film=True, aux_dim=6, keypoint_targets=keypoint_targets)
    batch = make_batch(dims(model))
    batch["image"][:] = 128  # one colour everywhere
    context = model.instruction_context(batch["instruction"])
    with torch.no_grad():
        heat = model.patch_embed(batch["image"], context).heat  # (B, T, C, M, h*w), softmax weights
    h = dims(model).keypoint_grid
    inner = heat.unflatten(-1, (h, h))[..., 2:-2, 2:-2]  # beyond the two convs' reach of the zero padding
    spread = (inner.amax((-2, -1)) - inner.amin((-2, -1))).max()
    assert (spread > 1e-4) if keypoint_targets else (spread < 1e-6), spread
    batch["aux"] = torch.randn(*batch["timestep"].shape, 6)
    model(batch)["aux_loss"].backward()
    reads_film = model.patch_embed.kp_film[0].weight.grad.abs().sum() > 0
    head_in = model.aux_head[0].in_features - 2 * 4 - dims(model).proprio_dim  # beyond keypoints + proprio
    assert (head_in == 0) == keypoint_targets and reads_film  # the keypoints themselves train either way


def test_film_stem_reads_the_instruction():
    """With FiLM, the patch features themselves depend on the instruction (not only later attention)."""
    model = make_model(patch_embed="conv", film=True)
    for film in model.patch_embed.film:  # well away from the identity, so the effect is visible
        torch.nn.init.normal_(film.weight, std=0.5)
    batch = make_batch(dims(model))
    other = dict(batch, instruction=batch["instruction"].flip(0))
    a = model.patch_embed(batch["image"], model.instruction_context(batch["instruction"])).tokens
    b = model.patch_embed(other["image"], model.instruction_context(other["instruction"])).tokens
    assert (a - b).abs().max() > 1e-3
    with pytest.raises(ValueError, match="film=True needs patch_embed='conv'"):
        tiny(film=True, patch_embed="linear", keypoints=0, aux_feed=False)


def test_the_instruction_conditions_the_stem_once_per_episode_not_per_step():
    """The FiLM scales, shifts and keypoint queries are computed in `start` (PatchEmbed.condition): a
    streaming step only reads them, so none of the layers that make them runs again per step."""
    model = make_model(patch_embed="conv", film=True, keypoints=2)
    pe, calls = model.patch_embed, []
    layers = [*pe.film, *pe.kp_film, pe.kp_query]
    for layer in layers:
        layer.register_forward_hook(lambda module, args, out: calls.append(module))
    batch, cache = make_batch(dims(model), B=1), model.new_cache(1)
    model.start(cache, batch["instruction"])
    assert calls == layers  # each once, in start
    for t in range(3):
        model.step(cache, batch["image"][:, 0], batch["proprio"][:, 0], torch.tensor([t]))
    assert calls == layers


def test_cache_restart_and_sampling():
    model = make_model()
    cfg, ep = dims(model), make_batch(dims(model), B=1, T=3)
    cache = model.new_cache(1)
    with pytest.raises(RuntimeError, match="start"):
        model.step(cache, ep["image"][:, 0], ep["proprio"][:, 0], ep["timestep"][:, 0])
    runs = []
    for _ in range(2):  # start() forgets the previous episode completely
        model.start(cache, ep["instruction"])
        runs.append([model.step(cache, ep["image"][:, t], ep["proprio"][:, t], ep["timestep"][:, t]) for t in range(3)])
    assert all(torch.equal(a.logits, b.logits) for a, b in zip(*runs, strict=True))
    out = runs[0][0]
    assert out.tokens.shape == (1, cfg.n_action_tokens) and torch.equal(out.tokens, out.logits.argmax(-1))


def test_memoized_step_masks_equal_masks_built_every_step():
    """KVCache.memo_mask reuses a step mask only for the same ring state: irregular timesteps (gaps, a
    repeat, a jump back), two instructions with different padding, a batch whose rows differ in time."""
    model = make_model(sharp=True, window=3)
    cfg = dims(model)
    ep = make_batch(cfg, B=2, T=16)
    memo, fresh = model.new_cache(2), model.new_cache(2)
    fresh.memo_mask = lambda slot, timestep, build: build(fresh.coords())  # the mask built every step
    schedule = [0, 1, 2, 3, 7, 8, 8, 9, 20, 2, 3, 4, 5, 6, 7, 8]  # ends steady: ring states repeat
    for instruction in (ep["instruction"], ep["instruction"].flip(0)):
        model.start(memo, instruction)
        model.start(fresh, instruction)
        for t, when in enumerate(schedule):
            timestep = torch.tensor([when, when + (t == 5)])  # at step 5 the two rows differ in time
            a = model.step(memo, ep["image"][:, t], ep["proprio"][:, t], timestep)
            b = model.step(fresh, ep["image"][:, t], ep["proprio"][:, t], timestep)
            assert torch.equal(a.logits, b.logits), (instruction[:, :5], t)
    assert 0 < len(memo._masks) < len(schedule)  # some states repeated, and were reused


# ------------------------------------------------------------------------------------ time and order


def test_relative_time_is_shift_invariant():
    model = make_model(sharp=True)
    batch = make_batch(dims(model))
    shifted = dict(batch, timestep=batch["timestep"] + 137)
    assert torch.allclose(model(batch)["logits"], model(shifted)["logits"], atol=1e-5)
    d1, _ = stream_vs_recompute(model, 6, t0=0)
    d2, _ = stream_vs_recompute(model, 6, t0=500)
    assert max(d1 + d2) <= 1e-4


def swap_steps(batch, i, j):
    out = {k: v.clone() for k, v in batch.items()}
    for key in ("image", "proprio", "actions"):
        out[key][:, [i, j]] = batch[key][:, [j, i]]
    return out


def test_order_sensitivity():
    """Swapping two past steps' observations changes the prediction: a sequence, not a set."""
    model = make_model(sharp=True)
    batch = make_batch(dims(model))
    last = model(batch)["logits"][:, -1]
    assert not torch.allclose(model(swap_steps(batch, 0, 1))["logits"][:, -1], last, atol=1e-4)


# ------------------------------------------------------------------------------------ padding


def test_padded_window_equals_shorter_window():
    model = make_model()
    cfg, n_pad = dims(model), 1
    short = make_batch(cfg, T=cfg.window - n_pad)
    padded = make_batch(cfg, T=cfg.window, seed=9)  # garbage in the padded steps
    padded["instruction"] = short["instruction"]
    for key in ("image", "proprio", "timestep", "actions"):
        padded[key][:, n_pad:] = short[key]
    padded["timestep"][:, :n_pad] = 0
    padded["step_mask"][:, :n_pad] = False
    out_s, out_p = model(short), model(padded)
    assert torch.allclose(out_p["logits"][:, n_pad:], out_s["logits"], atol=1e-5)
    assert torch.allclose(out_p["loss"], out_s["loss"], atol=1e-6)
    assert torch.allclose(out_p["accuracy"], out_s["accuracy"])
    args = ("instruction", "image", "proprio", "timestep")
    rec_s = model.recompute(*(short[k] for k in args))
    rec_p = model.recompute(*(padded[k] for k in args), step_mask=padded["step_mask"])
    assert torch.allclose(rec_p.logits, rec_s.logits, atol=1e-5) and torch.equal(rec_p.tokens, rec_s.tokens)


# ------------------------------------------------------------------------------------ training


def test_overfits_a_fixed_batch():
    model = make_model(chunk=2).train()
    batch = make_batch(dims(model), B=4)
    opt = torch.optim.AdamW(model.optim_groups(weight_decay=0.01), lr=3e-3)
    first = None
    for _ in range(80):
        loss = model(batch)["loss"]
        first = loss.item() if first is None else first
        opt.zero_grad()
        loss.backward()
        opt.step()
    out = model.eval()(batch)
    assert out["loss"].item() < 0.3 * first, (first, out["loss"].item())
    assert out["accuracy"].min() > 0.8


# ------------------------------------------------------------------------------------ card, config, maps


@pytest.mark.parametrize(
    "kw",
    [
        {},
        {"n_cameras": 2},
        {"aux_dim": 6},
        {"film": False, "keypoints": 4, "aux_dim": 6},
        {"patch_embed": "linear", "film": False, "keypoints": 0, "aux_feed": False},
    ],
)
def test_model_card_parameter_total(kw):
    cfg, spec = tiny(**kw)
    card = model_card(cfg, spec)
    model = ActionTransformer(cfg, spec)
    assert card["parameters"]["total"] == sum(p.numel() for p in model.parameters())
    d, dff = cfg.d_model, cfg.d_ff
    per_layer = sum(p.numel() for p in model.blocks[0].parameters())
    assert card["per_layer"]["actual"] == per_layer
    assert card["per_layer"]["formula_4d2_plus_2d_dff"] == 4 * d * d + 2 * d * dff
    assert card["per_layer"]["difference"] == 4 * d + dff + d + 4 * d  # biases + 2 LayerNorms
    assert card["tokens"]["per_step"] == model.layout.tokens_per_step
    assert card["flops"]["per_training_sample_train"] == 3 * card["flops"]["per_training_sample_forward"]
    assert card["flops"]["per_control_step_recompute"] > card["flops"]["per_control_step_streaming"]


def test_config_refuses_typos_and_bad_values():
    assert from_dict(ModelConfig, dict(TINY)) == tiny()[0]
    with pytest.raises(ConfigError, match="d_model"):
        from_dict(ModelConfig, {"d_modle": 64})
    with pytest.raises(ConfigError, match="n_head"):
        from_dict(ModelConfig, {"d_model": 30, "n_head": 4})
    with pytest.raises(ConfigError, match="'model.time_encoding' was removed .only 'relative' remains"):
        from_dict(ModelConfig, {"time_encoding": "learned"}, "model")
    assert from_dict(ModelConfig, {"time_encoding": "relative", "causal_scope": "step"}) == ModelConfig()  # old saves
    with pytest.raises(ConfigError, match="patch_size"):
        from_dict(ModelConfig, {"patch_size": 12, "patch_embed": "conv"})
    with pytest.raises(ConfigError, match="'model.image_size' is decided by the data"):
        from_dict(ModelConfig, {"image_size": 84}, "model")
    with pytest.raises(ValueError, match="image_size=84 .* not a multiple of model.patch_size=16"):
        ActionTransformer(ModelConfig(), DataSpec(image_size=84, proprio_dim=3, action_dim=2, vocab_size=9))


def test_attention_maps():
    model = make_model()
    batch = make_batch(dims(model))
    maps = model.inspect(batch)["attention"]
    N = model.cfg.instruction_len + model.cfg.window * model.layout.tokens_per_step
    assert len(maps) == model.cfg.n_layer and maps[0].shape == (2, model.cfg.n_head, N, N)
    assert torch.allclose(maps[0].sum(-1), torch.ones(2, model.cfg.n_head, N), atol=1e-5)
    assert (maps[-1].triu(diagonal=1) == 0).all()  # nothing attends to the future
    layout = model.token_layout()
    assert layout["segment"].shape == (N,) and (layout["step"][: model.cfg.instruction_len] == -1).all()


def test_replace_keeps_validation():
    with pytest.raises(ValueError, match="n_head"):
        dataclasses.replace(tiny()[0], n_head=5)


def _two_squares(
    B: int, cfg: types.SimpleNamespace, g: torch.Generator
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(B, 1, 1, H, W, 3) images with a red and a green 2x2 square at random places, which one is named
    (0 red, 1 green), and each image's two square centres as (row, column) in -1..1."""
    H = cfg.image_size
    image = torch.zeros(B, 1, 1, H, H, 3, dtype=torch.uint8)
    corners = torch.randint(0, H - 2, (B, 2, 2), generator=g)  # (B, square, (row, col))
    for b in range(B):
        for s in range(2):
            r, c = corners[b, s].tolist()
            image[b, 0, 0, r : r + 2, c : c + 2, s] = 255  # red square in channel 0, green in channel 1
    centres = (corners.float() + 1.0) / H * 2 - 1  # (B, 2, 2): a 2x2 square's centre is at its corner + 1
    return image, torch.randint(0, 2, (B,), generator=g), centres


@pytest.mark.slow
@pytest.mark.parametrize("keypoint_targets", [True, False], ids=["supervised-net", "label-free-net"])
def test_keypoint_targets_teach_an_instruction_conditioned_keypoint(keypoint_targets):
    """The heat-map loss makes keypoint 0 follow whichever square the instruction names: after a short
    training it lands on the named square, and renaming the other square moves it there. Either keypoint
    net (the one a spec with keypoint targets builds, and the label-free one) learns it."""
    model = make_model(window=1, keypoint_targets=keypoint_targets).train()
    cfg = dims(model)
    opt = torch.optim.Adam(model.parameters(), lr=3e-3)
    g = torch.Generator().manual_seed(0)

    def batch_for(image, named):
        batch = make_batch(cfg, B=len(image), T=1)
        batch["image"], batch["instruction"][:, 1] = image, 2 + named  # word 2 = "red", 3 = "green"
        return batch

    losses = []
    for _ in range(150):
        image, named, centres = _two_squares(32, cfg, g)
        batch = batch_for(image, named)
        batch["keypoint_targets"] = centres[torch.arange(32), named][:, None, None]  # (B, T=1, n=1, 2)
        loss = model(batch)["keypoint_loss"]
        opt.zero_grad()
        loss.backward()
        opt.step()
        losses.append(loss.item())
    assert sum(losses[-10:]) / 10 < sum(losses[:10]) / 10 - 1.0  # nats; the target's own entropy is ~2
    model.eval()
    image, named, centres = _two_squares(64, cfg, g)
    for which in (named, 1 - named):
        with torch.no_grad():
            where = model.patch_embed(image, model.instruction_context(batch_for(image, which)["instruction"])).where
        where = where[:, 0, 0, 0]  # (B, 2) keypoint 0
        err = (where - centres[torch.arange(64), which]).norm(dim=-1)
        assert err.median() < 0.2, err.median()  # a fifth of the half-width: within ~1.5 pixels of 16
    with pytest.raises(ValueError, match="keypoint targets need keypoints >= 3"):
        model(dict(batch, keypoint_targets=torch.zeros(32, 1, 3, 2)))
