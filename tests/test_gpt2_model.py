import pytest
import torch

from perflab.speed import datamovement
from perflab.gpt2.model import CONFIGS, GPT, GPTConfig, config


def tiny(**changes):
    base = dict(n_layer=2, n_head=2, n_embd=32, block_size=16, vocab_size=64)
    base.update(changes)
    return GPTConfig(**base)


def test_shapes_and_loss():
    torch.manual_seed(0)
    model = GPT(tiny())
    idx = torch.randint(0, 64, (3, 10))
    logits = model(idx)
    assert logits.shape == (3, 10, 64)
    logits, loss = model(idx, idx)
    assert loss.dim() == 0 and loss.item() > 0
    assert model.head.weight is model.wte.weight


def test_causal():
    torch.manual_seed(0)
    model = GPT(tiny()).eval()
    idx = torch.randint(0, 64, (1, 10))
    full = model(idx)
    changed = idx.clone()
    changed[0, -1] = (changed[0, -1] + 1) % 64
    # changing the last token cannot change the logits of earlier positions
    torch.testing.assert_close(model(changed)[:, :-1], full[:, :-1])


def test_124m_param_count_on_meta():
    cfg = CONFIGS["124M"]
    with torch.device("meta"):
        model = GPT(cfg)
    d, L, V, T = cfg.n_embd, cfg.n_layer, cfg.vocab_size, cfg.block_size
    per_block = 12 * d * d + 13 * d            # weights 3d^2 + d^2 + 8d^2, biases and 2 norms
    total = V * d + T * d + L * per_block + 2 * d
    assert model.num_params(non_embedding=False) == total
    assert model.num_params() == total - T * d
    assert 123e6 < model.num_params(non_embedding=False) < 125e6
    assert cfg.vocab_size == 50304 and cfg.vocab_size % 64 == 0


def test_configs():
    assert [c.n_layer for c in CONFIGS.values()] == [12, 24, 36, 48]
    assert config("350M", n_layer=2).n_embd == 1024
    with pytest.raises(KeyError, match="known"):
        config("7B")
    with pytest.raises(ValueError, match="multiple of n_head"):
        GPTConfig(n_embd=100, n_head=3)
    with pytest.raises(ValueError, match="n_layer"):
        GPTConfig(n_layer=0)
    with pytest.raises(ValueError, match="block_size"):
        GPT(tiny())(torch.zeros(1, 17, dtype=torch.long))


def test_flops_per_token_formula():
    model = GPT(tiny())
    c = model.cfg
    assert model.flops_per_token() == 6 * model.num_params() + 12 * c.n_layer * c.n_embd * 16
    assert model.flops_per_token(8) == 6 * model.num_params() + 12 * c.n_layer * c.n_embd * 8
    with pytest.raises(ValueError, match="seq_len"):
        model.flops_per_token(0)


def test_forward_flops_match_the_formula():
    # forward contractions: 2 FLOPs per matmul weight per token + 4 T d per layer and token;
    # flops_per_token counts three times that (forward + backward), plus 6 per non-matmul
    # parameter (biases, norms), which do no matrix product
    torch.manual_seed(0)
    model = GPT(tiny(bias=False))
    B, T = 2, 16
    idx = torch.randint(0, 64, (B, T))
    counted = datamovement.count_by_class(model, idx).flops[datamovement.CONTRACTION]
    c = model.cfg
    matmul_params = c.n_layer * 12 * c.n_embd ** 2 + c.vocab_size * c.n_embd
    assert counted == 2 * matmul_params * B * T + 4 * c.n_layer * T * c.n_embd * B * T
    norm_params = (2 * c.n_layer + 1) * c.n_embd
    assert model.flops_per_token(T) * B * T == 3 * counted + 6 * norm_params * B * T


def test_a_block_saves_its_weights_once_whatever_the_batch():
    """Chapter 10's autocast peak (review N6): a block's saved tensors were once counted at one
    sequence and scaled by the batch, which scaled the weights each linear saves too (run h:
    9.9 GiB of float32 parameters and 4.7 GiB of bf16 copies counted for nothing). In float32
    the linears save the parameters themselves (no new bytes); under autocast they save bf16
    copies, once per block, not once per sequence. Measured at one and two sequences, as the
    page does, the difference is a sequence's and the rest exactly the bf16 weight copies."""
    from perflab.gpt2.model import Block
    from perflab.internals.autograd import saved_tensors

    cfg = config("124M", n_layer=1, n_embd=64, n_head=2, block_size=32, attention="math")
    block = Block(cfg)
    params = {p.untyped_storage().data_ptr() for p in block.parameters()}
    weights = sum(m.weight.numel() for m in block.modules() if isinstance(m, torch.nn.Linear))

    def new_bytes(bf16, seqs):
        h = torch.randn(seqs, 32, 64, requires_grad=True)
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=bf16):
            saved = saved_tensors(block, h)
        stores = {t.storage_ptr: t for t in saved.tensors if t.dtype.is_floating_point}
        by_param = sum(t.storage_ptr in params for t in stores.values())
        return sum(t.storage_nbytes for p, t in stores.items() if p not in params), by_param

    (one32, shared32), (two32, _) = new_bytes(False, 1), new_bytes(False, 2)
    (one16, shared16), (two16, _) = new_bytes(True, 1), new_bytes(True, 2)
    assert shared32 - shared16 == 4     # float32: the four linears' weights by reference
    assert one32 - (two32 - one32) == 0          # nothing saved once in float32
    assert one16 - (two16 - one16) == 2 * weights  # the bf16 copies, once
