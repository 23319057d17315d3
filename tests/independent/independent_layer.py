#!/usr/bin/env python3
"""The check "`nvfp4moe run --input/--output` equals an independent implementation of the spec on a checkpoint
written by an independent writer".

Everything here is written from ../shared/docs/nvfp4-format.md alone, in pure Python + numpy, importing none of
the project's code:
  (a) a ModelOpt-layout NVFP4 MoE checkpoint: our own safetensors writer (struct + json), our own quantizer
      (section 3), config.json in Qwen3-MoE style (softmax top-k) and in DeepSeek-V3 style (sigmoid + bias,
      grouped top-k, routed scaling, a fused shared expert, a dense first layer), hf_quant_config.json, sharded
      with model.safetensors.index.json, odd shapes (H=80, I=48 / 32, E=6 / 8);
  (b) input files: hidden bf16 [T, H] + router_logits f32 [T, E] (with exact ties), and hidden f32 + topk_ids
      i32 + topk_weights f32 with unused (-1) slots;
  (c) `$NVFP4MOE_CLI run DIR --layer L --mode w4a16|w4a4 --input IN --output OUT --backend cpu`;
  (d) `out` f32 [T, H] read back with our own reader;
  (e) compared with our own numpy implementation of section 9 (routing with ties to the lower id; w4a4
      activation quantization exactly as section 4 in float32 arithmetic; intermediate rounded to bf16;
      per-expert gate/up weight scales; GEMM1 input scale = max of gate's and up's).

Comparison. The reference accumulates in float64; the CLI in fp32, in an order we do not know. The only
discrete decision downstream of a sum is the bf16 rounding of the intermediate a = silu(h_gate) * h_up: where
a lies within the fp32 error bound of h (K * 2^-23 * sum |terms|, generous) of a bf16 rounding boundary, both
neighbouring bf16 values are legitimate, and the reference takes, per token, the combination of those choices
closest to the CLI (reported). Everything else must agree to fp32 rounding:
  relative L2 <= 1e-5, max |err| <= 1e-4 * RMS(ref), RMS ratio in [0.99, 1.01], and per token relative L2
  <= 1e-4 (a token whose reference is exactly zero must be exactly zero).

Usage: independent_layer.py [--cli PATH] [--workdir DIR] [--keep] [--no-cli] [--backend cpu]
  --cli defaults to $NVFP4MOE_CLI. --no-cli runs (a), (b), (e) and the writer's self-checks only.
Exit status: 0 pass, 1 a comparison failed, 2 setup error (CLI missing or failing, numpy missing).
"""

import argparse
import json
import math
import os
import shutil
import struct
import subprocess
import sys
import tempfile

try:
    import numpy as np
except ImportError:  # pragma: no cover
    print("independent_layer: FAIL: numpy is not installed (pip install numpy)", file=sys.stderr)
    sys.exit(2)

F32 = np.float32

# ============================================================================================ codecs
# e2m1 magnitudes of code & 7 (section 2) and e4m3fn values of all codes, from the definitions.
E2M1_MAG = np.array([0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0])


def e4m3_value(code):
    if code & 0x7F == 0x7F:
        return math.nan
    e, m = (code >> 3) & 15, code & 7
    v = math.ldexp(m, -9) if e == 0 else math.ldexp(8 + m, e - 10)  # subnormal m*2^-9, else (1+m/8)*2^(e-7)
    return -v if code & 0x80 else v


E4M3_VALUES = np.array([e4m3_value(c) for c in range(256)])   # float64, index = code
E4M3_MAG = E4M3_VALUES[:127].copy()                            # finite magnitudes, ascending (0 .. 448)
E2M1_VALUES = np.concatenate([E2M1_MAG, -E2M1_MAG])           # index = code (8 is -0)


def nearest_even(a, mags):
    """Index of the nearest of the ascending `mags` to each a >= 0 (float64), ties to the even index."""
    hi = np.clip(np.searchsorted(mags, a), 1, len(mags) - 1)
    lo = hi - 1
    dlo, dhi = a - mags[lo], mags[hi] - a
    return np.where(dlo < dhi, lo, np.where(dhi < dlo, hi, np.where(lo % 2 == 0, lo, hi)))


def e4m3_encode(x):
    """float32 -> e4m3fn codes: round to nearest even, saturate to 448, NaN -> 0x7F (sign kept)."""
    x = np.asarray(x, dtype=F32)
    a = np.abs(x.astype(np.float64))
    with np.errstate(invalid="ignore"):
        code = nearest_even(np.nan_to_num(a, nan=0.0, posinf=448.0), E4M3_MAG)
        code = np.where(a >= 448.0, 0x7E, code)
    code = np.where(np.isnan(a), 0x7F, code)
    return (code | (np.signbit(x).astype(np.int64) << 7)).astype(np.uint8)


def e2m1_encode(x):
    """float32 -> e2m1 codes: round to nearest even, saturate to 6 (Inf too); sign only for x < 0."""
    x = np.asarray(x, dtype=F32)
    a = np.abs(x.astype(np.float64))
    with np.errstate(invalid="ignore"):
        code = nearest_even(np.nan_to_num(a, nan=6.0, posinf=6.0), E2M1_MAG)
        code = np.where(a >= 6.0, 7, code)
    code = np.where(np.isnan(a), 7, code)  # 0/0 in a block whose scale underflowed: dequantizes to 0 anyway
    return (code | ((x < 0).astype(np.int64) << 3)).astype(np.uint8)


def bf16_bits(x):
    """float32 -> bf16 bits, round to nearest even (no NaN in our data)."""
    u = np.asarray(x, dtype=F32).view(np.uint32).astype(np.uint64)
    return ((u + 0x7FFF + ((u >> 16) & 1)) >> 16).astype(np.uint16)


def bf16_to_f32(h):
    return (np.asarray(h, dtype=np.uint16).astype(np.uint32) << 16).view(F32)


def bf16_round64(a):
    """float64 -> nearest bf16 value (8 significant bits, ties to even), as float64."""
    m, e = np.frexp(np.asarray(a, dtype=np.float64))
    return np.ldexp(np.rint(m * 256.0), e - 8)


# ============================================================================================ quantizers
def quantize_weight(w):
    """Section 3 on one weight [N, K] (float32). Returns (packed u8 [N, K/2], scales u8 [N, K/16], ws2 f32)."""
    w = np.asarray(w, dtype=F32)
    n, k = w.shape
    amax = F32(np.max(np.abs(w)))
    ws2 = amax / F32(6 * 448) if amax > 0 else F32(1.0)   # all-zero tensor: 1.0 (any positive value works)
    blocks = w.reshape(n, k // 16, 16)
    s = np.max(np.abs(blocks), axis=2) / (F32(6.0) * ws2)  # float32 arithmetic throughout
    s = np.where(s == 0, F32(1.0), s).astype(F32)
    s8 = e4m3_encode(s)
    denom = (E4M3_VALUES[s8].astype(F32) * ws2).astype(F32)
    with np.errstate(divide="ignore", invalid="ignore"):
        x = (blocks / denom[:, :, None]).astype(F32)
    q = e2m1_encode(x).reshape(n, k)
    packed = (q[:, 0::2] | (q[:, 1::2] << 4)).astype(np.uint8)   # element 2i in the low nibble
    return packed, s8, ws2


def dequant_operand(packed, scales):
    """code * block scale, exact in float64: [N, K]."""
    n = packed.shape[0]
    q = np.empty((n, packed.shape[1] * 2), dtype=np.uint8)
    q[:, 0::2], q[:, 1::2] = packed & 15, packed >> 4
    return E2M1_VALUES[q] * np.repeat(E4M3_VALUES[scales], 16, axis=1)


def quant_dequant_activation(x, input_scale):
    """Section 4 with exact division, float32 arithmetic in the order written there. x: float32 [..., K].
    Returns (e2m1 * sf as exact float64 [..., K], 1/gs as float64)."""
    x = np.asarray(x, dtype=F32)
    gs = F32(1.0) / F32(input_scale)
    xb = x.reshape(x.shape[:-1] + (x.shape[-1] // 16, 16))
    vmax = np.max(np.abs(xb), axis=-1).astype(F32)
    S = ((gs * vmax).astype(F32) / F32(6.0)).astype(F32)
    sf = e4m3_encode(S)
    sff = E4M3_VALUES[sf].astype(F32)
    with np.errstate(divide="ignore"):
        os_ = np.where(sff != 0, F32(1.0) / (sff / gs).astype(F32), F32(0.0)).astype(F32)
    q = e2m1_encode((xb * os_[..., None]).astype(F32))
    deq = E2M1_VALUES[q] * E4M3_VALUES[sf][..., None]
    return deq.reshape(x.shape), 1.0 / float(gs)


# ============================================================================================ safetensors
ST_DTYPES = {"U8": (np.uint8, 1), "F8_E4M3": (np.uint8, 1), "F32": (np.float32, 4), "BF16": (np.uint16, 2),
             "I32": (np.int32, 4)}


def write_safetensors(path, tensors, metadata=None):
    """tensors: list of (name, dtype string, shape, numpy array). Header padded with spaces to 8 bytes."""
    header, offset, blobs = {}, 0, []
    for name, dtype, shape, arr in tensors:
        np_dtype, size = ST_DTYPES[dtype]
        data = np.ascontiguousarray(np.asarray(arr).astype(np_dtype)).astype(np.dtype(np_dtype).newbyteorder("<"))
        raw = data.tobytes()
        assert len(raw) == int(np.prod(shape, dtype=np.int64)) * size, (name, shape, len(raw))
        header[name] = {"dtype": dtype, "shape": list(shape), "data_offsets": [offset, offset + len(raw)]}
        blobs.append(raw)
        offset += len(raw)
    if metadata:
        header["__metadata__"] = metadata
    hb = json.dumps(header, separators=(",", ":")).encode()
    hb += b" " * ((8 - len(hb) % 8) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(hb)))
        f.write(hb)
        for raw in blobs:
            f.write(raw)
    return offset


def read_safetensors(path):
    with open(path, "rb") as f:
        buf = f.read()
    (n,) = struct.unpack("<Q", buf[:8])
    header = json.loads(buf[8:8 + n].decode())
    out = {}
    for name, info in header.items():
        if name == "__metadata__":
            continue
        np_dtype, size = ST_DTYPES[info["dtype"]]
        b, e = info["data_offsets"]
        raw = buf[8 + n + b:8 + n + e]
        shape = tuple(info["shape"])
        assert len(raw) == int(np.prod(shape, dtype=np.int64)) * size, (path, name)
        out[name] = (info["dtype"], np.frombuffer(raw, dtype=np.dtype(np_dtype).newbyteorder("<")).reshape(shape))
    return out


# ============================================================================================ the model
class Expert:
    """One NVFP4 SwiGLU expert as written to the checkpoint, plus what the reference needs."""

    def __init__(self, rng, hidden, inter, joint_amax, wscale):
        def weight(n, k):
            w = rng.standard_normal((n, k)) * wscale * np.exp(rng.uniform(-1.0, 1.0, size=(n, 1)))
            return bf16_to_f32(bf16_bits(w.astype(F32)))  # ModelOpt quantizes bf16 weights

        g, u, d = weight(inter, hidden), weight(inter, hidden), weight(hidden, inter)
        # Edge blocks: an all-zero block (scale 1.0), a block whose scale is an e4m3 subnormal, a block whose
        # scale underflows to 0 (nonzero codes that dequantize to 0), an all-zero row.
        g[0, 16:32] = 0.0
        g[1, 32:48] *= F32(2e-5)
        u[2, 0:16] *= F32(1e-7)
        d[3, :] = 0.0
        if joint_amax:  # what the ModelOpt exporter does: gate and up share one amax
            m = max(np.max(np.abs(g)), np.max(np.abs(u)))
            g[inter - 1, hidden - 1] = F32(m)
            u[inter - 1, hidden - 1] = F32(-m)
        self.w = {"gate_proj": g, "up_proj": u, "down_proj": d}
        self.q = {p: quantize_weight(w) for p, w in self.w.items()}
        self.input_scale = {}
        self._dq = {}

    def dq(self, proj):
        if proj not in self._dq:
            packed, scales, ws2 = self.q[proj]
            self._dq[proj] = (dequant_operand(packed, scales), float(ws2))
        return self._dq[proj]

    def tensors(self, prefix):
        out = []
        for p in ("gate_proj", "up_proj", "down_proj"):
            packed, scales, ws2 = self.q[p]
            n, k2 = packed.shape
            out += [(f"{prefix}.{p}.weight", "U8", [n, k2], packed),
                    (f"{prefix}.{p}.weight_scale", "F8_E4M3", [n, k2 * 2 // 16], scales),
                    (f"{prefix}.{p}.weight_scale_2", "F32", [], np.array(ws2, dtype=F32)),
                    (f"{prefix}.{p}.input_scale", "F32", [], np.array(self.input_scale[p], dtype=F32))]
        return out


class Case:
    """A checkpoint: config, experts and routing parameters of the MoE layer under test."""

    def __init__(self, name, style, H, I, E, k, norm, seed, n_group=1, topk_group=1, scaling=1.0,
                 n_shared=0, layers=2, moe_layer=1):
        self.name, self.style, self.H, self.I, self.E, self.k, self.norm = name, style, H, I, E, k, norm
        self.n_group, self.topk_group, self.scaling, self.n_shared = n_group, topk_group, scaling, n_shared
        self.layers, self.moe_layer, self.seed = layers, moe_layer, seed
        rng = np.random.default_rng(seed)
        self.rng = rng
        self.experts = [Expert(rng, H, I, joint_amax=(e % 2 == 0), wscale=0.05 * (1 + e % 3)) for e in range(E)]
        self.shared = Expert(rng, H, I * n_shared, True, 0.04) if n_shared else None
        self.router = bf16_bits((rng.standard_normal((E, H)) * 0.1).astype(F32))
        if style == "deepseek":
            # Bias repeats per group so that two groups (and two experts) can tie exactly.
            gsz = E // n_group
            base = (np.round(rng.uniform(-0.5, 0.5, size=E // 2) * 64) / 64).astype(F32)
            self.bias = np.concatenate([base, base]).astype(F32)
            assert gsz * n_group == E and (E // 2) % gsz == 0
        else:
            self.bias = None

    # ------------------------------------------------------------------ calibration-like input scales
    def set_input_scales(self, hidden):
        """input_scale = amax / 2688 from the data, times a factor (some below 1: saturating blocks); gate and up
        differ in some experts (the GEMM1 scale must be their max); gate/up weight scales differ in the odd
        experts (quantized separately)."""
        rng = self.rng
        normal = hidden[N_EDGE_ROWS:]  # the rows past the crafted edge rows
        amax_x = float(np.max(np.abs(normal)))
        allx = [(e, ex) for e, ex in enumerate(self.experts)] + ([(-1, self.shared)] if self.shared else [])
        for e, ex in allx:
            f = rng.uniform(0.6, 1.3)
            gate = F32(amax_x * f / 2688.0)
            up = F32(gate * (1.25 if e in (1, 3) else 1.0))
            if e == 4:
                gate, up = up * F32(1.5), gate  # gate the larger one
            ex.input_scale["gate_proj"], ex.input_scale["up_proj"] = gate, up
            # down: from the w4a16 intermediate of this expert over all tokens
            a = self.intermediate_w4a16(ex, hidden)
            ex.input_scale["down_proj"] = F32(max(float(np.max(np.abs(a))), 1e-6) * rng.uniform(0.5, 1.2) / 2688.0)

    def intermediate_w4a16(self, ex, hidden):
        g, wg = ex.dq("gate_proj")
        u, wu = ex.dq("up_proj")
        hg, hu = (hidden @ g.T) * wg, (hidden @ u.T) * wu
        return hg / (1.0 + np.exp(-hg)) * hu

    # ------------------------------------------------------------------ checkpoint files
    def config(self):
        H, I, E = self.H, self.I, self.E
        common = {"hidden_size": H, "num_hidden_layers": self.layers, "num_experts_per_tok": self.k,
                  "norm_topk_prob": self.norm, "hidden_act": "silu", "vocab_size": 64, "num_attention_heads": 4,
                  "num_key_value_heads": 2, "rms_norm_eps": 1e-6, "torch_dtype": "bfloat16",
                  "tie_word_embeddings": False, "max_position_embeddings": 4096}
        if self.style == "qwen":
            return dict(common, architectures=["Qwen3MoeForCausalLM"], model_type="qwen3_moe",
                        intermediate_size=2 * I, moe_intermediate_size=I, num_experts=E, decoder_sparse_step=1,
                        mlp_only_layers=[], head_dim=20)
        quant = {"quant_method": "modelopt", "quant_algo": "NVFP4", "producer": {"name": "modelopt", "version": "0.29.0"},
                 "config_groups": {"group_0": {
                     "weights": {"num_bits": 4, "type": "float", "group_size": 16, "dynamic": False},
                     "input_activations": {"num_bits": 4, "type": "float", "group_size": 16, "dynamic": False},
                     "targets": ["Linear"]}},
                 "ignore": ["lm_head"]}
        return dict(common, architectures=["DeepseekV3ForCausalLM"], model_type="deepseek_v3",
                    intermediate_size=2 * I * 2, moe_intermediate_size=I, n_routed_experts=E,
                    n_shared_experts=self.n_shared, n_group=self.n_group, topk_group=self.topk_group,
                    routed_scaling_factor=self.scaling, scoring_func="sigmoid", topk_method="noaux_tc",
                    first_k_dense_replace=self.moe_layer, moe_layer_freq=1, kv_lora_rank=16, q_lora_rank=None,
                    qk_nope_head_dim=16, qk_rope_head_dim=8, v_head_dim=16, quantization_config=quant)

    def write(self, d):
        os.makedirs(d, exist_ok=True)
        rng = np.random.default_rng(self.seed + 1)
        H = self.H
        bf = lambda *shape: bf16_bits((rng.standard_normal(shape) * 0.02).astype(F32))
        ones = lambda n: bf16_bits(np.ones(n, dtype=F32))
        tensors = [("model.embed_tokens.weight", "BF16", [64, H], bf(64, H)),
                   ("model.norm.weight", "BF16", [H], ones(H)), ("lm_head.weight", "BF16", [64, H], bf(64, H))]
        for L in range(self.layers):
            p = f"model.layers.{L}"
            tensors += [(f"{p}.input_layernorm.weight", "BF16", [H], ones(H)),
                        (f"{p}.post_attention_layernorm.weight", "BF16", [H], ones(H))]
            if self.style == "deepseek" and L < self.moe_layer:  # dense layer: an NVFP4 MLP
                dense = Expert(np.random.default_rng(self.seed + 7), H, 2 * self.I * 2, True, 0.03)
                dense.input_scale = {proj: F32(0.01) for proj in ("gate_proj", "up_proj", "down_proj")}
                tensors += dense.tensors(f"{p}.mlp")
                continue
            other = np.random.default_rng(self.seed + 100 + L)
            ex_list = self.experts if L == self.moe_layer else [
                Expert(other, H, self.I, True, 0.05) for _ in range(self.E)]
            for e, ex in enumerate(ex_list):
                if not ex.input_scale:
                    ex.input_scale = {"gate_proj": F32(0.002), "up_proj": F32(0.002), "down_proj": F32(0.001)}
                tensors += ex.tensors(f"{p}.mlp.experts.{e}")
            router = self.router if L == self.moe_layer else bf(self.E, H)
            tensors.append((f"{p}.mlp.gate.weight", "BF16", [self.E, H], router))
            if self.style == "deepseek":
                tensors.append((f"{p}.mlp.gate.e_score_correction_bias", "F32", [self.E], self.bias))
                tensors += self.shared.tensors(f"{p}.mlp.shared_experts")
        # Three shards, split by size (an expert's tensors may straddle two shards, as in real exports).
        sizes = [int(np.asarray(t[3]).nbytes) for t in tensors]
        total, shards, cur, acc = sum(sizes), [[]], 0, 0
        for t, s in zip(tensors, sizes):
            if acc > total * (len(shards)) / 3 and len(shards) < 3:
                shards.append([])
            shards[-1].append(t)
            acc += s
        weight_map = {}
        for i, sh in enumerate(shards):
            fname = f"model-{i + 1:05d}-of-{len(shards):05d}.safetensors"
            write_safetensors(os.path.join(d, fname), sh, {"format": "pt"})
            for t in sh:
                weight_map[t[0]] = fname
        with open(os.path.join(d, "model.safetensors.index.json"), "w") as f:
            json.dump({"metadata": {"total_size": total}, "weight_map": weight_map}, f, indent=2)
        with open(os.path.join(d, "config.json"), "w") as f:
            json.dump(self.config(), f, indent=2)
        with open(os.path.join(d, "hf_quant_config.json"), "w") as f:
            json.dump({"producer": {"name": "modelopt", "version": "0.29.0"},
                       "quantization": {"quant_algo": "NVFP4", "kv_cache_quant_algo": None, "group_size": 16,
                                        "exclude_modules": ["lm_head"]}}, f, indent=2)
        return len(shards)

    # ------------------------------------------------------------------ routing (section 7, float64)
    def route(self, logits):
        T, E, k = logits.shape[0], self.E, self.k
        ids = np.zeros((T, k), dtype=np.int64)
        w = np.zeros((T, k))
        lg = logits.astype(np.float64)
        for t in range(T):
            if self.style == "qwen":
                p = np.exp(lg[t] - lg[t].max())
                p /= p.sum()
                order = np.argsort(-p, kind="stable")[:k]  # by value, ties to the lower id
                ww = p[order]
                if self.norm:
                    ww = ww / ww.sum()
            else:
                s = 1.0 / (1.0 + np.exp(-lg[t]))
                sb = s + self.bias.astype(np.float64)
                gsz = E // self.n_group
                gscore = np.array([np.sort(sb[g * gsz:(g + 1) * gsz])[::-1][:2].sum() for g in range(self.n_group)])
                keep = np.argsort(-gscore, kind="stable")[:self.topk_group]
                masked = np.full(E, -np.inf)
                for g in keep:
                    masked[g * gsz:(g + 1) * gsz] = sb[g * gsz:(g + 1) * gsz]
                order = np.argsort(-masked, kind="stable")[:k]
                ww = s[order]
                if self.norm:
                    ww = ww / ww.sum()
                ww = ww * self.scaling
            ids[t], w[t] = order, ww
        return ids, w

    def routing_margin_ok(self, logits):
        """The generated logits must have exact ties or clear gaps (>= 1e-5 relative) in every compared score,
        so that fp32 vs float64 cannot decide a selection differently."""
        lg = logits.astype(np.float64)
        for t in range(lg.shape[0]):
            if self.style == "qwen":
                vals = [lg[t]]
            else:
                s = 1.0 / (1.0 + np.exp(-lg[t]))
                sb = s + self.bias.astype(np.float64)
                gsz = self.E // self.n_group
                vals = [sb, np.array([np.sort(sb[g * gsz:(g + 1) * gsz])[::-1][:2].sum() for g in range(self.n_group)])]
            for v in vals:
                d = np.abs(v[:, None] - v[None, :])
                if np.any((d > 0) & (d < 1e-5 * (1 + np.abs(v[:, None])))):
                    return False
        return True


# ============================================================================================ the reference layer
def expert_forward(ex, x, mode):
    """x: float32 [H] (bf16 values). Returns (y float64 [H], a = the bf16 intermediate, amb, y_of): amb lists
    (index, candidate bf16 values) for intermediate elements whose bf16 rounding the fp32 summation order may
    decide; y_of(a') recomputes GEMM2 (with its activation quantization in w4a4) for another intermediate."""
    g, wg = ex.dq("gate_proj")
    u, wu = ex.dq("up_proj")
    d, wd = ex.dq("down_proj")
    K1 = x.shape[0]
    if mode == "w4a4":
        op, inv_gs = quant_dequant_activation(x, max(ex.input_scale["gate_proj"], ex.input_scale["up_proj"]))
    else:
        op, inv_gs = x.astype(np.float64), 1.0
    hg = (g @ op) * (wg * inv_gs)
    hu = (u @ op) * (wu * inv_gs)
    # How far an fp32 evaluation of h may be from the exact value, for any reasonable summation order:
    # 2 u sum|t| for roundings that act alike on every term (a per-element scale multiply), plus a ~7-sigma
    # bound of the random-walk error of K partial-sum roundings, 3 u sqrt(K) (|h| + ||t||_2), plus 4 ulps of
    # the final scalings. (The worst case K u sum|t| is ~40x larger and never reached by an fp32 loop.)
    u32 = 2.0 ** -24

    def err_bound(m, h, scale):
        return (u32 * (2 * (np.abs(m) @ np.abs(op)) + 3 * math.sqrt(K1) * (np.abs(h) / scale + np.sqrt((m * m) @ (op * op))))
                * scale + 4 * u32 * np.abs(h))

    eg = err_bound(g, hg, wg * inv_gs)
    eu = err_bound(u, hu, wu * inv_gs)
    sg = 1.0 / (1.0 + np.exp(-hg))
    silu = hg * sg
    a = silu * hu
    dsilu = sg * (1.0 + hg * (1.0 - sg))
    da = np.abs(dsilu * hu) * eg + np.abs(silu) * eu + 6 * u32 * np.abs(a)  # + exp, division, product ulps
    a_b = bf16_round64(a)
    lo, hi = bf16_round64(a - da), bf16_round64(a + da)
    amb = []
    for i in np.nonzero(lo != hi)[0]:
        cands = sorted({float(lo[i]), float(hi[i]), float(a_b[i])})
        amb.append((int(i), cands))

    def y_of(av):
        if mode == "w4a4":
            op2, inv2 = quant_dequant_activation(av.astype(F32), ex.input_scale["down_proj"])
        else:
            op2, inv2 = av, 1.0
        return (d @ op2) * (wd * inv2)

    return y_of(a_b), a_b, amb, y_of


def reference_layer(case, hidden32, ids, w, mode, cli_out=None):
    """Section 9 for all tokens. hidden32: float32 [T, H] bf16 values. With cli_out, ambiguous intermediate
    roundings are resolved per token towards it. Returns (out float64 [T, H], stats)."""
    T, H = hidden32.shape
    out = np.zeros((T, H))
    stats = {"ambiguous": 0, "flipped": 0, "loose_tokens": 0}
    for t in range(T):
        slots = []  # (weight, base y, a, amb, y_of)
        for j in range(ids.shape[1]):
            e = int(ids[t, j])
            if e < 0:
                continue
            y, a, amb, y_of = expert_forward(case.experts[e], hidden32[t], mode)
            slots.append((float(w[t, j]), y, a, amb, y_of))
        if case.shared is not None:
            y, a, amb, y_of = expert_forward(case.shared, hidden32[t], mode)
            slots.append((1.0, y, a, amb, y_of))
        base = np.zeros(H)
        for wt, y, *_ in slots:
            base = base + wt * y
        n_amb = sum(len(s[3]) for s in slots)
        stats["ambiguous"] += n_amb
        if n_amb == 0 or cli_out is None:
            out[t] = base
            continue
        # Alternatives per slot: every combination of the candidate values of its ambiguous elements.
        alts = []
        for wt, y, a, amb, y_of in slots:
            if not amb:
                alts.append([(0, wt * y)])
                continue
            if len(amb) > 8:
                stats["loose_tokens"] += 1
                amb = amb[:8]
            combos = [[]]
            for i, cands in amb:
                combos = [c + [(i, v)] for c in combos for v in cands]
            opts = []
            for c in combos:
                av = a.copy()
                nflip = 0
                for i, v in c:
                    nflip += v != a[i]
                    av[i] = v
                opts.append((nflip, wt * y_of(av)))
            alts.append(opts)
        # Coordinate descent over slots (exhaustive when small), minimizing the distance to the CLI row.
        choice = [0] * len(alts)
        target = cli_out[t].astype(np.float64)
        for _ in range(3):
            for s in range(len(alts)):
                rest = sum(alts[q][choice[q]][1] for q in range(len(alts)) if q != s) if len(alts) > 1 else 0.0
                errs = [(float(np.sum((rest + o[1] - target) ** 2)), o[0]) for o in alts[s]]
                choice[s] = min(range(len(errs)), key=lambda c: errs[c])  # equal error: fewest flips
        out[t] = sum(alts[q][choice[q]][1] for q in range(len(alts)))
        stats["flipped"] += sum(alts[q][choice[q]][0] for q in range(len(alts)))
    return out, stats


def fp32_layer(case, hidden32, ids, w, mode):
    """A plain fp32 implementation (numpy float32 matmuls, whatever order BLAS sums in): what --simulate feeds
    to the comparison instead of the CLI, to show that an honest fp32 implementation passes it."""
    T, H = hidden32.shape

    def expert(ex, x):
        g, wg = ex.dq("gate_proj")
        u, wu = ex.dq("up_proj")
        d, wd = ex.dq("down_proj")
        if mode == "w4a4":
            op, inv = quant_dequant_activation(x, max(ex.input_scale["gate_proj"], ex.input_scale["up_proj"]))
            op = (op.astype(F32) * F32(inv)).astype(F32)
        else:
            op = x.astype(F32)
        hg = (g.astype(F32) @ op) * F32(wg)
        hu = (u.astype(F32) @ op) * F32(wu)
        a = bf16_to_f32(bf16_bits((hg / (F32(1) + np.exp(-hg))) * hu))
        if mode == "w4a4":
            op2, inv2 = quant_dequant_activation(a, ex.input_scale["down_proj"])
            a = (op2.astype(F32) * F32(inv2)).astype(F32)
        return (d.astype(F32) @ a) * F32(wd)

    out = np.zeros((T, H), dtype=F32)
    for t in range(T):
        for j in range(ids.shape[1]):
            if ids[t, j] >= 0:
                out[t] += F32(w[t, j]) * expert(case.experts[int(ids[t, j])], hidden32[t])
        if case.shared is not None:
            out[t] += expert(case.shared, hidden32[t])
    return out


# ============================================================================================ inputs
N_EDGE_ROWS = 13  # rows 0..12 of every input are crafted (routing ties, magnitudes, quantizer ties)


def make_hidden(rng, T, H):
    x = rng.standard_normal((T, H)) * np.exp(rng.uniform(-1.0, 1.0, size=(T, 1)))
    x[5] = 0.0                 # an all-zero token
    x[6, 16:32] = 0.0          # a zero block
    x[7] *= 2e-5               # tiny: e4m3-subnormal GEMM1 activation scales (GEMM2 input underflows to 0)
    x[8] *= 4.0                # past the calibration amax: saturating block scales
    x[9] *= 3e-3               # small: e4m3-subnormal GEMM2 activation scales
    return x.astype(F32)       # rows 10, 11, 12: craft_quantizer_ties()


def exact_gs_scale(target_input_scale, three):
    """An input_scale near the target whose gs = 1/input_scale is exactly 2^k (three=False) or 3 * 2^k."""
    base = 3.0 if three else 1.0
    k = int(round(math.log2(1.0 / (float(target_input_scale) * base))))
    for kk in (k, k + 1, k - 1, k + 2):
        s = F32(1.0 / (base * 2.0 ** kk))
        if float(F32(1.0) / s) == base * 2.0 ** kk:
            return s, kk
    raise RuntimeError("no exactly invertible input scale found")


def craft_quantizer_ties(case, rng, hidden):
    """Make section 4's rounding decisions land on exact ties for tokens 10 and 11.
    Expert 0 (and the shared expert) get gs = 3 * 2^k: then S = (gs * vmax) / 6 is exact, and token 10's block
    maxima put S exactly on an e4m3 midpoint whose tie goes DOWN to the even code (mantissa 6 -> 6.5): a
    kernel computing gs * (vmax / 6), or multiplying by an approximate 1/6, lands a hair above and rounds up.
    Expert 1 gets gs = 2^k (up_proj's scale; gate's smaller, so the max rule matters): token 11's blocks have
    power-of-two scales, so x * os is exact and hits every e2m1 tie (0.25 ... 5) exactly."""
    H = hidden.shape[1]
    targets = [case.experts[0]] + ([case.shared] if case.shared is not None else [])
    ex0 = case.experts[0]
    s0, k0 = exact_gs_scale(max(ex0.input_scale["gate_proj"], ex0.input_scale["up_proj"]), three=True)
    for ex in targets:
        ex.input_scale["gate_proj"] = ex.input_scale["up_proj"] = s0
    ex1 = case.experts[1]
    s1, k1 = exact_gs_scale(max(ex1.input_scale["gate_proj"], ex1.input_scale["up_proj"]), three=False)
    ex1.input_scale["up_proj"], ex1.input_scale["gate_proj"] = s1, F32(s1 * F32(0.8))
    # Token 10: S = vmax * 2^(k0 - 1) = midpoint of codes c (mantissa 6, even) and c + 1.
    row = np.zeros(H)
    for b in range(H // 16):
        e = int(rng.integers(4, 16)) if b else 0            # one block in the subnormal range (e = 0)
        c = (e << 3) | 6
        mid = (E4M3_VALUES[c] + E4M3_VALUES[c + 1]) / 2
        vmax = mid * 2.0 ** (1 - k0)
        blk = rng.uniform(-0.9, 0.9, size=16) * vmax
        blk[int(rng.integers(16))] = vmax * (1 if rng.integers(2) else -1)
        row[16 * b:16 * b + 16] = blk
    hidden[10] = bf16_to_f32(bf16_bits(row.astype(F32)))
    # Token 11: block scale 2^j, every element an exact e2m1 grid point or tie times 2^(j - k1).
    grid = np.array([0.25, 0.75, 1.25, 1.75, 2.5, 3.5, 5.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 0.0])
    row = np.zeros(H)
    for b in range(H // 16):
        j = int(rng.integers(-9, 8))                          # -9..-7: subnormal scales
        blk = rng.choice(grid, size=16) * np.where(rng.integers(2, size=16) == 1, 1.0, -1.0)
        blk[int(rng.integers(16))] = 6.0
        row[16 * b:16 * b + 16] = blk * 2.0 ** (j - k1)
    hidden[11] = row.astype(F32)
    # Token 12 (expert 2): S one fp32 ulp below an e4m3 midpoint whose tie goes UP (mantissa 1 -> 1.5, c odd).
    # With X = fl(gs * vmax) = prev_float(6 mid), the exact X / 6 = mid - 2/3 ulp rounds to mid - ulp -> code c,
    # while X * fl(1/6) = mid - 0.37 ulp rounds to mid, a tie -> code c + 1; gs * fl(vmax / 6) also lands on
    # c + 1 for the configuration chosen. Searched: a bf16 vmax and a gs = 1 / input_scale (exactly, in fp32)
    # with fl(gs * vmax) = X; the other blocks use vmax * 2^d (everything scales exactly).
    ex2 = case.experts[2]
    gs_cal = 1.0 / float(max(ex2.input_scale["gate_proj"], ex2.input_scale["up_proj"]))
    best = None
    for e in range(1, 16):
        c = (e << 3) | 1
        mid = (E4M3_VALUES[c] + E4M3_VALUES[c + 1]) / 2
        X = np.nextafter(F32(6 * mid), F32(0))
        for m in range(128):
            vm = 1 + m / 128
            j = int(round(math.log2(float(X) / gs_cal / vm)))
            vmax = F32(vm * 2.0 ** j)
            g0 = int(F32(float(X) / float(vmax)).view(np.uint32))
            for g in np.array([g0 - 1, g0, g0 + 1], dtype=np.uint32).view(F32):
                ins = F32(1) / g
                if F32(g * vmax) != X or F32(1) / ins != g:
                    continue
                S, S1 = F32(X / F32(6)), F32(X * (F32(1) / F32(6)))
                S2 = F32(g * F32(vmax / F32(6)))
                if not (int(e4m3_encode(S)) == c and int(e4m3_encode(S1)) == c + 1 and int(e4m3_encode(S2)) == c + 1):
                    continue
                dist = abs(math.log(float(g) / gs_cal))
                if best is None or dist < best[0]:
                    best = (dist, e, float(vmax), ins)
    assert best is not None, "no near-tie input scale found"
    _, e2, vmax2, ins2 = best
    ex2.input_scale["gate_proj"] = ex2.input_scale["up_proj"] = ins2
    row = np.zeros(H)
    for b in range(H // 16):
        d = int(rng.integers(1 - e2, 16 - e2))                # stay within the normal binades (e2 + d in 1..15)
        vmax = vmax2 * 2.0 ** d
        blk = rng.uniform(-0.9, 0.9, size=16) * vmax
        blk[int(rng.integers(16))] = vmax * (1 if rng.integers(2) else -1)
        row[16 * b:16 * b + 16] = blk
    hidden[12] = bf16_to_f32(bf16_bits(row.astype(F32)))
    for t in (10, 11, 12):
        assert np.array_equal(bf16_to_f32(bf16_bits(hidden[t])), hidden[t]), "crafted row not bf16-exact"
    return hidden


def make_logits(case, rng, T):
    E, k = case.E, case.k
    for attempt in range(100):
        lg = (np.round(rng.standard_normal((T, E)) * 2.0 * 64) / 64).astype(F32)
        lg[0] = F32(0.5)                                   # all equal
        o = np.argsort(-lg[1].astype(np.float64), kind="stable")
        lg[1, o[k]] = lg[1, o[k - 1]]                      # tie at the selection boundary
        lg[2, 0] = lg[2, E - 1] = np.max(lg[2]) + F32(0.25)  # tied maxima at both ends
        lg[10, 0] = np.max(lg[10]) + F32(1.0)              # the crafted tokens go to experts 0 and 1
        lg[11, 1] = np.max(lg[11]) + F32(1.0)
        lg[12, 2] = np.max(lg[12]) + F32(1.0)
        if case.style == "deepseek":
            half, gsz = E // 2, E // case.n_group
            lg[3, half:] = lg[3, :half]                    # groups g and g + n_group/2 tie exactly (and experts)
            # A tie at the group-selection boundary: group 0 clearly best, groups 1 and 1 + n_group/2 equal
            # and next, the rest low; keeping topk_group = 2 groups must take group 1.
            lg[4] = F32(-3.0)
            lg[4, 0:gsz] = F32(3.0)
            lg[4, gsz:2 * gsz] = lg[4, half + gsz:half + 2 * gsz] = F32(1.0)
        if case.routing_margin_ok(lg):
            return lg
    raise RuntimeError("could not draw router logits without near-ties")


def make_given_routing(rng, T, E, k):
    ids = np.zeros((T, k), dtype=np.int32)
    w = np.zeros((T, k), dtype=F32)
    for t in range(T):
        ids[t] = rng.permutation(E)[:k]
        w[t] = rng.uniform(0.05, 1.0, size=k).astype(F32)
    ids[0, k - 1] = -1          # an unused last slot
    ids[1, 0] = -1              # an unused first slot
    ids[2, :] = -1              # a token routed nowhere (output: shared expert only, or zero)
    ids[3, k // 2] = -1
    for t, e in ((10, 0), (11, 1), (12, 2)):  # the crafted tokens reach experts 0, 1, 2
        if e not in ids[t]:
            ids[t, int(rng.integers(k))] = e
    return ids, w


# ============================================================================================ the driver
def compare(tag, ref, got):
    ref = ref.astype(np.float64)
    got = got.astype(np.float64)
    err = got - ref
    rms = math.sqrt(float(np.mean(ref ** 2)))
    rel_l2 = float(np.linalg.norm(err) / max(np.linalg.norm(ref), 1e-300))
    max_abs = float(np.max(np.abs(err))) if err.size else 0.0
    rms_ratio = math.sqrt(float(np.mean(got ** 2))) / rms if rms > 0 else 1.0
    # Per token as well, so that tokens with small outputs (the 1e-4-scaled one) are checked too; a token whose
    # reference is exactly zero (zero input, or no expert and no shared expert) must come out exactly zero.
    tok_ref = np.linalg.norm(ref, axis=1)
    tok_err = np.linalg.norm(err, axis=1)
    tok_rel = np.where(tok_ref > 0, tok_err / np.where(tok_ref > 0, tok_ref, 1.0), np.where(tok_err > 0, np.inf, 0.0))
    worst_tok = int(np.argmax(tok_rel)) if tok_rel.size else 0
    ok = (bool(np.all(np.isfinite(got))) and rel_l2 <= 1e-5 and max_abs <= 1e-4 * rms and
          0.99 <= rms_ratio <= 1.01 and float(np.max(tok_rel, initial=0.0)) <= 1e-4)
    worst = np.unravel_index(int(np.argmax(np.abs(err))), err.shape) if err.size else (0, 0)
    line = (f"{tag}: rel_l2 {rel_l2:.3e} (<= 1e-5), max_abs {max_abs:.3e} (<= {1e-4 * rms:.3e} = 1e-4*RMS), "
            f"rms_ratio {rms_ratio:.6f}, worst token t{worst_tok} rel {tok_rel[worst_tok]:.2e} (<= 1e-4), "
            f"worst element {tuple(int(i) for i in worst)}: ref {ref[worst]:.7g} got {got[worst]:.7g}")
    return ok, line


def self_checks(case):
    """The writer's own sanity: dequantized weights close to the originals; codes in range."""
    problems = []
    for e, ex in enumerate(case.experts + ([case.shared] if case.shared else [])):
        for p, w in ex.w.items():
            dq, ws2 = ex.dq(p)
            deq = dq * ws2
            rel = np.linalg.norm(deq - w) / max(np.linalg.norm(w), 1e-30)
            if not (rel < 0.2):
                problems.append(f"expert {e} {p}: dequantization rel err {rel:.3f}")
            if np.any(E4M3_VALUES[ex.q[p][1]] > 448) or np.any(ex.q[p][1] & 0x7F == 0x7F):
                problems.append(f"expert {e} {p}: bad block scale code")
    return problems


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--cli", default=os.environ.get("NVFP4MOE_CLI"))
    ap.add_argument("--workdir")
    ap.add_argument("--keep", action="store_true")
    ap.add_argument("--no-cli", action="store_true")
    ap.add_argument("--backend", default="cpu")
    ap.add_argument("--simulate", action="store_true",
                    help="compare against a plain numpy fp32 implementation instead of the CLI (tests this script)")
    args = ap.parse_args()
    if args.simulate:
        args.no_cli = False
    if not args.no_cli and not args.simulate and (not args.cli or not os.path.isfile(args.cli) or not os.access(args.cli, os.X_OK)):
        print(f"independent_layer: FAIL: no CLI executable (--cli / $NVFP4MOE_CLI = {args.cli!r})")
        return 2
    work = args.workdir or tempfile.mkdtemp(prefix="nvfp4moe-indep-")
    os.makedirs(work, exist_ok=True)
    if not args.keep and not args.workdir:
        import atexit
        atexit.register(shutil.rmtree, work, True)  # also when an exception ends the run

    T = 37
    cases = [
        Case("qwen3", "qwen", H=80, I=48, E=6, k=2, norm=True, seed=11),
        Case("qwen3_nonorm", "qwen", H=80, I=48, E=6, k=3, norm=False, seed=12, layers=1, moe_layer=0),
        Case("deepseek_v3", "deepseek", H=80, I=32, E=8, k=3, norm=True, seed=13, n_group=4, topk_group=2,
             scaling=2.5, n_shared=2, layers=2, moe_layer=1),
    ]
    failures, setup_errors, n_runs = [], [], 0
    for case in cases:
        rng = np.random.default_rng(case.seed + 1000)
        hidden_bf = bf16_bits(make_hidden(rng, T, case.H))
        hidden32 = bf16_to_f32(hidden_bf)
        case.set_input_scales(hidden32.astype(np.float64))
        hidden32 = craft_quantizer_ties(case, rng, hidden32.copy())
        hidden_bf = bf16_bits(hidden32)
        ckpt = os.path.join(work, case.name)
        nshards = case.write(ckpt)
        for p in self_checks(case):
            failures.append(f"{case.name}: writer self-check: {p}")
        # Own reader round trip of every shard.
        idx = json.load(open(os.path.join(ckpt, "model.safetensors.index.json")))
        back = {}
        for fname in sorted(set(idx["weight_map"].values())):
            back.update(read_safetensors(os.path.join(ckpt, fname)))
        assert set(back) == set(idx["weight_map"]), "index and shards disagree"
        ex0 = case.experts[0]
        assert np.array_equal(back[f"model.layers.{case.moe_layer}.mlp.experts.0.gate_proj.weight"][1], ex0.q["gate_proj"][0])

        logits = make_logits(case, rng, T)
        ids_l, w_l = case.route(logits)
        in1 = os.path.join(work, f"{case.name}_logits.safetensors")
        write_safetensors(in1, [("hidden", "BF16", [T, case.H], hidden_bf),
                                ("router_logits", "F32", [T, case.E], logits)])
        # Second input: f32 hidden (not bf16-representable: the layer rounds it first) + given routing.
        hidden_f32 = (hidden32 * (1 + rng.uniform(-2 ** -9, 2 ** -9, size=hidden32.shape))).astype(F32)
        hidden_f32[10:13] = hidden32[10:13]  # keep the crafted ties
        hidden2 = bf16_to_f32(bf16_bits(hidden_f32))
        ids_g, w_g = make_given_routing(rng, T, case.E, case.k)
        in2 = os.path.join(work, f"{case.name}_ids.safetensors")
        write_safetensors(in2, [("hidden", "F32", [T, case.H], hidden_f32), ("topk_ids", "I32", [T, case.k], ids_g),
                                ("topk_weights", "F32", [T, case.k], w_g)])
        print(f"{case.name}: {case.style} H={case.H} I={case.I} E={case.E} k={case.k} norm={case.norm} "
              f"shared={case.n_shared} layer={case.moe_layer}, {nshards} shards in {ckpt}")
        for inp, hid, ids, w, what in ((in1, hidden32, ids_l, w_l, "logits"), (in2, hidden2, ids_g, w_g, "ids")):
            for mode in ("w4a16", "w4a4"):
                tag = f"{case.name} {what} {mode}"
                ref_plain, st = reference_layer(case, hid, ids, w, mode)
                if args.no_cli:
                    ok = np.all(np.isfinite(ref_plain)) and float(np.sqrt(np.mean(ref_plain ** 2))) > 0
                    print(f"  {tag}: reference only: RMS {np.sqrt(np.mean(ref_plain ** 2)):.4g}, "
                          f"{st['ambiguous']} bf16-ambiguous intermediates" + ("" if ok else "  FAIL"))
                    if not ok:
                        failures.append(f"{tag}: reference produced non-finite or zero output")
                    continue
                outp = os.path.join(work, f"{case.name}_{what}_{mode}_out.safetensors")
                if args.simulate:
                    write_safetensors(outp, [("out", "F32", [T, case.H], fp32_layer(case, hid, ids, w, mode))])
                    cmd = ["true"]
                else:
                    cmd = [args.cli, "run", ckpt, "--layer", str(case.moe_layer), "--mode", mode, "--input", inp,
                           "--output", outp, "--backend", args.backend]
                r = subprocess.run(cmd, capture_output=True, text=True)
                n_runs += 1
                if r.returncode != 0:
                    setup_errors.append(f"{tag}: `{' '.join(cmd)}` exited {r.returncode}:\n{r.stdout}{r.stderr}")
                    print(f"  {tag}: CLI FAILED (exit {r.returncode})")
                    continue
                try:
                    got_t = read_safetensors(outp)
                except Exception as ex:  # missing, truncated or malformed output file
                    failures.append(f"{tag}: cannot read the CLI's --output {outp}: {type(ex).__name__}: {ex}")
                    print(f"  FAIL {tag}: cannot read the CLI's output ({type(ex).__name__})")
                    continue
                if "out" not in got_t or got_t["out"][0] != "F32" or got_t["out"][1].shape != (T, case.H):
                    desc = {n: (d, v.shape) for n, (d, v) in got_t.items()}
                    failures.append(f"{tag}: output file lacks 'out' F32 [{T}, {case.H}]: {desc}")
                    continue
                got = got_t["out"][1].astype(np.float64)
                ref, st = reference_layer(case, hid, ids, w, mode, cli_out=got)
                ok, line = compare(tag, ref, got)
                line += f"; {st['ambiguous']} bf16-ambiguous intermediates, {st['flipped']} taken the other way"
                if st["loose_tokens"]:
                    line += f", {st['loose_tokens']} slots with > 8 ambiguities"
                print(("  " if ok else "  FAIL ") + line)
                if not ok:
                    # Per-token view of the worst rows, for the report.
                    errs = np.linalg.norm(got - ref, axis=1) / np.maximum(np.linalg.norm(ref, axis=1), 1e-30)
                    worst = np.argsort(-errs)[:5]
                    line += "\n    worst tokens (rel err): " + ", ".join(f"t{int(t)}={errs[t]:.2e}" for t in worst)
                    failures.append(line)
    if setup_errors:
        for s in setup_errors:
            print("independent_layer: CLI ERROR: " + s)
    if failures:
        for f in failures:
            print("independent_layer: FAIL: " + f)
    if setup_errors or failures:
        print(f"independent_layer: FAILED ({len(failures)} comparison failures, {len(setup_errors)} CLI errors, "
              f"{n_runs} CLI runs)")
        return 1 if failures else 2
    print(f"independent_layer: PASS ({n_runs} {'simulated' if args.simulate else 'CLI'} runs)" if not args.no_cli else
          "independent_layer: PASS (writer + reference only, no CLI)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
