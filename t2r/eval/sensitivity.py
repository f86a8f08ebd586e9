"""Which layers should stay softmax in a hybrid: each layer's sensitivity to conversion, measured.

A layer's sensitivity is KL(source || model with only that layer converted), in nats per token, on sample text:
how much the model's predictions move when that one attention is swapped for a freshly converted mixer
(HALO, Zebra-Llama and fla's hybrid distillation rank layers this way rather than by position). Keeping the N
most sensitive layers as softmax is `layers: "auto:N"` in `t2r convert` and in recipes.

The converted layer is untrained here (no alignment step), so the ranking says where the model leans on exact
softmax attention, measured on the text given: use text like the finetuning data.
"""

from __future__ import annotations

import json
import re
from dataclasses import asdict, dataclass, field
from pathlib import Path

import torch
import torch.nn.functional as F
from tqdm.auto import tqdm

AUTO_LAYERS = re.compile(r"auto:(\d+)")
"""`layers` spec that keeps the N most sensitive layers as softmax and converts the rest."""


def auto_softmax_count(spec) -> int | None:
    """N of an `auto:N` layers spec, or None for any other spec."""
    match = AUTO_LAYERS.fullmatch(spec.strip()) if isinstance(spec, str) else None
    return int(match.group(1)) if match else None


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
    from t2r.convert import convert

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


def calibration_rows(tokenizer, data=None, rows: int = 4, length: int = 512, seed: int = 0) -> torch.Tensor:
    """`[rows, length]` token ids for ranking: documents of `data` (a `DataConfig`; its training part) joined
    end to end, or, without data, generated long documents (`t2r.data.synthetic`)."""
    from t2r.eval.perplexity import token_rows

    if data is None:
        import tempfile

        from t2r.data.config import DataConfig
        from t2r.data.synthetic import write_long_jsonl

        with tempfile.TemporaryDirectory() as tmp:
            path = write_long_jsonl(Path(tmp) / "calibration.jsonl", count=rows, seed=20_000 + seed)
            return token_rows(DataConfig(path=str(path)), tokenizer, length, rows, seed, pack=True, part="train")
    return token_rows(data, tokenizer, length, rows, seed, pack=True, part="train")


def resolve_layers(spec, source, tokenizer, target: str, data=None, rows: int = 4, length: int = 512,
                   out_dir: str | Path | None = None, progress: bool = True, **options):
    """`layers` for `t2r.convert`: `spec` itself, or for `auto:N` the layers left after keeping the N most
    sensitive as softmax (ranked on `calibration_rows`; ranking.json / ranking.png written to `out_dir`, and
    read back from there when present, so a resumed run converts the same layers)."""
    count = auto_softmax_count(spec)
    if count is None:
        return spec
    layers = source.config.num_hidden_layers
    if count >= layers:
        raise ValueError(f"layers={spec!r}: keep between 0 and {layers - 1} of {layers} layers as softmax "
                         "(at least one layer must be converted)")
    calibration = {"data": getattr(data, "path", None), "rows": rows, "length": length}
    saved = Path(out_dir) / "ranking.json" if out_dir is not None else None
    if saved is not None and saved.is_file():
        stored = json.loads(saved.read_text())
        if (stored.get("target"), stored.get("calibration"), len(stored["kl"])) == (target, calibration, layers):
            return LayerRanking(target, stored["kl"], stored["tokens"], stored["options"]).converted_layers(count)
    ids = calibration_rows(tokenizer, data, rows, length)
    ranking = rank_layers(source, target, ids, progress=progress, **options)
    ranking.calibration = calibration
    if out_dir is not None:
        ranking.write(out_dir, count)
    return ranking.converted_layers(count)
