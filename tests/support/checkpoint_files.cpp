#include "support/checkpoint_files.h"

#include <unistd.h>

#include <fstream>
#include <map>
#include <memory>

#include "io/safetensors.h"

namespace nvfp4moe::test {

namespace fs = std::filesystem;

namespace {
struct ScratchRoot {
  fs::path path;
  explicit ScratchRoot(const std::string& suite)
      : path(fs::temp_directory_path() / ("nvfp4moe_" + suite + "_" + std::to_string(::getpid()))) {
    fs::remove_all(path);
    fs::create_directories(path);
  }
  ~ScratchRoot() {
    std::error_code ec;
    fs::remove_all(path, ec);
  }
};
}  // namespace

std::string fresh_dir(const std::string& suite, const std::string& name) {
  static std::map<std::string, std::unique_ptr<ScratchRoot>> roots;  // removed at exit
  auto& root = roots[suite];
  if (!root) root = std::make_unique<ScratchRoot>(suite);
  const fs::path p = root->path / name;
  fs::remove_all(p);
  return p.string();
}

std::vector<FileTensor> read_all_tensors(const std::string& dir) {
  const auto set = io::SafetensorsSet::open(dir);
  std::vector<FileTensor> out;
  for (const auto& n : set.names()) {
    const auto& t = set.get(n);
    out.push_back({n, t.dtype, t.shape, std::vector<uint8_t>(t.data, t.data + t.nbytes())});
  }
  return out;
}

nlohmann::json read_json(const fs::path& p) {
  std::ifstream f(p);
  return nlohmann::json::parse(f);
}

void write_json(const fs::path& p, const nlohmann::json& j) {
  std::ofstream f(p);
  f << j.dump(2);
}

void write_checkpoint_dir(const std::string& dir, const std::vector<FileTensor>& tensors, const nlohmann::json& config,
                          const nlohmann::json& hf_quant) {
  fs::create_directories(dir);
  std::vector<io::TensorToWrite> w;
  for (const auto& t : tensors) {
    io::TensorToWrite x;
    x.name = t.name;
    x.dtype = t.dtype;
    x.shape = t.shape;
    const FileTensor* tp = &t;
    x.fill = [tp](uint8_t* dst, size_t n) { std::memcpy(dst, tp->bytes.data(), n); };
    w.push_back(std::move(x));
  }
  io::write_safetensors((fs::path(dir) / "model.safetensors").string(), w);
  write_json(fs::path(dir) / "config.json", config);
  if (!hf_quant.is_null()) write_json(fs::path(dir) / "hf_quant_config.json", hf_quant);
}

bool ends_with(const std::string& s, const std::string& suffix) {
  return s.size() >= suffix.size() && s.compare(s.size() - suffix.size(), suffix.size(), suffix) == 0;
}

}  // namespace nvfp4moe::test
