"""t2r.ops.gsa: chunkwise and public forms against the step-by-step reference (GSA eq. 6-7)."""
import pytest
import torch

from t2r.ops import chunk_gsa, gsa, naive_recurrent_gsa
from tests.helpers.ops import B, H, K, make_inputs

FP32_RTOL, BF16_RTOL = 1e-4, 2e-2


@pytest.mark.parametrize("gate", ["mild", "strong"])
@pytest.mark.parametrize("HQ", [2, 4])
@pytest.mark.parametrize("T", [1, 7, 64, 100, 130])
def test_chunk_and_public_match_reference_fp32(T, HQ, gate, forward_backward, assert_close):
    inputs, h0 = make_inputs("gsa", T, HQ, gate)
    ref = forward_backward(naive_recurrent_gsa, inputs, h0)
    assert_close(forward_backward(chunk_gsa, inputs, h0), ref, FP32_RTOL)
    assert_close(forward_backward(gsa, inputs, h0), ref, FP32_RTOL)


@pytest.mark.parametrize("form", ["factored", "log_space"])
def test_both_intra_chunk_forms_match_reference(form, monkeypatch, forward_backward, assert_close):
    """Both passes through the factored form and through the log-space form, forced."""
    from t2r.ops.common import chunk as engine

    monkeypatch.setattr(engine, "FACTORED_LOG_RANGE", float("inf") if form == "factored" else -1.0)
    inputs, h0 = make_inputs("gsa", 100, HQ=4, gate="mild")
    ref = forward_backward(naive_recurrent_gsa, inputs, h0)
    assert_close(forward_backward(chunk_gsa, inputs, h0), ref, FP32_RTOL)


def test_write_weights_tied_to_forgetting(forward_backward, assert_close):
    """The GSA layer's parameterisation s = 1 - exp(g), with a non-default chunk size."""
    inputs, h0 = make_inputs("gsa", 100, HQ=4)
    inputs["s"] = 1 - inputs["g"].exp()
    ref = forward_backward(naive_recurrent_gsa, inputs, h0)
    assert_close(forward_backward(chunk_gsa, inputs, h0, chunk_size=32), ref, FP32_RTOL)


@pytest.mark.parametrize("T", [7, 130])
def test_bf16_inputs_track_fp32_reference(T, forward_backward, assert_close):
    inputs, h0 = make_inputs("gsa", T, HQ=4, dtype=torch.bfloat16)
    out = forward_backward(gsa, inputs, h0)
    ref = forward_backward(naive_recurrent_gsa, {n: t.float() for n, t in inputs.items()}, h0)
    assert gsa(**inputs)[0].dtype == torch.bfloat16
    assert_close(out, ref, BF16_RTOL)


def test_no_overflow_for_extreme_decay(forward_backward, assert_close):
    inputs, h0 = make_inputs("gsa", 130, HQ=4)
    inputs["g"] = inputs["g"] * 40 - 40
    ref = forward_backward(naive_recurrent_gsa, inputs, h0)
    assert_close(forward_backward(chunk_gsa, inputs, h0), ref, FP32_RTOL)


@pytest.mark.parametrize("split", [1, 64, 70])
def test_state_chaining_equals_one_run(split, assert_close):
    inputs, h0 = make_inputs("gsa", 130, HQ=4)
    full_o, (full_k, full_v) = chunk_gsa(**inputs, initial_state=h0, output_final_state=True)
    o1, mid = gsa(**{n: t[:, :split] for n, t in inputs.items()}, initial_state=h0, output_final_state=True)
    o2, (last_k, last_v) = gsa(**{n: t[:, split:] for n, t in inputs.items()}, initial_state=mid,
                               output_final_state=True)
    assert_close(torch.cat([o1, o2], dim=1), full_o, FP32_RTOL, "o")
    assert_close(last_k, full_k, FP32_RTOL, "final key slots")
    assert_close(last_v, full_v, FP32_RTOL, "final value slots")


@pytest.mark.parametrize("fn", [gsa, chunk_gsa])
def test_packed_sequences_equal_separate_runs(fn, forward_backward, assert_close, state_rows):
    bounds = [0, 7, 71, 130]
    inputs, h0 = make_inputs("gsa", 130, HQ=4, batch=1, seqs=len(bounds) - 1)

    def separate_runs(*tensors, initial_state, output_final_state):
        runs = [naive_recurrent_gsa(*(t[:, a:b] for t in tensors), None, state_rows(initial_state, i, i + 1), True)
                for i, (a, b) in enumerate(zip(bounds[:-1], bounds[1:]))]
        finals = [s for _, s in runs]
        return (torch.cat([o for o, _ in runs], dim=1),
                tuple(torch.cat(parts, dim=0) for parts in zip(*finals)))
    packed = forward_backward(fn, inputs, h0, cu_seqlens=torch.tensor(bounds))
    assert_close(packed, forward_backward(separate_runs, inputs, h0), FP32_RTOL)


def test_gqa_equals_reference_with_repeated_kv(forward_backward, assert_close, repeat_kv_heads):
    groups = 2
    inputs, h0 = make_inputs("gsa", 100, HQ=H * groups)

    def repeated_reference(q, k, v, s, g, initial_state, output_final_state):
        rep = [repeat_kv_heads(t, groups) for t in (k, v, s, g)]
        h0_rep = tuple(repeat_kv_heads(t, groups, dim=1) for t in initial_state)
        o, (key_slots, value_slots) = naive_recurrent_gsa(q, *rep, None, h0_rep, output_final_state)
        return o, (key_slots[:, ::groups], value_slots[:, ::groups])
    assert_close(forward_backward(gsa, inputs, h0),
                 forward_backward(repeated_reference, inputs, h0), FP32_RTOL)


def test_decode_path_without_grad_matches_reference(assert_close):
    inputs, h0 = make_inputs("gsa", 1, HQ=4)
    with torch.no_grad():
        o, (key_slots, value_slots) = gsa(**inputs, initial_state=list(h0), output_final_state=True)
    ref_o, (ref_k, ref_v) = naive_recurrent_gsa(**inputs, initial_state=h0, output_final_state=True)
    assert_close(o, ref_o, FP32_RTOL, "o")
    assert_close(key_slots, ref_k, FP32_RTOL, "key slots")
    assert_close(value_slots, ref_v, FP32_RTOL, "value slots")


@pytest.mark.parametrize("fn", [gsa, chunk_gsa])
def test_bad_inputs_raise_clear_errors(fn):
    inputs, h0 = make_inputs("gsa", 8, HQ=4)
    with pytest.raises(ValueError, match="multiple of the 2 key/value heads"):
        fn(**{**inputs, "q": torch.randn(B, 8, 3, K)})
    with pytest.raises(ValueError, match=r"g must have shape \[2, 8, 2, 8\]"):
        fn(**{**inputs, "g": inputs["g"][..., :4]})
    with pytest.raises(ValueError, match=r"s must have shape \[B, T, H, M\]"):
        fn(**{**inputs, "s": inputs["s"][:, :, :1]})
    with pytest.raises(ValueError, match="needs batch size 1"):
        fn(**inputs, cu_seqlens=torch.tensor([0, 3, 8]))
    with pytest.raises(ValueError, match="initial_state must be a pair"):
        fn(**inputs, initial_state=h0[0])
    with pytest.raises(ValueError, match=r"value slots\) must have shape \[2, 2, 8, 32\]"):
        fn(**inputs, initial_state=(h0[0], h0[1][..., :4]))
