"""t2r.ops.utils: grouping of packed sequences and recomputation in backward."""
import torch

from t2r.ops.utils import _length_groups, recompute_in_backward


def test_length_groups_cover_every_sequence_once_with_bounded_padding():
    for lengths in ([100, 10, 90, 12], [5], [3, 3, 3], [200, 5, 150, 3, 64], list(range(1, 40))):
        groups = _length_groups(lengths)
        assert sorted(i for group in groups for i in group) == list(range(len(lengths)))
        for group in groups:
            assert lengths[group[0]] == max(lengths[i] for i in group)  # longest first: the padded length
            assert len(group) * lengths[group[0]] <= 1.5 * sum(lengths[i] for i in group)
    assert _length_groups([100, 10, 90, 12]) == [[0, 2, 3], [1]]


def test_recompute_in_backward_keeps_only_inputs_and_gives_the_same_gradients():
    x = torch.randn(64, 64, requires_grad=True)

    def heavy(x):
        return (x.exp() @ x.sin()).tanh().sum()

    saved = []
    with torch.autograd.graph.saved_tensors_hooks(lambda t: saved.append(t.numel()) or t, lambda t: t):
        out = recompute_in_backward(heavy, x)
    assert sum(saved) == x.numel()  # only the input is kept
    grad = torch.autograd.grad(out, x)[0]
    assert torch.allclose(grad, torch.autograd.grad(heavy(x), x)[0])
    with torch.no_grad():
        assert torch.equal(recompute_in_backward(heavy, x), heavy(x))
