"""perflab.kernels.attention: backend names from kernel names, score-matrix bytes, CPU operator names."""

import pytest
import torch
import torch.nn.functional as F

from perflab.kernels import attention


def test_backend_of_kernel_names():
    assert attention.backend_of(["void pytorch_flash::flash_fwd_kernel<...>"]) == "flash"
    assert attention.backend_of(["fmha_cutlassF_f32_aligned_64x64_rf_sm80"]) == "efficient"
    assert attention.backend_of(["cudnn_generated_fort_native_sdpa_sm90"]) == "cudnn"
    assert attention.backend_of(["aten::bmm", "aten::_softmax"]) == "math"
    assert attention.backend_of([]) == "unknown"
    assert attention.backend_kernel(["ampere_bf16_gemm", "softmax_warp_forward"]) == \
        ("math", "softmax_warp_forward")


def test_math_scores_bytes():
    assert attention.math_scores_bytes(2, 4, 128, torch.bfloat16) == 2 * 4 * 128 * 128 * 2
    with pytest.raises(ValueError):
        attention.math_scores_bytes(0, 1, 1, torch.float32)


def test_sdpa_kernels_on_cpu_lists_operators():
    q = torch.randn(1, 2, 16, 8)
    names = attention.sdpa_kernels(lambda: F.scaled_dot_product_attention(q, q, q))
    assert names and all(n.startswith("aten::") for n in names)
