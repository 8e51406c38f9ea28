#!/usr/bin/env python3
"""Benchmark companion.attention against PyTorch, and its two paths against each other.

    python benchmarks/attention.py            # CPU-sized run (a few minutes on 2 cores)
    python benchmarks/attention.py --quick    # smaller, for a smoke test
    python benchmarks/attention.py --device cuda

Three tables, each with a ratio against a reference measured in the same run:

1. ``MultiHeadAttention`` forward+backward vs ``torch.nn.MultiheadAttention`` with the same
   shapes and weights (target: ratio <= 1.10).
2. The explicit path (``need_weights=True``: the ``(L, L)`` weights are materialised) vs the fused
   path (``F.scaled_dot_product_attention``) for L = 256 ... 4096: time of forward+backward and the
   activation memory kept for the backward pass (bytes of the tensors autograd saves; on CUDA also
   the peak allocated memory).
3. Greedy generation of new tokens by a small attention-only decoder with and without the KVCache.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

import torch
from torch import nn

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from companion.attention import KVCache, MultiHeadAttention, padding_mask  # noqa: E402
from companion.profiling import saved_tensor_bytes, synchronize  # noqa: E402
from companion.utils import get_device, seed_everything  # noqa: E402


def timed(fn, device: torch.device) -> float:
    synchronize(device)
    start = time.perf_counter()
    fn()
    synchronize(device)
    return time.perf_counter() - start


def compare(fns: dict, device: torch.device, repeats: int, warmup: int = 2) -> dict[str, float]:
    """Median seconds per call of each function, measured interleaved so that load on a shared
    machine hits all of them alike."""
    for fn in fns.values():
        for _ in range(warmup):
            fn()
    times: dict[str, list[float]] = {name: [] for name in fns}
    for _ in range(repeats):
        for name, fn in fns.items():
            times[name].append(timed(fn, device))
    return {name: statistics.median(t) for name, t in times.items()}


def table(title: str, header: list[str], rows: list[list[str]]) -> None:
    widths = [max(len(h), *(len(r[i]) for r in rows)) for i, h in enumerate(header)]
    print(f"\n{title}")
    print("| " + " | ".join(h.ljust(w) for h, w in zip(header, widths)) + " |")
    print("|" + "|".join("-" * (w + 2) for w in widths) + "|")
    for r in rows:
        print("| " + " | ".join(c.rjust(w) for c, w in zip(r, widths)) + " |")


# ----------------------------------------------------------------------------- 1. vs torch


def bench_vs_torch(device: torch.device, quick: bool) -> None:
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
        res = compare(
            {"ours": lambda: f_ours().sum().backward(), "torch": lambda: f_ref().sum().backward()}, device, repeats
        )
        ratio = res["ours"] / res["torch"]
        rows.append([name, f"{res['ours'] * 1e3:.2f}", f"{res['torch'] * 1e3:.2f}", f"{ratio:.2f}x",
                     "ok" if ratio <= 1.10 else "OVER"])
    table(
        f"1. MultiHeadAttention vs torch.nn.MultiheadAttention, forward+backward "
        f"(batch={batch}, seq={seq}, d_model={d}, heads={heads}, {device.type}; target <= 1.10x)",
        ["case", "ours (ms)", "torch (ms)", "ratio", "target"],
        rows,
    )


# ----------------------------------------------------------------------------- 2. explicit vs fused


def bench_explicit_vs_fused(device: torch.device, quick: bool) -> None:
    batch, heads, d_head = 1, 4, 32
    d = heads * d_head
    lengths = [256, 512, 1024] if quick else [256, 512, 1024, 2048, 4096]
    mha = MultiHeadAttention(d, heads).to(device)
    rows = []
    for L in lengths:
        x = torch.randn(batch, L, d, device=device, requires_grad=True)

        def explicit():
            mha(x, causal=True, need_weights=True)[0].sum().backward()

        def fused():
            mha(x, causal=True)[0].sum().backward()

        repeats = 3 if L >= 2048 else 5
        res = compare({"explicit": explicit, "fused": fused}, device, repeats, warmup=1)
        mem = {}
        for name, fn in (("explicit", lambda: mha(x, causal=True, need_weights=True)),
                         ("fused", lambda: mha(x, causal=True))):
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
        f"d_head={d_head}, {device.type}; 'saved' = activations autograd keeps for backward)",
        header,
        rows,
    )


# ----------------------------------------------------------------------------- 3. KV cache


class Decoder(nn.Module):
    """Embedding, learned positions, attention-only pre-norm residual layers, unembedding."""

    def __init__(self, vocab: int, d: int, heads: int, layers: int, max_len: int) -> None:
        super().__init__()
        self.emb = nn.Embedding(vocab, d)
        self.pos = nn.Embedding(max_len, d)
        self.norms = nn.ModuleList(nn.LayerNorm(d) for _ in range(layers))
        self.attn = nn.ModuleList(MultiHeadAttention(d, heads, layer_idx=i) for i in range(layers))
        self.head = nn.Linear(d, vocab)

    def forward(self, ids: torch.Tensor, kv_cache: KVCache | None = None) -> torch.Tensor:
        start = kv_cache.seq_len(0) if kv_cache is not None else 0
        pos = torch.arange(start, start + ids.shape[1], device=ids.device)
        x = self.emb(ids) + self.pos(pos)
        for norm, attn in zip(self.norms, self.attn):
            x = x + attn(norm(x), kv_cache=kv_cache, causal=True)[0]
        return self.head(x)


@torch.no_grad()
def generate(model: Decoder, prompt: torch.Tensor, new: int, use_cache: bool) -> torch.Tensor:
    ids = prompt
    cache = KVCache(len(model.attn)) if use_cache else None
    step_input = ids
    for _ in range(new):
        logits = model(step_input, kv_cache=cache) if use_cache else model(ids)
        nxt = logits[:, -1].argmax(-1, keepdim=True)
        ids = torch.cat([ids, nxt], dim=1)
        step_input = nxt
    return ids


def bench_kv_cache(device: torch.device, quick: bool) -> None:
    vocab, d, heads, layers = 256, 256, 8, 4
    prompt_len = 16
    news = [64, 128] if quick else [128, 256, 512]
    model = Decoder(vocab, d, heads, layers, prompt_len + max(news)).to(device).eval()
    prompt = torch.randint(0, vocab, (1, prompt_len), device=device)
    rows = []
    for new in news:
        out_cached = generate(model, prompt, new, True)
        out_full = generate(model, prompt, new, False)
        same = torch.equal(out_cached, out_full)
        res = compare({"cache": lambda: generate(model, prompt, new, True),
                       "none": lambda: generate(model, prompt, new, False)}, device, repeats=3, warmup=0)
        rows.append([
            str(new), f"{new / res['none']:.0f}", f"{new / res['cache']:.0f}", f"{res['none'] / res['cache']:.1f}x",
            "yes" if same else "NO",
        ])
    table(
        f"3. Greedy generation, attention-only decoder (d_model={d}, heads={heads}, layers={layers}, "
        f"prompt={prompt_len}, {device.type})",
        ["new tokens", "no cache (tok/s)", "KV cache (tok/s)", "speed-up", "same tokens"],
        rows,
    )


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--device", default="cpu", help="cpu (default), cuda or mps")
    parser.add_argument("--quick", action="store_true", help="smaller shapes, for a smoke test")
    parser.add_argument("--only", choices=["torch", "paths", "cache"], help="run one of the three tables")
    args = parser.parse_args()
    seed_everything(0)
    device = get_device(args.device)
    print(f"torch {torch.__version__}, device {device}, threads {torch.get_num_threads()}")
    if args.only in (None, "torch"):
        bench_vs_torch(device, args.quick)
    if args.only in (None, "paths"):
        bench_explicit_vs_fused(device, args.quick)
    if args.only in (None, "cache"):
        bench_kv_cache(device, args.quick)
    return 0


if __name__ == "__main__":
    sys.exit(main())
