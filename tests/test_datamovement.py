import pytest
import torch

from perflab.speed import datamovement
from perflab.gpt2.model import Block, GPTConfig


@pytest.mark.parametrize("name, cls", [
    ("aten::addmm", datamovement.CONTRACTION), ("mm", datamovement.CONTRACTION), ("aten.bmm.default", datamovement.CONTRACTION),
    ("aten::_scaled_dot_product_flash_attention", datamovement.CONTRACTION),
    ("aten::_scaled_dot_product_flash_attention_for_cpu_backward", datamovement.CONTRACTION),
    ("aten::native_layer_norm", datamovement.NORMALIZATION),
    ("native_layer_norm_backward", datamovement.NORMALIZATION),
    ("aten::_softmax", datamovement.SOFTMAX), ("aten::nll_loss_forward", datamovement.SOFTMAX),
    ("aten::gelu", datamovement.ELEMENTWISE), ("aten::add_.Tensor", datamovement.ELEMENTWISE),
    ("aten::gelu_backward", datamovement.ELEMENTWISE),
    ("aten::_fused_adamw_", datamovement.OPTIMIZER), ("aten::_foreach_mul_", datamovement.OPTIMIZER),
    ("aten::_to_copy", datamovement.OTHER), ("aten::embedding", datamovement.OTHER), ("aten::sum", datamovement.OTHER),
])
def test_classify_op(name, cls):
    assert datamovement.classify_op(name) == cls


@pytest.mark.parametrize("name, cls", [
    ("triton_per_fused_native_layer_norm_0", datamovement.NORMALIZATION),
    ("triton_red_fused_add_native_layer_norm_native_layer_norm_backward_7", datamovement.NORMALIZATION),
    ("triton_poi_fused_add_gelu_mul_pow_tanh_3", datamovement.ELEMENTWISE),
    ("triton_poi_fused__to_copy_1", datamovement.OTHER),
    ("triton_poi_fused__to_copy_view_12", datamovement.OTHER),
    ("triton_red_fused_sum_4", datamovement.OTHER),
    ("triton_per_fused__softmax_2", datamovement.SOFTMAX),
    ("triton_tem_fused_mm_5", datamovement.CONTRACTION),
    ("triton_poi_fused_add_11", datamovement.ELEMENTWISE),
])
def test_classify_triton(name, cls):
    assert datamovement.classify_triton(name) == cls
    assert datamovement.classify_kernel(name) == cls


@pytest.mark.parametrize("name, cls", [
    ("sm90_xmma_gemm_bf16bf16_bf16f32_f32_tn_n_tilesize128x128x64_warpgroupsize1x1x1",
     datamovement.CONTRACTION),
    ("nvjet_tst_128x256_64x4_1x2_h_bz_coopA_NTT", datamovement.CONTRACTION),
    ("void pytorch_flash::flash_fwd_kernel<Flash_fwd_kernel_traits<64, 128>>(Flash_fwd_params)",
     datamovement.CONTRACTION),
    ("void at::native::(anonymous namespace)::vectorized_layer_norm_kernel<c10::BFloat16, float>",
     datamovement.NORMALIZATION),
    ("void at::native::(anonymous namespace)::GammaBetaBackwardCUDAKernel<float, float>",
     datamovement.NORMALIZATION),
    ("void at::native::vectorized_elementwise_kernel<4, at::native::GeluCUDAKernelImpl(...)>",
     datamovement.ELEMENTWISE),
    ("void at::native::vectorized_elementwise_kernel<4, at::native::bfloat16_copy_kernel_cuda>",
     datamovement.OTHER),
    ("void at::native::reduce_kernel<512, 1, at::native::ReduceOp<float>>", datamovement.OTHER),
    ("void at::native::(anonymous namespace)::multi_tensor_apply_kernel<FusedAdamMathFunctor>",
     datamovement.OPTIMIZER),
])
def test_classify_kernel(name, cls):
    assert datamovement.classify_kernel(name) == cls


def test_classify_errors():
    assert datamovement.classify_kernel("some_unknown_kernel") is None
    with pytest.raises(TypeError):
        datamovement.classify_op(3)
    with pytest.raises(ValueError, match="triton"):
        datamovement.classify_triton("gemm")


def test_shares():
    s = datamovement.shares({datamovement.CONTRACTION: 3.0, datamovement.OTHER: 1.0})
    assert list(s) == list(datamovement.CLASSES)
    assert sum(s.values()) == pytest.approx(1.0)
    assert s[datamovement.CONTRACTION] == 0.75 and s[datamovement.NORMALIZATION] == 0.0
    with pytest.raises(ValueError, match="unknown class"):
        datamovement.shares({"matmul": 1.0})
    with pytest.raises(ValueError, match="sum to 0"):
        datamovement.shares({datamovement.OTHER: 0.0})
    with pytest.raises(ValueError, match=">= 0"):
        datamovement.shares({datamovement.OTHER: -1.0})


def _tiny_step(dtype=None):
    torch.manual_seed(0)
    cfg = GPTConfig(n_layer=2, n_head=2, n_embd=32, block_size=16, vocab_size=64)
    blocks = torch.nn.Sequential(*[Block(cfg) for _ in range(cfg.n_layer)])
    x = torch.randn(2, 16, cfg.n_embd)
    opt = torch.optim.AdamW(blocks.parameters(), lr=1e-3, fused=True)
    return cfg, blocks, x, datamovement.training_step(blocks, x, opt, dtype=dtype)


def test_counted_flops_equal_the_analytic_matmul_flops():
    cfg, blocks, x, (fwd_bwd, opt_step) = _tiny_step()
    b = datamovement.count_by_class(fwd_bwd, optimizer_step=opt_step)
    tokens, T, d, L = 2 * 16, 16, cfg.n_embd, cfg.n_layer
    # linear layers: 2 FLOPs per weight per token forward, 4 backward (input and weight grads)
    linear = 6 * 12 * d * d * L * tokens
    # attention: QK^T and AV forward (4 T d per token), five such products backward
    attention = (4 + 10) * T * d * L * tokens
    assert b.flops[datamovement.CONTRACTION] == linear + attention
    assert "_fused_adamw_" in b.ops[datamovement.OPTIMIZER]
    assert "native_layer_norm_backward" in b.ops[datamovement.NORMALIZATION]
    params = sum(p.numel() for p in blocks.parameters())
    assert b.flops[datamovement.OPTIMIZER] >= 14 * params
    # the optimizer reads and writes parameters, gradients and both moments: >= 7 passes of 4 B
    assert b.bytes[datamovement.OPTIMIZER] >= 7 * 4 * params
    s = datamovement.shares(b.flops)
    assert sum(s.values()) == pytest.approx(1.0)
    assert s[datamovement.CONTRACTION] > 0.9
    assert sum(datamovement.shares(b.bytes).values()) == pytest.approx(1.0)


def test_time_by_class_on_cpu():
    _, _, _, (fwd_bwd, opt_step) = _tiny_step(torch.bfloat16)
    record = {}
    t = datamovement.time_by_class(lambda: (fwd_bwd(), opt_step()), steps=1, warmup=1, record=record)
    assert "aten::_fused_adamw_" in record[datamovement.OPTIMIZER]
    assert sum(record[datamovement.CONTRACTION].values()) == pytest.approx(t[datamovement.CONTRACTION])
    assert set(t) == set(datamovement.CLASSES)
    assert t[datamovement.CONTRACTION] > 0 and t[datamovement.OPTIMIZER] > 0 and t[datamovement.NORMALIZATION] > 0
    with pytest.raises(ValueError):
        datamovement.time_by_class(fwd_bwd, steps=0)
    with pytest.raises(TypeError):
        datamovement.time_by_class(None)


def test_training_step_rejects_non_tensor():
    with pytest.raises(TypeError, match="inputs"):
        datamovement.training_step(torch.nn.Identity(), [1.0], None)
