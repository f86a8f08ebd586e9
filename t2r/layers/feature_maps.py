"""Feature maps phi applied to queries and keys before a linear-attention mixer."""

import torch
import torch.nn.functional as F


def elu1(x: torch.Tensor) -> torch.Tensor:
    """elu(x) + 1: positive, as in Katharopoulos et al. (2020)."""
    return F.elu(x) + 1


FEATURE_MAP_FUNCTIONS = {
    "identity": lambda x: x,
    "relu": F.relu,
    "swish": F.silu,
    "elu1": elu1,
}
