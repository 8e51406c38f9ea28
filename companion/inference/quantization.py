"""Weight quantization: int8 and group-wise int4 weights for ``nn.Linear``.

Generating one token reads every weight of the model once and does only two flops per weight
read, so decoding is limited by memory, not arithmetic: smaller weights mean faster tokens and
bigger models per GPU. Weight-only quantization stores each weight matrix ``W`` of shape
``(out_features, in_features)`` as small integers ``Q`` and a few floating-point scales ``s``,
and multiplies by ``Ŵ = s · Q`` instead of ``W``; activations stay in floating point.

**int8, per output channel** (absmax, as in LLM.int8(), Dettmers et al., 2022). Each row ``i``
gets its own scale, so one large row does not coarsen the others::

    s_i = max_j |W_ij| / 127        Q_ij = clamp(round(W_ij / s_i), −127, 127)        Ŵ_ij = s_i · Q_ij

Rounding to the nearest integer makes ``|W_ij − Ŵ_ij| ≤ s_i / 2``: half a quantization step.
The grid is symmetric, ``[−127, 127]``: zero is exact, ``−W`` quantizes to ``−Q``, and the largest
weight of each row is represented exactly. (torchao's ``Int8WeightOnlyConfig`` uses the whole
range ``[−128, 127]`` with ``s_i = max_j |W_ij| / 127.5`` instead; the two agree to within one
step, see ``tests/test_quantization.py``.)

**int4, per group** (round-to-nearest as in the baselines of GPTQ, Frantar et al., 2023, and
Dettmers & Zettlemoyer, 2023). Fifteen levels are too few for a whole row, so each row is cut into
groups of ``group_size`` consecutive input columns, each with its own scale ``max|W| / 7``, and
the integers lie in ``[−7, 7]``. The code −8 that 4 bits also hold is left unused: with it the
grid would be lopsided (the scale ``max|W| / 8`` cannot represent ``+max|W|``), and keeping
``[−7, 7]`` keeps zero exact and the error bound ``s / 2`` the same for both signs. Two 4-bit
values are packed in one byte. Smaller groups follow the weights more closely and cost more
scales: ``4 + 32 / group_size`` bits per weight with float32 scales.

:class:`QuantLinear` stores the integers and scales and, in :meth:`~QuantLinear.forward`,
dequantizes the weight and calls ``F.linear``. That teaches the numbers but not the speed: it
saves memory at rest, while real kernels (Marlin, torchao's, llama.cpp's) fuse the dequantization
into the matrix multiplication, so the full-precision weight never exists in memory::

    layer = QuantLinear.from_linear(nn.Linear(4096, 4096, bias=False), bits=4, group_size=128)
    layer.nbytes                              # 8,912,896: 4.25 bits a weight; float32 needs 67,108,864
    small = quantize_model(model, bits=8)     # a copy with int8 linear layers; model is unchanged
    model_bytes(small), model_bytes(model)    # tiny GPT (vocab_size=64): 134,656 vs 424,960 bytes
"""

from __future__ import annotations

import copy

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from companion._validation import check_int, tracing

__all__ = ["BITS", "quantize_int8", "dequantize_int8", "pack_int4", "unpack_int4", "quantize_int4", "dequantize_int4",
           "QuantLinear", "quantize_model", "model_bytes"]

BITS = (8, 4)


def _check_weight(weight: object) -> Tensor:
    if not isinstance(weight, Tensor) or not weight.is_floating_point():
        got = weight.dtype if isinstance(weight, Tensor) else type(weight).__name__
        raise TypeError(f"weight must be a floating-point torch.Tensor, got {got}")
    if weight.dim() != 2:
        raise ValueError(f"weight must have shape (out_features, in_features), got {tuple(weight.shape)}")
    return weight


def _check_bits(bits: object) -> int:
    if isinstance(bits, bool) or not isinstance(bits, int) or bits not in BITS:
        raise ValueError(f"bits must be one of {BITS}, got {bits!r}")
    return bits  # type: ignore[return-value]


def _check_group_size(group_size: object, in_features: int | None = None) -> int:
    if isinstance(group_size, bool) or not isinstance(group_size, int) or group_size < 2 or group_size % 2:
        raise ValueError(f"group_size must be an even int >= 2 (two 4-bit values per byte), got {group_size!r}")
    if in_features is not None and in_features % group_size:
        raise ValueError(f"group_size must divide in_features, got group_size={group_size}, in_features={in_features}")
    return group_size


def _absmax_scale(weight: Tensor, qmax: int) -> Tensor:
    # max|w| / qmax over the last dim, in float32; an all-zero row (or group) gets scale 1 (any scale gives Q = 0)
    amax = weight.float().abs().amax(-1)
    return torch.where(amax > 0, amax / qmax, torch.ones_like(amax))


# ----------------------------------------------------------------------------- int8


def quantize_int8(weight: Tensor) -> tuple[Tensor, Tensor]:
    """Symmetric per-output-channel absmax int8: ``weight`` ``(out_features, in_features)`` -> ``(q, scale)``.

    ``scale`` is float32 ``(out_features,)``, ``max_j |weight_ij| / 127`` (1 for an all-zero row);
    ``q`` is int8 ``(out_features, in_features)``, ``round(weight / scale)`` in ``[−127, 127]``.
    """
    weight = _check_weight(weight)
    scale = _absmax_scale(weight, 127)
    q = torch.round(weight.float() / scale[:, None]).clamp(-127, 127).to(torch.int8)
    return q, scale


def dequantize_int8(q: Tensor, scale: Tensor, dtype: torch.dtype | None = None) -> Tensor:
    """``scale_i · q_ij``: the weight ``(out_features, in_features)`` in ``dtype`` (default ``scale``'s)."""
    if not isinstance(q, Tensor) or q.dtype != torch.int8 or q.dim() != 2:
        raise ValueError(f"q must be an int8 tensor (out_features, in_features), got {_describe(q)}")
    if not isinstance(scale, Tensor) or tuple(scale.shape) != (q.shape[0],):
        raise ValueError(f"scale must have shape (out_features,) = ({q.shape[0]},), got {_describe(scale)}")
    return (q.to(scale.dtype) * scale[:, None]).to(dtype or scale.dtype)


# ----------------------------------------------------------------------------- int4


def pack_int4(q: Tensor) -> Tensor:
    """Pack integers in ``[−8, 7]`` two per byte: ``(..., 2·k)`` -> uint8 ``(..., k)``.

    Each value is stored as the 4-bit unsigned ``q + 8`` (offset binary); byte ``j`` holds column
    ``2j`` in its low nibble and column ``2j + 1`` in its high nibble.
    """
    if not isinstance(q, Tensor) or q.is_floating_point() or q.dtype == torch.bool or q.dim() < 1 or q.shape[-1] % 2:
        raise ValueError(f"q must be an integer tensor (..., 2·k) with an even last dim, got {_describe(q)}")
    if q.numel() and not tracing() and (int(q.min()) < -8 or int(q.max()) > 7):
        raise ValueError(f"q must lie in [-8, 7], got min {int(q.min())}, max {int(q.max())}")
    nibbles = (q + 8).to(torch.uint8)
    return nibbles[..., 0::2] | (nibbles[..., 1::2] << 4)


def unpack_int4(packed: Tensor) -> Tensor:
    """The inverse of :func:`pack_int4`: uint8 ``(..., k)`` -> int8 ``(..., 2·k)`` in ``[−8, 7]``."""
    if not isinstance(packed, Tensor) or packed.dtype != torch.uint8:
        raise ValueError(f"packed must be a uint8 tensor, got {_describe(packed)}")
    low, high = packed & 0x0F, packed >> 4
    return torch.stack([low, high], dim=-1).flatten(-2).to(torch.int8) - 8


def quantize_int4(weight: Tensor, group_size: int = 64) -> tuple[Tensor, Tensor]:
    """Group-wise symmetric int4: ``weight`` ``(out_features, in_features)`` -> ``(packed, scale)``.

    Each row is cut into ``in_features / group_size`` groups of consecutive columns; group ``g``
    of row ``i`` gets ``scale[i, g] = max |weight| / 7`` over the group (1 if it is all zero) and
    integers ``round(weight / scale)`` in ``[−7, 7]``. ``packed`` is uint8
    ``(out_features, in_features / 2)`` (:func:`pack_int4`), ``scale`` float32
    ``(out_features, in_features / group_size)``.
    """
    weight = _check_weight(weight)
    out_features, in_features = weight.shape
    _check_group_size(group_size, in_features)
    groups = weight.float().reshape(out_features, in_features // group_size, group_size)
    scale = _absmax_scale(groups, 7)
    q = torch.round(groups / scale[..., None]).clamp(-7, 7).to(torch.int8)
    return pack_int4(q.reshape(out_features, in_features)), scale


def dequantize_int4(packed: Tensor, scale: Tensor, group_size: int, in_features: int,
                    dtype: torch.dtype | None = None) -> Tensor:
    """The weight ``(out_features, in_features)`` back from :func:`quantize_int4`, in ``dtype`` (default scale's)."""
    check_int("in_features", in_features, 2)
    _check_group_size(group_size, in_features)
    if not isinstance(packed, Tensor) or packed.dim() != 2 or packed.shape[1] * 2 != in_features:
        raise ValueError(f"packed must have shape (out_features, in_features / 2 = {in_features // 2}), "
                         f"got {_describe(packed)}")
    expected = (packed.shape[0], in_features // group_size)
    if not isinstance(scale, Tensor) or tuple(scale.shape) != expected:
        raise ValueError(f"scale must have shape (out_features, in_features / group_size) = {expected}, "
                         f"got {_describe(scale)}")
    q = unpack_int4(packed).reshape(*expected, group_size)
    return (q.to(scale.dtype) * scale[..., None]).reshape(packed.shape[0], in_features).to(dtype or scale.dtype)


def _describe(x: object) -> str:
    return f"shape {tuple(x.shape)}, dtype {x.dtype}" if isinstance(x, Tensor) else type(x).__name__


# ----------------------------------------------------------------------------- the layer


class QuantLinear(nn.Module):
    """A linear layer whose weight is stored as int8 (per row) or int4 (per group) with float scales.

    A teaching implementation: :meth:`forward` dequantizes the whole weight to the input's dtype
    and calls ``F.linear``, so memory is saved at rest but not during the call. Real kernels fuse
    the dequantization into the matrix multiplication and read only the small integers.

    Buffers: ``qweight`` — int8 ``(out_features, in_features)`` for ``bits=8``, uint8
    ``(out_features, in_features / 2)`` (two values a byte) for ``bits=4``; ``scale`` — float32
    ``(out_features,)`` or ``(out_features, in_features / group_size)``. ``bias`` stays a float
    ``Parameter`` (or None). Like any floating buffer the scales follow ``.to(dtype)``.
    Build one from a trained layer with :meth:`from_linear`; the constructor makes an empty
    (all-zero) layer of the right shapes, for ``load_state_dict``.

    Args:
        in_features, out_features: as ``nn.Linear``.
        bias: keep a bias.
        bits: 8 or 4.
        group_size: input columns per scale for ``bits=4`` (even, dividing ``in_features``);
            ignored for ``bits=8``.
    """

    def __init__(self, in_features: int, out_features: int, bias: bool = True, *, bits: int = 8,
                 group_size: int = 64, device: torch.device | str | None = None,
                 dtype: torch.dtype | None = None) -> None:
        super().__init__()
        self.in_features = check_int("in_features", in_features)
        self.out_features = check_int("out_features", out_features)
        self.bits = _check_bits(bits)
        self.group_size = _check_group_size(group_size, in_features) if bits == 4 else None
        if bits == 8:
            qweight = torch.zeros(out_features, in_features, dtype=torch.int8, device=device)
            scale = torch.ones(out_features, device=device)
        else:
            qweight = torch.zeros(out_features, in_features // 2, dtype=torch.uint8, device=device)
            scale = torch.ones(out_features, in_features // group_size, device=device)
        self.register_buffer("qweight", qweight)
        self.register_buffer("scale", scale)
        self.bias = nn.Parameter(torch.zeros(out_features, device=device, dtype=dtype)) if bias else None

    @classmethod
    def from_linear(cls, linear: nn.Linear, bits: int = 8, group_size: int = 64) -> QuantLinear:
        """``linear`` with its weight quantized (its bias copied), on its device."""
        if not isinstance(linear, nn.Linear):
            raise TypeError(f"linear must be a torch.nn.Linear, got {type(linear).__name__}")
        weight = linear.weight.detach()
        layer = cls(linear.in_features, linear.out_features, linear.bias is not None, bits=bits,
                    group_size=group_size, device=weight.device,
                    dtype=linear.bias.dtype if linear.bias is not None else None)
        q, scale = quantize_int8(weight) if bits == 8 else quantize_int4(weight, group_size)
        layer.qweight.copy_(q)
        layer.scale.copy_(scale)
        if linear.bias is not None:
            layer.bias.data.copy_(linear.bias.detach())
        return layer

    def dequantized_weight(self, dtype: torch.dtype | None = None) -> Tensor:
        """``Ŵ = s · Q``, ``(out_features, in_features)``, in ``dtype`` (default the scales' dtype)."""
        if self.bits == 8:
            return dequantize_int8(self.qweight, self.scale, dtype)
        return dequantize_int4(self.qweight, self.scale, self.group_size, self.in_features, dtype)

    @property
    def weight(self) -> Tensor:
        """The dequantized weight, for code that reads ``layer.weight`` (cross-attention splits it)."""
        return self.dequantized_weight()

    @property
    def nbytes(self) -> int:
        """Exact bytes stored: integer weights + scales (+ bias)."""
        tensors = [self.qweight, self.scale] + ([self.bias] if self.bias is not None else [])
        return sum(t.numel() * t.element_size() for t in tensors)

    def forward(self, x: Tensor) -> Tensor:
        """``x Ŵᵀ + b`` for ``x`` ``(..., in_features)``, in ``x``'s dtype (weight and bias are cast to it)."""
        bias = self.bias.to(x.dtype) if self.bias is not None else None
        return F.linear(x, self.dequantized_weight(x.dtype), bias)

    def extra_repr(self) -> str:
        group = f", group_size={self.group_size}" if self.bits == 4 else ""
        return (f"in_features={self.in_features}, out_features={self.out_features}, bias={self.bias is not None}, "
                f"bits={self.bits}{group}")


# ----------------------------------------------------------------------------- whole models


def quantize_model(model: nn.Module, bits: int = 8, group_size: int = 64, *,
                   skip: tuple[str, ...] = ("head", "lm_head")) -> nn.Module:
    """A copy of ``model`` with its ``nn.Linear`` layers replaced by :class:`QuantLinear`; ``model`` is unchanged.

    Left in floating point:

    * layers named in ``skip``: an entry matches a layer's qualified name or its last parts
      (``"head"`` matches ``"head"`` and ``"gpt.head"``). By default the output heads — the LM
      head (companion's ``head``, Hugging Face's ``lm_head``) is commonly kept in full precision;
    * layers whose weight is shared with another module — a GPT with ``tie_embeddings`` has a
      ``head`` whose weight *is* the token embedding. Quantizing it would store a second, int copy
      next to the float embedding the lookup still needs: more bytes, not fewer;
    * subclasses of ``nn.Linear`` (e.g. the ``out_proj`` of ``nn.MultiheadAttention``, whose
      weight is read directly, not through its ``forward``).

    Embeddings and norms are never quantized. A layer whose ``in_features`` ``group_size`` does
    not divide raises a ``ValueError`` naming it (pass it in ``skip`` to keep it float).
    """
    _check_bits(bits)
    if bits == 4:
        _check_group_size(group_size)
    if isinstance(skip, str) or not all(isinstance(s, str) for s in skip):
        raise ValueError(f"skip must be a tuple of layer names, got {skip!r}")
    model = copy.deepcopy(model)  # keeps tied parameters tied in the copy
    owners: dict[int, int] = {}
    for module in model.modules():
        for p in module.parameters(recurse=False):
            owners[id(p)] = owners.get(id(p), 0) + 1
    targets = [(name, module) for name, module in model.named_modules()
               if type(module) is nn.Linear and owners[id(module.weight)] == 1
               and not any(name == s or name.endswith("." + s) for s in skip)]
    for name, linear in targets:
        if bits == 4 and linear.in_features % group_size:
            raise ValueError(f"group_size must divide in_features of every quantized layer, got group_size="
                             f"{group_size} for {name!r} with in_features={linear.in_features} (skip it to keep it)")
        parent_name, _, child = name.rpartition(".")
        parent = model.get_submodule(parent_name)
        setattr(parent, child, QuantLinear.from_linear(linear, bits, group_size))
    return model


def model_bytes(model: nn.Module) -> int:
    """Bytes of ``model``'s parameters and buffers, each shared tensor counted once."""
    tensors = {id(t): t for t in (*model.parameters(), *model.buffers())}
    return sum(t.numel() * t.element_size() for t in tensors.values())
