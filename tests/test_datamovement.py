import pytest
import torch

from perflab.speed import datamovement as dm
from perflab.gpt2 import model as gpt2


@pytest.mark.parametrize("name, cls", [
    ("aten::addmm", dm.CONTRACTION), ("mm", dm.CONTRACTION), ("aten.bmm.default", dm.CONTRACTION),
    ("aten::_scaled_dot_product_flash_attention", dm.CONTRACTION),
    ("aten::_scaled_dot_product_flash_attention_for_cpu_backward", dm.CONTRACTION),
    ("aten::native_layer_norm", dm.NORMALIZATION),
    ("native_layer_norm_backward", dm.NORMALIZATION),
    ("aten::_softmax", dm.SOFTMAX), ("aten::nll_loss_forward", dm.SOFTMAX),
    ("aten::gelu", dm.ELEMENTWISE), ("aten::add_.Tensor", dm.ELEMENTWISE),
    ("aten::gelu_backward", dm.ELEMENTWISE),
    ("aten::_fused_adamw_", dm.OPTIMIZER), ("aten::_foreach_mul_", dm.OPTIMIZER),
    ("aten::_to_copy", dm.OTHER), ("aten::embedding", dm.OTHER), ("aten::sum", dm.OTHER),
])
def test_classify_op(name, cls):
    assert dm.classify_op(name) == cls


@pytest.mark.parametrize("name, cls", [
    ("triton_per_fused_native_layer_norm_0", dm.NORMALIZATION),
    ("triton_red_fused_add_native_layer_norm_native_layer_norm_backward_7", dm.NORMALIZATION),
    ("triton_poi_fused_add_gelu_mul_pow_tanh_3", dm.ELEMENTWISE),
    ("triton_poi_fused__to_copy_1", dm.OTHER),
    ("triton_poi_fused__to_copy_view_12", dm.OTHER),
    ("triton_red_fused_sum_4", dm.OTHER),
    ("triton_per_fused__softmax_2", dm.SOFTMAX),
    ("triton_tem_fused_mm_5", dm.CONTRACTION),
    ("triton_poi_fused_add_11", dm.ELEMENTWISE),
])
def test_classify_triton(name, cls):
    assert dm.classify_triton(name) == cls
    assert dm.classify_kernel(name) == cls


@pytest.mark.parametrize("name, cls", [
    ("sm90_xmma_gemm_bf16bf16_bf16f32_f32_tn_n_tilesize128x128x64_warpgroupsize1x1x1",
     dm.CONTRACTION),
    ("nvjet_tst_128x256_64x4_1x2_h_bz_coopA_NTT", dm.CONTRACTION),
    ("void pytorch_flash::flash_fwd_kernel<Flash_fwd_kernel_traits<64, 128>>(Flash_fwd_params)",
     dm.CONTRACTION),
    ("void at::native::(anonymous namespace)::vectorized_layer_norm_kernel<c10::BFloat16, float>",
     dm.NORMALIZATION),
    ("void at::native::(anonymous namespace)::GammaBetaBackwardCUDAKernel<float, float>",
     dm.NORMALIZATION),
    ("void at::native::vectorized_elementwise_kernel<4, at::native::GeluCUDAKernelImpl(...)>",
     dm.ELEMENTWISE),
    ("void at::native::vectorized_elementwise_kernel<4, at::native::bfloat16_copy_kernel_cuda>",
     dm.OTHER),
    ("void at::native::reduce_kernel<512, 1, at::native::ReduceOp<float>>", dm.OTHER),
    ("void at::native::(anonymous namespace)::multi_tensor_apply_kernel<FusedAdamMathFunctor>",
     dm.OPTIMIZER),
])
def test_classify_kernel(name, cls):
    assert dm.classify_kernel(name) == cls


def test_classify_errors():
    assert dm.classify_kernel("some_unknown_kernel") is None
    with pytest.raises(TypeError):
        dm.classify_op(3)
    with pytest.raises(ValueError, match="triton"):
        dm.classify_triton("gemm")


def test_shares():
    s = dm.shares({dm.CONTRACTION: 3.0, dm.OTHER: 1.0})
    assert list(s) == list(dm.CLASSES)
    assert sum(s.values()) == pytest.approx(1.0)
    assert s[dm.CONTRACTION] == 0.75 and s[dm.NORMALIZATION] == 0.0
    with pytest.raises(ValueError, match="unknown class"):
        dm.shares({"matmul": 1.0})
    with pytest.raises(ValueError, match="sum to 0"):
        dm.shares({dm.OTHER: 0.0})
    with pytest.raises(ValueError, match=">= 0"):
        dm.shares({dm.OTHER: -1.0})


def _tiny_step(dtype=None):
    torch.manual_seed(0)
    cfg = gpt2.GPTConfig(n_layer=2, n_head=2, n_embd=32, block_size=16, vocab_size=64)
    blocks = torch.nn.Sequential(*[gpt2.Block(cfg) for _ in range(cfg.n_layer)])
    x = torch.randn(2, 16, cfg.n_embd)
    opt = torch.optim.AdamW(blocks.parameters(), lr=1e-3, fused=True)
    return cfg, blocks, x, dm.training_step(blocks, x, opt, dtype=dtype)


def test_counted_flops_equal_the_analytic_matmul_flops():
    cfg, blocks, x, (fwd_bwd, opt_step) = _tiny_step()
    b = dm.count_by_class(fwd_bwd, optimizer_step=opt_step)
    tokens, T, d, L = 2 * 16, 16, cfg.n_embd, cfg.n_layer
    # linear layers: 2 FLOPs per weight per token forward, 4 backward (input and weight grads)
    linear = 6 * 12 * d * d * L * tokens
    # attention: QK^T and AV forward (4 T d per token), five such products backward
    attention = (4 + 10) * T * d * L * tokens
    assert b.flops[dm.CONTRACTION] == linear + attention
    assert "_fused_adamw_" in b.ops[dm.OPTIMIZER]
    assert "native_layer_norm_backward" in b.ops[dm.NORMALIZATION]
    params = sum(p.numel() for p in blocks.parameters())
    assert b.flops[dm.OPTIMIZER] >= 14 * params
    # the optimizer reads and writes parameters, gradients and both moments: >= 7 passes of 4 B
    assert b.bytes[dm.OPTIMIZER] >= 7 * 4 * params
    s = dm.shares(b.flops)
    assert sum(s.values()) == pytest.approx(1.0)
    assert s[dm.CONTRACTION] > 0.9
    assert sum(dm.shares(b.bytes).values()) == pytest.approx(1.0)


def test_time_by_class_on_cpu():
    _, _, _, (fwd_bwd, opt_step) = _tiny_step(torch.bfloat16)
    record = {}
    t = dm.time_by_class(lambda: (fwd_bwd(), opt_step()), steps=1, warmup=1, record=record)
    assert "aten::_fused_adamw_" in record[dm.OPTIMIZER]
    assert sum(record[dm.CONTRACTION].values()) == pytest.approx(t[dm.CONTRACTION])
    assert set(t) == set(dm.CLASSES)
    assert t[dm.CONTRACTION] > 0 and t[dm.OPTIMIZER] > 0 and t[dm.NORMALIZATION] > 0
    with pytest.raises(ValueError):
        dm.time_by_class(fwd_bwd, steps=0)
    with pytest.raises(TypeError):
        dm.time_by_class(None)


def test_training_step_rejects_non_tensor():
    with pytest.raises(TypeError, match="inputs"):
        dm.training_step(torch.nn.Identity(), [1.0], None)
