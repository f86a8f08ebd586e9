import os, torch, t2r
from tests.helpers.models import tiny_source
torch.manual_seed(0)
for arch in ("llama", "gemma3_text"):
    base = t2r.convert(tiny_source(arch, hidden_size=256, num_attention_heads=4, num_key_value_heads=2), "gdn")
    ids = torch.randint(3, 97, (2, 200), device="cuda")
    res = {}
    for name, dtype, backend in (("ref32", torch.float32, "torch"), ("torch16", torch.bfloat16, "torch"), ("triton16", torch.bfloat16, "triton")):
        os.environ["T2R_OPS_BACKEND"] = backend
        m = __import__("copy").deepcopy(base).to("cuda", dtype).train()
        out = m(ids, labels=ids); out.loss.backward()
        res[name] = {n: p.grad.float() for n, p in m.named_parameters() if p.grad is not None and ("beta" in n or "dt_bias" in n or "A_log" in n or "q_proj" in n)}
    for n in list(res["ref32"])[:8]:
        r = res["ref32"][n]
        e = lambda x: ((x - r).norm() / r.norm().clamp_min(1e-12)).item()
        print(arch, n, f"torch-bf16 {e(res['torch16'][n]):.3f} triton-bf16 {e(res['triton16'][n]):.3f}")
