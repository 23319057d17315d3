#include "cli/cli_common.h"

#include <CLI/CLI.hpp>
#include <unistd.h>

#include <algorithm>
#include <cctype>
#include <cerrno>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <limits>

#include "nvfp4moe/error.h"

namespace nvfp4moe::cli {

CLI::Validator seed_check() {
  return CLI::Validator(
      [](std::string& s) -> std::string {
        char* end = nullptr;
        errno = 0;
        if (!s.empty() && std::isdigit(static_cast<unsigned char>(s[0]))) std::strtoull(s.c_str(), &end, 0);
        if (end && *end == '\0' && errno == 0) return {};
        return "expected an integer in [0, 18446744073709551615], got '" + s + "'";
      },
      "UINT64");
}

size_t shard_bytes_from_mb(double mb) {
  NVFP4MOE_CHECK(std::isfinite(mb) && mb > 0, ArgumentError, "--shard-mb: expected a finite size in MB > 0, got ", mb);
  const double bytes = mb * 1e6;
  if (bytes >= static_cast<double>(std::numeric_limits<size_t>::max())) return std::numeric_limits<size_t>::max();
  return std::max<size_t>(1, static_cast<size_t>(bytes));
}

float scaling_from_flag(double scaling) {
  NVFP4MOE_CHECK(std::isfinite(scaling) && scaling > 0 && scaling <= std::numeric_limits<float>::max(), ArgumentError,
                 "--scaling: expected a finite routed_scaling_factor > 0 (at most ",
                 std::numeric_limits<float>::max(), ", a float), got ", scaling);
  return static_cast<float>(scaling);
}

double now_seconds() {
  using clock = std::chrono::steady_clock;
  return std::chrono::duration<double>(clock::now().time_since_epoch()).count();
}

std::string format_bytes(size_t bytes) {
  const char* units[] = {"B", "KiB", "MiB", "GiB", "TiB"};
  double v = static_cast<double>(bytes);
  int u = 0;
  while (v >= 1024.0 && u < 4) {
    v /= 1024.0;
    ++u;
  }
  char buf[32];
  if (u == 0) std::snprintf(buf, sizeof buf, "%zu B", bytes);
  else std::snprintf(buf, sizeof buf, "%.1f %s", v, units[u]);
  return buf;
}

std::string format_seconds(double s) {
  char buf[32];
  if (s < 1e-3) std::snprintf(buf, sizeof buf, "%.1f us", s * 1e6);
  else if (s < 1.0) std::snprintf(buf, sizeof buf, "%.1f ms", s * 1e3);
  else std::snprintf(buf, sizeof buf, "%.2f s", s);
  return buf;
}

// ------------------------------------------------------------------ progress
LoadProgress::LoadProgress(std::string label) : label_(std::move(label)), tty_(isatty(STDERR_FILENO) != 0) {}

LoadProgress::~LoadProgress() { finish(); }

ProgressFn LoadProgress::fn() {
  return [this](size_t done, size_t total) {
    const double frac = total ? static_cast<double>(done) / static_cast<double>(total) : 1.0;
    const int pct = static_cast<int>(frac * 100.0);
    if (!tty_) {
      // Logs: one line per 10%, never a carriage-return mess.
      const int decile = pct / 10;
      if (decile == last_decile_) return;
      last_decile_ = decile;
    }
    std::fprintf(stderr, "%s%s: %3d%% (%s / %s)%s", tty_ ? "\r" : "", label_.c_str(), pct,
                 format_bytes(done).c_str(), format_bytes(total).c_str(), tty_ ? "" : "\n");
    std::fflush(stderr);
    drawn_ = true;
  };
}

void LoadProgress::finish() {
  if (drawn_ && tty_) std::fputc('\n', stderr);
  drawn_ = false;
}

// ------------------------------------------------------------------ accuracy
Accuracy compare(const float* got, const float* ref, size_t n) {
  double dot = 0, gg = 0, rr = 0, dd = 0, mx = 0;
  for (size_t i = 0; i < n; ++i) {
    const double g = got[i], r = ref[i], d = g - r;
    dot += g * r;
    gg += g * g;
    rr += r * r;
    dd += d * d;
    mx = std::max(mx, std::fabs(d));
  }
  Accuracy a;
  a.cosine = (gg == 0 && rr == 0) ? 1.0 : dot / std::sqrt(gg * rr);
  a.rel_l2 = rr == 0 ? (dd == 0 ? 0.0 : INFINITY) : std::sqrt(dd / rr);
  a.max_abs = mx;
  a.rms_ratio = rr == 0 ? (gg == 0 ? 1.0 : INFINITY) : std::sqrt(gg / rr);
  // NaN anywhere must show, not hide behind max(): propagate it into every metric.
  for (size_t i = 0; i < n; ++i) {
    if (std::isnan(got[i])) {
      a.cosine = a.rel_l2 = a.max_abs = a.rms_ratio = NAN;
      break;
    }
  }
  return a;
}

std::string describe(const Accuracy& a) {
  char buf[160];
  std::snprintf(buf, sizeof buf, "cosine %.6f  rel L2 %.3e  max abs %.3e  rms ratio %.4f", a.cosine, a.rel_l2,
                a.max_abs, a.rms_ratio);
  return buf;
}

}  // namespace nvfp4moe::cli
