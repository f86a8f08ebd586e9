"""Packed sequences without states (training): one segmented chunkwise call over the flattened row
equals each sequence run alone by the step-by-step reference, outputs and gradients, for every op and
both intra-chunk forms."""
import pytest
import torch

from t2r.ops import (
    chunk_gla,
    chunk_gsa,
    chunk_simple_gla,
    gla,
    gsa,
    naive_recurrent_gla,
    naive_recurrent_gsa,
    naive_recurrent_simple_gla,
    simple_gla,
)
from tests.helpers.ops import V, make_inputs

HQ = 4
# a boundary on a chunk start (64), sequences of 1 and 5 steps, one spanning three chunks, one ending the row
BOUNDS = [0, 5, 64, 134, 135, 300, 301, 330]


OPS = {"gla": (gla, chunk_gla, naive_recurrent_gla), "simple_gla": (simple_gla, chunk_simple_gla,
       naive_recurrent_simple_gla), "gsa": (gsa, chunk_gsa, naive_recurrent_gsa)}


@pytest.mark.parametrize("gate", ["mild", "moderate"])
@pytest.mark.parametrize("public", [True, False])
@pytest.mark.parametrize("op", list(OPS))
def test_packed_row_equals_separate_sequences(op, public, gate, assert_close):
    fn = OPS[op][0] if public else OPS[op][1]
    reference = OPS[op][2]
    inputs = {n: t.requires_grad_(True) for n, t in make_inputs(op, BOUNDS[-1], HQ, gate, batch=1)[0].items()}
    cotangent = torch.randn(1, BOUNDS[-1], HQ, V)
    packed, _ = fn(**inputs, cu_seqlens=torch.tensor(BOUNDS))
    grads = torch.autograd.grad((packed * cotangent).sum(), list(inputs.values()))
    parts = [reference(*(t[:, a:b] for t in inputs.values()))[0] for a, b in zip(BOUNDS[:-1], BOUNDS[1:])]
    alone = torch.cat(parts, dim=1)
    ref_grads = torch.autograd.grad((alone * cotangent).sum(), list(inputs.values()))
    assert_close(packed.float(), alone.float(), 1e-4, "o")
    for name, got, want in zip(inputs, grads, ref_grads):
        assert_close(got, want, 1e-4, f"d{name}")
