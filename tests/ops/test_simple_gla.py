"""t2r.ops.simple_gla: chunkwise and public forms against the step-by-step reference."""
import pytest
import torch

from t2r.ops import chunk_simple_gla, naive_recurrent_gla, naive_recurrent_simple_gla, simple_gla
from tests.helpers.ops import B, H, K, V, make_inputs

FP32_RTOL, BF16_RTOL = 1e-4, 2e-2


@pytest.mark.parametrize("gate", ["mild", "strong"])
@pytest.mark.parametrize("HQ", [2, 4])
@pytest.mark.parametrize("T", [1, 7, 64, 100, 130])
def test_chunk_and_public_match_reference_fp32(T, HQ, gate, forward_backward, assert_close):
    inputs, h0 = make_inputs("simple_gla", T, HQ, gate)
    ref = forward_backward(naive_recurrent_simple_gla, inputs, h0)
    assert_close(forward_backward(chunk_simple_gla, inputs, h0), ref, FP32_RTOL)
    assert_close(forward_backward(simple_gla, inputs, h0), ref, FP32_RTOL)


def test_scalar_gate_equals_gla_with_broadcast_gate(assert_close):
    """simple_gla is GLA whose key-channel decays are all equal."""
    inputs, h0 = make_inputs("simple_gla", 100, HQ=4)
    o, final = simple_gla(**inputs, initial_state=h0, output_final_state=True)
    g_k = inputs["g"][..., None].expand(-1, -1, -1, K)
    ref_o, ref_final = naive_recurrent_gla(inputs["q"], inputs["k"], inputs["v"], g_k,
                                           initial_state=h0, output_final_state=True)
    assert_close(o, ref_o, FP32_RTOL, "o")
    assert_close(final, ref_final, FP32_RTOL, "final state")


def test_retnet_constant_decay_matches_parallel_form(assert_close):
    """Constant gamma per head: o_i = sum_{j<=i} gamma^(i-j) (q_i . k_j) v_j (RetNet's parallel form)."""
    T = 100
    q, k, v = torch.randn(1, T, H, K), torch.randn(1, T, H, K), torch.randn(1, T, H, V)
    gammas = torch.tensor([1 - 2 ** -5, 1 - 2 ** -8])
    g = gammas.log().expand(1, T, H).contiguous()
    o, _ = simple_gla(q, k, v, g, scale=1.0)
    pos = torch.arange(T, dtype=torch.float32)
    distance = pos[:, None] - pos[None, :]
    decay = torch.where(distance >= 0, gammas[:, None, None] ** distance.clamp(min=0), 0.0)
    ref = torch.einsum("hij,bihk,bjhk,bjhv->bihv", decay, q, k, v)
    assert_close(o, ref, FP32_RTOL)


@pytest.mark.parametrize("chunk_size", [16, 32])
def test_other_chunk_sizes(chunk_size, forward_backward, assert_close):
    inputs, h0 = make_inputs("simple_gla", 100, HQ=4)
    ref = forward_backward(naive_recurrent_simple_gla, inputs, h0)
    assert_close(forward_backward(chunk_simple_gla, inputs, h0, chunk_size=chunk_size), ref, FP32_RTOL)


@pytest.mark.parametrize("T", [7, 130])
def test_bf16_inputs_track_fp32_reference(T, forward_backward, assert_close):
    inputs, h0 = make_inputs("simple_gla", T, HQ=4, dtype=torch.bfloat16)
    out = forward_backward(simple_gla, inputs, h0)
    ref = forward_backward(naive_recurrent_simple_gla, {n: t.float() for n, t in inputs.items()}, h0)
    assert simple_gla(**inputs)[0].dtype == torch.bfloat16
    assert_close(out, ref, BF16_RTOL)


def test_no_overflow_for_extreme_decay(forward_backward, assert_close):
    inputs, h0 = make_inputs("simple_gla", 130, HQ=4)
    inputs["g"] = inputs["g"] * 40 - 40
    ref = forward_backward(naive_recurrent_simple_gla, inputs, h0)
    assert_close(forward_backward(chunk_simple_gla, inputs, h0), ref, FP32_RTOL)


@pytest.mark.parametrize("split", [1, 64, 70])
def test_state_chaining_equals_one_run(split, assert_close):
    inputs, h0 = make_inputs("simple_gla", 130, HQ=4)
    full_o, full_state = chunk_simple_gla(**inputs, initial_state=h0, output_final_state=True)
    o1, mid = simple_gla(**{n: t[:, :split] for n, t in inputs.items()}, initial_state=h0,
                         output_final_state=True)
    o2, last = simple_gla(**{n: t[:, split:] for n, t in inputs.items()}, initial_state=mid,
                          output_final_state=True)
    assert_close(torch.cat([o1, o2], dim=1), full_o, FP32_RTOL, "o")
    assert_close(last, full_state, FP32_RTOL, "final state")


@pytest.mark.parametrize("fn", [simple_gla, chunk_simple_gla])
def test_packed_sequences_equal_separate_runs(fn, forward_backward, assert_close):
    bounds = [0, 7, 71, 130]
    inputs, _ = make_inputs("simple_gla", 130, HQ=4, batch=1)
    h0 = torch.randn(len(bounds) - 1, H, K, V)

    def separate_runs(*tensors, initial_state, output_final_state):
        runs = [naive_recurrent_simple_gla(*(t[:, a:b] for t in tensors), None, initial_state[i:i + 1], True)
                for i, (a, b) in enumerate(zip(bounds[:-1], bounds[1:]))]
        return torch.cat([o for o, _ in runs], dim=1), torch.cat([s for _, s in runs], dim=0)
    packed = forward_backward(fn, inputs, h0, cu_seqlens=torch.tensor(bounds))
    assert_close(packed, forward_backward(separate_runs, inputs, h0), FP32_RTOL)


def test_gqa_equals_reference_with_repeated_kv(forward_backward, assert_close, repeat_kv_heads):
    groups = 2
    inputs, h0 = make_inputs("simple_gla", 100, HQ=H * groups)

    def repeated_reference(q, k, v, g, initial_state, output_final_state):
        o, final = naive_recurrent_simple_gla(
            q, repeat_kv_heads(k, groups), repeat_kv_heads(v, groups), repeat_kv_heads(g, groups), None,
            repeat_kv_heads(initial_state, groups, dim=1), output_final_state)
        return o, final[:, ::groups]
    assert_close(forward_backward(simple_gla, inputs, h0),
                 forward_backward(repeated_reference, inputs, h0), FP32_RTOL)


def test_decode_path_without_grad_matches_reference(assert_close):
    inputs, h0 = make_inputs("simple_gla", 2, HQ=4)
    with torch.no_grad():
        o, final = simple_gla(**inputs, initial_state=h0, output_final_state=True)
    ref_o, ref_final = naive_recurrent_simple_gla(**inputs, initial_state=h0, output_final_state=True)
    assert_close(o, ref_o, FP32_RTOL, "o")
    assert_close(final, ref_final, FP32_RTOL, "final state")


@pytest.mark.parametrize("fn", [simple_gla, chunk_simple_gla])
def test_bad_inputs_raise_clear_errors(fn):
    inputs, h0 = make_inputs("simple_gla", 8, HQ=4)
    with pytest.raises(ValueError, match="multiple of the 2 key/value heads"):
        fn(**{**inputs, "q": torch.randn(B, 8, 5, K)})
    with pytest.raises(ValueError, match=r"g must have shape \[2, 8, 2\].*use gla"):
        fn(**{**inputs, "g": inputs["g"][..., None].expand(-1, -1, -1, K)})
    with pytest.raises(ValueError, match="needs batch size 1"):
        fn(**inputs, cu_seqlens=torch.tensor([0, 3, 8]))
    packed = {n: t[:1] for n, t in inputs.items()}
    with pytest.raises(ValueError, match="strictly increasing"):
        fn(**packed, cu_seqlens=torch.tensor([0, 3, 3, 8]))
    with pytest.raises(ValueError, match=r"initial_state must have shape \[3, 2, 16, 32\]"):
        fn(**packed, initial_state=h0, cu_seqlens=torch.tensor([0, 3, 5, 8]))
