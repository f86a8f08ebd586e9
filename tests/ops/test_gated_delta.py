"""t2r.ops.gated_delta: chunkwise and public forms against the step-by-step reference (Gated DeltaNet eq. 10)."""
import pytest
import torch
import torch.nn.functional as F

from t2r.ops import chunk_gated_delta_rule, gated_delta_rule, naive_recurrent_gated_delta_rule
from t2r.ops.gated_delta import gated_delta_rule_step
from t2r.ops.gated_delta.chunk import gated_delta_chunks

B, H, K, V = 2, 2, 16, 32
FP32_RTOL, BF16_RTOL = 1e-4, 2e-2


def make_inputs(make_log_decay, T, HQ=H, gate="moderate", dtype=torch.float32, batch=B, k_dim=K, v_dim=V,
                beta_max=1.0):
    """Unit-norm keys (as the layer makes them) and beta = beta_max * sigmoid(x)."""
    inputs = {
        "q": torch.randn(batch, T, HQ, k_dim),
        "k": F.normalize(torch.randn(batch, T, H, k_dim), dim=-1),
        "v": torch.randn(batch, T, H, v_dim),
        "g": make_log_decay((batch, T, H), gate),
        "beta": beta_max * torch.randn(batch, T, H).sigmoid(),
    }
    return {name: t.to(dtype) for name, t in inputs.items()}, torch.randn(batch, H, k_dim, v_dim)


def two_step_example():
    """K = 2, V = 1, one head, scale 1, worked by hand:
    step 1: k = (1, 0), v = 1, beta = 1, decay 1:       S1 = (1, 0)^T,  o1 = (1, 1) . S1 = 1
    step 2: k = (0.6, 0.8), v = 2, beta = 0.5, decay 0.5:
        (I - 0.5 k k^T) S1 = (1, 0) - 0.5 * 0.6 * (0.6, 0.8) = (0.82, -0.24)
        S2 = 0.5 * (0.82, -0.24) + 0.5 * 2 * (0.6, 0.8) = (1.01, 0.68),  o2 = 1.01 + 0.68 = 1.69"""
    q = torch.tensor([[1.0, 1.0], [1.0, 1.0]]).view(1, 2, 1, 2)
    k = torch.tensor([[1.0, 0.0], [0.6, 0.8]]).view(1, 2, 1, 2)
    v = torch.tensor([1.0, 2.0]).view(1, 2, 1, 1)
    g = torch.tensor([1.0, 0.5]).log().view(1, 2, 1)
    beta = torch.tensor([1.0, 0.5]).view(1, 2, 1)
    return (q, k, v, g, beta), torch.tensor([1.0, 1.69]).view(1, 2, 1, 1), torch.tensor([1.01, 0.68]).view(1, 1, 2, 1)


@pytest.mark.parametrize("fn", [naive_recurrent_gated_delta_rule, chunk_gated_delta_rule, gated_delta_rule])
def test_hand_computed_two_steps(fn):
    inputs, o_ref, state_ref = two_step_example()
    o, state = fn(*inputs, scale=1.0, output_final_state=True)
    torch.testing.assert_close(o, o_ref, rtol=1e-6, atol=1e-6)
    torch.testing.assert_close(state, state_ref, rtol=1e-6, atol=1e-6)


@pytest.mark.parametrize("gate", ["mild", "strong"])
@pytest.mark.parametrize("HQ", [2, 4])
@pytest.mark.parametrize("T", [1, 37, 64, 100, 130])
def test_chunk_and_public_match_reference_fp32(T, HQ, gate, make_log_decay, forward_backward, assert_close):
    inputs, h0 = make_inputs(make_log_decay, T, HQ, gate)
    ref = forward_backward(naive_recurrent_gated_delta_rule, inputs, h0)
    assert_close(forward_backward(chunk_gated_delta_rule, inputs, h0), ref, FP32_RTOL)
    assert_close(forward_backward(gated_delta_rule, inputs, h0), ref, FP32_RTOL)


@pytest.mark.parametrize("dims", [(32, 8), (8, 48)])
def test_key_and_value_dims_differ(dims, make_log_decay, forward_backward, assert_close):
    inputs, h0 = make_inputs(make_log_decay, 70, HQ=4, k_dim=dims[0], v_dim=dims[1])
    ref = forward_backward(naive_recurrent_gated_delta_rule, inputs, h0)
    assert_close(forward_backward(chunk_gated_delta_rule, inputs, h0), ref, FP32_RTOL)


def test_beta_up_to_two_negative_eigenvalues(make_log_decay, forward_backward, assert_close):
    """beta in (0, 2) (the negative-eigenvalue option): the same recurrence, still bounded for unit keys."""
    inputs, h0 = make_inputs(make_log_decay, 130, HQ=4, gate="mild", beta_max=2.0)
    assert inputs["beta"].max() > 1.5
    ref = forward_backward(naive_recurrent_gated_delta_rule, inputs, h0)
    assert_close(forward_backward(chunk_gated_delta_rule, inputs, h0), ref, FP32_RTOL)


@pytest.mark.parametrize("chunk_size", [8, 16, 32])
def test_other_chunk_sizes(chunk_size, make_log_decay, forward_backward, assert_close):
    inputs, h0 = make_inputs(make_log_decay, 100, HQ=4)
    ref = forward_backward(naive_recurrent_gated_delta_rule, inputs, h0)
    assert_close(forward_backward(chunk_gated_delta_rule, inputs, h0, chunk_size=chunk_size), ref, FP32_RTOL)


@pytest.mark.parametrize("T", [7, 130])
def test_bf16_inputs_track_fp32_reference(T, make_log_decay, forward_backward, assert_close):
    inputs, h0 = make_inputs(make_log_decay, T, HQ=4, dtype=torch.bfloat16)
    out = forward_backward(gated_delta_rule, inputs, h0)
    ref = forward_backward(naive_recurrent_gated_delta_rule, {n: t.float() for n, t in inputs.items()}, h0)
    assert gated_delta_rule(**inputs)[0].dtype == torch.bfloat16
    assert_close(out, ref, BF16_RTOL)


def test_no_overflow_for_extreme_decay(make_log_decay, forward_backward, assert_close):
    """Decays of -40 per step: every exponent the chunk form evaluates is a sum of gates (<= 0)."""
    inputs, h0 = make_inputs(make_log_decay, 130, HQ=4)
    inputs["g"] = inputs["g"] * 40 - 40
    ref = forward_backward(naive_recurrent_gated_delta_rule, inputs, h0)
    assert_close(forward_backward(chunk_gated_delta_rule, inputs, h0), ref, FP32_RTOL)


@pytest.mark.parametrize("split", [1, 64, 70])
def test_state_chaining_equals_one_run(split, make_log_decay, assert_close):
    inputs, h0 = make_inputs(make_log_decay, 130, HQ=4)
    full_o, full_state = chunk_gated_delta_rule(**inputs, initial_state=h0, output_final_state=True)
    o1, mid = gated_delta_rule(**{n: t[:, :split] for n, t in inputs.items()}, initial_state=h0,
                               output_final_state=True)
    o2, last = gated_delta_rule(**{n: t[:, split:] for n, t in inputs.items()}, initial_state=mid,
                                output_final_state=True)
    assert_close(torch.cat([o1, o2], dim=1), full_o, FP32_RTOL, "o")
    assert_close(last, full_state, FP32_RTOL, "final state")


def test_decode_steps_equal_forward(make_log_decay, assert_close):
    """Prefill 70 steps, then decode 5 tokens one by one with the step function and with the public op."""
    inputs, h0 = make_inputs(make_log_decay, 75, HQ=4)
    full_o, full_state = chunk_gated_delta_rule(**inputs, initial_state=h0, output_final_state=True)
    prefill = {n: t[:, :70] for n, t in inputs.items()}
    _, state = chunk_gated_delta_rule(**prefill, initial_state=h0, output_final_state=True)
    state_op = state
    for t in range(70, 75):
        step = {n: x[:, t] for n, x in inputs.items()}
        o_t, state = gated_delta_rule_step(**step, state=state, scale=K ** -0.5)
        with torch.no_grad():
            o_op, state_op = gated_delta_rule(**{n: x[:, t:t + 1] for n, x in inputs.items()},
                                              initial_state=state_op, output_final_state=True)
        assert_close(o_t, full_o[:, t], FP32_RTOL, f"step {t}")
        assert_close(o_op[:, 0], full_o[:, t], FP32_RTOL, f"public op step {t}")
    assert_close(state, full_state, FP32_RTOL, "final state")
    assert_close(state_op, full_state, FP32_RTOL, "final state (public op)")


@pytest.mark.parametrize("bounds", [[0, 7, 71, 130], [0, 200, 205, 355, 358, 422]])
@pytest.mark.parametrize("fn", [gated_delta_rule, chunk_gated_delta_rule])
def test_packed_sequences_equal_separate_runs(fn, bounds, make_log_decay, forward_backward, assert_close):
    inputs, _ = make_inputs(make_log_decay, bounds[-1], HQ=4, batch=1)
    h0 = torch.randn(len(bounds) - 1, H, K, V)

    def separate_runs(*tensors, initial_state, output_final_state):
        runs = [naive_recurrent_gated_delta_rule(*(t[:, a:b] for t in tensors), None, initial_state[i:i + 1], True)
                for i, (a, b) in enumerate(zip(bounds[:-1], bounds[1:]))]
        return torch.cat([o for o, _ in runs], dim=1), torch.cat([s for _, s in runs], dim=0)
    packed = forward_backward(fn, inputs, h0, cu_seqlens=torch.tensor(bounds))
    assert_close(packed, forward_backward(separate_runs, inputs, h0), FP32_RTOL)


def test_packed_without_states(make_log_decay, assert_close):
    inputs, _ = make_inputs(make_log_decay, 90, HQ=4, batch=1)
    o = gated_delta_rule(**inputs, cu_seqlens=torch.tensor([0, 40, 90]))[0]
    parts = [naive_recurrent_gated_delta_rule(*(t[:, a:b] for t in inputs.values()))[0] for a, b in ((0, 40), (40, 90))]
    assert_close(o, torch.cat(parts, dim=1), FP32_RTOL)


def test_gqa_equals_reference_with_repeated_kv(make_log_decay, forward_backward, assert_close, repeat_kv_heads):
    groups = 2
    inputs, h0 = make_inputs(make_log_decay, 100, HQ=H * groups)

    def repeated_reference(q, k, v, g, beta, initial_state, output_final_state):
        o, final = naive_recurrent_gated_delta_rule(
            q, *(repeat_kv_heads(t, groups) for t in (k, v, g, beta)), None,
            repeat_kv_heads(initial_state, groups, dim=1), output_final_state)
        return o, final[:, ::groups]   # the copies of a group's state are identical
    assert_close(forward_backward(gated_delta_rule, inputs, h0),
                 forward_backward(repeated_reference, inputs, h0), FP32_RTOL)


def test_delta_rule_replaces_the_value_under_a_key():
    """beta = 1, no decay, one unit key written twice: the second value replaces the first (the delta rule),
    where plain linear attention would store their sum."""
    k = F.normalize(torch.randn(1, 1, 1, 8), dim=-1).expand(1, 2, 1, 8)
    v = torch.tensor([3.0, -5.0]).view(1, 2, 1, 1)
    o, state = naive_recurrent_gated_delta_rule(k, k, v, torch.zeros(1, 2, 1), torch.ones(1, 2, 1), scale=1.0,
                                                output_final_state=True)
    torch.testing.assert_close(o[0, :, 0, 0], torch.tensor([3.0, -5.0]))
    torch.testing.assert_close(state, k[0, 0, 0][None, None, :, None] * -5.0)


def test_gradcheck_float64_chunk_form():
    """Autograd of the chunkwise form against finite differences, float64, two chunks and a partial third."""
    gen = torch.Generator().manual_seed(0)
    T, HQ, Hk, Kd, Vd = 9, 2, 1, 3, 2

    def leaf(*shape, fn=lambda x: x):
        return fn(torch.randn(*shape, generator=gen, dtype=torch.float64)).requires_grad_(True)
    args = (leaf(1, T, HQ, Kd), leaf(1, T, Hk, Kd, fn=lambda x: F.normalize(x, dim=-1)), leaf(1, T, Hk, Vd),
            leaf(1, T, Hk, fn=lambda x: F.logsigmoid(x)), leaf(1, T, Hk, fn=torch.sigmoid), leaf(1, Hk, Kd, Vd))

    def fn(q, k, v, g, beta, h0):
        return gated_delta_chunks(q, k, v, g, beta, scale=0.7, initial_state=h0, output_final_state=True,
                                  chunk_size=4)
    assert torch.autograd.gradcheck(fn, args)


def test_matches_fla_naive_recurrence(make_log_decay, assert_close):
    fla_naive = pytest.importorskip("fla.ops.gated_delta_rule.naive").naive_recurrent_gated_delta_rule
    inputs, h0 = make_inputs(make_log_decay, 50)
    o, state = gated_delta_rule(**inputs, initial_state=h0, output_final_state=True)
    ref_o, ref_state = fla_naive(inputs["q"], inputs["k"], inputs["v"], inputs["beta"], inputs["g"],
                                 initial_state=h0, output_final_state=True)
    assert_close(o, ref_o, FP32_RTOL, "o")
    assert_close(state, ref_state, FP32_RTOL, "final state")


@pytest.mark.parametrize("fn", [gated_delta_rule, chunk_gated_delta_rule])
def test_bad_inputs_raise_clear_errors(fn, make_log_decay):
    inputs, h0 = make_inputs(make_log_decay, 8, HQ=4)
    with pytest.raises(ValueError, match="multiple of the 2 key/value heads"):
        fn(**{**inputs, "q": torch.randn(B, 8, 3, K)})
    with pytest.raises(ValueError, match=r"g must have shape \[2, 8, 2\]"):
        fn(**{**inputs, "g": inputs["g"][..., None].expand(-1, -1, -1, K)})
    with pytest.raises(ValueError, match=r"beta must have shape \[2, 8, 2\]"):
        fn(**{**inputs, "beta": inputs["beta"][:, :, :1]})
    with pytest.raises(ValueError, match="needs batch size 1"):
        fn(**inputs, cu_seqlens=torch.tensor([0, 3, 8]))
    with pytest.raises(ValueError, match=r"initial_state must have shape \[2, 2, 16, 32\]"):
        fn(**inputs, initial_state=h0[:1])
