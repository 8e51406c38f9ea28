"""Input checks shared by the attention functions: bad input is reported by name, with shapes."""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import Tensor

from companion._validation import check_int

__all__ = ["check_tensor", "broadcasts_to", "check_mask_and_bias", "check_qkv", "check_probability", "check_scale",
           "check_length"]


def check_tensor(name: str, x: object, min_dim: int = 0, floating: bool = True) -> Tensor:
    """``x`` if it is a tensor (floating-point unless ``floating=False``) with ``>= min_dim`` dims."""
    if not isinstance(x, Tensor):
        raise TypeError(f"{name} must be a torch.Tensor, got {type(x).__name__}")
    if floating and not x.is_floating_point():
        raise TypeError(f"{name} must be a floating-point tensor, got dtype {x.dtype}")
    if x.dim() < min_dim:
        raise ValueError(f"{name} must have at least {min_dim} dimensions, got shape {tuple(x.shape)}")
    return x


def broadcasts_to(shape: Sequence[int], target: Sequence[int]) -> bool:
    """True when a tensor of ``shape`` broadcasts to exactly ``target`` (without enlarging it)."""
    if len(shape) > len(target):
        return False
    return all(s == 1 or s == t for s, t in zip(reversed(shape), reversed(target)))


def check_mask_and_bias(mask: Tensor | None, bias: Tensor | None, scores_shape: Sequence[int]) -> None:
    """``mask`` (bool) and ``bias`` (float) must broadcast to the scores ``(batch, heads, q_len, k_len)``."""
    target = tuple(scores_shape)
    if mask is not None:
        if not isinstance(mask, Tensor):
            raise TypeError(f"mask must be a bool torch.Tensor or None, got {type(mask).__name__}")
        if mask.dtype != torch.bool:
            raise ValueError(
                f"mask must be a bool tensor (True = may attend), got dtype {mask.dtype}; "
                "for an additive float mask pass it as bias="
            )
        if not broadcasts_to(mask.shape, target):
            raise ValueError(
                f"mask of shape {tuple(mask.shape)} does not broadcast to the attention scores of shape "
                f"{target} (batch, heads, q_len, k_len)"
            )
    if bias is not None:
        if not isinstance(bias, Tensor) or not bias.is_floating_point():
            got = bias.dtype if isinstance(bias, Tensor) else type(bias).__name__
            raise TypeError(f"bias must be a floating-point torch.Tensor or None, got {got}")
        if not broadcasts_to(bias.shape, target):
            raise ValueError(
                f"bias of shape {tuple(bias.shape)} does not broadcast to the attention scores of shape "
                f"{target} (batch, heads, q_len, k_len)"
            )


def check_qkv(q: Tensor, k: Tensor, v: Tensor) -> tuple[int, ...]:
    """Validate q, k, v and return the shape of the score matrix ``(*batch, q_len, k_len)``."""
    check_tensor("q", q, 2)
    check_tensor("k", k, 2)
    check_tensor("v", v, 2)
    if q.shape[-1] != k.shape[-1]:
        raise ValueError(
            f"q and k must have the same head dimension (last dim): q has shape {tuple(q.shape)}, "
            f"k has shape {tuple(k.shape)}"
        )
    if k.shape[-2] != v.shape[-2]:
        raise ValueError(
            f"k and v must have the same length k_len (dim -2): k has shape {tuple(k.shape)}, "
            f"v has shape {tuple(v.shape)}"
        )
    try:
        batch = torch.broadcast_shapes(q.shape[:-2], k.shape[:-2], v.shape[:-2])
    except RuntimeError as err:
        raise ValueError(
            f"the leading (batch, heads) dims of q {tuple(q.shape)}, k {tuple(k.shape)} and "
            f"v {tuple(v.shape)} do not broadcast together"
        ) from err
    if not (q.dtype == k.dtype == v.dtype):
        raise TypeError(f"q, k and v must share a dtype, got {q.dtype}, {k.dtype}, {v.dtype}")
    return (*batch, q.shape[-2], k.shape[-2])


def check_probability(name: str, p: object) -> float:
    """A probability in ``[0, 1)`` (dropout)."""
    if isinstance(p, bool) or not isinstance(p, (int, float)) or not 0.0 <= p < 1.0:
        raise ValueError(f"{name} must be a float in [0, 1), got {p!r}")
    return float(p)


def check_scale(scale: object) -> float | None:
    """None or a positive float (the factor on ``q·kᵀ``)."""
    if scale is not None and (isinstance(scale, bool) or not isinstance(scale, (int, float)) or scale <= 0):
        raise ValueError(f"scale must be None or a positive float, got {scale!r}")
    return scale  # type: ignore[return-value]


def check_length(name: str, n: object, minimum: int = 1) -> int:
    """A length: an int ``>= minimum``."""
    return check_int(name, n, minimum)
