"""perflab.machine.costs: FLOPs and minimum bytes, counted while a call runs and from trace shapes."""

import pytest
import torch

from perflab.machine.costs import count_cost, op_cost


def test_count_cost_of_a_matrix_product_is_2mnk_and_three_matrices():
    a, b = torch.randn(32, 64), torch.randn(64, 16)
    cost = count_cost(lambda: a @ b)
    assert cost.flops == 2 * 32 * 64 * 16
    assert cost.bytes == (32 * 64 + 64 * 16 + 32 * 16) * 4


def test_count_cost_counts_elementwise_flops_views_and_in_place_traffic():
    x, y = torch.randn(1000), torch.randn(1000)
    assert count_cost(lambda: x * 2).bytes == 2 * 1000 * 4          # read x, write the result
    assert count_cost(lambda: x * 2).flops == 1000
    assert count_cost(lambda: x.view(10, 100).t()).bytes == 0        # views move nothing
    z = torch.zeros(1000)
    assert count_cost(lambda: z.add_(y)).bytes == 3 * 1000 * 4       # read z and y, write z
    assert count_cost(lambda: z.zero_()).bytes == 1000 * 4           # a fill only writes


def test_count_cost_sees_backward_and_optimizer():
    lin = torch.nn.Linear(8, 4, bias=False)
    x = torch.randn(16, 8)
    fwd = count_cost(lambda: lin(x)).flops
    step = count_cost(lambda: lin(x).sum().backward()).flops
    assert fwd == 2 * 16 * 8 * 4
    assert step >= 2 * fwd                      # forward + the weight gradient at least
    with pytest.raises(TypeError, match="fn"):
        count_cost(42)


def test_op_cost_of_products_elementwise_and_unknown_operators():
    mm = op_cost("aten::mm", [[4, 8], [8, 2]], ["float", "float"])
    assert (mm.flops, mm.bytes) == (2 * 4 * 8 * 2, (32 + 16 + 8) * 4)
    addmm = op_cost("aten::addmm", [[2], [4, 8], [8, 2], [], []], ["c10::BFloat16"] * 3 + ["Scalar"] * 2)
    assert addmm.flops == 2 * 4 * 8 * 2 and addmm.bytes == (2 + 32 + 16 + 8) * 2
    lin = op_cost("aten::linear", [[3, 5, 8], [2, 8], [2]], ["float"] * 3)
    assert lin.flops == 2 * 15 * 8 * 2
    mul = op_cost("aten::mul", [[100], []], ["float", "Scalar"])
    assert (mul.flops, mul.bytes) == (100, 800)
    add_ = op_cost("aten::add_", [[100], [100], []], ["float", "float", "Scalar"])
    assert add_.bytes == 3 * 400
    copy = op_cost("aten::copy_", [[10], [10], []], ["float", "c10::Half", "Scalar"])
    assert (copy.flops, copy.bytes) == (0, 40 + 20)
    assert op_cost("aten::_foreach_add_", [[[4], [4]], [[4], [4]]], ["TensorList", "TensorList"]) is None
    assert op_cost("aten::some_new_op", [[4]], ["float"]) is None
    assert op_cost("aten::mm", [[4, 8], [8, 2]], ["weird_type", "float"]) is None
    with pytest.raises(TypeError, match="name"):
        op_cost(None, [], [])
