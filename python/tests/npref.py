"""Test helpers: a tiny ModelOpt NVFP4 checkpoint writer and a NumPy reference of the MoE layer.

Independent of the C++ code on purpose: the writer follows ../shared/docs/nvfp4-format.md section 1 and the
reference sections 7 and 9 (w4a16, softmax routing or given ids/weights, SwiGLU or relu^2, optional shared
expert), reading the weights back from the safetensors files, so it also checks checkpoints made by the C++
generator.
"""

from __future__ import annotations

import glob
import json
import os
import struct
from typing import Dict, Tuple

import numpy as np

# ----------------------------------------------------------------------------------------------- codecs
E2M1 = np.array([0, 0.5, 1, 1.5, 2, 3, 4, 6, -0.0, -0.5, -1, -1.5, -2, -3, -4, -6], dtype=np.float32)


def _e4m3_table() -> np.ndarray:
    t = np.zeros(256, dtype=np.float32)
    for b in range(256):
        s = -1.0 if b & 0x80 else 1.0
        e = (b >> 3) & 0xF
        m = b & 7
        if e == 15 and m == 7:
            t[b] = np.nan
        elif e == 0:
            t[b] = s * (m / 8.0) * 2.0**-6
        else:
            t[b] = s * (1 + m / 8.0) * 2.0 ** (e - 7)
    return t


E4M3 = _e4m3_table()


def bf16_round(x: np.ndarray) -> np.ndarray:
    """fp32 -> nearest-even bf16, returned as fp32."""
    u = np.ascontiguousarray(x, dtype=np.float32).view(np.uint32).astype(np.uint64)
    u = ((u + 0x7FFF + ((u >> 16) & 1)) >> 16) << 16
    return (u & 0xFFFFFFFF).astype(np.uint32).view(np.float32).reshape(np.shape(x))


def bf16_bits(x: np.ndarray) -> np.ndarray:
    return (bf16_round(x).view(np.uint32) >> 16).astype(np.uint16)


def dequant(packed: np.ndarray, scale: np.ndarray, scale2: float) -> np.ndarray:
    """U8 [N, K/2] codes + F8_E4M3 bytes [N, K/16] + global -> f32 [N, K]."""
    n = packed.shape[0]
    codes = np.empty((n, packed.shape[1] * 2), dtype=np.uint8)
    codes[:, 0::2] = packed & 0xF
    codes[:, 1::2] = packed >> 4
    w = E2M1[codes] * np.repeat(E4M3[scale], 16, axis=1)
    return (w * np.float32(scale2)).astype(np.float32)


# ----------------------------------------------------------------------------------------------- safetensors
_ST_DTYPES = {"U8": np.uint8, "F8_E4M3": np.uint8, "F32": np.float32, "BF16": np.uint16, "I32": np.int32}


def write_safetensors(path: str, tensors: Dict[str, Tuple[str, np.ndarray]]) -> None:
    header, blobs, off = {}, [], 0
    for name, (dt, arr) in tensors.items():
        b = np.ascontiguousarray(arr).tobytes()
        header[name] = {"dtype": dt, "shape": list(arr.shape), "data_offsets": [off, off + len(b)]}
        blobs.append(b)
        off += len(b)
    h = json.dumps(header).encode()
    h += b" " * ((8 - len(h) % 8) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(h)))
        f.write(h)
        for b in blobs:
            f.write(b)


def read_safetensors(path: str) -> Dict[str, np.ndarray]:
    with open(path, "rb") as f:
        data = f.read()
    (n,) = struct.unpack("<Q", data[:8])
    header = json.loads(data[8 : 8 + n])
    out = {}
    for name, info in header.items():
        if name == "__metadata__":
            continue
        a, b = info["data_offsets"]
        arr = np.frombuffer(data[8 + n + a : 8 + n + b], dtype=_ST_DTYPES[info["dtype"]])
        out[name] = arr.reshape(info["shape"])
    return out


def read_checkpoint_tensors(ckpt_dir: str) -> Dict[str, np.ndarray]:
    tensors: Dict[str, np.ndarray] = {}
    for p in sorted(glob.glob(os.path.join(ckpt_dir, "*.safetensors"))):
        tensors.update(read_safetensors(p))
    return tensors


# ----------------------------------------------------------------------------------------------- writer
def write_qwen3_checkpoint(path: str, hidden: int = 64, intermediate: int = 32, num_experts: int = 8,
                           top_k: int = 2, num_layers: int = 2, seed: int = 0) -> str:
    """A tiny Qwen3-MoE style NVFP4 checkpoint: random codes, random e4m3 block scales in [0.25, 3.75]."""
    rng = np.random.default_rng(seed)
    os.makedirs(path, exist_ok=True)
    tensors: Dict[str, Tuple[str, np.ndarray]] = {}
    scale_bytes = np.array([(e << 3) | m for e in range(5, 9) for m in range(8)], dtype=np.uint8)

    def proj(prefix: str, n: int, k: int, scale2: float) -> None:
        tensors[prefix + ".weight"] = ("U8", rng.integers(0, 256, size=(n, k // 2), dtype=np.uint8))
        tensors[prefix + ".weight_scale"] = ("F8_E4M3", rng.choice(scale_bytes, size=(n, k // 16)))
        tensors[prefix + ".weight_scale_2"] = ("F32", np.array(scale2, dtype=np.float32))
        tensors[prefix + ".input_scale"] = ("F32", np.array(rng.uniform(0.002, 0.004), dtype=np.float32))

    for L in range(num_layers):
        mlp = f"model.layers.{L}.mlp"
        tensors[mlp + ".gate.weight"] = ("BF16", bf16_bits(rng.standard_normal((num_experts, hidden)).astype(np.float32)))
        for e in range(num_experts):
            s2 = float(rng.uniform(0.01, 0.03))
            proj(f"{mlp}.experts.{e}.gate_proj", intermediate, hidden, s2)
            proj(f"{mlp}.experts.{e}.up_proj", intermediate, hidden, s2 * 1.25)  # gate/up scales differ
            proj(f"{mlp}.experts.{e}.down_proj", hidden, intermediate, float(rng.uniform(0.01, 0.03)))
    fname = "model.safetensors"
    write_safetensors(os.path.join(path, fname), tensors)
    with open(os.path.join(path, "model.safetensors.index.json"), "w") as f:
        json.dump({"metadata": {}, "weight_map": {n: fname for n in tensors}}, f)
    config = {
        "architectures": ["Qwen3MoeForCausalLM"], "model_type": "qwen3_moe", "hidden_size": hidden,
        "intermediate_size": 4 * hidden, "moe_intermediate_size": intermediate, "num_experts": num_experts,
        "num_experts_per_tok": top_k, "norm_topk_prob": True, "num_hidden_layers": num_layers,
        "decoder_sparse_step": 1, "mlp_only_layers": [], "hidden_act": "silu", "torch_dtype": "bfloat16",
        "vocab_size": 128, "num_attention_heads": 4, "num_key_value_heads": 4, "head_dim": 16,
    }
    with open(os.path.join(path, "config.json"), "w") as f:
        json.dump(config, f, indent=1)
    quant = {"producer": {"name": "modelopt", "version": "0.0.0-test"},
             "quantization": {"quant_algo": "NVFP4", "kv_cache_quant_algo": None, "group_size": 16,
                              "exclude_modules": ["lm_head"]}}
    with open(os.path.join(path, "hf_quant_config.json"), "w") as f:
        json.dump(quant, f, indent=1)
    return path


# ----------------------------------------------------------------------------------------------- reference
class Reference:
    """The MoE layer of section 9 in NumPy (w4a16), from a checkpoint's files and its nvfp4moe spec."""

    def __init__(self, ckpt_dir: str, spec, prefix: str = None):
        t = read_checkpoint_tensors(ckpt_dir)
        self.spec = spec
        mlp = prefix or f"model.layers.{spec.layer}.mlp"
        gated = spec.activation == "swiglu"

        def load(p):
            return dequant(t[p + ".weight"], t[p + ".weight_scale"], float(t[p + ".weight_scale_2"]))

        E = spec.num_experts
        self.up = np.stack([load(f"{mlp}.experts.{e}.up_proj") for e in range(E)])
        self.gate = np.stack([load(f"{mlp}.experts.{e}.gate_proj") for e in range(E)]) if gated else None
        self.down = np.stack([load(f"{mlp}.experts.{e}.down_proj") for e in range(E)])
        self.shared = None
        for name in ("shared_experts", "shared_expert"):
            if f"{mlp}.{name}.down_proj.weight" in t:
                self.shared = (load(f"{mlp}.{name}.gate_proj") if gated else None, load(f"{mlp}.{name}.up_proj"),
                               load(f"{mlp}.{name}.down_proj"))

    def route(self, logits: np.ndarray):
        s = self.spec
        assert s.routing == "softmax_topk" or "softmax" in s.routing, s.routing
        z = logits.astype(np.float32)
        p = np.exp(z - z.max(axis=1, keepdims=True))
        p = p / p.sum(axis=1, keepdims=True)
        ids = np.argsort(-p, axis=1, kind="stable")[:, : s.top_k].astype(np.int32)
        w = np.take_along_axis(p, ids, axis=1)
        if s.norm_topk_prob:
            w = w / w.sum(axis=1, keepdims=True)
        return ids, w.astype(np.float32)

    def _expert(self, x, gate, up, down):
        hu = up @ x
        if gate is not None:
            hg = gate @ x
            a = bf16_round(hg / (1 + np.exp(-hg)) * hu)
        else:
            a = bf16_round(np.maximum(hu, 0) ** 2)
        return down @ a

    def forward(self, hidden: np.ndarray, ids: np.ndarray, weights: np.ndarray) -> np.ndarray:
        x = bf16_round(hidden.astype(np.float32))
        out = np.zeros((x.shape[0], self.spec.hidden), dtype=np.float64)
        for t in range(x.shape[0]):
            for j in range(ids.shape[1]):
                e = int(ids[t, j])
                if e < 0:
                    continue
                g = self.gate[e] if self.gate is not None else None
                out[t] += float(weights[t, j]) * self._expert(x[t], g, self.up[e], self.down[e])
            if self.shared is not None:
                out[t] += self._expert(x[t], *self.shared)
        return out.astype(np.float32)


def rel_l2(a: np.ndarray, b: np.ndarray) -> float:
    a = np.asarray(a, dtype=np.float64)
    b = np.asarray(b, dtype=np.float64)
    return float(np.linalg.norm(a - b) / max(np.linalg.norm(b), 1e-30))
