"""A DeepSeek-sparse-attention training step with its lightning indexer (SPEC 2 and 5), small
enough for a CPU.

    python python/examples/dsa_train_step.py [--steps 12] [--check] [--device auto|cpu|cuda]

--device auto (the default) runs on CUDA when a device is there. On a GPU the layer takes the
kernels' shapes (16 heads, a 512-wide latent plus a 64-wide rope part, 16 indexer heads of 128)
and feeds the library bf16 activations (parameters and head weights stay fp32); the eager check
computes in fp32 from the same bf16-rounded activations, so gradients agree to bf16 tolerance
(2e-2 relative L2) instead of the CPU reference's 1e-3.

The layer: MLA-style attention in its absorbed form (one latent record per token, `kv =
[c_kv | rope(k_r)]`, shared by every head; per-head queries `q = [q_latent | rope(q_r)]`), an
attention sink per head, and the indexer (`q_I`, one `k_I` per token, per-token head weights
`w`). Two packed sequences share one flat token axis; `k_start`/`k_end` keep attention and
indexer causal inside each sequence.

Training follows DeepSeek-V3.2's two stages:
  1. dense warm-up: the attention is dense (every key of the causal range, given to
     deepseek_sparse_attention as its top-k list); only the indexer trains, on the dense KL loss;
  2. sparse: the indexer's top-k picks the keys; everything trains on the task loss plus the
     sparse KL loss. The indexer's inputs are detached from the task loss: the indexer learns
     from the KL loss alone, the attention from the task loss alone.
The KL loss falls in both stages. With --check, each stage's first step is also run through an
eager PyTorch implementation of the same layer (gather-based attention and SPEC 5's KL written
with torch ops), and every parameter's gradient is compared.
"""

from __future__ import annotations

import argparse
import math

import torch
from torch import nn

from sparse_attention import deepseek_sparse_attention, indexer_kl_loss, indexer_topk


# ---- the layer -----------------------------------------------------------------------------------
def rope(x: torch.Tensor, pos: torch.Tensor) -> torch.Tensor:
    """Rotary embedding over the last dim (pairs (i, i + d/2)) at positions `pos` [S]."""
    d = x.shape[-1] // 2
    freq = 10000.0 ** (-torch.arange(d, dtype=torch.float32, device=x.device) / d)
    ang = pos.float()[:, None] * freq[None, :]  # [S, d]
    while ang.dim() < x.dim():
        ang = ang.unsqueeze(-2)
    cos, sin = ang.cos().to(x.dtype), ang.sin().to(x.dtype)
    x1, x2 = x[..., :d], x[..., d:]
    return torch.cat([x1 * cos - x2 * sin, x1 * sin + x2 * cos], dim=-1)


class DsaLayer(nn.Module):
    def __init__(self, d_model=64, heads=4, d_latent=32, d_rope=16, index_heads=4, d_index=16):
        super().__init__()
        self.heads, self.d_latent, self.d_rope = heads, d_latent, d_rope
        self.index_heads, self.d_index = index_heads, d_index
        self.kv_down = nn.Linear(d_model, d_latent, bias=False)  # c_kv: the latent (and value)
        self.k_rope = nn.Linear(d_model, d_rope, bias=False)
        self.q_latent = nn.Linear(d_model, heads * d_latent, bias=False)  # absorbed W_q W_uk
        self.q_rope = nn.Linear(d_model, heads * d_rope, bias=False)
        self.out = nn.Linear(heads * d_latent, d_model, bias=False)  # absorbed W_uv W_o
        self.sink = nn.Parameter(torch.zeros(heads))
        # The lightning indexer.
        self.idx_q = nn.Linear(d_model, index_heads * d_index, bias=False)
        self.idx_k = nn.Linear(d_model, d_index, bias=False)
        self.idx_w = nn.Linear(d_model, index_heads, bias=False)

    def indexer_params(self):
        return [self.idx_q.weight, self.idx_k.weight, self.idx_w.weight]

    def attention_inputs(self, x, pos):
        s = x.shape[0]
        kv = torch.cat([self.kv_down(x), rope(self.k_rope(x), pos)], dim=-1)  # [S, D_qk]
        q = torch.cat([self.q_latent(x).view(s, self.heads, self.d_latent),
                       rope(self.q_rope(x).view(s, self.heads, self.d_rope), pos)], dim=-1)
        return q, kv

    def indexer_inputs(self, x):
        x = x.detach()  # the indexer learns from the KL loss only
        s = x.shape[0]
        q_i = self.idx_q(x).view(s, self.index_heads, self.d_index)
        return q_i, self.idx_k(x), self.idx_w(x) / math.sqrt(self.index_heads)


def dense_topk(k_start, k_end, width):
    """Every key of each causal range as a top-k list (then -1): dense attention through DSA."""
    i = torch.arange(width, device=k_start.device)[None, :]
    idx = k_start[:, None] + i
    length = k_end - k_start
    return torch.where(i < length[:, None], idx, -1).int(), length.int()


def step_losses(layer, x, y, pos, k_start, k_end, topk, sparse, eager=False, low=None):
    """(task loss, KL loss) of one step. Sparse: the indexer's top-k; dense: every key. `low`:
    the activations' dtype for the library (bf16 on a GPU); the eager path rounds to it too, then
    computes in fp32."""
    q, kv = layer.attention_inputs(x, pos)
    q_i, k_i, w = layer.indexer_inputs(x)
    if low is not None:
        q, kv, q_i, k_i = (t.to(low) for t in (q, kv, q_i, k_i))
    # The selection is the library's in both paths, on the activations in the library's dtype.
    select = (q_i.detach(), k_i.detach(), w.detach())
    if low is not None and eager:
        q, kv, q_i, k_i = (t.float() for t in (q, kv, q_i, k_i))
    if sparse:
        idx, length = indexer_topk(*select, topk, k_start, k_end)
    else:
        idx, length = dense_topk(k_start, k_end, x.shape[0])
    attend = eager_dsa if eager else deepseek_sparse_attention
    out, lse = attend(q, kv, idx, topk_length=length, sink=layer.sink, d_v=layer.d_latent)
    task = (layer.out(out.reshape(x.shape[0], -1).float()) - y).square().mean()
    kl_fn = eager_kl_loss if eager else indexer_kl_loss
    kl = kl_fn(q_i, k_i, w, q, kv, lse, idx if sparse else None, length if sparse else None,
               k_start, k_end, coeff=1.0 / x.shape[0])
    return task, kl


# ---- eager PyTorch versions of the two library calls (for --check) -------------------------------
def eager_dsa(q, kv, idx, topk_length, sink, d_v):
    """SPEC 2's forward with a gather: (out, lse)."""
    s_q, topk = idx.shape
    active = (idx >= 0) & (idx < kv.shape[0])
    active &= torch.arange(topk, device=idx.device)[None, :] < topk_length[:, None]
    keys = kv[idx.long().clamp(0, kv.shape[0] - 1)]  # [S_q, topk, D_qk]
    scale = float(torch.tensor(1.0 / math.sqrt(q.shape[-1]), dtype=torch.float32))
    s = (scale * torch.einsum("thd,tkd->thk", q, keys)).masked_fill(~active[:, None], -math.inf)
    lse = torch.logsumexp(s, dim=-1)
    big_l = torch.logaddexp(lse, sink[None, :])
    p = torch.exp(s - big_l[..., None])
    return torch.einsum("thk,tkd->thd", p, keys[..., :d_v]), lse.detach()


def eager_kl_loss(q_i, k_i, w, q, kv, lse, idx, length, k_start, k_end, coeff):
    """SPEC 5's loss with torch ops; dense mode when idx is None."""
    s_q, s_kv = q.shape[0], kv.shape[0]
    if idx is None:
        keys = torch.arange(s_kv, device=q.device).expand(s_q, s_kv)
        active = torch.ones(s_q, s_kv, dtype=torch.bool, device=q.device)
    else:
        keys = idx.long()
        active = (keys >= 0) & (keys < s_kv)
        active &= torch.arange(idx.shape[1], device=q.device)[None, :] < length[:, None]
    active &= (keys >= k_start[:, None]) & (keys < k_end[:, None])
    keys = keys.clamp(0, s_kv - 1)
    scale_i = float(torch.tensor(1.0 / math.sqrt(q_i.shape[-1]), dtype=torch.float32))
    scale = float(torch.tensor(1.0 / math.sqrt(q.shape[-1]), dtype=torch.float32))
    logits = scale_i * torch.einsum("tjd,tkd->tjk", q_i, k_i[keys])
    scores = (w[:, :, None] * logits.relu()).sum(1)
    with torch.no_grad():  # the target: no gradient
        s_att = scale * torch.einsum("thd,tkd->thk", q, kv[keys])
        log_a = torch.logsumexp(s_att - lse[..., None], 1)
        log_a = log_a.masked_fill(~active, -math.inf)
        row = active.any(-1)
        log_p = log_a - torch.logsumexp(log_a, -1, keepdim=True).masked_fill(~row[:, None], 0)
        p = torch.exp(log_p)
        log_p = torch.where(p > 0, log_p, torch.zeros_like(log_p))
    mask = active | ~row[:, None]
    log_r = scores - torch.logsumexp(scores.masked_fill(~mask, -math.inf), -1, keepdim=True)
    return coeff * (p * (log_p - log_r)).sum()


# ---- training ------------------------------------------------------------------------------------
def packed_causal_ranges(lengths, device):
    k_start, k_end, pos = [], [], []
    base = 0
    for n in lengths:
        for i in range(n):
            k_start.append(base)
            k_end.append(base + i + 1)
            pos.append(i)
        base += n
    as_t = lambda v: torch.tensor(v, dtype=torch.int32, device=device)  # noqa: E731
    return as_t(k_start), as_t(k_end), as_t(pos)


def compare_gradients(layer, batch, topk, sparse, low=None):
    """Relative L2 error of every parameter's gradient: library step vs eager step."""
    errors = {}
    grads = []
    for eager in (False, True):
        layer.zero_grad()
        task, kl = step_losses(layer, *batch, topk, sparse, eager=eager, low=low)
        (task + kl).backward()
        grads.append({n: p.grad.detach().clone() for n, p in layer.named_parameters()})
    for name, g in grads[0].items():
        ref = grads[1][name]
        errors[name] = float((g - ref).norm() / ref.norm().clamp_min(1e-30))
    layer.zero_grad()
    return errors


# The layer's sizes: tiny on the CPU (the reference takes any size), the kernels' shapes on a GPU.
CPU_LAYER = dict(d_model=64, heads=4, d_latent=32, d_rope=16, index_heads=4, d_index=16)
GPU_LAYER = dict(d_model=128, heads=16, d_latent=512, d_rope=64, index_heads=16, d_index=128)


def gradient_tolerance(device):
    """Relative L2 error allowed between the library's and the eager step's gradients."""
    return 2e-2 if torch.device(device).type == "cuda" else 1e-3


def train(steps=12, topk=8, seed=0, device="cpu", check=False, lr=None, log=print):
    """lr: Adam's rate of the warm-up (default 3e-2 on the CPU layer, 3e-3 on the GPU one, whose
    wider indexer overshoots at the CPU's rate)."""
    torch.manual_seed(seed)
    gpu = torch.device(device).type == "cuda"
    if lr is None:
        lr = 3e-3 if gpu else 3e-2
    dims = GPU_LAYER if gpu else CPU_LAYER
    low = torch.bfloat16 if gpu else None
    layer = DsaLayer(**dims).to(device)
    s_total = 48
    x = torch.randn(s_total, dims["d_model"], device=device)
    y = torch.randn(s_total, dims["d_model"], device=device)
    k_start, k_end, pos = packed_causal_ranges([20, 28], device)  # two packed sequences
    batch = (x, y, pos, k_start, k_end)
    history = {"dense_kl": [], "sparse_kl": [], "task": [], "grad_error": {}}

    # The sparse stage fine-tunes: the indexer at a tenth of the warm-up rate, the attention ten
    # times slower still, so that the indexer follows the attention's distribution as it moves.
    indexer = set(id(p) for p in layer.indexer_params())
    attention = [p for p in layer.parameters() if id(p) not in indexer]
    warmup = torch.optim.Adam(layer.indexer_params(), lr=lr)
    full = torch.optim.Adam([{"params": layer.indexer_params(), "lr": lr / 10},
                             {"params": attention, "lr": lr / 100}])
    for stage, opt, sparse in (("dense", warmup, False), ("sparse", full, True)):
        if check:
            history["grad_error"][stage] = compare_gradients(layer, batch, topk, sparse, low)
        for step in range(steps):
            task, kl = step_losses(layer, *batch, topk, sparse, low=low)
            opt.zero_grad()
            (kl if stage == "dense" else task + kl).backward()
            opt.step()
            history[stage + "_kl"].append(kl.item())
            if stage == "sparse":
                history["task"].append(task.item())
            log("%-6s step %2d  task %.5f  KL %.5f" % (stage, step, task.item(), kl.item()))
    return history


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--steps", type=int, default=12, help="optimizer steps per stage")
    ap.add_argument("--topk", type=int, default=8)
    ap.add_argument("--device", default="auto",
                    help="auto (CUDA when available), cpu or cuda")
    ap.add_argument("--check", action="store_true",
                    help="compare every gradient with an eager PyTorch implementation")
    args = ap.parse_args(argv)
    device = args.device
    if device == "auto":
        device = "cuda" if torch.cuda.is_available() else "cpu"
    print("device: %s" % device)
    h = train(args.steps, args.topk, device=device, check=args.check)
    for stage, errs in h["grad_error"].items():
        worst = max(errs, key=errs.get)
        print("%s step vs eager PyTorch: worst gradient %s, relative L2 error %.2e"
              % (stage, worst, errs[worst]))
    for stage in ("dense", "sparse"):
        kl = h[stage + "_kl"]
        print("%s KL: %.5f -> %.5f" % (stage, kl[0], kl[-1]))
    falls = all(h[s + "_kl"][-1] < h[s + "_kl"][0] for s in ("dense", "sparse"))
    tol = gradient_tolerance(device)
    ok = falls and all(e < tol for errs in h["grad_error"].values() for e in errs.values())
    print("OK" if ok else "FAILED")
    return 0 if ok else 1


if __name__ == "__main__":
    raise SystemExit(main())
