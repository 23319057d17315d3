// Test helpers for crafting checkpoint folders by hand: a per-process scratch folder, whole-tensor copies read
// from / written to safetensors, JSON files, and a message-checking expect_error. Shared by tests/model suites.
#pragma once

#include <cstdint>
#include <cstring>
#include <filesystem>
#include <functional>
#include <initializer_list>
#include <string>
#include <vector>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "nvfp4moe/tensor.h"

namespace nvfp4moe::test {

// A folder <tmp>/nvfp4moe_<suite>_<pid>/<name>, emptied first; the suite's root is removed at exit.
std::string fresh_dir(const std::string& suite, const std::string& name);

// Runs fn and checks it throws E whose message contains every one of parts.
template <typename E>
void expect_error(const std::function<void()>& fn, std::initializer_list<std::string> parts) {
  try {
    fn();
    ADD_FAILURE() << "expected an exception containing \"" << *parts.begin() << "\"";
  } catch (const E& e) {
    const std::string msg = e.what();
    for (const auto& p : parts) EXPECT_NE(msg.find(p), std::string::npos) << "message: " << msg << "\nmissing: " << p;
  } catch (const std::exception& e) {
    ADD_FAILURE() << "wrong exception type: " << e.what();
  }
}

// One tensor held whole in memory (small test checkpoints only).
struct FileTensor {
  std::string name;
  DType dtype;
  std::vector<int64_t> shape;
  std::vector<uint8_t> bytes;
  float scalar() const {
    float f;
    std::memcpy(&f, bytes.data(), 4);
    return f;
  }
  void set_scalar(float f) { std::memcpy(bytes.data(), &f, 4); }
};

std::vector<FileTensor> read_all_tensors(const std::string& dir);  // every tensor of a checkpoint, sorted by name
nlohmann::json read_json(const std::filesystem::path& p);
void write_json(const std::filesystem::path& p, const nlohmann::json& j);
// Writes model.safetensors + config.json (+ hf_quant_config.json unless null) into dir.
void write_checkpoint_dir(const std::string& dir, const std::vector<FileTensor>& tensors, const nlohmann::json& config,
                          const nlohmann::json& hf_quant);
bool ends_with(const std::string& s, const std::string& suffix);

}  // namespace nvfp4moe::test
