"""PyTorch integration: the ``nvfp4moe::moe_forward`` custom op, an ``nn.Module`` and ``fused_experts``.

The op is registered through ``torch.library.custom_op`` with a fake (meta) implementation, so modules that
call it trace under ``torch.compile`` (as one opaque node) and capture under ``torch.cuda.graph`` (the layer
runs on torch's current stream and never allocates, synchronizes or branches on tensor contents).

Custom ops take only tensors and scalars, so a layer is passed by an integer handle into a process-wide
registry: ``register_layer(layer) -> int``; :class:`NvFp4MoE` does this for you and unregisters on deletion.
"""

from __future__ import annotations

import itertools
import threading
import weakref
from typing import Any, Dict, Optional, Union

import torch

import nvfp4moe

__all__ = ["moe_forward", "register_layer", "unregister_layer", "get_layer", "NvFp4MoE", "fused_experts"]

_registry: Dict[int, "nvfp4moe.MoeLayer"] = {}
_next_handle = itertools.count(1)
_lock = threading.Lock()


def register_layer(layer: "nvfp4moe.MoeLayer") -> int:
    """Registers a layer for the custom op; returns its handle (keeps the layer alive until unregistered)."""
    if not isinstance(layer, nvfp4moe._core.MoeLayer):
        raise TypeError(f"layer: expected nvfp4moe.MoeLayer, got {type(layer).__name__}")
    with _lock:
        handle = next(_next_handle)
        _registry[handle] = layer
    return handle


def unregister_layer(handle: int) -> None:
    with _lock:
        _registry.pop(handle, None)


def get_layer(handle: int) -> "nvfp4moe.MoeLayer":
    try:
        return _registry[handle]
    except KeyError:
        raise ValueError(f"handle: no nvfp4moe layer is registered under handle {handle}") from None


@torch.library.custom_op("nvfp4moe::moe_forward", mutates_args=())
def moe_forward(
    hidden: torch.Tensor,
    handle: int,
    router_logits: Optional[torch.Tensor] = None,
    topk_ids: Optional[torch.Tensor] = None,
    topk_weights: Optional[torch.Tensor] = None,
) -> torch.Tensor:
    """out [T, H] (dtype of hidden) = the MoE layer ``handle`` applied to hidden [T, H], on the current stream.

    Routing: router_logits [T, E] float32, or topk_ids [T, k] int32 with topk_weights [T, k] float32.
    """
    layer = get_layer(handle)
    out = torch.empty((hidden.shape[0], layer.hidden_size), dtype=hidden.dtype, device=hidden.device)
    layer.forward(hidden, router_logits, topk_ids, topk_weights, out)
    return out


@moe_forward.register_fake
def _moe_forward_fake(hidden, handle, router_logits=None, topk_ids=None, topk_weights=None):
    return hidden.new_empty((hidden.shape[0], get_layer(handle).hidden_size))


class NvFp4MoE(torch.nn.Module):
    """An nn.Module running one NVFP4 MoE layer through the ``nvfp4moe::moe_forward`` op.

    NvFp4MoE(layer)  or  NvFp4MoE(checkpoint_or_path, layer_index, mode=..., max_tokens=..., device=...)

    forward(hidden, router_logits=None, topk_ids=None, topk_weights=None) -> [T, H] like hidden.
    """

    def __init__(self, layer: Union["nvfp4moe.MoeLayer", "nvfp4moe.Checkpoint", str], layer_index: Optional[int] = None,
                 **options: Any) -> None:
        super().__init__()
        if not isinstance(layer, nvfp4moe._core.MoeLayer):
            if layer_index is None:
                raise TypeError("NvFp4MoE(checkpoint, layer_index, ...): layer_index is required with a checkpoint")
            layer = nvfp4moe.MoeLayer(layer, layer_index, **options)
        elif layer_index is not None or options:
            raise TypeError("NvFp4MoE(layer): no further arguments with an nvfp4moe.MoeLayer")
        self.layer = layer
        self.handle = register_layer(layer)
        self._finalizer = weakref.finalize(self, unregister_layer, self.handle)

    @property
    def spec(self) -> "nvfp4moe.MoeSpec":
        return self.layer.spec

    def forward(self, hidden: torch.Tensor, router_logits: Optional[torch.Tensor] = None,
                topk_ids: Optional[torch.Tensor] = None, topk_weights: Optional[torch.Tensor] = None) -> torch.Tensor:
        return torch.ops.nvfp4moe.moe_forward(hidden, self.handle, router_logits, topk_ids, topk_weights)

    def extra_repr(self) -> str:
        return repr(self.layer)


def _resolve_handle(layer: Any) -> int:
    if isinstance(layer, NvFp4MoE):
        return layer.handle
    if isinstance(layer, int):
        return layer
    if isinstance(layer, nvfp4moe._core.MoeLayer):
        h = getattr(layer, "_nvfp4moe_handle", None)
        if h is None:
            h = register_layer(layer)
            layer._nvfp4moe_handle = h  # registered for the life of the process
        return h
    inner = getattr(layer, "nvfp4moe", None)  # e.g. a vLLM FusedMoE layer the quant method attached us to
    if inner is not None and inner is not layer:
        return _resolve_handle(inner)
    raise TypeError("layer: expected an NvFp4MoE module, an nvfp4moe.MoeLayer, a handle, or an object whose "
                    f".nvfp4moe attribute is one of those; got {type(layer).__name__}")


_ACTIVATIONS = {"silu": "swiglu", "swiglu": "swiglu", "relu2": "relu2", "relu2_no_mul": "relu2"}


def fused_experts(
    hidden_states: torch.Tensor,
    layer: Any,
    topk_weights: torch.Tensor,
    topk_ids: torch.Tensor,
    inplace: bool = False,
    activation: str = "silu",
    apply_router_weight_on_input: bool = False,
    global_num_experts: int = -1,
    expert_map: Optional[torch.Tensor] = None,
    **unused: Any,
) -> torch.Tensor:
    """The routed-experts call of vLLM's MoE methods: out = sum_j topk_weights[:, j] * expert_{topk_ids[:, j]}(x).

    hidden_states [T, H] bf16; topk_weights [T, k] (cast to float32); topk_ids [T, k] (cast to int32, int64
    values past int32 saturated so that they stay out of range; -1 = unused slot). ``layer`` is an NvFp4MoE, an nvfp4moe.MoeLayer, a handle, or an object with an
    ``.nvfp4moe`` attribute holding one. inplace=True writes the result into hidden_states. The extra keyword
    arguments vLLM passes (w1_scale, a1_scale, ...) are accepted and ignored: the weights live in the layer.
    """
    handle = _resolve_handle(layer)
    if expert_map is not None:
        raise NotImplementedError("fused_experts: expert_map (expert parallelism) is not supported yet")
    if apply_router_weight_on_input:
        raise NotImplementedError("fused_experts: apply_router_weight_on_input is not supported")
    spec = get_layer(handle).spec
    want = _ACTIVATIONS.get(activation.lower())
    if want is None or want != spec.activation.lower():
        raise ValueError(f"activation: the layer computes {spec.activation}, got activation={activation!r}")
    if global_num_experts not in (-1, spec.num_experts):
        raise ValueError(f"global_num_experts: expected {spec.num_experts} (or -1), got {global_num_experts}")
    if topk_ids.dtype == torch.int64:
        # saturate, not wrap: an id past int32 stays out of range (2**32 + 1 would wrap to expert 1), and the
        # layer then treats it as any out-of-range id; checking the values here would need a device sync
        topk_ids = topk_ids.clamp(-2**31, 2**31 - 1)
    if topk_ids.dtype != torch.int32:
        topk_ids = topk_ids.to(torch.int32)
    if topk_weights.dtype != torch.float32:
        topk_weights = topk_weights.to(torch.float32)
    out = torch.ops.nvfp4moe.moe_forward(hidden_states, handle, None, topk_ids, topk_weights)
    if inplace:
        hidden_states.copy_(out)
        return hidden_states
    return out
