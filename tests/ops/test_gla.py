"""t2r.ops.gla: chunkwise and public forms against the step-by-step reference."""
import pytest
import torch

from t2r.ops import chunk_gla, gla, naive_recurrent_gla, use_triton
from tests.helpers.ops import B, H, K, V, make_inputs

FP32_RTOL, BF16_RTOL = 1e-4, 2e-2


@pytest.mark.parametrize("gate", ["mild", "strong"])
@pytest.mark.parametrize("HQ", [2, 4])
@pytest.mark.parametrize("T", [1, 7, 64, 100, 130])
def test_chunk_and_public_match_reference_fp32(T, HQ, gate, forward_backward, assert_close):
    inputs, h0 = make_inputs("gla", T, HQ, gate)
    ref = forward_backward(naive_recurrent_gla, inputs, h0)
    assert_close(forward_backward(chunk_gla, inputs, h0), ref, FP32_RTOL)
    assert_close(forward_backward(gla, inputs, h0), ref, FP32_RTOL)


@pytest.mark.parametrize("chunk_size", [8, 16, 32])
def test_other_chunk_sizes(chunk_size, forward_backward, assert_close):
    inputs, h0 = make_inputs("gla", 100, HQ=4)
    ref = forward_backward(naive_recurrent_gla, inputs, h0)
    assert_close(forward_backward(chunk_gla, inputs, h0, chunk_size=chunk_size), ref, FP32_RTOL)


@pytest.mark.parametrize("T", [7, 130])
def test_bf16_inputs_track_fp32_reference(T, forward_backward, assert_close):
    inputs, h0 = make_inputs("gla", T, HQ=4, dtype=torch.bfloat16)
    out = forward_backward(gla, inputs, h0)
    ref = forward_backward(naive_recurrent_gla, {n: t.float() for n, t in inputs.items()}, h0)
    assert gla(**inputs)[0].dtype == torch.bfloat16
    assert_close(out, ref, BF16_RTOL)


def test_no_overflow_for_extreme_decay(forward_backward, assert_close):
    """Decays of -40 per step put exp(+2560) within reach of a naive chunk form."""
    inputs, h0 = make_inputs("gla", 130, HQ=4)
    inputs["g"] = inputs["g"] * 40 - 40
    ref = forward_backward(naive_recurrent_gla, inputs, h0)
    assert_close(forward_backward(chunk_gla, inputs, h0), ref, FP32_RTOL)


@pytest.mark.parametrize("form, gate", [("factored", "mild"), ("log_space", "mild"), ("log_space", "moderate")])
def test_both_intra_chunk_forms_match_reference(form, gate, monkeypatch, forward_backward, assert_close):
    """The factored form (gates within FACTORED_LOG_RANGE per chunk) and the log-space form each,
    forced by moving the range, against the step loop; the default picks factored for mild gates.
    (Moderate gates sum to about -50 over a chunk: factored, their exp(-b_j) would overflow.)"""
    from t2r.ops.common import chunk as engine

    calls = []
    for name in ("_intra_chunk", "_intra_chunk_factored"):
        real = getattr(engine, name)
        monkeypatch.setattr(engine, name, lambda *a, _real=real, _name=name: calls.append(_name) or _real(*a))
    if gate == "mild":
        chunk_gla(**make_inputs("gla", 64, HQ=4, gate=gate)[0])
        assert calls == ["_intra_chunk_factored"]
    monkeypatch.setattr(engine, "FACTORED_LOG_RANGE", float("inf") if form == "factored" else -1.0)
    inputs, h0 = make_inputs("gla", 100, HQ=4, gate=gate)
    ref = forward_backward(naive_recurrent_gla, inputs, h0)
    calls.clear()
    assert_close(forward_backward(chunk_gla, inputs, h0), ref, FP32_RTOL)
    assert set(calls) == {"_intra_chunk_factored" if form == "factored" else "_intra_chunk"}


@pytest.mark.parametrize("split", [1, 7, 64, 70])
def test_state_chaining_equals_one_run(split, assert_close):
    inputs, h0 = make_inputs("gla", 130, HQ=4)
    full_o, full_state = chunk_gla(**inputs, initial_state=h0, output_final_state=True)
    head = {n: t[:, :split] for n, t in inputs.items()}
    tail = {n: t[:, split:] for n, t in inputs.items()}
    o1, mid = gla(**head, initial_state=h0, output_final_state=True)
    o2, last = gla(**tail, initial_state=mid, output_final_state=True)
    assert_close(torch.cat([o1, o2], dim=1), full_o, FP32_RTOL, "o")
    assert_close(last, full_state, FP32_RTOL, "final state")


@pytest.mark.parametrize("bounds", [[0, 7, 71, 130], [0, 200, 205, 355, 358, 422]])
@pytest.mark.parametrize("fn", [gla, chunk_gla])
def test_packed_sequences_equal_separate_runs(fn, bounds, forward_backward, assert_close):
    """The second packing's lengths (200, 5, 150, 3, 64) fall into several padded groups."""
    inputs, _ = make_inputs("gla", bounds[-1], HQ=4, batch=1)
    h0 = torch.randn(len(bounds) - 1, H, K, V)

    def separate_runs(*tensors, initial_state, output_final_state):
        runs = [naive_recurrent_gla(*(t[:, a:b] for t in tensors), None, initial_state[i:i + 1], True)
                for i, (a, b) in enumerate(zip(bounds[:-1], bounds[1:]))]
        return torch.cat([o for o, _ in runs], dim=1), torch.cat([s for _, s in runs], dim=0)
    packed = forward_backward(fn, inputs, h0, cu_seqlens=torch.tensor(bounds))
    assert_close(packed, forward_backward(separate_runs, inputs, h0), FP32_RTOL)


def test_gqa_equals_reference_with_repeated_kv(forward_backward, assert_close, repeat_kv_heads):
    groups = 2
    inputs, h0 = make_inputs("gla", 100, HQ=H * groups)
    out = forward_backward(gla, inputs, h0)

    def repeated_reference(q, k, v, g, initial_state, output_final_state):
        o, final = naive_recurrent_gla(q, repeat_kv_heads(k, groups), repeat_kv_heads(v, groups),
                                       repeat_kv_heads(g, groups), None,
                                       repeat_kv_heads(initial_state, groups, dim=1), output_final_state)
        return o, final[:, ::groups]   # the copies of a group's state are identical
    assert_close(out, forward_backward(repeated_reference, inputs, h0), FP32_RTOL)


def test_decode_path_without_grad_matches_reference(assert_close):
    inputs, h0 = make_inputs("gla", 3, HQ=4)
    with torch.no_grad():
        o, final = gla(**inputs, initial_state=h0, output_final_state=True, scale=0.5)
    ref_o, ref_final = naive_recurrent_gla(**inputs, scale=0.5, initial_state=h0, output_final_state=True)
    assert_close(o, ref_o, FP32_RTOL, "o")
    assert_close(final, ref_final, FP32_RTOL, "final state")


def test_default_scale_is_inverse_sqrt_head_dim(assert_close):
    inputs, _ = make_inputs("gla", 70)
    assert_close(chunk_gla(**inputs)[0], chunk_gla(**inputs, scale=K ** -0.5)[0], 1e-7)
    assert rel_gap(chunk_gla(**inputs)[0], chunk_gla(**inputs, scale=1.0)[0]) > 0.1


def rel_gap(a, b):
    return ((a - b).norm() / b.norm()).item()


@pytest.mark.parametrize("fn", [gla, chunk_gla])
def test_bad_inputs_raise_clear_errors(fn):
    inputs, h0 = make_inputs("gla", 8, HQ=4)
    with pytest.raises(ValueError, match="multiple of the 2 key/value heads"):
        fn(**{**inputs, "q": torch.randn(B, 8, 3, K)})
    with pytest.raises(ValueError, match=r"g must have shape \[2, 8, 2, 16\].*use simple_gla"):
        fn(**{**inputs, "g": inputs["g"][..., 0]})
    with pytest.raises(ValueError, match="needs batch size 1"):
        fn(**inputs, cu_seqlens=torch.tensor([0, 3, 8]))
    with pytest.raises(ValueError, match=r"initial_state must have shape \[2, 2, 16, 32\]"):
        fn(**inputs, initial_state=h0[:1])
    packed = {n: t[:1] for n, t in inputs.items()}
    with pytest.raises(ValueError, match="end at the packed length 8"):
        fn(**packed, cu_seqlens=torch.tensor([0, 3, 7]))


def test_backend_selection(monkeypatch):
    x = torch.zeros(1)
    monkeypatch.setenv("T2R_OPS_BACKEND", "torch")
    assert use_triton(x) is False
    monkeypatch.setenv("T2R_OPS_BACKEND", "triton")
    assert use_triton(x) is True
    monkeypatch.setenv("T2R_OPS_BACKEND", "auto")
    assert use_triton(x) is False   # CPU tensors never take the Triton path automatically
    monkeypatch.setenv("T2R_OPS_BACKEND", "cuda")
    with pytest.raises(ValueError, match="T2R_OPS_BACKEND"):
        use_triton(x)
