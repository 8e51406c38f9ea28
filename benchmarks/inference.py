#!/usr/bin/env python3
"""Benchmark weight quantization and speculative decoding for generation (Chapter 15).

    python benchmarks/inference.py             # CPU-sized run (one thread; about two minutes)
    python benchmarks/inference.py --quick     # smaller, for a smoke test
    python benchmarks/inference.py --device cuda

One GPT-2-style model with random weights (the time of a matrix product does not depend on the
values): 4 layers of width 512, 8 heads, a 2,048-token vocabulary, tied embeddings, 13.8 M
parameters (55 MB in float32); the "small" preset with these overrides differs from the
chapter's timing model ("tiny" with the same overrides) only in its vocabulary (2,048 here, 82 there). Two tables,
each a ratio to a reference measured in the same run (the median of interleaved rounds, so that
load on a shared machine hits both sides alike):

1. Greedy decoding, batch 1, 64 new tokens after a 16-token prompt, with the KV cache: float32
   against companion's int8 and int4 (groups of 32) ``QuantLinear`` layers and torchao's
   ``Int8WeightOnlyConfig``, with the bytes of each model. Our layers dequantize the whole weight
   (convert, then multiply by the scales) before every product, a teaching implementation;
   torchao's weight-only layer converts the int8 weight and applies the scales to the output,
   one pass over the weight fewer. Both allocate a float copy of every weight at every call, so
   their speed depends on how the C library serves those allocations: glibc hands out blocks
   above its mmap threshold as fresh pages (a page fault and zeroing for every 4 kB, every call)
   and reuses blocks below it. The threshold adapts to what the process has freed before, so the
   same loop ran torchao's int8 at about 0.7x float32 in a fresh process and about 1.3x in one
   that had freed large blocks (the chapter's notebook). The table is therefore measured twice:
   with the defaults, then after ``mallopt`` raises the mmap and trim thresholds so that large
   blocks are reused (glibc only). The agreement column is teacher-forced: the share of positions
   of float32's greedy continuation at which the variant's top-1 token equals float32's (with
   random weights the logits are close to ties, so it is no measure of quality; the chapter
   measures that on trained and pre-trained models).
2. Speculative decoding (``companion.inference.speculative_generate``, k = 4, greedy) against plain
   greedy decoding of the same target, same tokens checked. With random weights a small draft
   would almost never agree with the target, so the acceptance rate would say nothing; two drafts
   that agree are used instead, each measuring one thing:

   * **draft = the target itself**: every proposal is accepted, but the draft costs as much as the
     target, so the ratio measures the machinery's overhead (k draft steps and one verification
     pass of k + 1 positions for k + 1 tokens, against k + 1 plain steps).
   * **draft = the target's first block**: the target's blocks 2-4 have their output projections
     (``out_proj``, ``w2``) and biases set to zero, so they add exactly nothing to the residual
     stream but still cost their full time (dense products of zeros take as long as any others);
     the 1-block draft then computes the target's logits exactly, every proposal is accepted, and
     the ratio is the speed-up of a draft a quarter of the target's cost at 100% acceptance: an
     upper bound for such a draft; a real draft, which is sometimes rejected, gains less.

There are no targets: every row is information ("-"). Exit status 0; 1 when speculative decoding
does not reproduce the plain greedy tokens (a bug, not a result).
"""

from __future__ import annotations

import argparse
import copy
import ctypes
import logging
import sys

import torch
from common import compare, table

from companion.config import ModelConfig
from companion.generation import generate
from companion.inference import model_bytes, quantize_model, speculative_generate
from companion.models.gpt import GPT
from companion.utils import count_parameters, get_device, seed_everything

SHAPES = {"d_model": 512, "n_heads": 8, "n_layers": 4}
QUICK_SHAPES = {"d_model": 128, "n_heads": 4, "n_layers": 4}
VOCAB, PROMPT = 2048, 16


def stored_bytes(model: torch.nn.Module) -> int:
    """:func:`model_bytes`, counting a torchao weight as its int8 data and its scales."""
    total = 0
    for t in {id(t): t for t in (*model.parameters(), *model.buffers())}.values():
        if type(t) not in (torch.Tensor, torch.nn.Parameter) and not hasattr(t, "qdata"):
            raise TypeError(f"unknown quantized tensor {type(t).__name__}: cannot count its bytes")
        parts = (t.qdata, t.scale) if hasattr(t, "qdata") else (t,)
        total += sum(p.numel() * p.element_size() for p in parts)
    return total


def torchao_int8(model: GPT) -> GPT | None:
    """A copy of ``model`` with torchao's int8 weight-only layers (the head kept float), or None without torchao."""
    logging.getLogger("torchao").setLevel(logging.ERROR)
    logging.getLogger("torch.utils._pytree").setLevel(logging.ERROR)
    try:
        from torchao.quantization import Int8WeightOnlyConfig, quantize_
    except ImportError:
        return None
    model = copy.deepcopy(model)
    quantize_(model, Int8WeightOnlyConfig(set_inductor_config=False),
              filter_fn=lambda module, name: type(module) is torch.nn.Linear and name != "head")
    return model


def reuse_large_blocks() -> bool:
    """Ask glibc to serve blocks up to 256 MB from its heap (reused) instead of fresh mmap pages; False elsewhere."""
    try:
        libc = ctypes.CDLL("libc.so.6")
    except OSError:
        return False
    m_trim_threshold, m_mmap_threshold = -1, -3  # mallopt parameters of glibc's malloc.h
    return bool(libc.mallopt(m_mmap_threshold, 256 * 2**20)) and bool(libc.mallopt(m_trim_threshold, 2**30))


def bench_quantization(model: GPT, prompt: torch.Tensor, new: int, device: torch.device, repeats: int,
                       suffix: str = ""):
    variants = {"float32": model, "companion int8 (per row)": quantize_model(model, 8),
                "companion int4 (groups of 32)": quantize_model(model, 4, 32)}
    ao = torchao_int8(model)
    if ao is not None:
        variants["torchao int8 weight-only"] = ao
    fns = {name: (lambda m=m: generate(m, prompt, new, temperature=0)) for name, m in variants.items()}
    seconds = compare(fns, device, repeats)
    reference = generate(model, prompt, new, temperature=0)
    with torch.no_grad():
        top1 = model(reference)[:, PROMPT - 1:-1].argmax(-1)
    rows = []
    for name, m in variants.items():
        with torch.no_grad():  # teacher-forced: the same input at every position, top-1 compared
            agree = (m(reference)[:, PROMPT - 1:-1].argmax(-1) == top1).float().mean().item()
        rows.append([name + suffix, f"{stored_bytes(m) / 1e6:.1f}", f"{stored_bytes(m) / stored_bytes(model):.2f}x",
                     f"{new / seconds[name]:,.0f}", f"{seconds['float32'] / seconds[name]:.2f}x", f"{agree:.0%}", "-"])
    if ao is None:
        rows.append(["torchao int8 weight-only", "-", "-", "-", "-", "-", "(torchao not installed)"])
    return rows


def first_block_draft(target: GPT) -> tuple[GPT, GPT]:
    """(target with blocks 2+ silenced, a 1-block draft with the target's first block): the same logits."""
    target = copy.deepcopy(target)
    with torch.no_grad():
        for block in target.layers[1:]:
            for linear in (block.self_attn.out_proj, block.ffn.w2):
                linear.weight.zero_()
                if linear.bias is not None:
                    linear.bias.zero_()
    draft = GPT(target.config.replace(n_layers=1)).to(next(target.parameters()).device)
    draft.load_state_dict({k: v for k, v in target.state_dict().items() if ".layers." not in k
                           or ".layers.0." in k})
    return target.eval(), draft.eval()


def bench_speculative(model: GPT, prompt: torch.Tensor, new: int, device: torch.device, repeats: int):
    rows, ok = [], True
    silenced, small = first_block_draft(model)
    for label, target, draft in (("draft = the target (overhead at 100% acceptance)", model, model),
                                 ("draft = the target's first block (1/4 of the cost, 100% acceptance)",
                                  silenced, small)):
        plain = generate(target, prompt, new, temperature=0)
        spec, stats = speculative_generate(target, draft, prompt, new, k=4, temperature=0)
        same = torch.equal(plain, spec)
        ok &= same
        seconds = compare({"plain": lambda t=target: generate(t, prompt, new, temperature=0),
                           "speculative": lambda t=target, d=draft: speculative_generate(t, d, prompt, new, k=4,
                                                                                         temperature=0)},
                          device, repeats)
        rows.append([label, f"{new / seconds['plain']:,.0f}", f"{new / seconds['speculative']:,.0f}",
                     f"{seconds['plain'] / seconds['speculative']:.2f}x", f"{stats.acceptance_rate:.0%}",
                     "yes" if same else "NO"])
    return rows, ok


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--device", default="cpu", help="cpu (default), cuda or mps")
    parser.add_argument("--quick", action="store_true", help="smaller shapes, for a smoke test")
    args = parser.parse_args()
    seed_everything(0)
    device = get_device(args.device)
    if device.type == "cpu":
        torch.set_num_threads(1)  # decode at batch 1: small products, threads only contend
    print(f"torch {torch.__version__}, device {device}, threads {torch.get_num_threads()}")
    shapes = QUICK_SHAPES if args.quick else SHAPES
    config = ModelConfig.preset("small", vocab_size=VOCAB, max_len=256, **shapes)
    model = GPT(config).to(device).eval()
    prompt = torch.randint(VOCAB, (1, PROMPT), generator=torch.Generator().manual_seed(0)).to(device)
    new, repeats = (16, 3) if args.quick else (64, 7)
    print(f"\nmodel: {config.n_layers} layers of width {config.d_model}, {config.n_heads} heads, vocab {VOCAB}, "
          f"{count_parameters(model):,} parameters, {model_bytes(model) / 1e6:.1f} MB in float32; random weights")
    table(f"Greedy decoding, batch 1, {new} new tokens after {PROMPT} ({device.type}): each variant against float32 "
          f"in the same run (median of {repeats} interleaved rounds)",
          ["weights", "MB", "bytes vs float32", "tokens/s", "speed vs float32", "top-1 as float32 (teacher-forced)",
           "status"], bench_quantization(model, prompt, new, device, repeats))
    if device.type == "cpu" and reuse_large_blocks():
        table("The same, after mallopt lets glibc reuse large blocks (no fresh pages for the float copies)",
              ["weights", "MB", "bytes vs float32", "tokens/s", "speed vs float32", "top-1 as float32 (teacher-forced)",
               "status"], bench_quantization(model, prompt, new, device, repeats, " (large blocks reused)"))
    rows, ok = bench_speculative(model, prompt, new, device, repeats)
    table(f"Speculative decoding (k = 4, greedy) against plain greedy decoding of the same target, {new} new tokens "
          f"({device.type}; median of {repeats} interleaved rounds)",
          ["draft", "plain tokens/s", "speculative tokens/s", "ratio", "acceptance", "same tokens"], rows)
    if not ok:
        print("\nSpeculative decoding changed the greedy tokens: a bug, not a result.", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
