"""Softmax attention over packed batches (`t2r.models.packed_attention`): the transformers interface function
equals SDPA over each document, and the context switches a model's implementation only where it can run."""
import pytest
import torch
from transformers import LlamaConfig, LlamaForCausalLM

from t2r.data.packing import collate_packed
from t2r.models.packed_attention import (
    NAME,
    attention_forward,
    packed_attention,
    packed_causal_attention,
    reference_packed_attention,
)

CUDA = torch.cuda.is_available()


def documents(lengths, heads_q=4, heads=2, dim=8, device="cpu", dtype=torch.float32):
    n = sum(lengths)
    q, k, v = (torch.randn(n, h, dim, device=device, dtype=dtype) for h in (heads_q, heads, heads))
    cu = torch.tensor([0, *torch.tensor(lengths).cumsum(0).tolist()], dtype=torch.int32, device=device)
    return q, k, v, cu


def test_reference_is_causal_attention_inside_each_document():
    q, k, v, cu = documents([5, 1, 9])
    out = reference_packed_attention(q, k, v, cu, scale=0.3)
    for start, end in [(0, 5), (5, 6), (6, 15)]:
        keys, values = k[start:end].repeat_interleave(2, 1), v[start:end].repeat_interleave(2, 1)
        logits = torch.einsum("qhd,khd->hqk", q[start:end], keys) * 0.3
        logits = logits.masked_fill(torch.ones(end - start, end - start, dtype=torch.bool).triu(1), float("-inf"))
        expected = torch.einsum("hqk,khd->qhd", logits.softmax(-1), values)
        torch.testing.assert_close(out[start:end], expected, rtol=1e-5, atol=1e-6)


def test_interface_function_reads_documents_from_cu_seq_lens():
    q, k, v, cu = documents([7, 3, 6])
    query, key, value = (t.transpose(0, 1)[None] for t in (q, k, v))  # [1, H, N, D], as the layers call it
    out, weights = attention_forward(None, query, key, value, None, scaling=0.4, cu_seq_lens_q=cu, max_length_q=7)
    assert weights is None
    torch.testing.assert_close(out[0], reference_packed_attention(q, k, v, cu, 0.4))
    whole, _ = attention_forward(None, query, key, value, None, scaling=0.4)  # no cu_seq_lens: one document
    torch.testing.assert_close(whole[0], reference_packed_attention(q, k, v, torch.tensor([0, 16]), 0.4))


def test_interface_function_refuses_masks_and_caches():
    q, k, v, _ = documents([4])
    query, key, value = (t.transpose(0, 1)[None] for t in (q, k, v))
    with pytest.raises(ValueError, match="no padding mask and no cache"):
        attention_forward(None, query, key, value, torch.ones(1, 1, 4, 4, dtype=torch.bool))
    with pytest.raises(ValueError, match="no padding mask and no cache"):
        attention_forward(None, query, key[:, :, :2], value[:, :, :2], None)


def tiny_llama():
    config = LlamaConfig(vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=2, attn_implementation="sdpa")
    return LlamaForCausalLM(config).eval()


def test_context_leaves_cpu_models_unchanged():
    model = tiny_llama()
    with packed_attention(model, None):
        assert model.config._attn_implementation == "sdpa"
    assert model.config._attn_implementation == "sdpa"


@pytest.mark.skipif(not CUDA, reason="varlen FlashAttention runs on CUDA")
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_kernels_equal_the_reference_forward_and_backward(dtype):
    q, k, v, cu = documents([300, 17, 1, 700], heads_q=9, heads=3, dim=64, device="cuda", dtype=dtype)
    for t in (q, k, v):
        t.requires_grad_(True)
    cotangent = torch.randn_like(q)
    results = []
    for fn in (reference_packed_attention, lambda *a: packed_causal_attention(*a[:4], 700, a[4])):
        out = fn(q, k, v, cu, 0.125)
        results.append([out, *torch.autograd.grad((out.float() * cotangent).sum(), (q, k, v))])
    for got, want in zip(results[1], results[0]):
        assert ((got.float() - want.float()).norm() / want.float().norm()).item() < 2e-2


@pytest.mark.skipif(not CUDA, reason="varlen FlashAttention runs on CUDA")
def test_a_packed_model_forward_equals_the_sdpa_one():
    model = tiny_llama().cuda().to(torch.bfloat16)
    rows = [{"input_ids": torch.randint(0, 64, (32,)), "position_ids": torch.tensor([*range(20), *range(12)])}
            for _ in range(3)]
    batch = {k: v.cuda() if torch.is_tensor(v) else v for k, v in collate_packed(rows).items()}
    with torch.no_grad():
        plain = model(**batch).logits.float()
        with packed_attention(model):
            assert model.config._attn_implementation == NAME
            packed = model(**batch).logits.float()
    assert model.config._attn_implementation == "sdpa"
    assert ((packed - plain).norm() / plain.norm()).item() < 2e-2
