"""Which layers should stay softmax in a hybrid: each layer's sensitivity to conversion, measured.

A layer's sensitivity is KL(source || model with only that layer converted), in nats per token, on sample text:
how much the model's predictions move when that one attention is swapped for a freshly converted mixer
(HALO, Zebra-Llama and fla's hybrid distillation rank layers this way rather than by position). Keeping the N
most sensitive layers as softmax is `layers: "auto:N"` in `t2r convert` and in recipes
(`t2r.convert.calibration.resolve_layers`).

The converted layer is untrained here (no alignment step), so the ranking says where the model leans on exact
softmax attention, measured on the text given: use text like the finetuning data.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from pathlib import Path

import torch
import torch.nn.functional as F
from tqdm.auto import tqdm

from t2r.convert.conversion import convert


@dataclass
class LayerRanking:
    target: str
    kl: list[float]
    """Per layer: KL(source || only this layer converted), nats per token."""
    tokens: int
    """Predicted tokens the KL is averaged over."""
    options: dict = field(default_factory=dict)
    calibration: dict = field(default_factory=dict)
    """What was ranked on (data path, rows, length): a saved ranking is reused only for the same."""

    def most_sensitive(self, count: int) -> list[int]:
        """The `count` layers with the largest KL, in layer order."""
        if not 0 <= count < len(self.kl):
            raise ValueError(f"auto:{count}: keep between 0 and {len(self.kl) - 1} of {len(self.kl)} layers as "
                             "softmax (at least one layer must be converted)")
        order = sorted(range(len(self.kl)), key=lambda i: -self.kl[i])
        return sorted(order[:count])

    def converted_layers(self, softmax_count: int) -> list[int]:
        kept = set(self.most_sensitive(softmax_count))
        return [i for i in range(len(self.kl)) if i not in kept]

    def write(self, directory: str | Path, softmax_count: int | None = None) -> Path:
        """ranking.json and ranking.png (bars per layer; the layers kept as softmax highlighted)."""
        directory = Path(directory)
        directory.mkdir(parents=True, exist_ok=True)
        kept = self.most_sensitive(softmax_count) if softmax_count else []
        (directory / "ranking.json").write_text(json.dumps(
            {**asdict(self), "order": sorted(range(len(self.kl)), key=lambda i: -self.kl[i]),
             "softmax_layers": kept}, indent=2) + "\n")
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt

        fig, ax = plt.subplots(figsize=(max(6, len(self.kl) * 0.3), 3.2))
        ax.bar(range(len(self.kl)), self.kl, color=["#d62728" if i in kept else "#1f77b4" for i in range(len(self.kl))])
        ax.set_xlabel("layer")
        ax.set_ylabel("KL to source (nats/token)")
        ax.set_title(f"sensitivity to {self.target}, one layer converted at a time"
                     + (f" (red: {len(kept)} kept softmax)" if kept else ""))
        fig.tight_layout()
        fig.savefig(directory / "ranking.png", dpi=120)
        plt.close(fig)
        return directory / "ranking.json"

    def table(self) -> str:
        order = sorted(range(len(self.kl)), key=lambda i: -self.kl[i])
        lines = [f"| rank | layer | KL (nats/token, {self.tokens} tokens) |", "|---|---|---|"]
        lines += [f"| {rank + 1} | {i} | {self.kl[i]:.4f} |" for rank, i in enumerate(order)]
        return "\n".join(lines)


@torch.no_grad()
def kl_to_reference(model, input_ids: torch.Tensor, reference: list[torch.Tensor], batch_size: int) -> float:
    """Mean KL(reference || model) per predicted token; `reference` holds the log-probs of each batch."""
    total, count = 0.0, 0
    device = next(model.parameters()).device
    for start, log_p in zip(range(0, len(input_ids), batch_size), reference):
        logits = model(input_ids[start:start + batch_size].to(device), use_cache=False).logits[:, :-1]
        log_q = F.log_softmax(logits.float(), -1)
        total += F.kl_div(log_q, log_p.to(device), log_target=True, reduction="sum").item()
        count += log_p.shape[0] * log_p.shape[1]
    return total / count


@torch.no_grad()
def rank_layers(source, target: str, input_ids: torch.Tensor, batch_size: int = 4, progress: bool = True,
                **options) -> LayerRanking:
    """Convert one layer at a time (`t2r.convert(source, target, layers=[i], **options)`) and measure its KL
    to `source` on `input_ids` `[rows, length]`."""
    source = source.eval()
    device = next(source.parameters()).device
    reference = [F.log_softmax(source(input_ids[s:s + batch_size].to(device), use_cache=False).logits[:, :-1].float(),
                               -1).cpu() for s in range(0, len(input_ids), batch_size)]
    kl = []
    for layer in tqdm(range(source.config.num_hidden_layers), desc=f"rank layers ({target})",
                      disable=None if progress else True, leave=False):
        single = convert(source, target, layers=[layer], **options).eval()
        kl.append(kl_to_reference(single, input_ids, reference, batch_size))
        del single
    return LayerRanking(target=target, kl=kl, tokens=int(input_ids.shape[0] * (input_ids.shape[1] - 1)),
                        options=dict(options))
