"""What a recipe will cost before it runs: memory per GPU under DDP and FSDP, and time from a throughput.

Counts come from the model config alone: the converted model is built on the meta device (no weights, nothing
downloaded but the config), so parameter counts, new gates and LoRA adapters are exact. Bytes per parameter:
weights in fp32 under mixed precision (master weights) or in the recipe's dtype; gradients and AdamW's two
moments in fp32 for trainable parameters; the teacher (distillation or attention transfer) in the recipe's
dtype. DDP holds all of it on every GPU; FSDP (full sharding) divides the student's part by the number of GPUs,
while every process holds a whole replica of the teacher (`t2r.train.model_setup.place_teacher`: it runs outside
the prepared model and is not sharded).

Activations are an estimate per micro-batch of b x T tokens: a layer's saved tensors take about 2 b T (16 d + 3 f)
bytes (bf16; attention, MLP and norms of a Llama layer), every layer's without gradient checkpointing, and with
it each layer's input (2 b T d) plus one layer's set. The loss holds the logits in bf16 and three fp32 copies
(upcast, log-softmax, gradient: 14 b T V bytes), and distillation the teacher's logits and both
log-probabilities (10 b T V more), or with the fused KL (the default) those of one chunk of tokens
(`loss_bytes`). Calibrated on SmolLM2 (H100, `benchmarks/bench_train.py`, 16K tokens per step, no
checkpointing): 25.2 GiB estimated, 24.9 GiB measured. The plain KL held more copies than counted here (the repro
recipe at micro-batch 8 measured ~48 GiB against 33 estimated): treat the figure as a floor.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from t2r.words import counted

from .kl import DEFAULT_CHUNK_TOKENS

GiB = 2**30


@dataclass
class Counts:
    total: int
    trainable: int
    layers: int
    hidden: int
    intermediate: int
    vocab: int


def count_parameters(recipe, config) -> Counts:
    """Parameters of the model the recipe trains (converted on the meta device), and how many train."""
    from t2r.convert import auto_softmax_count, t2r_config
    from t2r.models import ARCHITECTURES

    from .model_setup import attention_projections, new_module_names

    target, layers = recipe.convert.target, recipe.convert.layers
    with torch.device("meta"):
        if target == "none":
            from transformers import AutoModelForCausalLM

            model = AutoModelForCausalLM.from_config(config)
        else:
            softmax = auto_softmax_count(layers)
            if softmax is not None:  # the ranking is not known yet; gates are the same size in every layer
                layers = list(range(config.num_hidden_layers - softmax))
            converted = t2r_config(config, target, layers, **recipe.convert.options)
            model = ARCHITECTURES[config.model_type].causal_lm_class(converted)
    named = dict(model.named_parameters())
    total = sum(p.numel() for p in named.values())
    mode = recipe.train.trainable
    gates = set(new_module_names(model)) if target != "none" else set()

    def in_modules(name: str, modules) -> bool:
        return any(f".{m}." in name for m in modules)

    if mode == "all":
        trainable = total
    elif mode == "attention":
        trainable = sum(p.numel() for n, p in named.items() if ".self_attn." in n)
    elif mode == "gates":
        trainable = sum(p.numel() for n, p in named.items() if in_modules(n, gates))
    else:  # lora: r (in + out) per targeted linear layer, plus the gates trained in full
        targets = recipe.lora.target_modules or attention_projections(model)
        trainable = sum(recipe.lora.r * (m.in_features + m.out_features) for n, m in model.named_modules()
                        if n.rsplit(".", 1)[-1] in targets and hasattr(m, "in_features"))
        trainable += sum(p.numel() for n, p in named.items() if in_modules(n, gates))
    return Counts(total, trainable, config.num_hidden_layers, config.hidden_size, config.intermediate_size,
                  config.vocab_size)


def loss_bytes(stage, vocab: int, fused_kl: bool) -> int:
    """What a stage's loss holds beside the layers' activations: whole logits in bf16 and three fp32 copies
    (14 b T V bytes) for the next-token loss, and for a KL the teacher's logits and both log-probabilities
    (10 b T V more); with the fused KL (`train.fused_kl`) those of one chunk of tokens only, and neither model's
    whole logits; attention MSE alone, none (the teacher stops at its last converted layer)."""
    tokens = stage.micro_batch_size * stage.seq_len
    if stage.loss.get("kl"):
        return 24 * (min(tokens, DEFAULT_CHUNK_TOKENS) if fused_kl else tokens) * vocab
    return 14 * tokens * vocab if stage.loss.get("next_token") else 0


def memory_rows(recipe, counts: Counts, world_sizes=(1, 2, 4, 8)) -> list[dict]:
    """Per-GPU GiB of each part, for DDP and FSDP at each world size."""
    from t2r.dtypes import torch_dtype

    train = recipe.train
    dtype_bytes = torch.tensor([], dtype=torch_dtype(recipe.model.dtype)).element_size()
    weight_bytes = 4 if train.mixed_precision != "no" else dtype_bytes
    teacher = recipe.needs_teacher
    stages = recipe.stage_list
    tokens = max(s.micro_batch_size * s.seq_len for s in stages)  # the largest micro-batch of any stage
    d, f, layers, vocab = counts.hidden, counts.intermediate, counts.layers, counts.vocab
    full_layer = 2 * tokens * (16 * d + 3 * f)
    activations = (layers * 2 * tokens * d + full_layer) if train.gradient_checkpointing else layers * full_layer
    activations += max(loss_bytes(s, vocab, train.fused_kl) for s in stages)
    parts = {
        "weights": counts.total * weight_bytes,
        "gradients": counts.trainable * 4,
        "optimizer": counts.trainable * 8,
        "teacher": counts.total * dtype_bytes if teacher else 0,
    }
    rows = []
    for strategy in ("DDP", "FSDP"):
        for world in world_sizes:
            shard = world if strategy == "FSDP" else 1
            row = {"strategy": strategy, "gpus": world,
                   **{k: v / (1 if k == "teacher" else shard) / GiB for k, v in parts.items()},
                   "activations": activations / GiB}
            row["total"] = sum(v for k, v in row.items() if k not in ("strategy", "gpus"))
            rows.append(row)
    return rows


def format_plan(recipe, counts: Counts, tokens_per_second: float | None = None) -> str:
    """The plan as text: counts, the memory table, and time if a throughput (tokens/s per GPU) is given."""
    total_tokens = recipe.total_steps * recipe.train.tokens_per_step
    lines = [f"# memory plan (estimate, per GPU, GiB): {counts.total / 1e9:.2f}B parameters, "
             f"{counts.trainable / 1e9:.3f}B trainable ({recipe.train.trainable}), micro-batch "
             f"{recipe.train.micro_batch_size} x {recipe.data.seq_len} tokens",
             "# | strategy | GPUs | weights | gradients | optimizer | teacher | activations | total |",
             "# |---|---|---|---|---|---|---|---|"]
    for row in memory_rows(recipe, counts):
        lines.append(f"# | {row['strategy']} | {row['gpus']} | " + " | ".join(
            f"{row[k]:.1f}" for k in ("weights", "gradients", "optimizer", "teacher", "activations", "total")) + " |")
    if tokens_per_second:
        lines.append(f"# time at {tokens_per_second:,.0f} tokens/s per GPU for {total_tokens:,} tokens:")
        for world in (1, 8, 64):
            hours = total_tokens / (tokens_per_second * world) / 3600
            wall = f"{hours:,.1f} h" if hours >= 1 else f"{hours * 60:.1f} min"
            lines.append(f"#   {counted(world, 'GPU')}: {wall} wall, {hours * world:,.1f} GPU-hours")
    else:
        lines.append("# time: pass --tokens-per-second (per GPU, e.g. from benchmarks/bench_train.py) to project it")
    return "\n".join(lines)
