// NVFP4 numerics: e2m1 / e4m3 / bf16 codecs and the weight and activation quantizers, exactly as
// ../shared/docs/nvfp4-format.md (sections 2-4) defines them. Header-only and __host__ __device__ so the CPU
// reference and the CUDA kernels run the very same code; every function is bit-exact and branch-light.
//
// Non-finite policy (tested in tests/format):
//   e4m3_encode: NaN -> 0x7F (the e4m3fn NaN, sign kept); +-Inf and |x| >= 448 saturate to +-448 (0x7E / 0xFE).
//   e2m1_encode: +-Inf and |x| > 5 saturate to +-6; NaN -> 0x7 (+6, as PTX cvt.satfinite does for NaN into a
//                format without NaN). Weight quantization refuses non-finite weights at the API level instead.
//   bf16_from_float: NaN -> quiet NaN with the sign kept; Inf stays Inf.
#pragma once

#include <cstdint>
#include <cstring>
#include <cmath>

#if defined(__CUDACC__)
#define NVFP4_HD __host__ __device__ __forceinline__
#else
#define NVFP4_HD inline
#endif

namespace nvfp4moe::fmt {

inline constexpr int kBlock = 16;             // elements per block scale
inline constexpr float kE2m1Max = 6.0f;
inline constexpr float kE4m3Max = 448.0f;
inline constexpr float kWeightScaleDenom = 6.0f * 448.0f;  // amax / 2688 = weight_scale_2, input_scale

NVFP4_HD uint32_t float_bits(float f) {
#if defined(__CUDA_ARCH__)
  return __float_as_uint(f);
#else
  uint32_t u;
  std::memcpy(&u, &f, 4);
  return u;
#endif
}
NVFP4_HD float bits_float(uint32_t u) {
#if defined(__CUDA_ARCH__)
  return __uint_as_float(u);
#else
  float f;
  std::memcpy(&f, &u, 4);
  return f;
#endif
}

// IEEE single-precision add / multiply / fma, never contracted or reassociated: nvcc fuses a * b + c into one
// FMA by default (-fmad=true), which would change a result that must be bit-exact; on the host these are the
// plain operations (the build has no -ffast-math and no FMA contraction target).
NVFP4_HD float add_rn(float a, float b) {
#if defined(__CUDA_ARCH__)
  return __fadd_rn(a, b);
#else
  return a + b;
#endif
}
NVFP4_HD float mul_rn(float a, float b) {
#if defined(__CUDA_ARCH__)
  return __fmul_rn(a, b);
#else
  return a * b;
#endif
}
NVFP4_HD float fma_rn(float a, float b, float c) {
#if defined(__CUDA_ARCH__)
  return __fmaf_rn(a, b, c);
#else
  return std::fma(a, b, c);
#endif
}

// ---------------------------------------------------------------- e2m1 (4-bit: sign, 2 exponent, 1 mantissa)
// Magnitude of code & 7: 0, 0.5, 1, 1.5, 2, 3, 4, 6.
NVFP4_HD float e2m1_decode(uint8_t code) {
  const uint32_t mag = code & 7u;
  // (mag < 2) ? mag * 0.5 : (1 + (mag & 1) * 0.5) * 2^((mag >> 1) - 1); written branch-free via bits:
  // bit pattern of a normal value: exponent 127 + (mag>>1) - 1, mantissa (mag & 1) << 22.
  float v = (mag < 2u) ? 0.5f * static_cast<float>(mag)
                       : bits_float(((126u + (mag >> 1)) << 23) | ((mag & 1u) << 22));
  return (code & 8u) ? -v : v;
}

// Round to nearest even with saturation; the thresholds are nvfp4-format.md section 3 step 4.
// Sign bit set only for x < 0 (so -0.1 -> 0x8, -0.0 -> 0x0).
NVFP4_HD uint8_t e2m1_encode(float x) {
  if (x != x) return 0x7;  // NaN policy, see the file comment
  const float a = fabsf(x);
  uint8_t m;
  if (a <= 0.25f) m = 0;
  else if (a < 0.75f) m = 1;
  else if (a <= 1.25f) m = 2;
  else if (a < 1.75f) m = 3;
  else if (a <= 2.5f) m = 4;
  else if (a < 3.5f) m = 5;
  else if (a <= 5.0f) m = 6;
  else m = 7;
  return static_cast<uint8_t>(m | (x < 0.0f ? 8u : 0u));
}

// e2m1_decode(e2m1_encode(x)) without the code: the value x rounds to. On the e2m1 grid, round to nearest
// even is rounding to a multiple of the grid's spacing (0.5 below 2, 1 below 4, 2 above), then the saturation at
// 6 (fminf also maps NaN to 6, as e2m1_encode does) and the sign (x < 0 only, so -0.0 -> +0 and -0.1 -> -0, as
// the code 0x8 decodes). The rounding is done by the fp32 adder itself: (a + C) - C with C = spacing * 2^23
// (2^22, 2^23 or 2^24, whose ulp is the spacing) rounds a to nearest even on exactly the bits below the spacing,
// and the subtraction is exact; Inf stays Inf (then 6), NaN stays NaN (then 6). Per value: C selected (two
// compares, two selects) and two adds, where rint on a scaled value took the same compares, four selects, two
// multiplies and an FRND (and the earlier ternary of three rints a convergence region per value: docs/gemm.md,
// "The quantizing epilogue's branches"): the activation quantizers on the GPU run it per value. The same bits as
// the three-rint ternary for all 2^32 floats (tests/format/test_nvfp4.cpp, Shortcuts.EqualTheirDefinitionsFor-
// EveryFloat), and as decode(encode(x)) over every float with |x| in [2^-4, 2^4) and at the boundaries (same file).
NVFP4_HD float e2m1_round(float x) {
  const float a = fabsf(x);
  const float c = a < 2.0f ? 0x1p22f : (a < 4.0f ? 0x1p23f : 0x1p24f);  // NaN: 2^24, as the ternary's last arm
  float r = add_rn(add_rn(a, c), -c);
  r = fminf(r, 6.0f);
  return x < 0.0f ? -r : r;
}

// ---------------------------------------------------------------- e4m3fn (bias 7, max 448, NaN 0x7F/0xFF)
// Without a branch (the activation quantizers decode one scale per block in their serial scale chain): a normal
// code is its bits moved into place, (1 + m/8) 2^(e-7); a subnormal one, m 2^-9, is the normal pattern with
// exponent 2^-6, (1 + m/8) 2^-6, minus 2^-6 (exact: both in one binade). Equal to the former if-chain for all 256
// codes (tests/format/test_nvfp4.cpp).
NVFP4_HD float e4m3_decode(uint8_t code) {
  const uint32_t e = (code >> 3) & 0xFu, m = code & 7u;
  const bool subnormal = e == 0;
  const float pattern = bits_float(((subnormal ? 121u : e + 120u) << 23) | (m << 20));
  float v = add_rn(pattern, subnormal ? -0x1p-6f : 0.0f);                   // 2^-6 + m 2^-9 - 2^-6
  v = (code & 0x7Fu) == 0x7Fu ? bits_float(0x7FC00000u) : v;                // NaN
  return (code & 0x80u) ? -v : v;
}

// Round to nearest even, saturating to +-448 (satfinite), NaN -> 0x7F|sign. Integer ops, one fp32 add and
// selects, no branch: the quantizing epilogue computes one per batch and the gather one per 16 values, and
// ptxas had compiled the former if-chain into four convergence regions that nothing schedules across.
// - |x| >= 2^-6 (normal e4m3): the fp32 bits rounded to 3 mantissa bits, ties to even, as bf16_from_float
//   rounds to 7 (a carry rolls into the exponent, as it must); the exponent rebiased 127 -> 7 (-120 << 3);
//   saturated at 0x7E.
// - |x| < 2^-6 (subnormal e4m3, quantum 2^-9): |x| + 2^14 is |x| rounded to a multiple of 2^-9 by the fp32 add
//   itself (the ulp of 2^14 is 2^-9: the add rounds to nearest even on exactly the bits to drop), and its bits
//   minus those of 2^14 count the quanta, 0..8 (8 = 2^-6 is the code of the first normal: the same integer).
// Bit-identical to the former branchy form for all 2^32 inputs (tests/format/test_nvfp4.cpp).
NVFP4_HD uint8_t e4m3_encode(float x) {
  const uint32_t u = float_bits(x);
  const uint32_t sign = (u >> 24) & 0x80u;
  const uint32_t a = u & 0x7FFFFFFFu;
  const uint32_t rounded = (a + 0x7FFFFu + ((a >> 20) & 1u)) >> 20;  // (exponent << 3) + mantissa, rounded
  const uint32_t normal = rounded - (120u << 3) < 0x7Eu ? rounded - (120u << 3) : 0x7Eu;
  const uint32_t subnormal = float_bits(add_rn(bits_float(a), 16384.0f)) - 0x46800000u;  // 0x46800000 = 2^14
  uint32_t code = a >= 0x3C800000u ? normal : subnormal;  // 0x3C800000 = 2^-6
  code = a >= 0x43E00000u ? 0x7Eu : code;                 // >= 448, Inf included
  code = a > 0x7F800000u ? 0x7Fu : code;                  // NaN
  return static_cast<uint8_t>(code | sign);
}

// e4m3_encode(x / 6.0f) without the division, for every float x but NaN (NaN -> 0x7F, without its sign, as
// the GPU's division returns its canonical positive NaN): the block scale of an activation block is
// e4m3(gs * vmax / 6). The quotient is q0 = x * RN(1/6), corrected once by its exact remainder
// (fma(-q0, 6, x)): q = fma(r, RN(1/6), q0), three FMA-pipe instructions where the IEEE division is a
// reciprocal, a Newton step, the same three, and a range check that branches to a slow path (a convergence
// region). q is not always RN(x / 6) (subnormal quotients differ), but its e4m3 code always is that of RN(x / 6):
// checked for all 2^32 inputs (tests/format/test_nvfp4.cpp; q0 alone differs at 30 of them, exact ties).
// |x| is clamped to 8192 first (x / 6 > 448 saturates either way), which keeps Inf out of the FMAs.
NVFP4_HD uint8_t e4m3_encode_div6(float x) {
  const uint32_t u = float_bits(x);
  const uint32_t a = u & 0x7FFFFFFFu;
  const bool nan = a > 0x7F800000u;
  const float m = bits_float(nan || a < 0x46000000u ? a : 0x46000000u);  // 0x46000000 = 8192
  constexpr float kSixth = 1.0f / 6.0f;
  const float q0 = mul_rn(m, kSixth);
  const float q = fma_rn(fma_rn(-q0, 6.0f, m), kSixth, q0);
  // (a NaN's sign may flip in the fmas on the host: the code is taken without it)
  return static_cast<uint8_t>((e4m3_encode(q) & 0x7Fu) | (nan ? 0u : (u >> 24) & 0x80u));
}

// ---------------------------------------------------------------- bf16
NVFP4_HD uint16_t bf16_from_float(float f) {
  const uint32_t u = float_bits(f);
  if ((u & 0x7FFFFFFFu) > 0x7F800000u) return static_cast<uint16_t>((u >> 16) | 0x40u);
  return static_cast<uint16_t>((u + 0x7FFFu + ((u >> 16) & 1u)) >> 16);
}
NVFP4_HD float bf16_to_float(uint16_t h) { return bits_float(static_cast<uint32_t>(h) << 16); }
// The bf16 bits of a value that already is a bf16 number: a bf16_round result (a NaN among them quiet, bit 22
// set) or an exact e2m1 * e4m3 product (a NaN from a NaN scale is quiet as well). The top half of its fp32
// bits, which bf16_from_float would return too after its rounding add and NaN check: the epilogues that
// store such values save those ~5 instructions per value. Equal to bf16_from_float for every bf16_round result
// and every e2m1 x e4m3 product (tests/format/test_nvfp4.cpp).
NVFP4_HD uint16_t bf16_bits_exact(float v) { return static_cast<uint16_t>(float_bits(v) >> 16); }
// Two such values as one bf16x2 word (lo in the low half): the operand rows the kernels store 16 bytes at a time.
NVFP4_HD uint32_t bf16x2_bits_exact(float lo, float hi) {
  return (float_bits(lo) >> 16) | (float_bits(hi) & 0xFFFF0000u);
}
NVFP4_HD float bf16_round(float f) { return bf16_to_float(bf16_from_float(f)); }

// ---------------------------------------------------------------- packing (element 2i in the low nibble)
NVFP4_HD uint8_t pack_e2m1x2(uint8_t even, uint8_t odd) {
  return static_cast<uint8_t>(((odd & 0xFu) << 4) | (even & 0xFu));
}
NVFP4_HD uint8_t unpack_e2m1(const uint8_t* packed, int64_t k) {
  return static_cast<uint8_t>((packed[k >> 1] >> ((k & 1) * 4)) & 0xFu);
}

// ---------------------------------------------------------------- weight quantizer (section 3)
// weight_scale_2 from the tensor amax. An all-zero tensor gets 1.0 (policy: any positive value decodes the
// zero codes to zero; 1.0 keeps the block-scale arithmetic finite).
NVFP4_HD float weight_global_scale(float amax) { return amax > 0.0f ? amax / kWeightScaleDenom : 1.0f; }

// Block scale code for one block of weights with max |w| = block_amax.
NVFP4_HD uint8_t weight_block_scale(float block_amax, float weight_scale_2) {
  float s = block_amax / (6.0f * weight_scale_2);
  if (s == 0.0f) s = 1.0f;
  return e4m3_encode(s);
}

// Quantizes one block of (up to) 16 weights; codes[i] for i < n. Returns the block scale code.
NVFP4_HD uint8_t quantize_weight_block(const float* w, int n, float weight_scale_2, uint8_t* codes) {
  float amax = 0.0f;
  for (int i = 0; i < n; ++i) amax = fmaxf(amax, fabsf(w[i]));
  const uint8_t s8 = weight_block_scale(amax, weight_scale_2);
  const float denom = e4m3_decode(s8) * weight_scale_2;
  for (int i = 0; i < n; ++i) codes[i] = e2m1_encode(w[i] / denom);
  return s8;
}

// ---------------------------------------------------------------- activation quantizer (section 4)
// Fixed global scale gs = 1 / input_scale. Exact division, in the order nvfp4-format.md writes it.
NVFP4_HD float activation_global_scale(float input_scale) { return 1.0f / input_scale; }

// e4m3((gs * vmax) / 6): the product, then the division by 6 done by e4m3_encode_div6 (the same code as the
// IEEE quotient's for every product).
NVFP4_HD uint8_t activation_block_scale(float block_vmax, float gs) { return e4m3_encode_div6(gs * block_vmax); }

NVFP4_HD float activation_block_output_scale_of(float sff, float gs) { return sff != 0.0f ? 1.0f / (sff / gs) : 0.0f; }
NVFP4_HD float activation_block_output_scale(uint8_t sf, float gs) {
  return activation_block_output_scale_of(e4m3_decode(sf), gs);
}

// The three numbers every user of one block's scale needs: the e4m3 code, its value, and the output scale
// the values are multiplied by before the e2m1 rounding (sections 4.4 and 4.5). The code is decoded once.
struct ActivationBlockScale {
  uint8_t code;
  float value;
  float output_scale;
};
NVFP4_HD ActivationBlockScale activation_block_scales(float block_vmax, float gs) {
  const uint8_t sf = activation_block_scale(block_vmax, gs);
  const float sff = e4m3_decode(sf);
  return {sf, sff, activation_block_output_scale_of(sff, gs)};
}

// Quantizes one block of n <= 16 activations. Returns the block scale code; codes[i] for i < n.
NVFP4_HD uint8_t quantize_activation_block(const float* x, int n, float gs, uint8_t* codes) {
  float vmax = 0.0f;
  for (int i = 0; i < n; ++i) vmax = fmaxf(vmax, fabsf(x[i]));
  const ActivationBlockScale sc = activation_block_scales(vmax, gs);
  for (int i = 0; i < n; ++i) codes[i] = e2m1_encode(x[i] * sc.output_scale);
  return sc.code;
}

// The GEMM operand an NVFP4 element becomes on Hopper: code * block scale, exact in bf16 (2 x 4 significant
// bits). The per-tensor factor (weight_scale_2, input_scale) is applied in fp32 after the K reduction.
NVFP4_HD float dequant_operand(uint8_t code, uint8_t scale_code) { return e2m1_decode(code) * e4m3_decode(scale_code); }

}  // namespace nvfp4moe::fmt
