"""mok.swap_moe on real transformers v5 models built from small random configs, and on
torchtitan-style grouped experts: same logits and gradients before and after, same Parameter
objects and state_dict keys, router untouched."""
import pytest
import torch
from torch import nn

import mok
from conftest import DEVICES
from shapes import rel_err

transformers = pytest.importorskip("transformers")

COMMON = dict(vocab_size=97, hidden_size=64, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2)


def hf_config(name):
    tf = transformers
    if name == "qwen3_moe":
        return tf.Qwen3MoeConfig(**COMMON, intermediate_size=96, moe_intermediate_size=40, num_experts=8,
                                 num_experts_per_tok=2, head_dim=16, norm_topk_prob=True)
    if name == "mixtral":
        return tf.MixtralConfig(**COMMON, intermediate_size=48, num_local_experts=4, num_experts_per_tok=2)
    if name == "qwen2_moe":
        return tf.Qwen2MoeConfig(**COMMON, intermediate_size=96, moe_intermediate_size=32,
                                 shared_expert_intermediate_size=48, num_experts=8, num_experts_per_tok=2)
    if name == "olmoe":
        return tf.OlmoeConfig(**COMMON, intermediate_size=40, num_experts=8, num_experts_per_tok=2)
    if name == "deepseek_v3":
        return tf.DeepseekV3Config(**COMMON, intermediate_size=96, moe_intermediate_size=32, n_routed_experts=8,
                                   num_experts_per_tok=2, n_group=2, topk_group=1, n_shared_experts=1,
                                   first_k_dense_replace=1, q_lora_rank=None, kv_lora_rank=16, qk_rope_head_dim=8,
                                   qk_nope_head_dim=8, v_head_dim=16)
    if name == "gpt_oss":
        return tf.GptOssConfig(**COMMON, intermediate_size=32, num_local_experts=4, num_experts_per_tok=2, head_dim=16)
    raise ValueError(name)


def build(name, device, dtype):
    torch.manual_seed(0)
    model = transformers.AutoModelForCausalLM.from_config(hf_config(name)).to(device=device, dtype=dtype)
    with torch.no_grad():  # random weights of a sensible scale everywhere (some inits leave zeros)
        for p in model.parameters():
            if p.dim() >= 2:
                p.normal_(0, 0.05)
    return model


def logits_and_grads(model, tokens):
    model.zero_grad(set_to_none=True)
    out = model(tokens).logits
    out.float().square().mean().backward()
    grads = {n: p.grad.detach().clone() for n, p in model.named_parameters() if p.grad is not None}
    return out.detach(), grads


HF_MODELS = ["qwen3_moe", "mixtral", "qwen2_moe", "olmoe", "deepseek_v3"]


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
@pytest.mark.parametrize("name", HF_MODELS)
def test_swap_round_trip(device, dtype, name):
    if device == "cpu" and dtype == torch.bfloat16 and name != "qwen3_moe":
        pytest.skip("bf16 on CPU: one model is enough")
    model = build(name, device, dtype)
    tokens = torch.randint(0, 97, (2, 11), device=device)
    ref_logits, ref_grads = logits_and_grads(model, tokens)
    params_before = {n: p for n, p in model.named_parameters()}
    keys_before = list(model.state_dict().keys())
    router = model.model.layers[1].mlp.gate
    router_hooks = dict(router._forward_hooks)

    swapped = mok.swap_moe(model)
    expected = sum(1 for layer in model.model.layers if hasattr(layer.mlp, "experts"))
    assert swapped == expected >= 1
    assert all(isinstance(layer.mlp.experts, mok.integrations.hf.MokHFExperts)
               for layer in model.model.layers if hasattr(layer.mlp, "experts"))
    assert list(model.state_dict().keys()) == keys_before
    assert all(p is params_before[n] for n, p in model.named_parameters())
    assert model.model.layers[1].mlp.gate is router and dict(router._forward_hooks) == router_hooks
    assert mok.swap_moe(model) == 0  # idempotent

    logits, grads = logits_and_grads(model, tokens)
    tol = 1e-5 if dtype == torch.float32 else 2e-2
    assert rel_err(logits, ref_logits) < tol
    assert grads.keys() == ref_grads.keys()
    for n in grads:
        assert rel_err(grads[n], ref_grads[n]) < 5 * tol, n


def test_router_hooks_still_fire_after_swap():
    model = build("qwen3_moe", "cpu", torch.float32)
    seen = []
    model.model.layers[0].mlp.gate.register_forward_hook(lambda m, i, o: seen.append(o[0].shape))
    mok.swap_moe(model)
    model(torch.randint(0, 97, (1, 5)))
    assert seen == [torch.Size([5, 8])]


def test_experts_interface_registration():
    from transformers.integrations.moe import ALL_EXPERTS_FUNCTIONS

    mok.integrations.hf.register()
    assert "mok" in ALL_EXPERTS_FUNCTIONS
    model = build("mixtral", "cpu", torch.float32)
    tokens = torch.randint(0, 97, (2, 9))
    ref = model(tokens).logits
    model.set_experts_implementation("mok")
    assert rel_err(model(tokens).logits, ref) < 1e-5


def test_gpt_oss_is_refused_with_a_reason():
    model = build("gpt_oss", "cpu", torch.float32)
    with pytest.raises(ValueError, match=r"GptOssExperts.*is_transposed"):
        mok.swap_moe(model)


def test_sentinel_ids_need_the_option():
    model = build("qwen3_moe", "cpu", torch.float32)
    mok.swap_moe(model, skip_invalid=True)
    experts = model.model.layers[0].mlp.experts
    x = torch.randn(4, 64)
    idx = torch.tensor([[0, 8], [1, 2], [8, 8], [3, 4]])
    w = torch.rand(4, 2)
    y = experts(x, idx, w)
    assert torch.all(y[2] == 0)
    experts.skip_invalid = False
    with pytest.raises(ValueError, match="topk_idx"):
        experts(x, idx, w)


# ---- torchtitan-style grouped experts (w1/w2/w3, sorted tokens + per-expert counts) ----


class TitanStyleGroupedExperts(nn.Module):
    """The torchtitan GroupedExperts contract, written out with a loop: rows sorted by expert."""

    def __init__(self, dim, hidden_dim, num_experts):
        super().__init__()
        self.w1 = nn.Parameter(torch.randn(num_experts, hidden_dim, dim) * 0.1)
        self.w2 = nn.Parameter(torch.randn(num_experts, dim, hidden_dim) * 0.1)
        self.w3 = nn.Parameter(torch.randn(num_experts, hidden_dim, dim) * 0.1)

    def forward(self, x, num_tokens_per_expert):
        outs, start = [], 0
        for e, n in enumerate(num_tokens_per_expert.tolist()):
            xe = x[start : start + n]
            outs.append((torch.nn.functional.silu(xe @ self.w1[e].t()) * (xe @ self.w3[e].t())) @ self.w2[e].t())
            start += n
        return torch.cat(outs)


class TitanStyleMoE(nn.Module):
    def __init__(self):
        super().__init__()
        self.experts = TitanStyleGroupedExperts(32, 24, 5)


@pytest.mark.parametrize("device", DEVICES)
def test_swap_torchtitan_style(device):
    torch.manual_seed(0)
    moe = TitanStyleMoE().to(device)
    counts = torch.tensor([3, 0, 7, 1, 9], device=device)
    x = torch.randn(int(counts.sum()), 32, device=device, requires_grad=True)
    ref = moe.experts(x, counts)
    ref.sum().backward()
    ref_grads = [p.grad.clone() for p in moe.experts.parameters()] + [x.grad.clone()]
    params = list(moe.experts.parameters())
    x.grad = None
    moe.zero_grad()
    assert mok.swap_moe(moe) == 1
    assert all(a is b for a, b in zip(moe.experts.parameters(), params))
    y = moe.experts(x, counts)
    y.sum().backward()
    assert rel_err(y, ref) < 1e-5
    for g, r in zip([p.grad for p in moe.experts.parameters()] + [x.grad], ref_grads):
        assert rel_err(g, r) < 1e-5


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("options", [dict(recipe="blockwise"), dict(recipe="blockwise", fp8_dgrad=True, fp8_wgrad=True),
                                     dict(recipe="blockwise", fp8_dgrad=True, fp8_wgrad="tiled"),
                                     dict(recipe="mxfp8")], ids=str)
def test_swap_with_fp8_recipes(device, options):
    # swap_moe(model, recipe=...): every swapped experts module runs moe_experts with the options (its
    # output bitwise that call's), and the model's logits and gradients stay within the FP8 recipes'
    # distance of the BF16 model's.
    tf = transformers
    cfg = tf.Qwen3MoeConfig(**{**COMMON, "hidden_size": 128}, intermediate_size=256, moe_intermediate_size=128,
                            num_experts=8, num_experts_per_tok=2, head_dim=32, norm_topk_prob=True)
    torch.manual_seed(0)
    model = transformers.AutoModelForCausalLM.from_config(cfg).to(device=device, dtype=torch.bfloat16)
    with torch.no_grad():
        for p in model.parameters():
            if p.dim() >= 2:
                p.normal_(0, 0.05)
    tokens = torch.randint(0, 97, (2, 40), device=device)
    ref_logits, ref_grads = logits_and_grads(model, tokens)
    assert mok.swap_moe(model, **options) == 2
    experts = model.model.layers[1].mlp.experts
    assert (experts.recipe, experts.fp8_dgrad, experts.fp8_wgrad) == (
        options["recipe"], options.get("fp8_dgrad", False), options.get("fp8_wgrad", False))
    assert options["recipe"] in repr(experts)
    h = torch.randn(30, 128, device=device, dtype=torch.bfloat16)
    idx = torch.randint(0, 8, (30, 2), device=device)
    w = torch.rand(30, 2, device=device, dtype=torch.bfloat16)
    want = mok.functional.moe_experts(h, idx, w, experts.gate_up_proj, experts.down_proj, **options)
    assert torch.equal(experts(h, idx, w), want)
    logits, grads = logits_and_grads(model, tokens)
    # (measured 5.4-5.8e-2 on the logits and 7-10e-2 on the experts' weight gradients: the E4M3 / MXFP8
    # rounding through two layers; above 1e-2, so the recipe did run)
    assert 1e-2 < rel_err(logits, ref_logits) < 0.12
    for n in ("model.layers.1.mlp.experts.gate_up_proj", "model.layers.1.mlp.experts.down_proj"):
        assert rel_err(grads[n], ref_grads[n]) < 0.2, n


def test_swap_recipe_options_are_checked():
    model = build("qwen3_moe", "cpu", torch.float32)
    with pytest.raises(ValueError, match="mok.swap_moe: recipe must be one of"):
        mok.swap_moe(model, recipe="fp8")
    with pytest.raises(ValueError, match="mok.swap_moe: fp8_wgrad must be False unless recipe='blockwise'"):
        mok.swap_moe(model, fp8_wgrad=True)
    with pytest.raises(ValueError, match="fp8_wgrad must be False, True or 'tiled'"):
        mok.swap_moe(model, recipe="blockwise", fp8_wgrad="1x128")
    assert mok.swap_moe(model) == 2  # nothing was replaced by the failed calls
    # the forward's shape rules of the recipe, at the first call (here H = 64: not whole 128-blocks)
    model = build("qwen3_moe", "cpu", torch.bfloat16)
    mok.swap_moe(model, recipe="blockwise")
    with pytest.raises(ValueError, match="multiples of 128"):
        model(torch.randint(0, 97, (1, 5)))


def test_swapped_model_compiles_fullgraph():
    torch._dynamo.reset()
    model = build("qwen3_moe", "cpu", torch.float32)
    tokens = torch.randint(0, 97, (2, 9))
    ref_logits, ref_grads = logits_and_grads(model, tokens)
    mok.swap_moe(model)
    compiled = torch.compile(model, fullgraph=True)
    model.zero_grad(set_to_none=True)
    out = compiled(tokens).logits
    out.float().square().mean().backward()
    assert rel_err(out, ref_logits) < 1e-5
    for n, p in model.named_parameters():
        assert rel_err(p.grad, ref_grads[n]) < 5e-5, n
