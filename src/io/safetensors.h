// safetensors: a validated, memory-mapped reader (single file and sharded index) and an atomic writer.
// Every header field is checked before any byte is used; each failure throws FormatError naming the file,
// the tensor and the values involved. See tests/io for the crafted corpus of bad files.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include <nlohmann/json_fwd.hpp>

#include "nvfp4moe/tensor.h"

namespace nvfp4moe::io {

// Parses JSON text, refusing what nlohmann accepts silently: a duplicate key (it keeps the last value) and
// nesting deeper than 32 levels. Throws FormatError "<label>: duplicate key "k" in the <what>" (naming the
// enclosing object's key when nested) or "<label>: <what> is not valid JSON: ...". Used for the safetensors
// header and index, and for the checkpoints' config.json / hf_quant_config.json.
nlohmann::json parse_json_strict(const char* begin, const char* end, const std::string& label, const char* what);

struct TensorInfo {
  std::string name;
  DType dtype = DType::U8;
  std::vector<int64_t> shape;
  uint64_t begin = 0, end = 0;    // data_offsets, relative to the start of the data section
  const uint8_t* data = nullptr;  // points into the mapping; valid while the file object lives
  size_t nbytes() const { return static_cast<size_t>(end - begin); }
  int64_t numel() const;
};

// Limits the reader enforces (safetensors' own: header <= 100 MB).
inline constexpr uint64_t kMaxHeaderBytes = 100ull * 1000 * 1000;

class SafetensorsFile {
 public:
  // Maps and validates `path`. Throws FormatError on anything malformed (see tests/io/bad_files).
  static std::shared_ptr<SafetensorsFile> open(const std::string& path);
  // Same validation over an in-memory image (used by the fuzzer; `bytes` must outlive the object).
  static std::shared_ptr<SafetensorsFile> from_memory(const uint8_t* bytes, size_t size, const std::string& label);
  ~SafetensorsFile();

  const std::string& path() const { return path_; }
  const std::vector<TensorInfo>& tensors() const { return tensors_; }  // in offset order
  const TensorInfo* find(const std::string& name) const;               // nullptr if absent
  const std::map<std::string, std::string>& metadata() const { return metadata_; }

 private:
  SafetensorsFile() = default;
  void parse(const uint8_t* bytes, size_t size);
  std::string path_;
  void* map_ = nullptr;
  size_t map_size_ = 0;
  std::vector<TensorInfo> tensors_;
  std::map<std::string, size_t> by_name_;
  std::map<std::string, std::string> metadata_;
};

// A checkpoint's tensors across shards: a directory with model.safetensors.index.json, a directory with one
// *.safetensors file, or a single file path. Validates that every tensor the index names is in its shard and
// every shard the index names exists.
class SafetensorsSet {
 public:
  static SafetensorsSet open(const std::string& path);
  const TensorInfo* find(const std::string& name) const;
  const TensorInfo& get(const std::string& name) const;  // throws FormatError "tensor X not found in ..."
  std::vector<std::string> names() const;                 // sorted
  const std::string& file_of(const std::string& name) const;
  size_t num_files() const { return files_.size(); }

 private:
  std::vector<std::shared_ptr<SafetensorsFile>> files_;
  std::map<std::string, std::pair<const TensorInfo*, size_t>> index_;  // name -> (info, file number)
  std::string path_;  // what open() was given, for messages
};

// Writer. Tensors are described up front and their bytes produced by a callback, so a large checkpoint is
// written without holding it in memory. The file is written to `path + ".tmp"` and renamed on success; on any
// failure the partial file is removed.
struct TensorToWrite {
  std::string name;
  DType dtype = DType::U8;
  std::vector<int64_t> shape;
  // Writes exactly nbytes bytes into dst (called once, in the order tensors were added).
  std::function<void(uint8_t* dst, size_t nbytes)> fill;
};
void write_safetensors(const std::string& path, const std::vector<TensorToWrite>& tensors,
                       const std::map<std::string, std::string>& metadata = {});

// Splits tensors into shards of about max_shard_bytes (in order), writes model-0000i-of-0000n.safetensors and
// model.safetensors.index.json into dir.
void write_sharded_safetensors(const std::string& dir, const std::vector<TensorToWrite>& tensors,
                               size_t max_shard_bytes);

}  // namespace nvfp4moe::io
