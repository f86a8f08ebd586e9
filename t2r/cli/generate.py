"""`t2r generate`."""

from __future__ import annotations

import sys
import time

from t2r.cli import threads
from t2r.cli.common import default_device, dtype_arg
from t2r.cli.convert import fresh_conversion_note
from t2r.paths import check_model_spec, offline_if_unreachable
from t2r.sources import verify_ahead


def run_generate(args) -> int:
    check_model_spec(args.model)
    offline_if_unreachable(args.model)
    threads.note()
    verify_ahead(args.model)  # its checksums hashed beside the imports below
    import torch

    from t2r.sources import load_source

    device = default_device(args.device)
    model, tokenizer = load_source(args.model, dtype=dtype_arg(args.dtype), device=device)
    note = fresh_conversion_note(args.model)
    if note:
        print(note, file=sys.stderr)
    if tokenizer.pad_token is None:
        tokenizer.pad_token = tokenizer.eos_token
    tokenizer.padding_side = "left"  # recurrent layers are exact under left padding
    inputs = tokenizer(args.prompt, return_tensors="pt", padding=True).to(device)
    torch.manual_seed(args.seed)
    start = time.perf_counter()
    output = model.generate(
        **inputs, max_new_tokens=args.max_new_tokens, do_sample=args.sample,
        temperature=args.temperature if args.sample else None, top_p=args.top_p if args.sample else None,
        top_k=None, pad_token_id=tokenizer.pad_token_id,
    )
    elapsed = time.perf_counter() - start
    new_tokens = output[:, inputs["input_ids"].shape[1]:]
    texts = tokenizer.batch_decode(new_tokens, skip_special_tokens=True, clean_up_tokenization_spaces=False)
    for prompt, text in zip(args.prompt, texts):
        print(f"{prompt}{text}")
    print(f"[{new_tokens.numel()} tokens in {elapsed:.2f}s on {device}]", file=sys.stderr)
    return 0
