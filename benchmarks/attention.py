#!/usr/bin/env python3
"""Benchmark companion.attention against PyTorch, and its two paths against each other.

    python benchmarks/attention.py            # CPU-sized run (a few minutes on 2 cores)
    python benchmarks/attention.py --quick    # smaller, for a smoke test
    python benchmarks/attention.py --device cuda

Two tables, each with a ratio against a reference measured in the same run:

1. ``MultiHeadAttention`` forward+backward vs ``torch.nn.MultiheadAttention`` with the same
   shapes and weights (target: ratio <= 1.10; each row's status from ``common.status``: "ok",
   "borderline" when under the target by less than ``common.BORDERLINE_MARGIN``, "OVER").
2. The explicit path (``need_weights=True``: the ``(L, L)`` weights are materialised) vs the fused
   path (``F.scaled_dot_product_attention``) for L = 256 ... 4096: time of forward+backward and the
   activation memory kept for the backward pass (bytes of the tensors autograd saves; on CUDA also
   the peak allocated memory).

Generation with and without the KV cache is measured on a whole model in ``benchmarks/gpt.py``.

Exit status: 0, borderline rows included; 3 (``common.TARGET_MISSED``) when a row is over the target.
"""

from __future__ import annotations

import argparse
import sys

import torch
from common import MET, TARGET_MISSED, compare, status, table
from torch import nn

from companion.attention import MultiHeadAttention, padding_mask
from companion.profiling import saved_tensor_bytes
from companion.utils import get_device, seed_everything

# ----------------------------------------------------------------------------- 1. vs torch

TARGET = 1.10  # ours / torch, time


def bench_vs_torch(device: torch.device, quick: bool) -> bool:
    batch, seq, d, heads = (4, 64, 128, 4) if quick else (8, 128, 256, 8)
    repeats = 10 if quick else 30
    ref = nn.MultiheadAttention(d, heads, batch_first=True).to(device)
    ours = MultiHeadAttention(d, heads).to(device)
    with torch.no_grad():
        ours.in_proj.weight.copy_(ref.in_proj_weight)
        ours.in_proj.bias.copy_(ref.in_proj_bias)
        ours.out_proj.load_state_dict(ref.out_proj.state_dict())
    x = torch.randn(batch, seq, d, device=device, requires_grad=True)
    lengths = torch.randint(seq // 2, seq + 1, (batch,)).tolist()
    mask = padding_mask(lengths, max_len=seq, device=device)
    kpm = ~mask[:, 0, 0]

    cases = {
        "no mask, no weights": (lambda: ours(x)[0], lambda: ref(x, x, x, need_weights=False)[0]),
        "key padding, no weights": (
            lambda: ours(x, mask=mask)[0],
            lambda: ref(x, x, x, key_padding_mask=kpm, need_weights=False)[0],
        ),
        "no mask, per-head weights": (
            lambda: ours(x, need_weights=True)[0],
            lambda: ref(x, x, x, need_weights=True, average_attn_weights=False)[0],
        ),
    }
    rows = []
    for name, (f_ours, f_ref) in cases.items():
        torch.testing.assert_close(f_ours(), f_ref(), atol=1e-4, rtol=1e-4)
        res = compare({"ours": lambda f=f_ours: f().sum().backward(), "torch": lambda f=f_ref: f().sum().backward()},
                      device, repeats)
        ratio = res["ours"] / res["torch"]
        rows.append([name, f"{res['ours'] * 1e3:.2f}", f"{res['torch'] * 1e3:.2f}", f"{ratio:.2f}x",
                     status(ratio, TARGET, higher_is_better=False)])
    table(
        f"1. MultiHeadAttention vs torch.nn.MultiheadAttention, forward+backward "
        f"(batch={batch}, seq={seq}, d_model={d}, heads={heads}, {device.type}; target <= {TARGET:.2f}x)",
        ["case", "ours (ms)", "torch (ms)", "ratio", "status"],
        rows,
    )
    return all(r[-1] in MET for r in rows)


# ----------------------------------------------------------------------------- 2. explicit vs fused


def bench_explicit_vs_fused(device: torch.device, quick: bool) -> None:
    batch, heads, head_dim = 1, 4, 32
    d = heads * head_dim
    lengths = [256, 512, 1024] if quick else [256, 512, 1024, 2048, 4096]
    mha = MultiHeadAttention(d, heads).to(device)
    rows = []
    for L in lengths:
        x = torch.randn(batch, L, d, device=device, requires_grad=True)

        def explicit(x=x):
            mha(x, causal=True, need_weights=True)[0].sum().backward()

        def fused(x=x):
            mha(x, causal=True)[0].sum().backward()

        repeats = 3 if L >= 2048 else 5
        res = compare({"explicit": explicit, "fused": fused}, device, repeats, warmup=1)
        mem = {}
        for name, fn in (("explicit", lambda x=x: mha(x, causal=True, need_weights=True)),
                         ("fused", lambda x=x: mha(x, causal=True))):
            mem[name] = saved_tensor_bytes(fn)
        peak = {}
        if device.type == "cuda":
            for name, fn in (("explicit", explicit), ("fused", fused)):
                torch.cuda.reset_peak_memory_stats(device)
                base = torch.cuda.memory_allocated(device)
                fn()
                peak[name] = torch.cuda.max_memory_allocated(device) - base
        weights_mb = batch * heads * L * L * 4 / 2**20
        row = [
            str(L),
            f"{res['explicit'] * 1e3:.1f}", f"{res['fused'] * 1e3:.1f}", f"{res['explicit'] / res['fused']:.2f}x",
            f"{mem['explicit'] / 2**20:.1f}", f"{mem['fused'] / 2**20:.1f}", f"{mem['explicit'] / mem['fused']:.1f}x",
            f"{weights_mb:.1f}",
        ]
        if peak:
            row += [f"{peak['explicit'] / 2**20:.1f}", f"{peak['fused'] / 2**20:.1f}"]
        rows.append(row)
    header = ["L", "explicit (ms)", "fused (ms)", "time ratio", "explicit saved (MiB)", "fused saved (MiB)",
              "memory ratio", "one (h,L,L) fp32 matrix (MiB)"]
    if device.type == "cuda":
        header += ["explicit peak (MiB)", "fused peak (MiB)"]
    table(
        f"2. Explicit vs fused attention, causal, forward+backward (batch={batch}, heads={heads}, "
        f"head_dim={head_dim}, {device.type}; 'saved' = activations autograd keeps for backward)",
        header,
        rows,
    )


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--device", default="cpu", help="cpu (default), cuda or mps")
    parser.add_argument("--quick", action="store_true", help="smaller shapes, for a smoke test")
    parser.add_argument("--only", choices=["torch", "paths"], help="run one of the two tables")
    args = parser.parse_args()
    seed_everything(0)
    device = get_device(args.device)
    print(f"torch {torch.__version__}, device {device}, threads {torch.get_num_threads()}")
    met = True
    if args.only in (None, "torch"):
        met = bench_vs_torch(device, args.quick)
    if args.only in (None, "paths"):
        bench_explicit_vs_fused(device, args.quick)
    return 0 if met else TARGET_MISSED


if __name__ == "__main__":
    sys.exit(main())
