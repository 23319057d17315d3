// Tests of src/format/nvfp4.h: the e2m1 / e4m3 / bf16 codecs and the weight and activation quantizers.
//
// Three layers of checking (docs/numerics.md, "How it is tested"):
//   1. exhaustive over small domains: all 16 e2m1 codes, all 256 e4m3 codes, every e2m1 and e4m3 rounding
//      tie with its nextafter neighbours, every e2m1 x e4m3 product;
//   2. the documented edge-case policies: saturation, NaN/Inf, -0, zero blocks, amax exactly 6*448, all-zero
//      tensors, bf16 ties / NaN / overflow;
//   3. >= 1e7 random values and random 16-element blocks compared bit-exactly against a second implementation
//      in this file (namespace ref) written the slow, obvious way: nearest-value search in double over the
//      decoded code tables with ties to the even code, and bf16 by comparing the two neighbouring bf16 values
//      in double.
#include <gtest/gtest.h>

#include <algorithm>
#include <array>
#include <atomic>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <mutex>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "format/nvfp4.h"

namespace {

namespace fmt = nvfp4moe::fmt;

float f_from_bits(uint32_t u) {
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}
uint32_t bits_of(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  return u;
}
std::string hexf(float f) {
  std::ostringstream os;
  os.precision(9);
  os << f << " (0x" << std::hex << bits_of(f) << ")";
  return os.str();
}
const float kInf = std::numeric_limits<float>::infinity();
const float kNaN = std::numeric_limits<float>::quiet_NaN();

// ===================================================================================== the second implementation
namespace ref {

// e2m1 magnitudes by code & 7, written out (nvfp4-format.md section 2).
constexpr std::array<double, 8> kE2m1 = {0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0};

double e2m1_value(int code) { return (code & 8) ? -kE2m1[code & 7] : kE2m1[code & 7]; }

// Nearest of the 8 magnitudes, ties to the even code (= even mantissa bit); anything past 6 (Inf included) is 6;
// sign only for x < 0; NaN -> 0x7 (the header's documented policy).
uint8_t e2m1_encode(float x) {
  if (std::isnan(x)) return 0x7;
  const uint8_t sign = x < 0.0f ? 8 : 0;
  const double a = std::fabs(static_cast<double>(x));
  if (a >= 6.0) return 7 | sign;  // satfinite (also keeps the distances below exact in double)
  int best = 0;
  double bestd = a;
  for (int c = 1; c < 8; ++c) {
    const double d = std::fabs(a - kE2m1[c]);
    if (d < bestd || (d == bestd && (c % 2 == 0))) {
      best = c;
      bestd = d;
    }
  }
  return static_cast<uint8_t>(best | sign);
}

// e4m3fn value of a code from its definition: bias 7, subnormals m * 2^-9, 0x7F/0xFF NaN.
double e4m3_value(int code) {
  const int e = (code >> 3) & 15, m = code & 7;
  if ((code & 0x7F) == 0x7F) return std::numeric_limits<double>::quiet_NaN();
  const double v = (e == 0) ? std::ldexp(m, -9) : std::ldexp(8 + m, e - 10);  // (1 + m/8) 2^(e-7)
  return (code & 0x80) ? -v : v;
}

struct E4m3Table {
  std::array<double, 127> mag;  // codes 0x00..0x7E, ascending
  E4m3Table() {
    for (int c = 0; c < 127; ++c) mag[c] = e4m3_value(c);
  }
};
const E4m3Table kE4m3;

// Brute force: nearest finite e4m3 magnitude, ties to the even code; values from 448 up (Inf included)
// saturate to 448; NaN -> 0x7F with the sign. The sign bit is the float's (so
// -0.0 and tiny negatives give 0x80).
uint8_t e4m3_encode(float x) {
  const uint8_t sign = std::signbit(x) ? 0x80 : 0;
  if (std::isnan(x)) return 0x7F | sign;
  const double a = std::fabs(static_cast<double>(x));
  if (a >= 448.0) return 0x7E | sign;  // satfinite, Inf included (keeps the distances below exact in double)
  int best = 0;
  double bestd = a;
  for (int c = 1; c < 127; ++c) {
    const double d = std::fabs(a - kE4m3.mag[c]);
    if (d < bestd || (d == bestd && (c % 2 == 0))) {
      best = c;
      bestd = d;
    }
    if (kE4m3.mag[c] - a > bestd) break;  // ascending table: nothing closer beyond
  }
  return static_cast<uint8_t>(best | sign);
}

// bf16 value of 16 bits in double; the all-ones exponent with mantissa 0 stands for 2^128 (the rounding
// target "one step past the max", which IEEE overflow turns into Inf).
double bf16_value(uint16_t h) {
  const int s = h >> 15, e = (h >> 7) & 0xFF, m = h & 0x7F;
  const double v = (e == 0) ? std::ldexp(m, -133) : std::ldexp(128 + m, e - 134);
  return s ? -v : v;
}

// bf16 round-to-nearest-even by comparing the two neighbouring bf16 values in double.
uint16_t bf16_from_float(float f) {
  const uint32_t u = bits_of(f);
  if (std::isnan(f)) return static_cast<uint16_t>((u >> 16) | 0x40);  // quiet NaN, sign kept
  if (std::isinf(f)) return static_cast<uint16_t>(u >> 16);
  const uint16_t lo = static_cast<uint16_t>(u >> 16);  // truncation toward zero
  const uint16_t hi = static_cast<uint16_t>(lo + 1);   // next magnitude up (0x7F80 = Inf as 2^128)
  const double x = std::fabs(static_cast<double>(f));
  const double dlo = x - std::fabs(bf16_value(lo)), dhi = std::fabs(bf16_value(hi)) - x;
  if (dlo < dhi) return lo;
  if (dhi < dlo) return hi;
  return (lo & 1) ? hi : lo;
}

// The quantizers, straight from nvfp4-format.md sections 3 and 4, on the reference codecs.
uint8_t weight_block(const float* w, int n, float ws2, uint8_t* codes) {
  float amax = 0.0f;
  for (int i = 0; i < n; ++i) amax = std::max(amax, std::fabs(w[i]));
  float s = amax / (6.0f * ws2);
  if (s == 0.0f) s = 1.0f;
  const uint8_t s8 = e4m3_encode(s);
  const float denom = static_cast<float>(e4m3_value(s8)) * ws2;
  for (int i = 0; i < n; ++i) codes[i] = e2m1_encode(w[i] / denom);
  return s8;
}

uint8_t activation_block(const float* x, int n, float gs, uint8_t* codes) {
  float vmax = 0.0f;
  for (int i = 0; i < n; ++i)
    if (std::fabs(x[i]) > vmax) vmax = std::fabs(x[i]);  // NaN never wins a comparison
  const float S = (gs * vmax) / 6.0f;
  const uint8_t sf = e4m3_encode(S);
  const float sff = static_cast<float>(e4m3_value(sf));
  const float os = (sff != 0.0f) ? 1.0f / (sff / gs) : 0.0f;
  for (int i = 0; i < n; ++i) codes[i] = e2m1_encode(x[i] * os);
  return sf;
}

}  // namespace ref

// ===================================================================================== random helpers
uint64_t mix64(uint64_t x) {  // splitmix64 finalizer: a counter-based generator, identical under any threading
  x += 0x9E3779B97F4A7C15ull;
  x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
  x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
  return x ^ (x >> 31);
}
struct Rng {
  uint64_t s;
  explicit Rng(uint64_t seed) : s(mix64(seed)) {}
  uint64_t next() { return s = mix64(s); }
  uint32_t u32() { return static_cast<uint32_t>(next() >> 32); }
  int range(int lo, int hi) { return lo + static_cast<int>(next() % static_cast<uint64_t>(hi - lo + 1)); }
  double unit() { return static_cast<double>(next() >> 11) * 0x1.0p-53; }
};

// A float with exponent field in [elo, ehi], random sign and mantissa; a third of them with only the top 3..5
// mantissa bits (exact ties of e4m3 / e2m1 / grid values) and some of those moved by one ulp either way.
float random_float(Rng& r, uint32_t elo, uint32_t ehi) {
  const uint32_t e = static_cast<uint32_t>(r.range(static_cast<int>(elo), static_cast<int>(ehi)));
  uint32_t m = r.u32() & 0x7FFFFFu;
  const int kind = r.range(0, 8);
  if (kind <= 2) m &= ~((1u << (23 - r.range(2, 5))) - 1u);
  uint32_t u = (e << 23) | m | (r.u32() & 0x80000000u);
  if (kind == 1) u += 1;
  if (kind == 2 && (u & 0x7FFFFFFFu) > 0) u -= 1;
  return f_from_bits(u);
}

// Runs check(i) for i in [0, n) on all OpenMP threads; reports the count and the first few failures.
template <typename F>
void parallel_check(const char* what, int64_t n, F check) {
  std::atomic<int64_t> bad{0};
  std::mutex mu;
  std::vector<std::string> first;
#pragma omp parallel for schedule(static, 4096)
  for (int64_t i = 0; i < n; ++i) {
    std::string msg;
    if (!check(i, &msg)) {
      if (bad.fetch_add(1) < 5) {
        std::lock_guard<std::mutex> lock(mu);
        first.push_back(msg);
      }
    }
  }
  for (const auto& m : first) ADD_FAILURE() << what << ": " << m;
  EXPECT_EQ(bad.load(), 0) << what << ": mismatches out of " << n;
}

// ===================================================================================== e2m1
TEST(E2m1, AllSixteenCodesDecodeToTheTable) {
  const float table[16] = {0.0f,  0.5f,  1.0f,  1.5f,  2.0f,  3.0f,  4.0f,  6.0f,
                           -0.0f, -0.5f, -1.0f, -1.5f, -2.0f, -3.0f, -4.0f, -6.0f};
  for (int c = 0; c < 16; ++c) {
    const float v = fmt::e2m1_decode(static_cast<uint8_t>(c));
    EXPECT_EQ(bits_of(v), bits_of(table[c])) << "code " << c;  // bitwise: code 8 is -0.0
    EXPECT_EQ(static_cast<double>(v), ref::e2m1_value(c)) << "code " << c;
  }
  // Only the low nibble counts.
  for (int c = 16; c < 256; ++c)
    EXPECT_EQ(bits_of(fmt::e2m1_decode(static_cast<uint8_t>(c))), bits_of(table[c & 15])) << "byte " << c;
}

TEST(E2m1, CodesReencodeToThemselvesExceptNegativeZero) {
  for (int c = 0; c < 16; ++c) {
    const uint8_t back = fmt::e2m1_encode(fmt::e2m1_decode(static_cast<uint8_t>(c)));
    // -0 policy: the sign is set only for x < 0, so -0.0 (code 8) encodes to code 0.
    EXPECT_EQ(back, c == 8 ? 0 : c) << "code " << c;
  }
  EXPECT_EQ(fmt::e2m1_encode(-0.0f), 0);
  EXPECT_EQ(fmt::e2m1_encode(-0.1f), 8);  // a negative value that rounds to zero keeps its sign: code 8
  EXPECT_EQ(fmt::e2m1_encode(-0.25f), 8);
  EXPECT_EQ(fmt::e2m1_encode(-1e-30f), 8);
}

TEST(E2m1, EveryTieAndItsNeighbours) {
  struct Tie { float x; uint8_t at, below, above; };
  // Midpoints of adjacent magnitudes; the tie goes to the even code.
  const Tie ties[] = {
      {0.25f, 0, 0, 1}, {0.75f, 2, 1, 2}, {1.25f, 2, 2, 3}, {1.75f, 4, 3, 4},
      {2.5f, 4, 4, 5},  {3.5f, 6, 5, 6},  {5.0f, 6, 6, 7},
  };
  for (const Tie& t : ties) {
    for (int s = 0; s < 2; ++s) {
      const float x = s ? -t.x : t.x;
      const uint8_t sg = s ? 8 : 0;
      const float toward0 = std::nextafter(x, 0.0f), away = std::nextafter(x, s ? -kInf : kInf);
      EXPECT_EQ(fmt::e2m1_encode(x), t.at | sg) << hexf(x);
      EXPECT_EQ(fmt::e2m1_encode(toward0), t.below | sg) << hexf(toward0);
      EXPECT_EQ(fmt::e2m1_encode(away), t.above | sg) << hexf(away);
      EXPECT_EQ(ref::e2m1_encode(x), t.at | sg) << hexf(x);
      EXPECT_EQ(ref::e2m1_encode(toward0), t.below | sg) << hexf(toward0);
      EXPECT_EQ(ref::e2m1_encode(away), t.above | sg) << hexf(away);
    }
  }
}

TEST(E2m1, SaturationAndNonFinitePolicy) {
  for (float x : {6.0f, 6.5f, 7.0f, 100.0f, 1e30f, std::numeric_limits<float>::max(), kInf}) {
    EXPECT_EQ(fmt::e2m1_encode(x), 0x7) << hexf(x);
    EXPECT_EQ(fmt::e2m1_encode(-x), 0xF) << hexf(-x);
  }
  // NaN (either sign, quiet or signaling) -> 0x7, i.e. +6 (what PTX cvt.rn.satfinite.e2m1x2 does).
  for (uint32_t u : {0x7FC00000u, 0xFFC00000u, 0x7F800001u, 0xFFFFFFFFu})
    EXPECT_EQ(fmt::e2m1_encode(f_from_bits(u)), 0x7) << std::hex << u;
  // Tiny and float-subnormal values are zero.
  EXPECT_EQ(fmt::e2m1_encode(f_from_bits(1)), 0);
  EXPECT_EQ(fmt::e2m1_encode(0.0f), 0);
}

// e2m1_round's one-rint form (the grid spacing as a selected power of two, then its inverse) against the
// three-rint ternary it replaced (whose three FRND ptxas compiled into branches, one convergence region per value
// in the GPU quantizers): the same bits for all 2^32 floats, NaNs included.
// The shortcuts the GPU kernels take, each against the form it replaced or the operation it stands for, for all
// 2^32 floats in one threaded pass (one pass: ~25 s on 2 cores for all four, where four passes took ~60):
//   - e2m1_round: the rounding by the fp32 adder ((a + C) - C), against the three-rint ternary it replaced;
//   - e4m3_encode: the branch-free form, against the former integer if-chain (kept below, itself checked
//     against the brute-force ref::e4m3_encode at every tie and on random values by the tests further down);
//   - e4m3_encode_div6(x): against e4m3_encode(x / 6.0f) (the IEEE division), NaN -> 0x7F;
//   - bf16_bits_exact: against bf16_from_float on every bf16_round result.
// Each fails on a one-constant mutation of its shortcut (checked when each was written).
uint8_t e4m3_encode_if_chain(float x) {
  const uint32_t u = bits_of(x);
  const uint8_t sign = static_cast<uint8_t>((u >> 24) & 0x80u);
  const uint32_t a = u & 0x7FFFFFFFu;
  if (a > 0x7F800000u) return static_cast<uint8_t>(0x7Fu | sign);
  if (a >= 0x43E00000u) return static_cast<uint8_t>(0x7Eu | sign);
  uint32_t code;
  if (a < 0x3C800000u) {
    const uint32_t exp = a >> 23;
    if (exp < 110u) return sign;
    const uint32_t sig = (a & 0x7FFFFFu) | 0x800000u;
    const uint32_t shift = 150u - 9u - exp;
    const uint32_t q = sig >> shift;
    const uint32_t rem = sig & ((1u << shift) - 1u);
    const uint32_t half = 1u << (shift - 1u);
    code = q + ((rem > half || (rem == half && (q & 1u))) ? 1u : 0u);
  } else {
    const uint32_t exp = (a >> 23) - 127u + 7u;
    const uint32_t mant = a & 0x7FFFFFu;
    uint32_t keep = mant >> 20;
    const uint32_t rem = mant & 0xFFFFFu;
    if (rem > 0x80000u || (rem == 0x80000u && (keep & 1u))) ++keep;
    code = (exp << 3) + keep;
    if (code > 0x7Eu) code = 0x7Eu;
  }
  return static_cast<uint8_t>(code | sign);
}

// e4m3_decode (branch-free) against the if-chain it replaced, for all 256 codes, bit for bit (NaN included).
TEST(Shortcuts, E4m3DecodeIsTheIfChainForEveryCode) {
  for (int c = 0; c < 256; ++c) {
    const uint32_t e = (c >> 3) & 0xFu, m = c & 7u;
    float v;
    if ((c & 0x7F) == 0x7F) v = f_from_bits(0x7FC00000u);
    else if (e == 0) v = static_cast<float>(m) * 0.001953125f;
    else v = f_from_bits(((e + 120u) << 23) | (m << 20));
    if (c & 0x80) v = -v;
    EXPECT_EQ(bits_of(fmt::e4m3_decode(static_cast<uint8_t>(c))), bits_of(v)) << "code " << c;
  }
}

TEST(Shortcuts, EqualTheirDefinitionsForEveryFloat) {
  auto ternary = [](float x) {
    const float a = std::fabs(x);
    float r = a < 2.0f ? std::rint(2.0f * a) * 0.5f : a < 4.0f ? std::rint(a) : 2.0f * std::rint(0.5f * a);
    r = std::fmin(r, 6.0f);
    return x < 0.0f ? -r : r;
  };
  constexpr int kChecks = 4;
  const char* const names[kChecks] = {"e2m1_round vs the three-rint ternary", "e4m3_encode vs the if-chain",
                                      "e4m3_encode_div6(x) vs e4m3_encode(x / 6)",
                                      "bf16_bits_exact vs bf16_from_float of bf16_round(x)"};
  const unsigned workers = std::max(1u, std::thread::hardware_concurrency());
  std::vector<std::array<uint64_t, kChecks>> bad(workers);
  std::vector<std::array<uint32_t, kChecks>> first_bad(workers);
  std::vector<std::thread> pool;
  for (unsigned w = 0; w < workers; ++w)
    pool.emplace_back([&, w] {
      bad[w].fill(0);
      first_bad[w].fill(0);
      auto record = [&](int check, bool ok, uint64_t i) {
        if (!ok && bad[w][check]++ == 0) first_bad[w][check] = static_cast<uint32_t>(i);
      };
      const uint64_t begin = (uint64_t{1} << 32) * w / workers, end = (uint64_t{1} << 32) * (w + 1) / workers;
      for (uint64_t i = begin; i < end; ++i) {
        const float x = f_from_bits(static_cast<uint32_t>(i));
        record(0, fmt::float_bits(fmt::e2m1_round(x)) == fmt::float_bits(ternary(x)), i);
        record(1, fmt::e4m3_encode(x) == e4m3_encode_if_chain(x), i);
        record(2, fmt::e4m3_encode_div6(x) == (std::isnan(x) ? 0x7F : fmt::e4m3_encode(x / 6.0f)), i);
        const float b = fmt::bf16_round(x);
        record(3, fmt::bf16_bits_exact(b) == fmt::bf16_from_float(b) && fmt::bf16_bits_exact(b) == fmt::bf16_from_float(x),
               i);
      }
    });
  for (auto& t : pool) t.join();
  for (int c = 0; c < kChecks; ++c)
    for (unsigned w = 0; w < workers; ++w)
      EXPECT_EQ(bad[w][c], 0u) << names[c] << ": first mismatch at bits 0x" << std::hex << first_bad[w][c];
}

// bf16_bits_exact on the other values the quantizing epilogue stores: every e2m1 value (both signs, -0 included)
// times every e4m3 value (NaN included): the product is exact in bf16 (or a quiet NaN), so its top 16 bits are
// what bf16_from_float returns.
TEST(Bf16, BitsExactIsBf16FromFloatOnEveryE2m1TimesE4m3Product) {
  for (int c = 0; c < 16; ++c)
    for (int s = 0; s < 256; ++s) {
      const float v = fmt::e2m1_decode(static_cast<uint8_t>(c)) * fmt::e4m3_decode(static_cast<uint8_t>(s));
      EXPECT_EQ(fmt::bf16_bits_exact(v), fmt::bf16_from_float(v)) << "e2m1 code " << c << " e4m3 code " << s;
      const float w = -v;  // the other half of a pair
      EXPECT_EQ(fmt::bf16x2_bits_exact(v, w), fmt::bf16_from_float(v) | (uint32_t{fmt::bf16_from_float(w)} << 16));
    }
  for (float v : {6.0f, -6.0f, 0.0f, -0.0f})  // e2m1_round's outputs times a NaN scale
    EXPECT_EQ(fmt::bf16_bits_exact(v * kNaN), fmt::bf16_from_float(v * kNaN));
}

// e2m1_round (the GPU quantizers' shortcut) is bit-identical to decode(encode(x)): every float with |x| in
// [2^-4, 2^4) (both signs: the whole range where the grid is not just 0 or 6), every power of two around it,
// the specials, and a sweep of the rest of the exponent range.
TEST(E2m1, RoundEqualsDecodeOfEncodeForEveryRelevantFloat) {
  auto check = [](float x) {
    const float want = fmt::e2m1_decode(fmt::e2m1_encode(x)), got = fmt::e2m1_round(x);
    return fmt::float_bits(want) == fmt::float_bits(got);
  };
  uint64_t bad = 0;
  uint32_t first_bad = 0;
  for (uint32_t sign = 0; sign < 2; ++sign)
    for (uint32_t e = 127 - 4; e < 127 + 4; ++e)
      for (uint32_t m = 0; m < (1u << 23); ++m) {
        const uint32_t u = (sign << 31) | (e << 23) | m;
        if (!check(f_from_bits(u)) && bad++ == 0) first_bad = u;
      }
  EXPECT_EQ(bad, 0u) << "first mismatch at bits 0x" << std::hex << first_bad;
  for (uint32_t sign = 0; sign < 2; ++sign)
    for (uint32_t e = 0; e < 255; ++e)
      for (uint32_t m : {0u, 1u, 0x3FFFFFu, 0x400000u, 0x400001u, 0x7FFFFFu, 0x123457u}) {
        const uint32_t u = (sign << 31) | (e << 23) | m;
        EXPECT_TRUE(check(f_from_bits(u))) << std::hex << u;
      }
  for (uint32_t u : {0x00000000u, 0x80000000u, 0x7F800000u, 0xFF800000u, 0x7FC00000u, 0xFFC00000u, 0x7F800001u,
                     0xFFFFFFFFu, 0x00000001u, 0x80000001u})
    EXPECT_TRUE(check(f_from_bits(u))) << std::hex << u;
}

TEST(E2m1, PackingPutsEvenElementInTheLowNibble) {
  for (int a = 0; a < 16; ++a)
    for (int b = 0; b < 16; ++b) {
      const uint8_t byte = fmt::pack_e2m1x2(static_cast<uint8_t>(a), static_cast<uint8_t>(b));
      ASSERT_EQ(byte, (b << 4) | a);
      const uint8_t buf[2] = {byte, static_cast<uint8_t>(~byte)};
      EXPECT_EQ(fmt::unpack_e2m1(buf, 0), a);
      EXPECT_EQ(fmt::unpack_e2m1(buf, 1), b);
      EXPECT_EQ(fmt::unpack_e2m1(buf, 2), (~byte) & 15);
      EXPECT_EQ(fmt::unpack_e2m1(buf, 3), ((~byte) >> 4) & 15);
    }
  // Upper bits of the inputs are ignored.
  EXPECT_EQ(fmt::pack_e2m1x2(0xF3, 0xA5), 0x53);
}

// ===================================================================================== e4m3
TEST(E4m3, All256CodesDecodeAndRoundTrip) {
  for (int c = 0; c < 256; ++c) {
    const uint8_t code = static_cast<uint8_t>(c);
    const float v = fmt::e4m3_decode(code);
    if ((c & 0x7F) == 0x7F) {
      EXPECT_TRUE(std::isnan(v)) << "code " << c;
      EXPECT_EQ(fmt::e4m3_encode(v), c) << "NaN code " << c << " must encode back to 0x7F|sign";
      continue;
    }
    EXPECT_EQ(static_cast<double>(v), ref::e4m3_value(c)) << "code " << c;
    EXPECT_EQ(std::signbit(v), (c & 0x80) != 0) << "code " << c;  // 0x80 is -0.0
    EXPECT_EQ(fmt::e4m3_encode(v), c) << "code " << c << " value " << hexf(v);
  }
  EXPECT_EQ(fmt::e4m3_decode(0x7E), 448.0f);
  EXPECT_EQ(fmt::e4m3_decode(0x08), 0x1.0p-6f);  // smallest normal
  EXPECT_EQ(fmt::e4m3_decode(0x07), 0x1.cp-7f);  // largest subnormal 7 * 2^-9
  EXPECT_EQ(fmt::e4m3_decode(0x01), 0x1.0p-9f);  // smallest subnormal
  EXPECT_EQ(fmt::e4m3_decode(0x38), 1.0f);
}

TEST(E4m3, NaNEncodesTo7FWithSign) {
  for (uint32_t u : {0x7FC00000u, 0x7F800001u, 0x7FFFFFFFu, 0x7FA00000u})
    EXPECT_EQ(fmt::e4m3_encode(f_from_bits(u)), 0x7F) << std::hex << u;
  for (uint32_t u : {0xFFC00000u, 0xFF800001u, 0xFFFFFFFFu})
    EXPECT_EQ(fmt::e4m3_encode(f_from_bits(u)), 0xFF) << std::hex << u;
}

TEST(E4m3, EveryMidpointAndItsNeighbours) {
  // All 126 pairs of adjacent finite magnitudes (subnormal and normal, 0..448); the midpoint has 5
  // significant bits, exact in fp32.
  int checked = 0;
  for (int c = 0; c < 0x7E; ++c) {
    const float lo = static_cast<float>(ref::e4m3_value(c)), hi = static_cast<float>(ref::e4m3_value(c + 1));
    const float mid = static_cast<float>((static_cast<double>(lo) + hi) / 2);
    ASSERT_EQ(static_cast<double>(mid), (static_cast<double>(lo) + hi) / 2);
    const int even = (c % 2 == 0) ? c : c + 1;
    for (int s = 0; s < 2; ++s) {
      const uint8_t sg = s ? 0x80 : 0;
      const float x = s ? -mid : mid;
      const float below = std::nextafter(x, 0.0f), above = std::nextafter(x, s ? -kInf : kInf);
      EXPECT_EQ(fmt::e4m3_encode(x), even | sg) << "midpoint of codes " << c << "," << c + 1 << " " << hexf(x);
      EXPECT_EQ(fmt::e4m3_encode(below), c | sg) << hexf(below);
      EXPECT_EQ(fmt::e4m3_encode(above), (c + 1) | sg) << hexf(above);
      EXPECT_EQ(ref::e4m3_encode(x), even | sg) << hexf(x);
      EXPECT_EQ(ref::e4m3_encode(below), c | sg) << hexf(below);
      EXPECT_EQ(ref::e4m3_encode(above), (c + 1) | sg) << hexf(above);
      // The exact code values and their neighbours.
      const float v = s ? -hi : hi;
      EXPECT_EQ(fmt::e4m3_encode(v), (c + 1) | sg);
      EXPECT_EQ(fmt::e4m3_encode(std::nextafter(v, 0.0f)), (c + 1) | sg);
      if (c + 1 < 0x7E) {
        EXPECT_EQ(fmt::e4m3_encode(std::nextafter(v, s ? -kInf : kInf)), (c + 1) | sg);
      }
      ++checked;
    }
  }
  EXPECT_EQ(checked, 2 * 126);
}

TEST(E4m3, SubnormalRange) {
  // 2^-10 is the midpoint between 0 and the smallest subnormal: ties to 0 (even).
  EXPECT_EQ(fmt::e4m3_encode(0x1.0p-10f), 0x00);
  EXPECT_EQ(fmt::e4m3_encode(std::nextafter(0x1.0p-10f, 1.0f)), 0x01);
  EXPECT_EQ(fmt::e4m3_encode(-std::nextafter(0x1.0p-10f, 1.0f)), 0x81);
  EXPECT_EQ(fmt::e4m3_encode(0x1.8p-9f), 0x02);   // 1.5 * 2^-9: tie between 1 and 2 -> 2
  EXPECT_EQ(fmt::e4m3_encode(0x1.4p-8f), 0x02);   // 2.5 * 2^-9 -> 2
  EXPECT_EQ(fmt::e4m3_encode(0x1.ep-7f), 0x08);   // 7.5 * 2^-9: tie between 7 (odd) and 8 (2^-6) -> 8
  EXPECT_EQ(fmt::e4m3_encode(std::nextafter(0x1.ep-7f, 0.0f)), 0x07);
  for (int m = 1; m < 8; ++m) EXPECT_EQ(fmt::e4m3_encode(std::ldexp(static_cast<float>(m), -9)), m);
  // Far below: zero with the sign kept, including fp32 subnormals and the early-out exponent boundary.
  for (uint32_t u : {0x00000001u, 0x007FFFFFu, 0x00800000u, 0x36FFFFFFu, 0x37000000u, 0x3A000000u}) {
    EXPECT_EQ(fmt::e4m3_encode(f_from_bits(u)), 0x00) << std::hex << u;
    EXPECT_EQ(fmt::e4m3_encode(f_from_bits(u | 0x80000000u)), 0x80) << std::hex << u;
    EXPECT_EQ(ref::e4m3_encode(f_from_bits(u)), 0x00) << std::hex << u;
  }
  EXPECT_EQ(fmt::e4m3_encode(0.0f), 0x00);
  EXPECT_EQ(fmt::e4m3_encode(-0.0f), 0x80);
  // Every fp32 value in [2^-17, 2^-6] (each exponent, many mantissas) against the brute force.
  for (uint32_t u = 0x37000000u; u <= 0x3C800000u; u += 0x101u) {
    ASSERT_EQ(fmt::e4m3_encode(f_from_bits(u)), ref::e4m3_encode(f_from_bits(u))) << hexf(f_from_bits(u));
  }
}

TEST(E4m3, Saturation) {
  const float sat[] = {448.0f, std::nextafter(448.0f, kInf), 450.0f, std::nextafter(464.0f, 0.0f), 464.0f,
                       std::nextafter(464.0f, kInf), 480.0f, 1000.0f, 1e30f,
                       std::numeric_limits<float>::max(), kInf};
  for (float x : sat) {
    EXPECT_EQ(fmt::e4m3_encode(x), 0x7E) << hexf(x);
    EXPECT_EQ(fmt::e4m3_encode(-x), 0xFE) << hexf(-x);
    EXPECT_EQ(ref::e4m3_encode(x), 0x7E) << hexf(x);
  }
  EXPECT_EQ(fmt::e4m3_encode(432.0f), 0x7E);  // tie between 416 (0x7D, odd) and 448 -> 448
  EXPECT_EQ(fmt::e4m3_encode(std::nextafter(432.0f, 0.0f)), 0x7D);
}

// The Hopper design's exactness fact: every e2m1 x e4m3 product is exact in fp32 and in bf16.
TEST(E4m3, EveryE2m1TimesE4m3ProductIsExactInBf16) {
  for (int q = 0; q < 16; ++q)
    for (int s = 0; s < 256; ++s) {
      if ((s & 0x7F) == 0x7F) continue;
      const double exact = ref::e2m1_value(q) * ref::e4m3_value(s);
      const float p = fmt::dequant_operand(static_cast<uint8_t>(q), static_cast<uint8_t>(s));
      ASSERT_EQ(static_cast<double>(p), exact) << "q " << q << " s " << s;
      ASSERT_EQ(fmt::bf16_round(p), p) << "q " << q << " s " << s;
    }
}

// ===================================================================================== bf16
TEST(Bf16, RoundToNearestEvenTies) {
  EXPECT_EQ(fmt::bf16_from_float(1.0f), 0x3F80);
  EXPECT_EQ(fmt::bf16_from_float(f_from_bits(0x3F808000u)), 0x3F80);  // tie, 0x3F80 even
  EXPECT_EQ(fmt::bf16_from_float(f_from_bits(0x3F818000u)), 0x3F82);  // tie, 0x3F81 odd -> up
  EXPECT_EQ(fmt::bf16_from_float(f_from_bits(0x3F808001u)), 0x3F81);
  EXPECT_EQ(fmt::bf16_from_float(f_from_bits(0x3F807FFFu)), 0x3F80);
  EXPECT_EQ(fmt::bf16_from_float(f_from_bits(0x3F817FFFu)), 0x3F81);
  EXPECT_EQ(fmt::bf16_from_float(f_from_bits(0xBF818000u)), 0xBF82);
  EXPECT_EQ(fmt::bf16_from_float(f_from_bits(0xBF808000u)), 0xBF80);
  EXPECT_EQ(fmt::bf16_from_float(f_from_bits(0x3FFF8000u)), 0x4000);  // carry into the exponent
  EXPECT_EQ(fmt::bf16_from_float(f_from_bits(0x00008000u)), 0x0000);  // subnormal tie -> even (0)
  EXPECT_EQ(fmt::bf16_from_float(f_from_bits(0x00018000u)), 0x0002);
  EXPECT_EQ(fmt::bf16_from_float(f_from_bits(0x007F8000u)), 0x0080);  // largest subnormal rounds to normal
  EXPECT_EQ(fmt::bf16_from_float(-0.0f), 0x8000);
  // Every tie pattern in one binade and its neighbours, against the double reference.
  for (uint32_t hi = 0x3F80u; hi <= 0x3FFFu; ++hi)
    for (uint32_t low : {0x7FFFu, 0x8000u, 0x8001u}) {
      const float f = f_from_bits((hi << 16) | low);
      EXPECT_EQ(fmt::bf16_from_float(f), ref::bf16_from_float(f)) << hexf(f);
      EXPECT_EQ(fmt::bf16_from_float(-f), ref::bf16_from_float(-f)) << hexf(-f);
    }
}

TEST(Bf16, NaNInfAndOverflow) {
  EXPECT_EQ(fmt::bf16_from_float(kInf), 0x7F80);
  EXPECT_EQ(fmt::bf16_from_float(-kInf), 0xFF80);
  // NaN stays NaN (quiet bit forced, sign kept) even when its payload is only in the low 16 bits.
  for (uint32_t u : {0x7FC00000u, 0x7F800001u, 0x7F80FFFFu, 0x7FFFFFFFu, 0xFF800001u, 0xFFC00000u}) {
    const uint16_t h = fmt::bf16_from_float(f_from_bits(u));
    EXPECT_TRUE(std::isnan(fmt::bf16_to_float(h))) << std::hex << u;
    EXPECT_EQ(h & 0x8000, (u >> 16) & 0x8000) << std::hex << u;
    EXPECT_EQ(h & 0x0040, 0x0040) << std::hex << u;
  }
  // Overflow: max bf16 is 0x7F7F; the tie between it and "2^128" and anything above rounds to Inf.
  EXPECT_EQ(fmt::bf16_from_float(f_from_bits(0x7F7F7FFFu)), 0x7F7F);
  EXPECT_EQ(fmt::bf16_from_float(f_from_bits(0x7F7F8000u)), 0x7F80);
  EXPECT_EQ(fmt::bf16_from_float(std::numeric_limits<float>::max()), 0x7F80);
  EXPECT_EQ(fmt::bf16_from_float(-std::numeric_limits<float>::max()), 0xFF80);
  EXPECT_EQ(ref::bf16_from_float(std::numeric_limits<float>::max()), 0x7F80);
  // Decoding is the high half of fp32.
  EXPECT_EQ(bits_of(fmt::bf16_to_float(0x3F81)), 0x3F810000u);
  EXPECT_EQ(fmt::bf16_round(1.00390625f), 1.0f);
}

// ===================================================================================== quantizers: edge cases
TEST(WeightQuantizer, ZeroBlockGetsScaleOneAndZeroCodes) {
  for (float ws2 : {1.0f, 0.001f, 3.7e-5f, 1e-30f, 12345.0f}) {
    for (float z : {0.0f, -0.0f}) {
      float w[16];
      std::fill(w, w + 16, z);
      uint8_t codes[16];
      std::fill(codes, codes + 16, 0xAA);
      EXPECT_EQ(fmt::quantize_weight_block(w, 16, ws2, codes), 0x38) << "ws2 " << ws2;
      for (int i = 0; i < 16; ++i) EXPECT_EQ(codes[i], 0) << "ws2 " << ws2 << " i " << i;
    }
    EXPECT_EQ(fmt::weight_block_scale(0.0f, ws2), 0x38);
  }
}

TEST(WeightQuantizer, AmaxExactlySixTimes448) {
  EXPECT_EQ(fmt::weight_global_scale(2688.0f), 1.0f);
  const float ws2 = fmt::weight_global_scale(2688.0f);
  float w[16] = {2688.0f, -2688.0f, 1344.0f, -448.0f, 0.0f, 224.0f, 112.0f, 56.0f,
                 2016.0f, 1120.0f, 560.0f,  672.0f,  896.0f, 1568.0f, 5.0f, -2000.0f};
  uint8_t codes[16];
  const uint8_t s8 = fmt::quantize_weight_block(w, 16, ws2, codes);
  EXPECT_EQ(s8, 0x7E);  // block scale 448
  EXPECT_EQ(fmt::e4m3_decode(s8), 448.0f);
  EXPECT_EQ(codes[0], 0x7);  // 2688 / 448 = 6: the e2m1 value 6 (code 7)
  EXPECT_EQ(codes[1], 0xF);
  EXPECT_EQ(fmt::e2m1_decode(codes[0]) * fmt::e4m3_decode(s8) * ws2, 2688.0f);
  // x = w / 448: 3 -> 5, -1 -> 0xA, 0 -> 0, 0.5 -> 1, 0.25 (tie) -> 0, 0.125 -> 0, 4.5 -> 6, 2.5 (tie) -> 4,
  // 1.25 (tie) -> 2, 1.5 -> 3, 2 -> 4, 3.5 (tie) -> 6, ~0.011 -> 0, -4.46 -> 0xE.
  const uint8_t want[16] = {7, 0xF, 5, 0xA, 0, 1, 0, 0, 6, 4, 2, 3, 4, 6, 0, 0xE};
  for (int i = 0; i < 16; ++i) EXPECT_EQ(codes[i], want[i]) << "i " << i;
}

TEST(WeightQuantizer, AllZeroTensorGlobalScaleIsOne) {
  EXPECT_EQ(fmt::weight_global_scale(0.0f), 1.0f);
  EXPECT_EQ(fmt::weight_global_scale(-0.0f), 1.0f);
  EXPECT_EQ(fmt::weight_global_scale(1.0f), 1.0f / 2688.0f);
}

TEST(WeightQuantizer, ScaleUnderflowDequantizesToZero) {
  // A block far below the tensor amax: s = amax_b / (6 ws2) < 2^-10 rounds to e4m3 0. The codes are then the
  // saturated e2m1 of +-Inf (and NaN -> 7 for exact zeros), exactly as the section-3 formula gives, and every
  // element dequantizes to zero.
  const float ws2 = 1.0f;
  float w[16] = {1e-3f, -1e-3f, 0.0f, 5e-4f};
  std::fill(w + 4, w + 16, 0.0f);
  uint8_t codes[16], rcodes[16];
  EXPECT_EQ(fmt::quantize_weight_block(w, 16, ws2, codes), 0x00);
  EXPECT_EQ(ref::weight_block(w, 16, ws2, rcodes), 0x00);
  for (int i = 0; i < 16; ++i) {
    EXPECT_EQ(codes[i], rcodes[i]) << i;
    EXPECT_EQ(fmt::dequant_operand(codes[i], 0x00), 0.0f) << i;
  }
  EXPECT_EQ(codes[0], 0x7);
  EXPECT_EQ(codes[1], 0xF);
}

TEST(ActivationQuantizer, ZeroBlockGetsScaleZeroAndZeroCodes) {
  for (float gs : {1.0f, 2688.0f, 1e-3f, 1e20f}) {
    for (float z : {0.0f, -0.0f}) {
      float x[16];
      std::fill(x, x + 16, z);
      uint8_t codes[16];
      std::fill(codes, codes + 16, 0xAA);
      const uint8_t sf = fmt::quantize_activation_block(x, 16, gs, codes);
      EXPECT_EQ(sf, 0x00) << "gs " << gs;
      EXPECT_EQ(fmt::activation_block_output_scale(sf, gs), 0.0f);
      for (int i = 0; i < 16; ++i) EXPECT_EQ(codes[i], 0) << "gs " << gs << " i " << i;
    }
  }
  // A non-zero block whose scale underflows e4m3 is quantized to zero as well (os = 0).
  float x[16] = {1e-6f, -2e-6f};
  std::fill(x + 2, x + 16, 0.0f);
  uint8_t codes[16];
  EXPECT_EQ(fmt::quantize_activation_block(x, 16, 1.0f, codes), 0x00);
  for (int i = 0; i < 16; ++i) EXPECT_EQ(codes[i], 0) << i;
}

TEST(ActivationQuantizer, AmaxAtCalibrationMaxAndSaturation) {
  // input_scale = amax / 2688 with amax = 2688: gs = 1; a block holding the calibration amax gets scale 448
  // and code 7 (value 6). A block past the calibration amax saturates the scale at 448 and the codes at 6.
  const float gs = fmt::activation_global_scale(fmt::weight_global_scale(2688.0f));
  EXPECT_EQ(gs, 1.0f);
  float x[16] = {2688.0f, -1344.0f, 448.0f};
  std::fill(x + 3, x + 16, 0.0f);
  uint8_t codes[16];
  EXPECT_EQ(fmt::quantize_activation_block(x, 16, gs, codes), 0x7E);
  EXPECT_EQ(codes[0], 0x7);
  EXPECT_EQ(codes[1], 0xD);  // -3
  EXPECT_EQ(codes[2], 0x2);  // 1
  x[0] = 10000.0f;
  EXPECT_EQ(fmt::quantize_activation_block(x, 16, gs, codes), 0x7E);
  EXPECT_EQ(codes[0], 0x7);
}

TEST(ActivationQuantizer, NonFinitePolicy) {
  // Inf: vmax = Inf, the scale saturates to 448, Inf -> 6 (code 7), finite values scale by 1/448.
  float x[16] = {kInf, 448.0f, -896.0f};
  std::fill(x + 3, x + 16, 0.0f);
  uint8_t codes[16];
  EXPECT_EQ(fmt::quantize_activation_block(x, 16, 1.0f, codes), 0x7E);
  EXPECT_EQ(codes[0], 0x7);
  EXPECT_EQ(codes[1], 0x2);
  EXPECT_EQ(codes[2], 0xC);
  // NaN: ignored by the max (fmaxf), then encoded as +6 (code 7).
  float y[16] = {kNaN, 3.0f};
  std::fill(y + 2, y + 16, 0.0f);
  const uint8_t sf = fmt::quantize_activation_block(y, 16, 1.0f, codes);
  EXPECT_EQ(sf, fmt::e4m3_encode(0.5f));  // (1 * 3) / 6
  EXPECT_EQ(codes[0], 0x7);
  EXPECT_EQ(codes[1], 0x7);
}

// ===================================================================================== random, bit-exact
constexpr int64_t kRandomE4m3 = 4'000'000;
constexpr int64_t kRandomE2m1 = 3'000'000;
constexpr int64_t kRandomBf16 = 3'000'000;
constexpr int64_t kRandomBlocks = 200'000;  // per quantizer, 16 values each

TEST(Random, E4m3MatchesBruteForce) {
  parallel_check("e4m3", kRandomE4m3, [](int64_t i, std::string* msg) {
    Rng r(0xE4E3000000ull + static_cast<uint64_t>(i));
    float x;
    const int k = r.range(0, 99);
    if (k == 0) x = f_from_bits(r.u32());                 // anything, NaN/Inf/huge/fp32 subnormal included
    else if (k < 30) x = random_float(r, 110, 121);       // the e4m3 subnormal range and around it
    else x = random_float(r, 104, 138);                   // 2^-23 .. 2^11: every e4m3 binade and beyond
    const uint8_t got = fmt::e4m3_encode(x), want = ref::e4m3_encode(x);
    if (got == want) return true;
    std::ostringstream os;
    os << hexf(x) << " got 0x" << std::hex << int(got) << " want 0x" << int(want);
    *msg = os.str();
    return false;
  });
}

TEST(Random, E2m1MatchesBruteForce) {
  parallel_check("e2m1", kRandomE2m1, [](int64_t i, std::string* msg) {
    Rng r(0xE2E1000000ull + static_cast<uint64_t>(i));
    const float x = r.range(0, 99) == 0 ? f_from_bits(r.u32()) : random_float(r, 118, 131);  // 2^-9 .. 2^4
    const uint8_t got = fmt::e2m1_encode(x), want = ref::e2m1_encode(x);
    if (got == want) return true;
    std::ostringstream os;
    os << hexf(x) << " got " << int(got) << " want " << int(want);
    *msg = os.str();
    return false;
  });
}

TEST(Random, Bf16MatchesDoubleReference) {
  parallel_check("bf16", kRandomBf16, [](int64_t i, std::string* msg) {
    Rng r(0xBF16000000ull + static_cast<uint64_t>(i));
    uint32_t u = r.u32();
    const int k = r.range(0, 3);
    if (k == 1) u = (u & 0xFFFF0000u) | 0x8000u;  // exact ties
    if (k == 2) u = (u & 0xFFFF0000u) | (0x7FFFu + static_cast<uint32_t>(r.range(0, 2)));
    const float f = f_from_bits(u);
    const uint16_t got = fmt::bf16_from_float(f), want = ref::bf16_from_float(f);
    if (got == want) return true;
    std::ostringstream os;
    os << hexf(f) << " got 0x" << std::hex << got << " want 0x" << want;
    *msg = os.str();
    return false;
  });
}

// A random block of n <= 16 values at level `unit` (the value that maps to e2m1 1.0): a mix of random values
// spread over many binades below the block max, exact e2m1 grid points and ties, zeros, and random signs.
int random_block(Rng& r, float unit, float* v) {
  const int n = r.range(0, 7) == 0 ? r.range(1, 16) : 16;
  static const float kGrid[] = {0.0f, 0.25f, 0.5f, 0.75f, 1.0f, 1.25f, 1.5f, 1.75f,
                                2.0f, 2.5f,  3.0f, 3.5f,  4.0f, 5.0f,  6.0f};
  for (int i = 0; i < n; ++i) {
    const int k = r.range(0, 9);
    float m;
    if (k < 4) m = kGrid[r.range(0, 14)];
    else if (k < 8) m = static_cast<float>(6.0 * r.unit());
    else m = static_cast<float>(std::ldexp(r.unit(), -r.range(0, 30)));
    float x = m * unit;
    if (k == 9 && x != 0.0f) x = std::nextafter(x, r.range(0, 1) ? 0.0f : kInf);
    v[i] = r.range(0, 1) ? -x : x;
  }
  if (r.range(0, 1)) v[r.range(0, n - 1)] = (r.range(0, 1) ? -6.0f : 6.0f) * unit;  // block max on the grid
  if (r.range(0, 49) == 0) std::fill(v, v + n, 0.0f);
  return n;
}

// Makes one element of the block its max, placed within a few ulps of the value whose block scale lands
// exactly on an e4m3 midpoint: mid * six_over (six_over = 6 * ws2 for weights, 6 / gs for activations). This
// is where the order of the scale formula's operations decides the rounding.
void put_max_near_scale_midpoint(Rng& r, int n, double six_over, float* v) {
  const int c = r.range(0, 0x7D);
  const double mid = (ref::e4m3_value(c) + ref::e4m3_value(c + 1)) / 2;
  float m = static_cast<float>(mid * six_over);
  for (int k = r.range(-3, 3); k != 0; k += (k > 0 ? -1 : 1)) m = std::nextafter(m, k > 0 ? kInf : 0.0f);
  for (int i = 0; i < n; ++i) v[i] = std::fabs(v[i]) >= m ? v[i] * 0.5f : v[i];
  v[r.range(0, n - 1)] = r.range(0, 1) ? -m : m;
}

TEST(Random, WeightBlocksMatchTheFormula) {
  parallel_check("weight blocks", kRandomBlocks, [](int64_t i, std::string* msg) {
    Rng r(0x3EE6000000ull + static_cast<uint64_t>(i));
    // weight_scale_2 either a power of two (exact ties survive the division) or amax / 2688 of a random amax.
    const float ws2 = r.range(0, 1) ? std::ldexp(1.0f, r.range(-30, 5))
                                    : fmt::weight_global_scale(static_cast<float>(std::ldexp(0.5 + r.unit(), r.range(-12, 12))));
    // Block scale target: a random e4m3 code (normal or subnormal), or a random value (incl. above 448).
    const float sc = r.range(0, 1) ? fmt::e4m3_decode(static_cast<uint8_t>(r.range(1, 0x7E)))
                                   : static_cast<float>(std::ldexp(r.unit(), r.range(-14, 9)));
    float w[16];
    const int n = random_block(r, sc * ws2, w);
    if (r.range(0, 2) == 0) put_max_near_scale_midpoint(r, n, 6.0 * ws2, w);
    uint8_t got[16], want[16];
    const uint8_t s_got = fmt::quantize_weight_block(w, n, ws2, got);
    const uint8_t s_want = ref::weight_block(w, n, ws2, want);
    bool ok = s_got == s_want && s_got == fmt::weight_block_scale([&] {
      float a = 0.0f;
      for (int j = 0; j < n; ++j) a = std::max(a, std::fabs(w[j]));
      return a;
    }(), ws2);
    for (int j = 0; j < n; ++j) ok = ok && got[j] == want[j];
    if (ok) return true;
    std::ostringstream os;
    os << "ws2 " << hexf(ws2) << " n " << n << " scale got 0x" << std::hex << int(s_got) << " want 0x"
       << int(s_want) << std::dec;
    for (int j = 0; j < n; ++j) os << " [" << hexf(w[j]) << " " << int(got[j]) << "/" << int(want[j]) << "]";
    *msg = os.str();
    return false;
  });
}

TEST(Random, ActivationBlocksMatchTheFormula) {
  parallel_check("activation blocks", kRandomBlocks, [](int64_t i, std::string* msg) {
    Rng r(0xAC70000000ull + static_cast<uint64_t>(i));
    // gs = 1 / input_scale, input_scale = amax / 2688 from a random calibration amax, or a power of two.
    const float gs = r.range(0, 1) ? std::ldexp(1.0f, r.range(-10, 20))
                                   : fmt::activation_global_scale(fmt::weight_global_scale(
                                         static_cast<float>(std::ldexp(0.5 + r.unit(), r.range(-8, 12)))));
    const float sc = r.range(0, 1) ? fmt::e4m3_decode(static_cast<uint8_t>(r.range(1, 0x7E)))
                                   : static_cast<float>(std::ldexp(r.unit(), r.range(-14, 10)));
    float x[16];
    const int n = random_block(r, sc / gs, x);
    for (int j = 0; j < n; ++j) x[j] = fmt::bf16_round(x[j]);  // activations are bf16 values
    if (r.range(0, 2) == 0) put_max_near_scale_midpoint(r, n, 6.0 / gs, x);  // (the max is not bf16-rounded)
    uint8_t got[16], want[16];
    const uint8_t s_got = fmt::quantize_activation_block(x, n, gs, got);
    const uint8_t s_want = ref::activation_block(x, n, gs, want);
    bool ok = s_got == s_want;
    for (int j = 0; j < n; ++j) ok = ok && got[j] == want[j];
    // The dequantized operand as the reference layer forms it.
    const float os_got = fmt::activation_block_output_scale(s_got, gs);
    const double sff = ref::e4m3_value(s_want);
    ok = ok && os_got == (sff != 0.0 ? 1.0f / (static_cast<float>(sff) / gs) : 0.0f);
    if (ok) return true;
    std::ostringstream os;
    os << "gs " << hexf(gs) << " n " << n << " scale got 0x" << std::hex << int(s_got) << " want 0x"
       << int(s_want) << std::dec;
    for (int j = 0; j < n; ++j) os << " [" << hexf(x[j]) << " " << int(got[j]) << "/" << int(want[j]) << "]";
    *msg = os.str();
    return false;
  });
}

}  // namespace
