"""GPT-2 small on a GPU: training throughput and MFU, and fast decoding, against Hugging Face.

Imported by ``benchmarks/gpt.py``, which runs these rows with ``--device cuda`` (and, on smaller
shapes so that a CPU can smoke-test the code paths, with ``--quick``).

**Training**: ``ModelConfig.preset("gpt2-small", vocab_size=50304, dropout=0.0)`` (124.5M
parameters; the vocabulary padded to a multiple of 128), 16 rows of 1,024 tokens, bf16 autocast,
AdamW; one step is forward, loss, backward and optimizer step. Each variant is built fresh and run
alone (its peak memory is its own), each row adding one change to the one above, so the table
says what each change bought; Hugging Face's ``GPT2LMHeadModel`` gets the same changes but CUDA graphs. MFU
counts ``6 N + 12 · L · T · d`` FLOPs per token (:mod:`companion.flops`) against the GPU's dense
bf16 peak. A profile of the fastest variant of ours splits a step's GPU time by kernel kind.

**Decoding**: greedy, batch 1, a 16-token prompt and 256 new tokens, fp32, on the same weights in
both libraries (a random ``GPT2LMHeadModel`` loaded into our ``GPT``); the tokens are compared.
Then the cached step against the uncached one (the whole sequence re-run for one token) at a
1,024-token prefix.
"""

from __future__ import annotations

import statistics
import time
import traceback
from collections.abc import Callable

import torch
import torch.nn.functional as F
from common import timed

from companion.config import ModelConfig
from companion.fast_generation import CompiledGenerator
from companion.flops import flops_per_token, mfu, peak_flops
from companion.generation import generate
from companion.utils import count_parameters

# (batch, seq) of a training step, and (prompt, new tokens, prefix of the cached-vs-uncached step)
GPU_SHAPES = {"train": (16, 1024), "decode": (16, 256, 1024)}
QUICK_SHAPES = {"train": (4, 64), "decode": (8, 24, 64)}


def model_config(device: torch.device, quick: bool, vocab_size: int) -> ModelConfig:
    """GPT-2 small; for ``quick``, a 2-layer, 128-wide stand-in with the same code paths."""
    if quick:
        return ModelConfig.preset("gpt2-small", vocab_size=512, d_model=128, n_layers=2, n_heads=4, max_len=128,
                                  dropout=0.0)
    return ModelConfig.preset("gpt2-small", vocab_size=vocab_size, dropout=0.0)


def hf_pair(config: ModelConfig, device: torch.device):
    """A random ``GPT2LMHeadModel`` of ``config``'s sizes and our ``GPT`` with its weights."""
    from gpt import hf_gpt2

    return hf_gpt2(config, device)


def _median_step(step: Callable[[], object], device: torch.device, warmup: int, repeats: int) -> tuple[float, float]:
    """(seconds per step, seconds of the first step, which includes any compilation).

    Steps run back to back, as in a training loop, synchronised only at the ends of a block of
    ``repeats`` steps: the median over 3 blocks.
    """
    first = timed(step, device)
    for _ in range(warmup):
        step()

    def block() -> None:
        for _ in range(repeats):
            step()

    return statistics.median(timed(block, device) for _ in range(3)) / repeats, first


# (name, fused AdamW, torch.compile): each variant adds one change to the one before
VARIANTS = [("eager, AdamW (foreach)", False, False), ("eager, fused AdamW", True, False),
            ("torch.compile (model + loss), fused AdamW", True, True),
            ("the same with mode='reduce-overhead' (CUDA graphs)", True, "reduce-overhead")]


def training_step(model: torch.nn.Module, hf: bool, device: torch.device, fused: bool, compiled: bool | str,
                  x: torch.Tensor, y: torch.Tensor) -> Callable[[], None]:
    """One training step of ``model`` on ``(x, y)``: bf16 autocast, loss, backward, AdamW."""
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4, fused=fused)

    def loss_fn(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        logits = model(x, use_cache=False).logits if hf else model(x)  # HF: no KV cache built in training
        return F.cross_entropy(logits.flatten(0, 1), y.flatten())

    # the loss inside the compiled function: the head's logits and the cross-entropy fuse
    loss = torch.compile(loss_fn, mode=compiled if isinstance(compiled, str) else None) if compiled else loss_fn

    def step() -> None:
        if compiled == "reduce-overhead":
            torch.compiler.cudagraph_mark_step_begin()  # the last step's graph outputs are no longer used
        with torch.autocast(device.type, dtype=torch.bfloat16):
            value = loss(x, y)
        value.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)

    return step


def profile_split(step: Callable[[], None], device: torch.device, steps: int = 3) -> tuple[list[list[str]], str]:
    """GPU time per step by kernel kind, and the top kernels, over ``steps`` steps under ``torch.profiler``."""
    from torch.profiler import ProfilerActivity, profile

    # attention first: cuDNN's attention kernels' names also hold "sm90"
    kinds = [("attention (cuDNN / flash / memory-efficient)", ("sdpa", "flash", "fmha", "attention", "efficient")),
             ("matrix multiplies (cuBLAS/CUTLASS)", ("gemm", "nvjet", "cutlass", "sm90", "sm80", "xmma", "ampere")),
             ("fused elementwise and norms (Triton)", ("triton",)),
             ("optimizer (fused AdamW)", ("adam",))]
    torch.cuda.synchronize(device)
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        start = time.perf_counter()
        for _ in range(steps):
            step()
        torch.cuda.synchronize(device)
        wall = (time.perf_counter() - start) / steps
    events = [e for e in prof.key_averages() if e.device_type == torch.autograd.DeviceType.CUDA]
    totals = {name: 0.0 for name, _ in kinds} | {"other kernels": 0.0}
    for e in events:
        kind = next((name for name, keys in kinds if any(k in e.key.lower() for k in keys)), "other kernels")
        totals[kind] += e.self_device_time_total / 1e6 / steps  # seconds per step
    idle = max(wall - sum(totals.values()), 0.0)
    rows = [[kind, f"{1e3 * t:.2f}", f"{t / wall:.0%}"] for kind, t in totals.items()]
    rows.append(["GPU idle (launches, syncs, host work)", f"{1e3 * idle:.2f}", f"{idle / wall:.0%}"])
    rows.append(["one step under the profiler (wall)", f"{1e3 * wall:.2f}", "100%"])
    top = sorted(events, key=lambda e: -e.self_device_time_total)[:8]
    lines = [f"{1e3 * e.self_device_time_total / 1e6 / steps:7.2f} ms/step  {e.key[:100]}" for e in top]
    return rows, "\n".join(lines)


def bench_training(device: torch.device, quick: bool) -> tuple[list[list[str]], dict[str, float], list[list[str]], str]:
    """The training table's rows, {variant: seconds per step} for both libraries, the profile's rows and top kernels."""
    batch, seq = QUICK_SHAPES["train"] if quick else GPU_SHAPES["train"]
    config = model_config(device, quick, vocab_size=50304)
    peak = peak_flops(device)
    rows, seconds_of, profile_rows, top = [], {}, [], ""
    for library in ("ours", "HF"):
        for name, fused, compiled in VARIANTS:
            if compiled == "reduce-overhead" and (library == "HF" or device.type != "cuda"):
                continue  # CUDA graphs: on a GPU, for ours
            torch.manual_seed(0)
            hf, ours = hf_pair(config, device)
            model = (ours if library == "ours" else hf).train()
            del hf, ours
            ids = torch.randint(0, config.vocab_size, (batch, seq + 1), device=device)
            step = training_step(model, library == "HF", device, fused, compiled, ids[:, :-1], ids[:, 1:])
            if device.type == "cuda":
                torch.cuda.reset_peak_memory_stats(device)
            try:
                seconds, first = _median_step(step, device, warmup=2, repeats=3 if quick else 10)
            except Exception as err:  # a variant that fails is reported, not fatal to the others
                traceback.print_exc()
                rows.append([f"{library}: {name}", f"failed: {type(err).__name__}", "-", "-", "-", "-"])
                continue
            memory = f"{torch.cuda.max_memory_allocated(device) / 1e9:.1f} GB" if device.type == "cuda" else "-"
            n_params = count_parameters(model)
            tokens = batch * seq / seconds
            util = f"{mfu(tokens, flops_per_token(n_params, config.n_layers, seq, config.d_model), peak):.1%}" \
                if peak else "-"
            seconds_of[f"{library}: {name}"] = seconds
            rows.append([f"{library}: {name}", f"{1e3 * seconds:.1f}", f"{tokens / 1e3:,.0f} k", util, memory,
                         f"{first:.0f} s"])
            if library == "ours" and compiled is True and device.type == "cuda":
                profile_rows, top = profile_split(step, device)
            del step, model
            if device.type == "cuda":
                torch.cuda.empty_cache()
    return rows, seconds_of, profile_rows, top


def bench_decoding(device: torch.device, quick: bool) -> list[list[str]]:
    """Rows of the decoding table: HF generate, ours eager, ours static + compiled; cached vs uncached."""
    prompt_len, new, prefix = QUICK_SHAPES["decode"] if quick else GPU_SHAPES["decode"]
    config = model_config(device, quick, vocab_size=50257)
    hf, ours = hf_pair(config, device)
    hf.eval(), ours.eval()
    torch.manual_seed(0)
    prompt = torch.randint(1, config.vocab_size, (1, prompt_len), device=device)

    def run_hf(**options) -> torch.Tensor:
        with torch.no_grad():
            return hf.generate(prompt, attention_mask=torch.ones_like(prompt), do_sample=False, max_new_tokens=new,
                               min_new_tokens=new, pad_token_id=0, **options)

    fast = CompiledGenerator(ours, 1, prefix)  # one compilation serves both measurements below
    graph = " + one recorded CUDA graph" if device.type == "cuda" else ""
    runs = {"HF generate (eager, its dynamic cache)": run_hf,
            "ours: generate (eager, KVCache)": lambda: generate(ours, prompt, new, temperature=0),
            f"ours: CompiledGenerator (StaticKVCache, torch.compile{graph})": lambda: fast.generate(prompt, new,
                                                                                                  temperature=0)}
    # like with like: Hugging Face's static cache, which its generate compiles by itself on a GPU
    runs["HF generate (static cache; compiled by transformers on a GPU)"] = lambda: run_hf(
        cache_implementation="static")
    if device.type == "cuda":  # PyTorch's own CUDA graphs ("CUDA graph trees") instead of ours
        trees = CompiledGenerator(ours, 1, prefix, mode="reduce-overhead")
        runs["ours: CompiledGenerator, torch.compile(mode='reduce-overhead')"] = lambda: trees.generate(
            prompt, new, temperature=0)
    reference = run_hf()
    rows, base = [], None
    for name, fn in runs.items():
        try:
            first = timed(fn, device)  # the compiled path compiles here
        except Exception as err:  # reported, not fatal to the other rows
            traceback.print_exc()
            rows.append([name, f"failed: {type(err).__name__}", "-", "-", "-"])
            continue
        same = torch.equal(fn(), reference)
        seconds = statistics.median(timed(fn, device) for _ in range(3 if quick else 5))
        base = base or seconds
        rows.append([name, f"{new / seconds:,.0f}", f"{base / seconds:.2f}x", "yes" if same else "NO",
                     f"{first:.1f} s"])

    # cached vs uncached at a long prefix: one compiled step after `prefix - 1` cached tokens,
    # against the whole `prefix`-token sequence re-run for the last position's logits
    long_ids = torch.randint(1, config.vocab_size, (1, prefix), device=device)
    fast.generate(long_ids[:, : prefix - 8], 8, temperature=0)  # fills slots 0 .. prefix - 2
    tok, pos = long_ids[:, -1:], torch.tensor([prefix - 1], device=device)

    def cached() -> None:
        with torch.no_grad():
            fast.step(tok, pos)

    def uncached() -> None:
        with torch.no_grad():
            ours.head(ours._hidden(long_ids, None, None, None, False)[:, -1:])

    t_cached = statistics.median(timed(cached, device) for _ in range(20))
    t_uncached = statistics.median(timed(uncached, device) for _ in range(5 if quick else 10))
    rows.append([f"one step at a {prefix}-token prefix: compiled cached step vs the whole sequence re-run",
                 f"{1e3 * t_cached:.2f} ms vs {1e3 * t_uncached:.2f} ms", f"{t_uncached / t_cached:.1f}x", "-", "-"])
    return rows
