"""Fast decoding: a static KV cache and a compiled one-token step (the recipe of PyTorch's gpt-fast).

A cached decoding step of a small model is mostly fixed cost: the Python of a dozen modules and a
few hundred kernel launches of a few microseconds each, around little arithmetic (Chapter 11 and
Appendix B measure it). Two tools remove them. ``torch.compile`` traces the step once and fuses
its operations into fewer kernels; a **CUDA graph** records the kernels a step launches, once, and
the GPU then replays the whole recording with a single launch from the CPU. Both need a step whose
shapes and memory addresses never change, which :class:`~companion.attention.StaticKVCache`
provides: each step writes its keys and values at a position given as a tensor and attends over
every slot through a mask.

::

    fast = CompiledGenerator(model, batch_size=1, max_len=272)
    out = fast.generate(prompt, 256, temperature=0)   # the first call compiles (tens of seconds)
    out = fast.generate(prompt, 256, temperature=0)   # later calls reuse the compiled step

The prompt runs once, in eager mode (its length varies from call to call), filling the cache;
each new token is then one call of the compiled step. The tokens are those of
:func:`companion.generation.generate` (greedy decoding and seeded sampling, up to rounding: the
tests compare them on CPU).
"""

from __future__ import annotations

import torch
from torch import Tensor

from companion._validation import check_int
from companion.generation import _check_sampling, _EvalMode, sampling_probs
from companion.models.gpt import GPT, check_ids

__all__ = ["CompiledGenerator"]


class CompiledGenerator:
    """Generate from a :class:`~companion.models.gpt.GPT` with a static KV cache and a compiled step.

    Args:
        model: the decoder (any position scheme but ALiBi and T5's buckets, whose score bias is
            built for the filled length); it is put in eval mode during :meth:`generate`.
        batch_size: prompts decoded together (of equal length).
        max_len: room for prompt + new tokens; default ``model.config.max_len``.
        compile: compile the step with ``torch.compile`` (False: the same step in eager mode,
            for comparison).
        mode: ``torch.compile``'s mode. ``"reduce-overhead"`` lets PyTorch record CUDA graphs
            itself (its "CUDA graph trees"); the default records one graph here instead.
        cuda_graph: record the step as one ``torch.cuda.CUDAGraph`` and replay it at every step
            (default: on a CUDA device, unless ``mode="reduce-overhead"`` does it).

    Attributes:
        cache: the :class:`~companion.attention.StaticKVCache`, on the model's device and dtype.
    """

    def __init__(self, model: GPT, batch_size: int = 1, max_len: int | None = None, *, compile: bool = True,
                 mode: str | None = None, cuda_graph: bool | None = None) -> None:
        if not isinstance(model, GPT):
            raise TypeError(f"model must be a companion GPT, got {type(model).__name__}")
        check_int("batch_size", batch_size)
        max_len = model.config.max_len if max_len is None else check_int("max_len", max_len)
        if model.config.position in ("alibi", "t5"):
            raise ValueError(f"model.config.position must not be 'alibi' or 't5' (a score bias built for the filled "
                             f"length), got {model.config.position!r}: use companion.generation.generate")
        if model.config.position == "learned" and max_len > model.config.max_len:
            raise ValueError(f"max_len must be <= the model's max_len={model.config.max_len} learned positions, "
                             f"got {max_len}")
        device = model.tok_emb.weight.device
        if cuda_graph is None:
            cuda_graph = device.type == "cuda" and mode != "reduce-overhead"
        if cuda_graph and device.type != "cuda":
            raise ValueError(f"cuda_graph=True needs the model on a CUDA device, got {device.type!r}")
        self.model = model
        self.cache = model.make_cache(batch_size, max_len, static=True)
        self._fn = torch.compile(self._step, mode=mode, fullgraph=True, dynamic=False) if compile else self._step
        self._graph: torch.cuda.CUDAGraph | None = None
        self._cuda_graph = cuda_graph

    def _step(self, ids: Tensor, positions: Tensor) -> Tensor:
        # the model without its input checks (made once in generate), logits of the last position
        return self.model.head(self.model._hidden(ids, None, self.cache, positions, False))[:, -1]

    def _capture(self) -> None:
        """Record one step as a CUDA graph: later steps copy their inputs in and replay it with one launch."""
        batch = self.cache.keys[0].shape[0]
        device = self.cache.keys[0].device
        self._ids = torch.zeros(batch, 1, dtype=torch.long, device=device)
        self._positions = torch.zeros(1, dtype=torch.long, device=device)  # slot 0: the next prompt overwrites it
        side = torch.cuda.Stream(device)
        side.wait_stream(torch.cuda.current_stream(device))
        with torch.cuda.stream(side), torch.no_grad():
            for _ in range(3):  # compile (if compiling) and warm up outside the recording
                self._fn(self._ids, self._positions)
        torch.cuda.current_stream(device).wait_stream(side)
        self._graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(self._graph), torch.no_grad():
            self._logits = self._fn(self._ids, self._positions)

    def step(self, ids: Tensor, positions: Tensor) -> Tensor:
        """Logits ``(batch, vocab_size)`` of the token after ``ids`` ``(batch, 1)`` at ``positions`` ``(1,)``.

        Writes the token's keys and values into the cache. With a CUDA graph the returned tensor
        is the graph's output buffer, overwritten by the next step: read it before then.
        """
        if not self._cuda_graph:
            return self._fn(ids, positions)
        if self._graph is None:  # recording runs the step at slot 0: a cache being used would lose it
            raise RuntimeError("the CUDA graph is recorded by generate(); call it once before step()")
        self._ids.copy_(ids)
        self._positions.copy_(positions)
        self._graph.replay()
        return self._logits

    def generate(self, ids: Tensor, max_new_tokens: int, *, temperature: float = 1.0, top_k: int | None = None,
                 top_p: float | None = None, generator: torch.Generator | None = None) -> Tensor:
        """Continue each prompt of ``ids`` ``(batch_size, prompt_len)`` by ``max_new_tokens`` tokens.

        Arguments as :func:`companion.generation.generate` (``temperature=0``: greedy); no
        ``eos_id``, since stopping early would read the tokens on the host at every step.

        Returns:
            ``(batch_size, prompt_len + max_new_tokens)`` ids, prompts included.
        """
        check_ids("ids", ids, self.model.config.vocab_size)
        check_int("max_new_tokens", max_new_tokens, 1)
        _check_sampling(temperature, top_k, top_p)
        batch = self.cache.keys[0].shape[0]
        if ids.shape[0] != batch:
            raise ValueError(f"ids must hold batch_size={batch} prompts, got {ids.shape[0]}")
        total = ids.shape[1] + max_new_tokens
        if total > self.cache.max_len:
            raise ValueError(f"prompt_len + max_new_tokens = {total} exceeds the cache's max_len={self.cache.max_len}")
        positions = torch.arange(total, device=ids.device)
        tokens = [ids]
        # no_grad rather than inference mode: the compiled step writes the cache, made outside it
        with _EvalMode(self.model, inference=False):
            if self._cuda_graph and self._graph is None:
                self._capture()  # before the prompt: recording writes slot 0, which the prompt then fills
            logits = self.model.head(self.model._hidden(ids, None, self.cache, positions[: ids.shape[1]], False))[:, -1]
            for t in range(ids.shape[1], total):
                if temperature == 0:
                    nxt = logits.argmax(-1, keepdim=True)
                else:
                    nxt = torch.multinomial(sampling_probs(logits, temperature, top_k, top_p), 1, generator=generator)
                tokens.append(nxt)
                if t + 1 < total:
                    # a CUDA graph's output is overwritten by its next replay: it was read into nxt above
                    logits = self.step(nxt, positions[t : t + 1])
        return torch.cat(tokens, dim=1)
