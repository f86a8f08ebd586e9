"""Which layers should stay softmax in a hybrid: each layer's sensitivity to conversion, measured.

A layer's sensitivity is KL(source || model with only that layer converted), in nats per token, on sample text:
how much the model's predictions move when that one attention is swapped for a freshly converted mixer
(HALO, Zebra-Llama and fla's hybrid distillation rank layers this way rather than by position). Keeping the N
most sensitive layers as softmax is `layers: "auto:N"` in `t2r convert` and in recipes
(`t2r.convert.calibration.resolve_layers`).

The converted layer is untrained here (no alignment step), so the ranking says where the model leans on exact
softmax attention, measured on the text given: use text like the finetuning data.

Text KL alone favours the first layers (a fresh conversion of layer 0 or 1 breaks everything) and is blind to
retrieval, the one thing a fixed-size state loses. With recall prompts (MQAR, `t2r.data.recall_prompts`) each
layer also gets a recall cost: how much converting it alone raises the answer tokens' loss. Criteria
(`CRITERIA`): `kl`; `recall` (the recall cost alone: the Jet-Nemotron sweep's retrieval drop); `halo` (recall cost
over text KL, capped at 50: HALO keeps the layers whose conversion hurts retrieval much more than general text,
and so converts layer 0); `kl+recall` (each normalised by its mean over layers, summed).

Two sweeps (`SWEEPS`): `convert-one` converts one layer at a time (the cost of converting it alone), `keep-one`
converts all but one (what keeping that layer softmax buys back in an otherwise converted model: KL and recall
loss of the all-converted model minus those with the layer kept). In a hybrid most layers are converted, and a
lone converted layer with a window barely touches recall (the other layers still see everything), so
`keep-one` is the sweep that finds the layers retrieval lives in.
"""

from __future__ import annotations

import contextlib
import json
import sys
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

import torch
import torch.nn.functional as F
from tqdm.auto import tqdm

from t2r.convert.candidates import answer_loss_sum, group_size, kl_sum, row_logits, scores_side_by_side
from t2r.convert.conversion import convert
from t2r.models.compilation import decoder_layers
from t2r.models.packed_attention import can_run, packed_attention
from t2r.ranking import CRITERIA, SWEEPS

HALO_CAP = 50.0


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
    recall: list[float] | None = None
    """Per layer: how much converting only this layer raises the recall answers' loss (nats per answer token)."""
    criterion: str = "kl"
    """What `scores` ranks by (`CRITERIA`)."""
    sweep: str = "convert-one"
    """How `kl` and `recall` were measured (`SWEEPS`): the cost of converting only this layer, or the gain of
    keeping only this layer softmax."""

    def scores(self) -> list[float]:
        """Per layer, by `criterion`: the larger, the more the layer should stay softmax."""
        if self.criterion not in CRITERIA:
            raise ValueError(f"rank by {self.criterion!r}: choose one of {', '.join(CRITERIA)}")
        if self.criterion == "kl":
            return list(self.kl)
        if self.recall is None:
            raise ValueError(f"rank by {self.criterion!r} needs recall costs: rank with recall prompts")
        if self.criterion == "recall":
            return list(self.recall)
        if self.criterion == "halo":
            return [min(max(r, 0.0) / max(k, 1e-6), HALO_CAP) for r, k in zip(self.recall, self.kl)]
        mean_kl = sum(self.kl) / len(self.kl) or 1.0
        mean_recall = sum(abs(r) for r in self.recall) / len(self.recall) or 1.0
        return [k / mean_kl + r / mean_recall for k, r in zip(self.kl, self.recall)]

    def order(self) -> list[int]:
        scores = self.scores()
        return sorted(range(len(scores)), key=lambda i: -scores[i])

    def most_sensitive(self, count: int) -> list[int]:
        """The `count` layers with the largest score, in layer order."""
        if not 0 <= count < len(self.kl):
            raise ValueError(f"auto:{count}: keep between 0 and {len(self.kl) - 1} of {len(self.kl)} layers as "
                             "softmax (at least one layer must be converted)")
        return sorted(self.order()[:count])

    def converted_layers(self, softmax_count: int) -> list[int]:
        kept = set(self.most_sensitive(softmax_count))
        return [i for i in range(len(self.kl)) if i not in kept]

    def write(self, directory: str | Path, softmax_count: int | None = None) -> Path:
        """ranking.json and ranking.png (bars per layer; the layers kept as softmax highlighted)."""
        directory = Path(directory)
        directory.mkdir(parents=True, exist_ok=True)
        kept = self.most_sensitive(softmax_count) if softmax_count else []
        (directory / "ranking.json").write_text(json.dumps(
            {**asdict(self), "order": self.order(), "softmax_layers": kept}, indent=2) + "\n")
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt

        panels = [("KL to source (nats/token)", self.kl)]
        if self.recall is not None:
            panels.append(("recall cost (nats/answer token)", self.recall))
        if self.criterion not in ("kl", "recall"):
            panels.append((f"score ({self.criterion})", self.scores()))
        fig, axes = plt.subplots(len(panels), 1, figsize=(max(6, len(self.kl) * 0.3), 2.4 * len(panels) + 0.8),
                                 squeeze=False, sharex=True)
        colors = ["#d62728" if i in kept else "#1f77b4" for i in range(len(self.kl))]
        for ax, (label, values) in zip(axes[:, 0], panels):
            ax.bar(range(len(values)), values, color=colors)
            ax.set_ylabel(label, fontsize=8)
        axes[-1, 0].set_xlabel("layer")
        axes[0, 0].set_title(f"sensitivity to {self.target}, one layer converted at a time, ranked by "
                             f"{self.criterion}" + (f" (red: {len(kept)} kept softmax)" if kept else ""))
        fig.tight_layout()
        fig.savefig(directory / "ranking.png", dpi=120)
        plt.close(fig)
        return directory / "ranking.json"

    def table(self) -> str:
        scores = self.scores()
        head = f"| rank | layer | KL (nats/token, {self.tokens} tokens) |"
        if self.recall is not None:
            head += " recall cost (nats/answer token) |"
        if self.criterion not in ("kl", "recall"):
            head += f" {self.criterion} score |"
        lines = [head, "|---" * head.count(" |") + "|"]
        for rank, i in enumerate(self.order()):
            row = f"| {rank + 1} | {i} | {self.kl[i]:.4f} |"
            if self.recall is not None:
                row += f" {self.recall[i]:.4f} |"
            if self.criterion not in ("kl", "recall"):
                row += f" {scores[i]:.3f} |"
            lines.append(row)
        return "\n".join(lines)


@torch.no_grad()
def kl_to_reference(model, input_ids: torch.Tensor, reference: list[torch.Tensor], batch_size: int) -> float:
    """Mean KL(reference || model) per predicted token; `reference` holds the log-probs of each batch."""
    total, count = 0.0, 0
    device = next(model.parameters()).device
    for start, log_p in zip(range(0, len(input_ids), batch_size), reference):
        logits = model(input_ids[start:start + batch_size].to(device), use_cache=False).logits
        total += kl_sum(logits, log_p.to(device)).item()
        count += log_p.shape[0] * log_p.shape[1]
    return total / count


@torch.no_grad()
def answer_loss(model, ids: torch.Tensor, answers: torch.Tensor, batch_size: int) -> float:
    """Mean next-token loss over the positions `answers` `[N, width]` (bool) marks in `ids` `[N, width]`."""
    total, count = 0.0, 0
    device = next(model.parameters()).device
    for start in range(0, len(ids), batch_size):
        rows, mask = ids[start:start + batch_size].to(device), answers[start:start + batch_size, 1:].to(device)
        total += answer_loss_sum(model(rows, use_cache=False).logits, rows, mask).item()
        count += int(mask.sum())
    return total / max(count, 1)


class RankingProgress:
    """A ranking's progress where no bar shows (stderr is not a terminal: a log file, a notebook, `nohup`): a line
    on stderr before the source's forward, then one per candidate with its scores, the time per candidate and
    the time left (a CPU ranking of SmolLM2 takes minutes; on a terminal tqdm draws the bar instead)."""

    def __init__(self, title: str, total: int, enabled: bool = True):
        self.title, self.total = title, total
        self.enabled = enabled and not _is_terminal(sys.stderr)  # tqdm's rule for its bar (disable=None)
        self.began = self.started = time.perf_counter()

    def line(self, text: str) -> None:
        if self.enabled:
            print(f"{self.title}: {text}", file=sys.stderr, flush=True)

    def start(self) -> None:
        """The candidates begin (the source's forward and the conversion done)."""
        self.started = time.perf_counter()
        self.line(f"ready in {self.started - self.began:.1f} s; {self.total} candidates follow")

    def done(self, layer: int, kl: float, recall: float | None) -> None:
        count = layer + 1
        each = (time.perf_counter() - self.started) / count
        scores = f"KL {kl:.4f}" + (f", recall {recall:.4f}" if recall is not None else "")
        self.line(f"layer {layer} ({count}/{self.total}): {scores}; {each:.1f} s each, "
                  f"{_duration(each * (self.total - count))} left")


def _is_terminal(stream) -> bool:
    try:
        return stream.isatty()
    except (AttributeError, ValueError):  # no isatty, or closed
        return False


def _duration(seconds: float) -> str:
    minutes, seconds = divmod(int(round(seconds)), 60)
    return f"{minutes}m{seconds:02d}s"


@torch.no_grad()
def rank_layers(source, target: str, input_ids: torch.Tensor, batch_size: int = 4, progress: bool = True,
                recall: tuple[torch.Tensor, torch.Tensor] | None = None, criterion: str = "kl",
                sweep: str = "convert-one", packed: bool | None = None, **options) -> LayerRanking:
    """Per layer, the KL to `source` on `input_ids` `[rows, length]` and, with `recall` (`(ids, answer mask)`,
    as `t2r.data.recall_prompts.answer_rows` makes), the loss of the recall answers: with only that layer
    converted (`convert-one`: the rise over the source), or with all but that layer converted (`keep-one`:
    the fall from the all-converted model). Conversions are `t2r.convert(source, target, layers=..., **options)`.
    `packed`: each batch of rows run as one packed sequence (`row_logits`); by default where varlen attention
    runs (CUDA)."""
    if criterion not in CRITERIA:
        raise ValueError(f"rank by {criterion!r}: choose one of {', '.join(CRITERIA)}")
    if sweep not in SWEEPS:
        raise ValueError(f"sweep {sweep!r}: choose one of {', '.join(SWEEPS)}")
    if criterion != "kl" and recall is None:
        raise ValueError(f"rank by {criterion!r} needs recall prompts")
    source = source.eval()
    device = next(source.parameters()).device
    packed = can_run(device, torch.bfloat16) if packed is None else packed
    layers = source.config.num_hidden_layers
    say = RankingProgress(f"rank layers ({target}, {sweep})", layers, progress)
    say.line(f"{layers} candidates on {input_ids.shape[0]} rows of {input_ids.shape[1]} tokens"
             + (f" and {len(recall[0])} recall prompts" if recall is not None else "")
             + f" ({device.type}{', packed' if packed else ''}); the source's log-probs and one conversion first")
    # one conversion of every layer; a candidate is that model with the source's own attention put back in the
    # layers it keeps softmax (no conversion per candidate: 31 of them took 157 s of a 189 s cold start)
    with torch.random.fork_rng(devices=[]):  # the new gates from the same seed: reproducible
        torch.manual_seed(0)
        converted = convert(source, target, **options).eval()
    with contextlib.ExitStack() as fast:
        if packed:  # both configurations: the source's attention modules read the source's, also inside `converted`
            fast.enter_context(packed_attention(source, converted))
        if device.type == "cuda":  # bf16 autocast, so that the mixers run their kernels (in fp32 they take the
            # PyTorch paths: 142 s for a keep-one ranking of SmolLM2 on an H100); it compares layers, not digits
            fast.enter_context(torch.autocast("cuda", dtype=torch.bfloat16))
        # the source's log-probs stay where the model is: every candidate reads them
        reference = [F.log_softmax(row_logits(source, input_ids[s:s + batch_size].to(device), packed)[:, :-1]
                                   .float(), -1) for s in range(0, len(input_ids), batch_size)]
        kl, costs = _sweep(converted, source, input_ids, reference, recall, batch_size, packed, sweep, say, progress)
    return LayerRanking(target=target, kl=kl, tokens=int(input_ids.shape[0] * (input_ids.shape[1] - 1)),
                        options=dict(options), recall=costs if recall is not None else None, criterion=criterion,
                        sweep=sweep)


def _sweep(converted, source, input_ids, reference, recall, batch_size, packed, sweep, say, progress):
    """Per layer, the (KL, recall cost) of its candidate (see `rank_layers`): two lists, the second empty
    without recall prompts. Packed, the candidates run side by side, several to a forward
    (`t2r.convert.candidates`)."""
    layers = len(decoder_layers(converted))
    every = list(range(layers))
    keep_one = sweep == "keep-one"
    kept = [[] if keep_one else every] + [[layer] if keep_one else every[:layer] + every[layer + 1:] for layer in every]
    group = group_size(batch_size, input_ids.shape[1], converted) if packed else 1
    sign = -1.0 if keep_one else 1.0  # the fall from the all-converted model, the rise over the source
    measured, kl, costs = [], [], []
    say.start()
    bar = tqdm(total=layers, desc=say.title, disable=None if progress else True, leave=False)
    for first in range(0, len(kept), group):
        kls, recalls = scores_side_by_side(converted, source, kept[first:first + group], input_ids, reference, recall,
                                           batch_size, packed)
        measured += zip(kls, recalls if recalls is not None else [None] * len(kls))
        base_kl, base_recall = measured[0]
        if not keep_one:
            base_kl = 0.0  # the base is the source itself
        for layer in range(len(kl), len(measured) - 1):
            layer_kl, layer_recall = measured[layer + 1]
            kl.append(sign * (layer_kl - base_kl))
            if recall is not None:
                costs.append(sign * (layer_recall - base_recall))
            say.done(layer, kl[-1], costs[-1] if recall is not None else None)
            bar.update()
    bar.close()
    return kl, costs
