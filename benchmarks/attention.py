#!/usr/bin/env python3
"""Benchmark companion.attention against PyTorch, and its two paths against each other.

    python benchmarks/attention.py            # CPU-sized run (a few minutes on 2 cores)
    python benchmarks/attention.py --quick    # smaller, for a smoke test
    python benchmarks/attention.py --device cuda

Three tables, each with a ratio against a reference measured in the same run:

1. ``MultiHeadAttention`` forward+backward vs ``torch.nn.MultiheadAttention`` with the same
   shapes and weights (target: ratio <= 1.10; each row's status from ``common.status``: "ok",
   "borderline" when under the target by less than ``common.BORDERLINE_MARGIN``, "OVER").
2. The explicit path (``need_weights=True``: the ``(L, L)`` weights are materialised) vs the fused
   path (``F.scaled_dot_product_attention``) for L = 256 ... 4096: time of forward+backward and the
   activation memory kept for the backward pass (bytes of the tensors autograd saves; on CUDA also
   the peak allocated memory).

3. Long sequences (``--only long``), causal, forward+backward, batch 1, one head of width 64, at
   L = 4096 and 16384: the tiled kernel (``tiled_attention``, the online softmax in Python loops)
   against PyTorch's fused kernel, and the chunked sliding window (``sliding_window_attention``,
   w = 128) against dense attention with the window as an ``(L, L)`` mask. Targets: the tiled output
   equals the fused one to 1e-5 (max |diff|) and, at L <= 4096, its gradients equal the fused
   kernel's to 1e-4; the window's output equals the dense masked one to 1e-5 (above the dense budget:
   the reference is ``F.scaled_dot_product_attention`` without gradients, one chunk of queries at a
   time with the band mask of their keys); and the window's saved activations stay within 1.2x of its O(L·w) bound
   ``4·B·H·L'·(2w + 5·head_dim) + L'·2w`` bytes, with ``L' = ceil(L / w)·w``: the (L', 2w) weights,
   the query chunks and the (L', 2w) blocks of keys and values in float32, and the bool band mask.
   Dense attention is run only while its saved bytes, ``4·B·H·L² + L²`` (weights and mask), fit
   ``DENSE_BUDGET`` (1 GiB); above it (16k: 1 GiB per head) its memory is that formula, checked
   against the measurement at 4096, and its time is not measured. Times are wall-clock medians; on
   the CPU a line under the table splits one forward+backward of the dense reference into user and
   system CPU time: most of the system part is the operating system zeroing fresh pages for the
   ``(L, L)`` tensors (page faults), not attention's arithmetic.

Generation with and without the KV cache is measured on a whole model in ``benchmarks/gpt.py``.

Exit status: 0, borderline rows included; 3 (``common.TARGET_MISSED``) when a row is over the target.
"""

from __future__ import annotations

import argparse
import sys

import torch
import torch.nn.functional as F
from common import MET, TARGET_MISSED, compare, status, table
from torch import nn

from companion.attention import (
    MultiHeadAttention,
    padding_mask,
    scaled_dot_product_attention,
    sliding_window_attention,
    sliding_window_mask,
    tiled_attention,
)
from companion.profiling import cpu_usage_of, saved_tensor_bytes
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


# ----------------------------------------------------------------------------- 3. long sequences

EQUAL_ATOL = 1e-5  # max |diff| of the outputs
GRAD_ATOL = 1e-4  # max |diff| of the gradients of q, k, v (tiled vs fused, L <= GRAD_CHECK_MAX_LEN)
GRAD_CHECK_MAX_LEN = 4096
WINDOW_MEMORY_TARGET = 1.2  # saved bytes / the O(L·w) bound
DENSE_BUDGET = 2**30  # dense attention is run only while its saved activations fit 1 GiB


def window_bound_bytes(batch: int, heads: int, L: int, window: int, head_dim: int) -> int:
    """The O(L·w) bound on what causal ``sliding_window_attention`` (chunk = window) saves, in bytes."""
    padded = -(-L // window) * window
    return 4 * batch * heads * padded * (2 * window + 5 * head_dim) + padded * 2 * window


def dense_bytes(batch: int, heads: int, L: int) -> int:
    """What dense attention with an (L, L) bool mask saves at least: float32 weights and the mask."""
    return 4 * batch * heads * L * L + L * L


def _long_kernels(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, window: int, block: int,
                  dense: bool) -> dict:
    """The kernels of table 3 on one input, as functions of nothing; ``dense`` adds the masked dense one."""
    fns = {
        "tiled": lambda: tiled_attention(q, k, v, causal=True, block_size=block),
        "fused": lambda: F.scaled_dot_product_attention(q, k, v, is_causal=True),
        "window": lambda: sliding_window_attention(q, k, v, window),
    }
    if dense:
        mask = sliding_window_mask(q.shape[-2], window=window, device=q.device)
        fns["dense"] = lambda: scaled_dot_product_attention(q, k, v, mask)[0]
    return fns


def banded_reference(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, window: int, chunk: int = 1024) -> torch.Tensor:
    """Causal sliding-window attention by PyTorch's kernel, without gradients, ``chunk`` queries at a time.

    Query ``i`` sees keys ``i - window … i``; each chunk of queries is attended against the keys from
    ``window`` before its first query to its last, with that band as a boolean mask: O(chunk · (chunk + w))
    memory, so it can check the window kernel where an ``(L, L)`` mask would not fit.
    """
    L = q.shape[-2]
    pieces = []
    with torch.no_grad():
        for start in range(0, L, chunk):
            stop, first = min(start + chunk, L), max(0, start - window)
            i = torch.arange(start, stop, device=q.device)[:, None]
            j = torch.arange(first, stop, device=q.device)[None, :]
            band = (i - j >= 0) & (i - j <= window)
            pieces.append(F.scaled_dot_product_attention(q[..., start:stop, :], k[..., first:stop, :],
                                                         v[..., first:stop, :], attn_mask=band))
    return torch.cat(pieces, dim=-2)


def bench_long(device: torch.device, quick: bool) -> bool:
    batch, heads, head_dim, window, block = 1, 1, 64, 128, 128
    lengths = [1024, 4096] if quick else [4096, 16384]
    rows = []
    dense_usage = {}  # L -> CpuUsage of one forward+backward of the dense reference (CPU only)
    for L in lengths:
        q, k, v = (torch.randn(batch, heads, L, head_dim, device=device, requires_grad=True) for _ in range(3))
        repeats = 2 if L > 4096 else 3
        dense_fits = dense_bytes(batch, heads, L) * 1.1 <= DENSE_BUDGET
        fns = _long_kernels(q, k, v, window, block, dense_fits)
        with torch.no_grad():
            out = {name: fn() for name, fn in fns.items()}
        tiled_diff = (out["tiled"] - out["fused"]).abs().max().item()
        reference = out["dense"] if dense_fits else banded_reference(q.detach(), k.detach(), v.detach(), window)
        window_diff = (out["window"] - reference).abs().max().item()
        del out, reference
        grad_diff = None
        if L <= GRAD_CHECK_MAX_LEN:  # gradients of q, k, v: tiled (recomputed tiles) vs PyTorch's fused kernel
            g_out = torch.randn_like(q)
            grads = [torch.autograd.grad(fns[name](), (q, k, v), g_out) for name in ("tiled", "fused")]
            grad_diff = max((a - b).abs().max().item() for a, b in zip(*grads))
            del grads
        saved = {name: saved_tensor_bytes(fn) for name, fn in fns.items()}
        times = compare({name: lambda fn=fn: fn().sum().backward() for name, fn in fns.items()}, device, repeats,
                        warmup=1)
        bound = window_bound_bytes(batch, heads, L, window, head_dim)
        mib = 2**20
        tiled_target = f"max abs diff {tiled_diff:.1e} <= {EQUAL_ATOL:.0e}"
        tiled_ok = tiled_diff <= EQUAL_ATOL
        if grad_diff is not None:
            tiled_target += f", grads {grad_diff:.1e} <= {GRAD_ATOL:.0e}"
            tiled_ok = tiled_ok and grad_diff <= GRAD_ATOL
        rows.append([str(L), "tiled vs fused SDPA", f"{times['tiled'] * 1e3:.0f}", f"{times['fused'] * 1e3:.0f}",
                     f"{times['tiled'] / times['fused']:.2f}x", f"{saved['tiled'] / mib:.2f}",
                     f"{saved['fused'] / mib:.2f}", tiled_target, "ok" if tiled_ok else "NO"])
        if dense_fits:
            assert saved["dense"] >= dense_bytes(batch, heads, L)  # the formula used above the budget is a floor
            dense_cells = [f"{times['dense'] * 1e3:.0f}", f"{times['window'] / times['dense']:.2f}x",
                           f"{saved['window'] / mib:.2f}", f"{saved['dense'] / mib:.1f}"]
            if device.type == "cpu":
                dense_usage[L] = cpu_usage_of(lambda step=fns["dense"]: step().sum().backward())
        else:
            floor = dense_bytes(batch, heads, L) / mib
            dense_cells = ["-", "-", f"{saved['window'] / mib:.2f}", f">= {floor:.0f} (formula)"]
        window_ok = window_diff <= EQUAL_ATOL
        ratio = saved["window"] / bound
        window_status = status(ratio, WINDOW_MEMORY_TARGET, higher_is_better=False)
        if not window_ok:
            window_status = "NO"
        equal = f"max abs diff {window_diff:.1e}{'' if dense_fits else ' (banded SDPA)'}, "
        rows.append([str(L), f"window w={window} vs dense masked", f"{times['window'] * 1e3:.0f}", dense_cells[0],
                     dense_cells[1], dense_cells[2], dense_cells[3],
                     f"{equal}saved / bound {ratio:.2f} <= {WINDOW_MEMORY_TARGET}", window_status])
    table(
        f"3. Long sequences, causal, forward+backward (batch=1, heads=1, head_dim=64, {device.type}; 'saved' = "
        f"activations autograd keeps for backward; window bound = 4·B·H·L'·(2w + 5·head_dim) + L'·2w bytes, "
        f"L' = ceil(L/w)·w; dense run only within {DENSE_BUDGET // 2**20} MiB)",
        ["L", "kernel vs reference", "kernel (ms)", "reference (ms)", "time ratio", "kernel saved (MiB)",
         "reference saved (MiB)", "target", "status"],
        rows,
    )
    for L, use in dense_usage.items():
        print(f"\nDense masked reference at L = {L}, one forward+backward: {use.user * 1e3:.0f} ms user + "
              f"{use.system * 1e3:.0f} ms system CPU time, {use.page_faults:,} page faults (fresh 4 KiB pages "
              f"zeroed by the operating system): its wall time above counts both.")
    return all(r[-1] in MET for r in rows)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--device", default="cpu", help="cpu (default), cuda or mps")
    parser.add_argument("--quick", action="store_true", help="smaller shapes, for a smoke test")
    parser.add_argument("--only", choices=["torch", "paths", "long"], help="run one of the three tables")
    args = parser.parse_args()
    seed_everything(0)
    device = get_device(args.device)
    print(f"torch {torch.__version__}, device {device}, threads {torch.get_num_threads()}")
    met = True
    if args.only in (None, "torch"):
        met = bench_vs_torch(device, args.quick)
    if args.only in (None, "paths"):
        bench_explicit_vs_fused(device, args.quick)
    if args.only in (None, "long"):
        met = bench_long(device, args.quick) and met
    return 0 if met else TARGET_MISSED


if __name__ == "__main__":
    sys.exit(main())
