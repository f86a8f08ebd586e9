"""t2r.ops.utils: grouping of packed sequences and recomputation in backward."""
import pytest
import torch
from torch.utils.checkpoint import checkpoint

from t2r.ops.utils import _length_groups, recompute_in_backward, saved_tensors_managed


def test_length_groups_cover_every_sequence_once_with_bounded_padding():
    for lengths in ([100, 10, 90, 12], [5], [3, 3, 3], [200, 5, 150, 3, 64], list(range(1, 40))):
        groups = _length_groups(lengths)
        assert sorted(i for group in groups for i in group) == list(range(len(lengths)))
        for group in groups:
            assert lengths[group[0]] == max(lengths[i] for i in group)  # longest first: the padded length
            assert len(group) * lengths[group[0]] <= 1.5 * sum(lengths[i] for i in group)
    assert _length_groups([100, 10, 90, 12]) == [[0, 2, 3], [1]]


def _counted(calls):
    def heavy(x):
        calls.append(1)
        return (x.exp() @ x.sin()).tanh().sum(0)
    return heavy


def test_recompute_in_backward_runs_the_op_again_and_gives_the_same_gradients():
    x = torch.randn(64, 64, requires_grad=True)
    calls = []
    heavy = _counted(calls)
    out = recompute_in_backward(heavy, x).sum()
    grad = torch.autograd.grad(out, x)[0]
    assert len(calls) == 2  # forward, then again in backward: only the input was kept
    assert torch.allclose(grad, torch.autograd.grad(heavy(x).sum(), x)[0])
    calls.clear()
    with torch.no_grad():
        assert torch.equal(recompute_in_backward(heavy, x), heavy(x))
    assert len(calls) == 2  # no gradient: plain calls


def test_recompute_is_not_nested_inside_a_checkpointed_layer():
    """Under activation checkpointing of the layer, the op runs twice (forward, the layer's recompute), not
    three times, and the gradients are the same."""
    x = torch.randn(64, 64, requires_grad=True)
    calls = []
    heavy = _counted(calls)

    def layer(x):  # the op's output feeds a node that saves it, so the layer's recompute reaches the op
        return (recompute_in_backward(heavy, x.cos()) * 2).sin().sum()

    out = checkpoint(layer, x, use_reentrant=False)
    assert not saved_tensors_managed()  # only inside the checkpointed region
    grad = torch.autograd.grad(out, x)[0]
    assert len(calls) == 2
    assert torch.allclose(grad, torch.autograd.grad((heavy(x.cos()) * 2).sin().sum(), x)[0])


def test_packed_offsets_are_read_once_a_tensor_and_again_after_a_change(monkeypatch):
    """`check_cu_seqlens` reads the offsets' values (a host sync on a GPU) once per tensor and version: every layer
    of a forward passes the same tensor; an offsets tensor changed in place is read again and refused."""
    from t2r.ops import utils

    reads = []
    offsets = torch.tensor([0, 3, 8], dtype=torch.int32)
    real_tolist = torch.Tensor.tolist
    monkeypatch.setattr(torch.Tensor, "tolist", lambda t: reads.append(1) or real_tolist(t))
    assert [utils.check_cu_seqlens("op", offsets, 1, 8) for _ in range(5)] == [2] * 5
    assert len(reads) == 1
    offsets[1] = 9  # in place: the version changes
    with pytest.raises(ValueError, match="strictly increasing"):
        utils.check_cu_seqlens("op", offsets, 1, 8)
    with pytest.raises(ValueError, match="end at the packed length 9"):
        utils.check_cu_seqlens("op", torch.tensor([0, 3, 8]), 1, 9)


def test_the_same_offsets_checked_against_another_length_are_read_again():
    """The check's memo is per packed length: offsets that passed for one length are refused for another."""
    from t2r.ops import utils

    offsets = torch.tensor([0, 3, 8], dtype=torch.int32)
    assert utils.check_cu_seqlens("op", offsets, 1, 8) == 2
    with pytest.raises(ValueError, match="end at the packed length 9"):
        utils.check_cu_seqlens("op", offsets, 1, 9)
