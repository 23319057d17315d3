"""nvfp4moe: NVFP4 Mixture-of-Experts layers (CUDA on Hopper, exact CPU reference backend).

    import nvfp4moe
    ckpt = nvfp4moe.Checkpoint("/models/Qwen3-30B-A3B-NVFP4")
    layer = nvfp4moe.MoeLayer(ckpt, ckpt.moe_layers[0], mode="w4a16", max_tokens=256, device="cuda")
    out = layer.forward(hidden, router_logits=logits)          # torch in -> torch out, current stream

See docs/python.md. ``nvfp4moe.torch`` adds the torch.library custom op, an nn.Module and fused_experts().
"""

from __future__ import annotations

import dataclasses
from typing import Any, List, Optional

from . import _core
from ._core import FormatError, built_with_cuda, cuda_available

__all__ = [
    "Checkpoint",
    "MoeLayer",
    "MoeSpec",
    "FormatError",
    "built_with_cuda",
    "cuda_available",
    "generate_checkpoint",
    "synthetic_presets",
    "__version__",
]
__version__ = "0.1.0"


@dataclasses.dataclass(frozen=True)
class MoeSpec:
    """Everything that defines one MoE layer's math (mirrors nvfp4moe::MoeSpec)."""

    layer: int
    hidden: int
    intermediate: int
    num_experts: int
    top_k: int
    activation: str
    routing: str
    norm_topk_prob: bool
    n_group: int
    topk_group: int
    routed_scaling_factor: float
    has_router_bias: bool
    shared_intermediate: int
    shared_expert_gated: bool

    @classmethod
    def _from_core(cls, d: dict) -> "MoeSpec":
        return cls(**{f.name: d[f.name] for f in dataclasses.fields(cls)})


class Checkpoint(_core.Checkpoint):
    """An NVFP4 MoE checkpoint directory (ModelOpt layout), opened and validated.

    ``close()`` releases the mapped files; any later use raises ValueError. Also a context manager.
    Layers created from the checkpoint keep their own weights and stay usable after close().
    """

    def spec(self, layer: int) -> MoeSpec:  # type: ignore[override]
        return MoeSpec._from_core(super().spec(layer))

    def __enter__(self) -> "Checkpoint":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    def __repr__(self) -> str:
        state = "closed" if self.closed else f"moe_layers={self.moe_layers}"
        return f"nvfp4moe.Checkpoint({self.path!r}, {state})"


def _default_device() -> str:
    return "cuda" if _core.cuda_available() else "cpu"


class MoeLayer(_core.MoeLayer):
    """One MoE layer of a checkpoint, prepared on a backend.

    MoeLayer(checkpoint, layer, mode="w4a16", max_tokens=1024, device=None)

    checkpoint: a Checkpoint (or a path to one); layer: the decoder-layer index (see Checkpoint.moe_layers);
    mode: "w4a16" or "w4a4"; max_tokens: the largest T forward() accepts (the workspace is sized for it);
    device: "cuda", "cuda:N" or "cpu" (None: "cuda" when available, else "cpu").

    forward(hidden, router_logits=None, topk_ids=None, topk_weights=None, out=None, stream=None) -> out
        hidden [T, H] bf16 or f32; routing by router_logits [T, E] f32, or topk_ids [T, k] int32 with
        topk_weights [T, k] f32 (id -1: an unused slot; an id outside [-1, E) is refused on "cpu" and read as
        unused on CUDA, which cannot check device data without a sync); out [T, H] bf16 or f32 (allocated like hidden when None: torch.Tensor.new_empty
        for torch, numpy.empty for NumPy, cupy.empty for CuPy). Any DLPack tensor is accepted. On CUDA the
        layer runs on ``stream`` (a cudaStream_t as int); when None, torch inputs use torch's current stream
        and other inputs the default stream. Returns out.
    """

    def __init__(
        self,
        checkpoint: "Checkpoint | str",
        layer: int,
        mode: str = "w4a16",
        max_tokens: int = 1024,
        device: Optional[str] = None,
        shared_max_input_scale: bool = False,
    ) -> None:
        if isinstance(checkpoint, str):
            with Checkpoint(checkpoint) as ck:
                super().__init__(ck, layer, mode, max_tokens, device or _default_device(), shared_max_input_scale)
            return
        if not isinstance(checkpoint, _core.Checkpoint):
            raise TypeError(f"checkpoint: expected nvfp4moe.Checkpoint or a path, got {type(checkpoint).__name__}")
        super().__init__(checkpoint, layer, mode, max_tokens, device or _default_device(), shared_max_input_scale)

    @property
    def spec(self) -> MoeSpec:  # type: ignore[override]
        return MoeSpec._from_core(_core.MoeLayer.spec.__get__(self))

    __call__ = _core.MoeLayer.forward

    def __repr__(self) -> str:
        s = _core.MoeLayer.spec.__get__(self)
        return (f"nvfp4moe.MoeLayer(layer={s['layer']}, H={s['hidden']}, I={s['intermediate']}, "
                f"E={s['num_experts']}, k={s['top_k']}, mode={self.mode!r}, device={self.device!r}, "
                f"max_tokens={self.max_tokens})")


def _alloc_out(hidden: Any, shape: tuple) -> Any:
    """out=None for non-torch inputs: an uninitialized array of the same framework, dtype and device."""
    mod = type(hidden).__module__.split(".")[0]
    if mod == "numpy":
        import numpy as np

        return np.empty(shape, dtype=hidden.dtype)
    if mod == "cupy":
        import cupy

        with cupy.cuda.Device(hidden.device.id):
            return cupy.empty(shape, dtype=hidden.dtype)
    raise TypeError(
        f"out: cannot allocate an output for inputs of type {type(hidden).__module__}.{type(hidden).__name__} "
        "(immutable or unknown framework); pass out= (a writable [T, H] bf16 or f32 array)")


_core._set_out_allocator(_alloc_out)


def generate_checkpoint(path: str, **options: Any) -> str:
    """Writes a small synthetic NVFP4 checkpoint to ``path`` (for tests and demos) and returns the path.

    Random weights quantized exactly as ModelOpt does, written in a real model family's layout, so
    ``Checkpoint(path)`` reads it like the real thing. Options (all keyword): preset (one of
    synthetic_presets(), "" for explicit shapes), style ("qwen3_moe", "deepseek_v3", "qwen2_moe", "mixtral",
    "gpt_oss", "nemotron_h"), hidden, intermediate, experts, top_k, routing ("softmax_topk" or
    "sigmoid_grouped_topk"), activation ("swiglu" or "relu2"), norm_topk_prob, shared_intermediate, n_group,
    topk_group, routed_scaling_factor, router_bias, layers (1), first_dense_layers (0), seed (1),
    max_shard_bytes, overwrite (False). Without a preset the shape defaults to hidden=256, intermediate=128,
    experts=8, top_k=2.
    """
    if not getattr(_core, "have_generator", False):
        raise RuntimeError("this build of nvfp4moe has no synthetic checkpoint generator")
    if not options.get("preset"):
        for k, v in (("hidden", 256), ("intermediate", 128), ("experts", 8), ("top_k", 2)):
            options.setdefault(k, v)
    return _core.generate_checkpoint(str(path), **options)


def synthetic_presets() -> List[str]:
    """Names of the generator's presets (real models' MoE shapes)."""
    return list(_core.synthetic_presets()) if getattr(_core, "have_generator", False) else []
