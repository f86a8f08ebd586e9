"""Does a student learn? A small CPU test bed: SmolLM2's first L layers (with its final norm and head) as the
teacher, converted to a target, optionally aligned (stage 1, attention MSE, `t2r.train.transfer`), then distilled
(KL(teacher || student), AdamW, all weights) on a few hundred tokens a step; prints KL on held-out text at
conversion, after stage 1 and after stage 2 (issue 31: GLA / RetNet with the per-head output norm stalled).

    python benchmarks/truncated_distill.py retnet --opts '{"denominator": false, "output_norm": true}' --s2 30
"""

import argparse
import copy
import gzip
import json
import time

import torch
import torch.nn.functional as F

import t2r
from t2r.sources import load_source
from t2r.train.transfer import attention_transfer

p = argparse.ArgumentParser()
p.add_argument("target")
p.add_argument("--opts", default="{}", help="conversion options as JSON")
p.add_argument("--train-file", default="../shared/data/corpus/train-00.jsonl.gz")
p.add_argument("--val-file", default="../shared/data/corpus/validation-00.jsonl.gz")
p.add_argument("--layers", type=int, default=6)
p.add_argument("--s1", type=int, default=0)
p.add_argument("--s1lr", type=float, default=1e-3)
p.add_argument("--s2", type=int, default=30)
p.add_argument("--lr", type=float, default=3e-4)
p.add_argument("--len", type=int, default=256)
p.add_argument("--bs", type=int, default=2)
a = p.parse_args()
torch.manual_seed(0)
torch.set_num_threads(2)
src, tok = load_source("smollm2")
L = a.layers
src.model.layers = src.model.layers[:L]
src.config.num_hidden_layers = L
if getattr(src.config, "layer_types", None):
    src.config.layer_types = src.config.layer_types[:L]
src.requires_grad_(False)


def docs(path, n):
    out = []
    with gzip.open(path, "rt") as f:
        for line in f:
            out.append(json.loads(line)["text"])
            if sum(map(len, out)) > n:
                break
    return " ".join(out)


train = tok(docs(a.train_file, 300_000), return_tensors="pt")["input_ids"][0]
val = tok(docs(a.val_file, 40_000), return_tensors="pt")["input_ids"][0][: 4 * a.len].view(4, a.len)


def batch(i):
    n = a.bs * a.len
    s = (i * n) % (len(train) - n)
    return train[s : s + n].view(a.bs, a.len)


with torch.no_grad():
    ref_val = src(val).logits.float().log_softmax(-1)


def val_kl(m):
    with torch.no_grad():
        lp = m(val).logits.float().log_softmax(-1)
        kl = F.kl_div(lp, ref_val, log_target=True, reduction="none").sum(-1)
    T = kl.shape[1]
    return "%.3f (first quarter %.3f, last %.3f)" % (
        kl.mean().item(),
        kl[:, : T // 4].mean().item(),
        kl[:, -T // 4 :].mean().item(),
    )


opts = json.loads(a.opts)
student = t2r.convert(copy.deepcopy(src), a.target, **opts).train()
student.requires_grad_(True)
print(
    f"== {a.target} {opts} L={L} s1={a.s1}@{a.s1lr} s2={a.s2}@{a.lr}; val KL at conversion", val_kl(student), flush=True
)
if a.s1:
    t0 = time.time()
    losses = attention_transfer(student, src, ({"input_ids": batch(i)} for i in range(a.s1)), a.s1, a.s1lr)
    print(
        f"stage1 MSE {losses[0]:.4f} -> {losses[-1]:.4f} ({time.time() - t0:.0f}s); val KL", val_kl(student), flush=True
    )
opt = torch.optim.AdamW([p for p in student.parameters() if p.requires_grad], lr=a.lr, weight_decay=0.0)
t0 = time.time()
kls = []
for i in range(a.s2):
    x = batch(1000 + i)
    with torch.no_grad():
        t = src(x).logits.float()
    s = student(x).logits.float()
    loss = F.kl_div(
        s.flatten(0, 1).log_softmax(-1), t.flatten(0, 1).log_softmax(-1), log_target=True, reduction="batchmean"
    )
    loss.backward()
    opt.step()
    opt.zero_grad()
    kls.append(loss.item())
print(
    "stage2 train KL every 5 steps:",
    " ".join("%.2f" % (sum(kls[j : j + 5]) / len(kls[j : j + 5])) for j in range(0, len(kls), 5)),
)
print(f"stage2 ({time.time() - t0:.0f}s); val KL", val_kl(student), flush=True)
