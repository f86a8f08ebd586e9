"""Where a distillation step spends its time: the frontier student's KL step as `t2r finetune` runs it.

The student of `recipes/frontier/smollm2-gdn-hybrid.yaml` (SmolLM2's shape, 22 of 30 layers converted to gdn
with a 64-token window and 4 sinks, 8 kept softmax), its bf16 teacher, micro-batches of 8 x 2048 tokens packed
as `collate_packed` lays them (one `[1, 16384]` sequence, documents cut at their boundaries, document lengths
drawn like the corpus's: median ~1.1K tokens), the stage's loss (`t2r.train.losses.stage_loss`, KL 0.9 +
next-token 0.1, fused chunked KL), AdamW, 4 micro-batches a step. Random weights (speed does not depend on
their values; `--real` loads SmolLM2 through `t2r.sources` where it is staged).

Three views of the same step, each a table:
1. phases: the GPU time of teacher forward, student forward, loss, backward and optimizer (CUDA events between
   them, no synchronisation inside the step), beside the host time spent issuing each; host >= GPU means the
   phase is launch-bound;
2. kernels by kind (torch.profiler over one step): attention (flash / cuDNN / memory-efficient SDPA), the window's
   FlexAttention, t2r's Triton kernels, matrix products, everything else elementwise, with launch counts;
3. variants side by side (`--variants`): tokens/s of whole steps for each lever.

    python benchmarks/profile_distill.py --variants eager compiled --out benchmarks/results/profile_distill_H100.md
    python benchmarks/profile_distill.py --shape tiny --seq-len 256 --micro-batch 2 --accum 1 --steps 1   # CPU smoke
"""

from __future__ import annotations

import argparse
import contextlib
import copy
import gc
import statistics
import sys
import time
from collections import defaultdict
from pathlib import Path

import torch
from transformers import LlamaConfig, LlamaForCausalLM

import t2r
from t2r.data.packing import collate_packed
from t2r.models.compilation import compile_layers
from t2r.optim import build_optimizer
from t2r.train.losses import stage_loss
from t2r.train.recipe import StageSection

sys.path.insert(0, str(Path(__file__).parent))
from bench_train import SHAPES  # noqa: E402

KINDS = [  # (kind, substrings of a kernel's name); the first match wins
    ("softmax attention (SDPA / flash / cuDNN)", ("flash", "fmha", "cudnn", "attention_kernel", "efficient_attention",
                                                  "sdpa", "attn")),
    ("window FlexAttention", ("flex", "triton_tem")),
    ("inductor fused", ("triton_poi", "triton_red", "triton_per")),
    ("matrix products", ("gemm", "nvjet", "cutlass", "sm90_xmma", "wgmma", "splitk", "gemv")),
    ("softmax / log-softmax / logsumexp", ("softmax", "logsumexp")),
    ("optimizer", ("adam", "multi_tensor", "foreach")),
    ("copies and casts", ("copy", "cast", "convert")),
    ("reductions", ("reduce", "sum", "norm")),
]


def kernel_kind(name: str, triton_kernels: set[str]) -> str:
    """The kind of a CUDA kernel, from its name; t2r's own Triton kernels by their function names."""
    if name in triton_kernels or name.split("_0d1d")[0] in triton_kernels:
        return "t2r Triton kernels (gdn chunk)"
    low = name.lower()
    for kind, keys in KINDS:
        if any(key in low for key in keys):
            return kind
    return "elementwise and other"


def t2r_triton_kernels() -> set[str]:
    """The names of t2r's Triton kernels (their functions' names are the kernels' names)."""
    import importlib
    import pkgutil

    import t2r.ops as ops

    names = set()
    for info in pkgutil.walk_packages(ops.__path__, "t2r.ops."):
        if "triton" not in info.name:
            continue
        try:
            module = importlib.import_module(info.name)
        except Exception:  # noqa: BLE001 - a module that needs what this machine lacks has no kernels here
            continue
        names.update(n for n, v in vars(module).items() if type(v).__name__ in ("JITFunction", "Autotuner",
                                                                                 "Heuristics"))
    return names


def document_rows(rows: int, seq_len: int, vocab: int, generator: torch.Generator) -> list[dict]:
    """`rows` packed rows as `PackedSequences` yields them: documents of lognormal length (median ~1.1K tokens,
    mean ~2.7K, as the corpus's), cut into rows, positions restarting at every document and every row."""
    out = []
    carry = 0  # tokens of the current document still to place
    for _ in range(rows):
        positions, filled = [], 0
        while filled < seq_len:
            if carry == 0:
                carry = max(8, int(torch.empty(1).log_normal_(7.0, 1.3, generator=generator).item()))
            take = min(carry, seq_len - filled)
            positions.append(torch.arange(take))
            carry -= take
            filled += take
        ids = torch.randint(0, vocab, (seq_len,), generator=generator)
        out.append({"input_ids": ids, "position_ids": torch.cat(positions)})
    return out


@contextlib.contextmanager
def old_path(active: bool):
    """Inside (when `active`), losses built take the path before the profile: FlexAttention for the window,
    SDPA's packed mask for the softmax layers."""
    import os

    import t2r.train.losses as losses

    if not active:
        yield
        return
    saved = losses.packed_attention, os.environ.get("T2R_WINDOW_BACKEND")
    losses.packed_attention = lambda *models: contextlib.nullcontext()
    os.environ["T2R_WINDOW_BACKEND"] = "flex"
    try:
        yield
    finally:
        losses.packed_attention = saved[0]
        if saved[1] is None:
            os.environ.pop("T2R_WINDOW_BACKEND")
        else:
            os.environ["T2R_WINDOW_BACKEND"] = saved[1]


def as_rows(batch: dict, rows: int) -> dict:
    """A packed micro-batch as `[rows, T]` rows, positions 0..T-1 in each (no document boundaries)."""
    ids = batch["input_ids"].view(rows, -1)
    return {"input_ids": ids, "labels": ids, "use_cache": False}


def build_models(args, device):
    torch.manual_seed(0)
    if args.real:
        from t2r.sources import load_source

        source, _ = load_source("smollm2", dtype=torch.float32)
    else:
        source = LlamaForCausalLM(LlamaConfig(**SHAPES[args.shape], attn_implementation="sdpa"))
    source = source.to(device)
    layers = source.config.num_hidden_layers
    kept = [int(i) for i in args.keep.split(",")] if args.keep else \
        sorted({round(i * (layers - 1) / max(args.kept - 1, 1)) for i in range(args.kept)}) if args.kept else []
    converted = [i for i in range(layers) if i not in kept]
    options = dict(window=args.window, sinks=args.sinks) if args.window else {}
    student = t2r.convert(source, args.target, layers=converted, **options).train()
    teacher = source.to(torch.bfloat16).eval().requires_grad_(False)
    return student, teacher, kept


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--shape", choices=sorted(SHAPES), default="smollm2")
    parser.add_argument("--real", action="store_true", help="SmolLM2's weights (t2r.sources), not random ones")
    parser.add_argument("--target", default="gdn")
    parser.add_argument("--kept", type=int, default=8, help="softmax layers kept, evenly spaced")
    parser.add_argument("--keep", default="17,18,20,21,22,23,24,28",
                        help="the kept layers (default: the frontier student's ranked set); '' for --kept")
    parser.add_argument("--window", type=int, default=64)
    parser.add_argument("--sinks", type=int, default=4)
    parser.add_argument("--seq-len", type=int, default=2048)
    parser.add_argument("--micro-batch", type=int, default=8)
    parser.add_argument("--accum", type=int, default=4, help="micro-batches per optimizer step")
    parser.add_argument("--steps", type=int, default=3, help="timed steps per variant (after one warm-up step)")
    parser.add_argument("--variants", nargs="+", default=["eager"], choices=["before", "eager", "compiled", "rows"],
                        help="before: eager with the window on FlexAttention and the softmax layers on SDPA's packed "
                             "mask (the path of 2026-11-26); rows: eager, each micro-batch as [B, T] rows without "
                             "document boundaries (what packing by documents costs)")
    parser.add_argument("--no-profile", action="store_true")
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args()
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    cuda = device.type == "cuda"
    name = torch.cuda.get_device_name() if cuda else "cpu"
    generator = torch.Generator().manual_seed(0)
    student, teacher, kept = build_models(args, device)
    vocab = student.config.vocab_size
    batches = [collate_packed(document_rows(args.micro_batch, args.seq_len, vocab, generator))
               for _ in range(args.accum * (args.steps + 1))]
    batches = [{k: v.to(device) if torch.is_tensor(v) else v for k, v in b.items()} for b in batches]
    segments = statistics.mean(len(b["cu_seq_lens_q"]) - 1 for b in batches)
    stage = StageSection(name="distill", loss={"kl": 0.9, "next_token": 0.1})
    autocast = (lambda: torch.autocast("cuda", dtype=torch.bfloat16)) if cuda else contextlib.nullcontext
    lines = [f"# Distillation step profile: {args.target}, {len(kept)} softmax layers kept ({kept}), window "
             f"{args.window} + {args.sinks} sinks, {args.micro_batch} x {args.seq_len} tokens a micro-batch "
             f"({segments:.1f} documents on average), {args.accum} micro-batches a step; device: {name}",
             f"torch {torch.__version__}; weights {'SmolLM2' if args.real else 'random, ' + args.shape + ' shape'}; "
             "fp32 student + bf16 autocast, bf16 teacher, loss KL 0.9 + next-token 0.1 (fused chunked KL), AdamW", ""]
    for variant in args.variants:
        lines += profile_variant(variant, student, teacher, batches, args, stage, autocast, cuda)
        gc.collect()
        if cuda:
            torch.cuda.empty_cache()
    text = "\n".join(lines) + "\nCommand: python " + " ".join(sys.argv) + "\n"
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(text)
    print(text)


def profile_variant(variant: str, student, teacher, batches, args, stage, autocast, cuda: bool) -> list[str]:
    """Time `args.steps` steps of one variant after a warm-up step; its lines of the report."""
    tokens = args.micro_batch * args.seq_len
    model = copy.deepcopy(student)
    teach = teacher
    if variant == "compiled":
        compile_layers(model)
        teach = compile_layers(copy.deepcopy(teacher))
    scope = contextlib.ExitStack()
    scope.enter_context(old_path(variant == "before"))  # for the whole variant: read at every call
    loss_fn = stage_loss(model, teach, None, stage, autocast, fused=True)
    feed = batches if variant != "rows" else [as_rows(b, args.micro_batch) for b in batches]
    optimizer = build_optimizer([p for p in model.parameters() if p.requires_grad], 3e-4,
                                device=next(model.parameters()).device)
    phase_gpu, phase_host = defaultdict(list), defaultdict(list)
    marks, recording = [], [False]

    def mark(label):
        if recording[0]:
            event = torch.cuda.Event(enable_timing=True) if cuda else None
            if event is not None:
                event.record()
            marks.append((label, event, time.perf_counter()))

    hooks = [teach.register_forward_hook(lambda *_: mark("teacher forward")),
             model.register_forward_hook(lambda *_: mark("student forward"))]

    def step(index: int, record: bool):
        """One optimizer step over `args.accum` micro-batches; with `record`, its phases' times."""
        marks.clear()
        recording[0] = record
        for micro in range(args.accum):
            batch = feed[(index * args.accum + micro) % len(feed)]
            mark("start")
            loss, _ = loss_fn(batch)  # the hooks mark the teacher's and the student's forward
            mark("loss (fused KL + next-token)")
            loss.backward()
            mark("backward")
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        mark("optimizer")
        if record and cuda:
            torch.cuda.synchronize()
        for (_, start, host_start), (label, end, host_end) in zip(marks, marks[1:]):
            if label == "start":
                continue
            phase_host[label].append((host_end - host_start) * 1e3)
            if cuda:
                phase_gpu[label].append(start.elapsed_time(end))

    try:
        start = time.perf_counter()
        step(0, False)  # warm-up: compilation, autotuning, allocator
        if cuda:
            torch.cuda.synchronize()
        first = time.perf_counter() - start
        times = []
        for i in range(1, args.steps + 1):
            if cuda:
                torch.cuda.synchronize()
            start = time.perf_counter()
            step(i, True)
            times.append(time.perf_counter() - start)
        ms = statistics.median(times) * 1e3
        speed = tokens * args.accum / ms * 1e3
        print(f"{variant}: {ms:.1f} ms a step, {speed:,.0f} tokens/s; warm-up step {first:.1f} s", flush=True)
        lines = [f"## {variant}: {speed:,.0f} tokens/s ({ms:.1f} ms a step of {tokens * args.accum:,} tokens; "
                 f"the first step {first:.1f} s)", "",
                 "| phase (per micro-batch; optimizer per step) | GPU ms | host ms |", "|---|---|---|"]
        for label in phase_host:
            gpu = f"{statistics.median(phase_gpu[label]):.1f}" if phase_gpu[label] else "-"
            lines.append(f"| {label} | {gpu} | {statistics.median(phase_host[label]):.1f} |")
        if not args.no_profile and cuda:
            lines += ["", *kernel_table(lambda: step(args.steps + 1, False), args.accum)]
        lines.append("")
        print("\n".join(lines), flush=True)
        return lines
    finally:
        for hook in hooks:
            hook.remove()
        scope.close()


def kernel_table(run, accum: int) -> list[str]:
    """torch.profiler over one step: GPU time and launches per kernel kind, per micro-batch; the top kernels."""
    from torch.profiler import ProfilerActivity, profile

    torch.cuda.synchronize()
    start = time.perf_counter()
    with profile(activities=[ProfilerActivity.CUDA, ProfilerActivity.CPU]) as prof:
        run()
        torch.cuda.synchronize()
    return profile_summary(prof, (time.perf_counter() - start) * 1e3, accum)


def profile_summary(prof, wall: float, micro_batches: int, label: str = "step") -> list[str]:
    """A finished torch.profiler's GPU time and launches per kernel kind, per micro-batch, the top kernels, and
    the host's waits for the GPU (synchronisations and device-to-host copies), over `wall` ms of
    `micro_batches` micro-batches."""
    triton_kernels = t2r_triton_kernels()
    by_kind, launches, by_name = defaultdict(float), defaultdict(int), defaultdict(float)
    waits, waited = 0, 0.0
    for event in prof.events():
        if annotation(event.is_user_annotation, getattr(event, "activity_type", "")):
            continue
        if event.device_type != torch.autograd.DeviceType.CUDA:
            if event.name in ("cudaStreamSynchronize", "cudaDeviceSynchronize", "cudaEventSynchronize"):
                waits += 1
                waited += event.cpu_time_total / 1e3
            continue
        kind = kernel_kind(event.name, triton_kernels)
        by_kind[kind] += event.device_time / 1e3
        launches[kind] += 1
        by_name[event.name] += event.device_time / 1e3
    busy = sum(by_kind.values())
    if not busy:
        return [f"Under torch.profiler: {label} {wall:.0f} ms wall; no GPU kernels (no kernel table)"]
    lines = [f"Under torch.profiler: {label} {wall:.0f} ms wall, GPU busy {busy:.0f} ms ({busy / wall:.0%}), "
             f"{sum(launches.values()):,} kernel launches; the host waited for the GPU {waits} times "
             f"({waited:.0f} ms)", "",
             "| kernels by kind | GPU ms per micro-batch | share | launches per micro-batch |", "|---|---|---|---|"]
    for kind, value in sorted(by_kind.items(), key=lambda kv: -kv[1]):
        lines.append(f"| {kind} | {value / micro_batches:.1f} | {value / busy:.0%} | "
                     f"{launches[kind] / micro_batches:,.0f} |")
    lines += ["", "| top kernels | GPU ms per micro-batch |", "|---|---|"]
    for kernel, value in sorted(by_name.items(), key=lambda kv: -kv[1])[:15]:
        lines.append(f"| `{kernel[:90]}` | {value / micro_batches:.1f} |")
    return lines + idle_lines(device_intervals(prof), wall)


def annotation(flagged: bool, activity) -> bool:
    """Whether a profiler event is a named range (`nccl:all_reduce`, `DistributedDataParallel.forward`, on the
    GPU's timeline too), not work: it spans kernels counted on their own."""
    return bool(flagged) or "annotation" in str(activity)


def device_intervals(prof) -> dict[int, list[tuple[int, int, str]]]:
    """Each CUDA stream's kernels and copies as (start ns, end ns, name), from the profiler's raw events."""
    streams: dict[int, list[tuple[int, int, str]]] = defaultdict(list)
    for event in prof.profiler.kineto_results.events():
        if (event.device_type() == torch.autograd.DeviceType.CUDA
                and not annotation(event.is_user_annotation(), event.activity_type())):
            streams[event.device_resource_id()].append((event.start_ns(), event.end_ns(), event.name()))
    return streams


def stream_gaps(intervals: list[tuple[int, int, str]], at_least_ns: int) -> list[tuple[int, str, str]]:
    """The stream's idle gaps of `at_least_ns` or more, as (ns, the kernel before, the kernel after), longest
    first: overlapping kernels merge into one busy span."""
    gaps, end, last = [], None, ""
    for start, stop, name in sorted(intervals):
        if end is not None and start - end >= at_least_ns:
            gaps.append((start - end, last, name))
        if end is None or stop >= end:
            end, last = stop, name
    return sorted(gaps, key=lambda gap: -gap[0])


def idle_lines(streams: dict[int, list[tuple[int, int, str]]], wall: float, at_least_ms: float = 0.5) -> list[str]:
    """Where the busiest stream (the compute stream) sat idle: its gaps of `at_least_ms` or more in total and the
    longest, each between which two kernels: a host that falls behind its GPU shows here."""
    if not streams:
        return []
    busiest = max(streams, key=lambda s: sum(stop - start for start, stop, _ in streams[s]))
    gaps = stream_gaps(streams[busiest], int(at_least_ms * 1e6))
    total = sum(ns for ns, _, _ in gaps) / 1e6
    lines = ["", f"The compute stream (stream {busiest}, of {len(streams)}) sat idle {total:.0f} ms of {wall:.0f} ms "
             f"in {len(gaps)} gaps of {at_least_ms} ms or more", "",
             "| longest gaps, ms | after | before |", "|---|---|---|"]
    lines += [f"| {ns / 1e6:.1f} | `{before[:60]}` | `{after[:60]}` |" for ns, before, after in gaps[:12]]
    return lines


if __name__ == "__main__":
    main()
