// safetensors reader (validated, memory-mapped, single file or sharded index) and atomic writer.
// Layout: 8-byte little-endian header length N, N bytes of UTF-8 JSON (padded with spaces), then the data
// section, which the tensors' data_offsets must cover exactly, without gaps or overlaps.
#include "io/safetensors.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cinttypes>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <limits>
#include <set>

#include <nlohmann/json.hpp>

#include "nvfp4moe/error.h"

namespace nvfp4moe::io {

namespace fs = std::filesystem;
using json = nlohmann::json;

namespace {

constexpr int kMaxJsonDepth = 32;                        // a valid header nests 3 deep
constexpr uint64_t kMaxIndexBytes = 512ull * 1000 * 1000;  // model.safetensors.index.json

template <typename... Args>
[[noreturn]] void fail(const std::string& file, const Args&... args) {
  throw FormatError(detail::cat("safetensors ", file, ": ", args...));
}

std::string hex_byte(uint8_t b) {
  char buf[8];
  std::snprintf(buf, sizeof buf, "0x%02X", static_cast<unsigned>(b));
  return buf;
}

std::string shape_str(const std::vector<int64_t>& shape) {
  std::string s = "[";
  for (size_t i = 0; i < shape.size(); ++i) s += (i ? ", " : "") + std::to_string(shape[i]);
  return s + "]";
}

// A JSON value for an error message, cut to a readable length.
std::string brief(const json& v) {
  std::string s = v.dump(-1, ' ', false, json::error_handler_t::replace);
  if (s.size() > 60) s = s.substr(0, 57) + "...";
  return std::string(v.type_name()) + " " + s;
}

// Offset of the first byte that breaks UTF-8 (overlong forms, surrogates and > U+10FFFF included), or npos.
size_t find_invalid_utf8(const uint8_t* s, size_t n) {
  static constexpr uint32_t kMinCodepoint[] = {0, 0, 0x80, 0x800, 0x10000};
  size_t i = 0;
  while (i < n) {
    const uint8_t c = s[i];
    if (c < 0x80) {
      ++i;
      continue;
    }
    size_t len;
    uint32_t cp;
    if ((c & 0xE0) == 0xC0) {
      len = 2, cp = c & 0x1Fu;
    } else if ((c & 0xF0) == 0xE0) {
      len = 3, cp = c & 0x0Fu;
    } else if ((c & 0xF8) == 0xF0) {
      len = 4, cp = c & 0x07u;
    } else {
      return i;
    }
    if (n - i < len) return i;
    for (size_t k = 1; k < len; ++k) {
      if ((s[i + k] & 0xC0) != 0x80) return i;
      cp = (cp << 6) | (s[i + k] & 0x3Fu);
    }
    if (cp < kMinCodepoint[len] || cp > 0x10FFFF || (cp >= 0xD800 && cp <= 0xDFFF)) return i;
    i += len;
  }
  return std::string::npos;
}

// A non-negative JSON integer, or nullopt-like failure reported by the caller.
bool get_nonneg_integer(const json& v, uint64_t* out) {
  if (v.is_number_unsigned()) {
    *out = v.get<uint64_t>();
    return true;
  }
  if (v.is_number_integer() && v.get<int64_t>() >= 0) {
    *out = static_cast<uint64_t>(v.get<int64_t>());
    return true;
  }
  return false;
}

std::string known_dtypes() {
  std::string s;
  for (DType d : {DType::U8, DType::I8, DType::F8_E4M3, DType::F8_E5M2, DType::BF16, DType::F16, DType::F32,
                  DType::I32, DType::I64, DType::BOOL})
    s += (s.empty() ? "" : ", ") + std::string(dtype_name(d));
  return s;
}

TensorInfo parse_entry(const std::string& file, const std::string& name, const json& v, uint64_t data_size) {
  TensorInfo t;
  t.name = name;
  const std::string where = "tensor \"" + name + "\": ";
  if (!v.is_object()) fail(file, where, "entry is not a JSON object (got ", brief(v), ")");
  auto field = [&](const char* key) -> const json& {
    auto it = v.find(key);
    if (it == v.end()) fail(file, where, "missing \"", key, "\"");
    return *it;
  };

  const json& jd = field("dtype");
  if (!jd.is_string()) fail(file, where, "\"dtype\" is not a string (got ", brief(jd), ")");
  const std::string& dname = jd.get_ref<const std::string&>();
  if (!dtype_from_name(dname, &t.dtype))
    fail(file, where, "unknown dtype \"", dname, "\" (supported: ", known_dtypes(), ")");

  const json& js = field("shape");
  if (!js.is_array()) fail(file, where, "\"shape\" is not an array (got ", brief(js), ")");
  for (size_t i = 0; i < js.size(); ++i) {
    const json& e = js[i];
    if (!e.is_number_integer()) fail(file, where, "shape[", i, "] is not an integer (got ", brief(e), ")");
    if (e.is_number_unsigned()) {
      const uint64_t u = e.get<uint64_t>();
      if (u > static_cast<uint64_t>(std::numeric_limits<int64_t>::max()))
        fail(file, where, "shape[", i, "] = ", u, " does not fit in int64");
      t.shape.push_back(static_cast<int64_t>(u));
    } else {
      const int64_t d = e.get<int64_t>();
      if (d < 0) fail(file, where, "shape[", i, "] = ", d, " is negative");
      t.shape.push_back(d);
    }
  }
  int64_t numel = 1;
  for (int64_t d : t.shape)
    if (__builtin_mul_overflow(numel, d, &numel))
      fail(file, where, "element count of shape ", shape_str(t.shape), " overflows int64");
  size_t nbytes = 0;
  if (__builtin_mul_overflow(static_cast<size_t>(numel), dtype_size(t.dtype), &nbytes))
    fail(file, where, "byte size of ", dname, shape_str(t.shape), " (", numel, " elements * ",
         dtype_size(t.dtype), " bytes) overflows size_t");

  const json& jo = field("data_offsets");
  if (!jo.is_array() || jo.size() != 2)
    fail(file, where, "\"data_offsets\" is not an array of 2 integers (got ", brief(jo), ")");
  uint64_t off[2];
  for (size_t k = 0; k < 2; ++k)
    if (!get_nonneg_integer(jo[k], &off[k]))
      fail(file, where, "data_offsets[", k, "] is not a non-negative integer (got ", brief(jo[k]), ")");
  t.begin = off[0];
  t.end = off[1];
  if (t.begin > t.end)
    fail(file, where, "data_offsets [", t.begin, ", ", t.end, "] are reversed (begin > end)");
  if (t.end > data_size)
    fail(file, where, "data_offsets [", t.begin, ", ", t.end, "] extend past the end of the data section (",
         data_size, " bytes)");
  if (t.end - t.begin != nbytes)
    fail(file, where, "byte length ", t.end - t.begin, " (data_offsets [", t.begin, ", ", t.end,
         "]) does not match ", dname, shape_str(t.shape), " = ", numel, " elements * ", dtype_size(t.dtype),
         " bytes = ", nbytes, " bytes");
  return t;
}

std::string read_small_file(const std::string& path, uint64_t limit, const std::string& label) {
  int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) fail(label, "cannot open: ", std::strerror(errno));
  std::string out;
  char buf[1 << 16];
  for (;;) {
    ssize_t r = ::read(fd, buf, sizeof buf);
    if (r < 0 && errno == EINTR) continue;
    if (r < 0) {
      const int err = errno;
      ::close(fd);
      fail(label, "read failed: ", std::strerror(err));
    }
    if (r == 0) break;
    out.append(buf, static_cast<size_t>(r));
    if (out.size() > limit) {
      ::close(fd);
      fail(label, "larger than the limit of ", limit, " bytes");
    }
  }
  ::close(fd);
  return out;
}

}  // namespace

// Parses JSON text, refusing duplicate keys (nlohmann keeps the last one silently) and deep nesting.
// `what` names the text in messages ("header", "index"); `label` starts them ("safetensors <file>").
json parse_json_strict(const char* begin, const char* end, const std::string& label, const char* what) {
  auto fail = [&](const auto&... args) { throw FormatError(detail::cat(label, ": ", args...)); };
  struct Level {
    std::set<std::string> keys;
    std::string last_key;
    std::string name;  // key of this object in its parent ("" for the top level)
  };
  std::vector<Level> objects;
  int depth = 0;
  auto callback = [&](int, json::parse_event_t event, json& parsed) -> bool {
    switch (event) {
      case json::parse_event_t::object_start:
      case json::parse_event_t::array_start:
        if (++depth > kMaxJsonDepth) fail(what, " JSON nests deeper than ", kMaxJsonDepth, " levels");
        if (event == json::parse_event_t::object_start)
          objects.push_back({{}, {}, objects.empty() ? std::string() : objects.back().last_key});
        break;
      case json::parse_event_t::object_end:
        objects.pop_back();
        --depth;
        break;
      case json::parse_event_t::array_end:
        --depth;
        break;
      case json::parse_event_t::key: {
        Level& level = objects.back();
        const std::string& key = parsed.get_ref<const std::string&>();
        if (!level.keys.insert(key).second) {
          if (objects.size() == 1)
            fail("duplicate key \"", key, "\" in the ", what,
                 std::string(what) == "header" ? " (duplicate tensor name)" : "");
          fail("duplicate key \"", key, "\" in \"", level.name, "\" of the ", what);
        }
        level.last_key = key;
        break;
      }
      case json::parse_event_t::value:
        break;
    }
    return true;
  };
  try {
    return json::parse(begin, end, callback, /*allow_exceptions=*/true, /*ignore_comments=*/false);
  } catch (const json::exception& e) {
    throw FormatError(detail::cat(label, ": ", what, " is not valid JSON: ", e.what()));
  }
}

// ------------------------------------------------------------------------------------------ reader

int64_t TensorInfo::numel() const {
  int64_t n = 1;
  for (int64_t d : shape) n *= d;
  return n;
}

std::shared_ptr<SafetensorsFile> SafetensorsFile::open(const std::string& path) {
  std::shared_ptr<SafetensorsFile> f(new SafetensorsFile());
  f->path_ = path;
  int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) fail(path, "cannot open: ", std::strerror(errno));
  struct stat st {};
  if (::fstat(fd, &st) != 0) {
    const int err = errno;
    ::close(fd);
    fail(path, "cannot stat: ", std::strerror(err));
  }
  if (!S_ISREG(st.st_mode)) {
    ::close(fd);
    fail(path, "not a regular file");
  }
  const size_t size = static_cast<size_t>(st.st_size);
  if (size < 8) {  // too short to map usefully; parse() reports it
    uint8_t small[8] = {};
    ::close(fd);
    f->parse(small, size);
  }
  void* p = ::mmap(nullptr, size, PROT_READ, MAP_PRIVATE, fd, 0);
  const int err = errno;
  ::close(fd);
  if (p == MAP_FAILED) fail(path, "mmap of ", size, " bytes failed: ", std::strerror(err));
  f->map_ = p;
  f->map_size_ = size;
  f->parse(static_cast<const uint8_t*>(p), size);  // on throw, ~SafetensorsFile unmaps
  return f;
}

std::shared_ptr<SafetensorsFile> SafetensorsFile::from_memory(const uint8_t* bytes, size_t size,
                                                              const std::string& label) {
  NVFP4MOE_CHECK(bytes != nullptr || size == 0, ArgumentError, "from_memory(", label, "): bytes is null but size is ",
                 size);
  std::shared_ptr<SafetensorsFile> f(new SafetensorsFile());
  f->path_ = label;
  static const uint8_t kEmpty[1] = {0};
  f->parse(bytes ? bytes : kEmpty, size);
  return f;
}

SafetensorsFile::~SafetensorsFile() {
  if (map_) ::munmap(map_, map_size_);
}

const TensorInfo* SafetensorsFile::find(const std::string& name) const {
  auto it = by_name_.find(name);
  return it == by_name_.end() ? nullptr : &tensors_[it->second];
}

void SafetensorsFile::parse(const uint8_t* bytes, size_t size) {
  const std::string& f = path_;
  if (size < 8) fail(f, "file is ", size, " bytes, shorter than the 8-byte header length");
  uint64_t n = 0;
  for (int i = 7; i >= 0; --i) n = (n << 8) | bytes[i];
  if (n < 2) fail(f, "header length ", n, " is less than 2 (the smallest header is \"{}\")");
  if (n > kMaxHeaderBytes) fail(f, "header length ", n, " exceeds the limit of ", kMaxHeaderBytes, " bytes");
  if (n > size - 8)
    fail(f, "header length ", n, " extends past the end of the file (file is ", size,
         " bytes, header would end at byte ", 8 + n, "; truncated file?)");
  const uint8_t* header = bytes + 8;
  const size_t bad = find_invalid_utf8(header, n);
  if (bad != std::string::npos)
    fail(f, "header is not valid UTF-8 (byte ", hex_byte(header[bad]), " at header offset ", bad, ")");
  if (header[0] != '{') fail(f, "header does not start with '{' (first byte ", hex_byte(header[0]), ")");
  // JSON text never holds a raw NUL, and nlohmann would take one for the end of the input.
  if (const void* z = std::memchr(header, 0, n))
    fail(f, "header contains a NUL byte at header offset ", static_cast<const uint8_t*>(z) - header);
  const json j = parse_json_strict(reinterpret_cast<const char*>(header), reinterpret_cast<const char*>(header + n),
                                   "safetensors " + f, "header");
  if (!j.is_object()) fail(f, "header is not a JSON object (got ", j.type_name(), ")");

  const uint64_t data_size = size - 8 - n;  // the data section starts right after the header
  const uint8_t* data = header + n;
  for (auto it = j.begin(); it != j.end(); ++it) {
    const std::string& key = it.key();
    if (key == "__metadata__") {
      const json& m = it.value();
      if (!m.is_object()) fail(f, "\"__metadata__\" is not a JSON object (got ", brief(m), ")");
      for (auto mi = m.begin(); mi != m.end(); ++mi) {
        if (!mi.value().is_string())
          fail(f, "\"__metadata__\" value of \"", mi.key(), "\" is not a string (got ", brief(mi.value()), ")");
        metadata_[mi.key()] = mi.value().get<std::string>();
      }
      continue;
    }
    TensorInfo t = parse_entry(f, key, it.value(), data_size);
    t.data = data + t.begin;
    tensors_.push_back(std::move(t));
  }

  std::sort(tensors_.begin(), tensors_.end(), [](const TensorInfo& a, const TensorInfo& b) {
    return a.begin != b.begin ? a.begin < b.begin : a.end != b.end ? a.end < b.end : a.name < b.name;
  });
  // Sorted by offset, the tensors must tile [0, data_size) exactly.
  uint64_t covered = 0;
  const TensorInfo* prev = nullptr;
  for (const TensorInfo& t : tensors_) {
    if (t.begin < covered)
      fail(f, "tensors \"", prev->name, "\" [", prev->begin, ", ", prev->end, ") and \"", t.name, "\" [", t.begin,
           ", ", t.end, ") overlap");
    if (t.begin > covered) {
      if (prev)
        fail(f, "gap of ", t.begin - covered, " bytes in the data section between \"", prev->name,
             "\" (ends at ", covered, ") and \"", t.name, "\" (begins at ", t.begin, ")");
      fail(f, "gap of ", t.begin, " bytes at the start of the data section before \"", t.name, "\" (begins at ",
           t.begin, ")");
    }
    covered = t.end;
    prev = &t;
  }
  if (covered != data_size) {
    if (prev)
      fail(f, data_size - covered, " trailing bytes after the last tensor \"", prev->name, "\" (tensors end at ",
           covered, ", data section is ", data_size, " bytes)");
    fail(f, data_size, " trailing bytes after the header, which lists no tensors");
  }
  for (size_t i = 0; i < tensors_.size(); ++i)
    if (!by_name_.emplace(tensors_[i].name, i).second) fail(f, "duplicate tensor name \"", tensors_[i].name, "\"");
}

// ------------------------------------------------------------------------------------------ sets

namespace {

void add_whole_file(std::vector<std::shared_ptr<SafetensorsFile>>& files,
                    std::map<std::string, std::pair<const TensorInfo*, size_t>>& index,
                    std::shared_ptr<SafetensorsFile> file) {
  const size_t k = files.size();
  for (const TensorInfo& t : file->tensors()) index[t.name] = {&t, k};
  files.push_back(std::move(file));
}

bool ends_with(const std::string& s, const std::string& suffix) {
  return s.size() >= suffix.size() && s.compare(s.size() - suffix.size(), suffix.size(), suffix) == 0;
}

}  // namespace

SafetensorsSet SafetensorsSet::open(const std::string& path) {
  SafetensorsSet set;
  set.path_ = path;
  std::error_code ec;
  const fs::path p(path);
  fs::path index_path;
  if (fs::is_directory(p, ec)) {
    if (fs::exists(p / "model.safetensors.index.json", ec)) {
      index_path = p / "model.safetensors.index.json";
    } else {
      std::vector<std::string> found;
      for (const auto& e : fs::directory_iterator(p, ec))
        if (e.path().extension() == ".safetensors" && e.is_regular_file(ec)) found.push_back(e.path().string());
      if (ec) fail(path, "cannot list directory: ", ec.message());
      std::sort(found.begin(), found.end());
      if (found.empty()) fail(path, "directory has no model.safetensors.index.json and no *.safetensors file");
      if (found.size() > 1) {
        std::string list;
        for (const auto& s : found) list += (list.empty() ? "" : ", ") + fs::path(s).filename().string();
        fail(path, "directory has ", found.size(), " *.safetensors files (", list,
             ") but no model.safetensors.index.json to say how they belong together");
      }
      add_whole_file(set.files_, set.index_, SafetensorsFile::open(found[0]));
      return set;
    }
  } else if (ends_with(path, ".index.json")) {
    index_path = p;
  } else {
    add_whole_file(set.files_, set.index_, SafetensorsFile::open(path));
    return set;
  }

  // ---- a sharded checkpoint: model.safetensors.index.json's weight_map names the shard of every tensor
  const std::string ix = index_path.string();
  const fs::path dir = index_path.parent_path();
  const std::string text = read_small_file(ix, kMaxIndexBytes, ix);
  const size_t bad = find_invalid_utf8(reinterpret_cast<const uint8_t*>(text.data()), text.size());
  if (bad != std::string::npos)
    fail(ix, "index is not valid UTF-8 (byte ", hex_byte(static_cast<uint8_t>(text[bad])), " at offset ", bad, ")");
  if (const size_t z = text.find('\0'); z != std::string::npos)
    fail(ix, "index contains a NUL byte at offset ", z);
  const json j = parse_json_strict(text.data(), text.data() + text.size(), "safetensors " + ix, "index");
  if (!j.is_object()) fail(ix, "index is not a JSON object (got ", brief(j), ")");
  auto wm = j.find("weight_map");
  if (wm == j.end()) fail(ix, "index has no \"weight_map\"");
  if (!wm->is_object()) fail(ix, "\"weight_map\" is not a JSON object (got ", brief(*wm), ")");

  std::map<std::string, std::string> shard_of;                // tensor -> shard file name
  std::map<std::string, std::vector<std::string>> by_shard;   // shard -> tensors
  for (auto it = wm->begin(); it != wm->end(); ++it) {
    if (!it.value().is_string())
      fail(ix, "\"weight_map\" value of tensor \"", it.key(), "\" is not a string (got ", brief(it.value()), ")");
    const std::string& shard = it.value().get_ref<const std::string&>();
    const fs::path sp(shard);
    if (shard.empty() || sp.is_absolute() ||
        std::any_of(sp.begin(), sp.end(), [](const fs::path& c) { return c == ".."; }))
      fail(ix, "tensor \"", it.key(), "\" maps to shard \"", shard,
           "\", which is not a relative path inside the checkpoint directory");
    shard_of[it.key()] = shard;
    by_shard[shard].push_back(it.key());
  }

  std::map<std::string, size_t> file_no;  // shard -> index in files_
  for (const auto& [shard, names] : by_shard) {
    const fs::path sp = dir / shard;
    if (!fs::exists(sp, ec))
      fail(ix, "shard \"", shard, "\" (holding tensor \"", names.front(), "\"",
           names.size() > 1 ? detail::cat(" and ", names.size() - 1, " more") : std::string(),
           ") does not exist at ", sp.string());
    file_no[shard] = set.files_.size();
    set.files_.push_back(SafetensorsFile::open(sp.string()));
  }

  // What the shards actually hold; a tensor must live in exactly one shard, the one the index names.
  std::map<std::string, const std::string*> holder;
  for (const auto& [shard, k] : file_no) {
    for (const TensorInfo& t : set.files_[k]->tensors()) {
      auto [it, inserted] = holder.emplace(t.name, &shard);
      if (!inserted)
        fail(ix, "tensor \"", t.name, "\" is in two shards: \"", *it->second, "\" and \"", shard, "\"");
    }
  }
  for (const auto& [name, shard] : shard_of) {
    const size_t k = file_no.at(shard);
    const TensorInfo* t = set.files_[k]->find(name);
    if (!t) {
      auto h = holder.find(name);
      fail(ix, "index maps tensor \"", name, "\" to shard \"", shard, "\", which does not contain it",
           h != holder.end() ? " (it is in \"" + *h->second + "\")" : std::string());
    }
    set.index_[name] = {t, k};
  }
  for (const auto& [name, shard] : holder)
    if (!shard_of.count(name))
      fail(ix, "tensor \"", name, "\" is in shard \"", *shard, "\" but the index's weight_map does not list it");
  return set;
}

const TensorInfo* SafetensorsSet::find(const std::string& name) const {
  auto it = index_.find(name);
  return it == index_.end() ? nullptr : it->second.first;
}

const TensorInfo& SafetensorsSet::get(const std::string& name) const {
  const TensorInfo* t = find(name);
  if (!t)
    throw FormatError(detail::cat("tensor \"", name, "\" not found in ", path_, " (", index_.size(), " tensors in ",
                                  files_.size(), " file", files_.size() == 1 ? "" : "s", ")"));
  return *t;
}

std::vector<std::string> SafetensorsSet::names() const {
  std::vector<std::string> out;
  out.reserve(index_.size());
  for (const auto& kv : index_) out.push_back(kv.first);
  return out;
}

const std::string& SafetensorsSet::file_of(const std::string& name) const {
  auto it = index_.find(name);
  if (it == index_.end())
    throw FormatError(detail::cat("tensor \"", name, "\" not found in ", path_, " (", index_.size(), " tensors)"));
  return files_[it->second.second]->path();
}

// ------------------------------------------------------------------------------------------ writer

namespace {

// Validates one tensor description and returns its byte size.
size_t checked_nbytes(const TensorToWrite& t, const std::string& where) {
  const std::string who = where + ": tensor \"" + t.name + "\"";
  NVFP4MOE_CHECK(dtype_size(t.dtype) != 0, ArgumentError, who, ": invalid dtype code ",
                 static_cast<int>(t.dtype));
  int64_t numel = 1;
  for (size_t i = 0; i < t.shape.size(); ++i) {
    NVFP4MOE_CHECK(t.shape[i] >= 0, ArgumentError, who, ": shape[", i, "] = ", t.shape[i], " is negative");
    NVFP4MOE_CHECK(!__builtin_mul_overflow(numel, t.shape[i], &numel), ArgumentError, who,
                   ": element count of shape ", shape_str(t.shape), " overflows int64");
  }
  size_t nbytes = 0;
  NVFP4MOE_CHECK(!__builtin_mul_overflow(static_cast<size_t>(numel), dtype_size(t.dtype), &nbytes), ArgumentError,
                 who, ": byte size of shape ", shape_str(t.shape), " overflows size_t");
  NVFP4MOE_CHECK(nbytes == 0 || t.fill, ArgumentError, who, ": no fill callback for ", nbytes, " bytes");
  return nbytes;
}

std::vector<size_t> validate_for_write(const std::vector<TensorToWrite>& tensors, const std::string& where) {
  std::set<std::string> seen;
  std::vector<size_t> sizes;
  sizes.reserve(tensors.size());
  for (const TensorToWrite& t : tensors) {
    NVFP4MOE_CHECK(find_invalid_utf8(reinterpret_cast<const uint8_t*>(t.name.data()), t.name.size()) ==
                       std::string::npos,
                   ArgumentError, where, ": tensor name \"", t.name, "\" is not valid UTF-8");
    NVFP4MOE_CHECK(t.name != "__metadata__", ArgumentError, where,
                   ": tensor name \"__metadata__\" is reserved for the header's metadata");
    NVFP4MOE_CHECK(seen.insert(t.name).second, ArgumentError, where, ": duplicate tensor name \"", t.name, "\"");
    sizes.push_back(checked_nbytes(t, where));
  }
  return sizes;
}

// Header bytes (length prefix included), padded with spaces so the data section starts 8-byte aligned.
std::string build_header(const TensorToWrite* tensors, const size_t* sizes, size_t count,
                         const std::map<std::string, std::string>& metadata, const std::string& where) {
  nlohmann::ordered_json h = nlohmann::ordered_json::object();
  if (!metadata.empty()) {
    nlohmann::ordered_json m = nlohmann::ordered_json::object();
    for (const auto& [k, v] : metadata) {
      NVFP4MOE_CHECK(find_invalid_utf8(reinterpret_cast<const uint8_t*>(k.data()), k.size()) == std::string::npos &&
                         find_invalid_utf8(reinterpret_cast<const uint8_t*>(v.data()), v.size()) == std::string::npos,
                     ArgumentError, where, ": metadata entry \"", k, "\" is not valid UTF-8");
      m[k] = v;
    }
    h["__metadata__"] = std::move(m);
  }
  uint64_t offset = 0;
  for (size_t i = 0; i < count; ++i) {
    nlohmann::ordered_json e = nlohmann::ordered_json::object();
    e["dtype"] = dtype_name(tensors[i].dtype);
    e["shape"] = tensors[i].shape;
    e["data_offsets"] = {offset, offset + sizes[i]};
    offset += sizes[i];
    h[tensors[i].name] = std::move(e);
  }
  std::string text = h.dump();
  text.append((8 - text.size() % 8) % 8, ' ');
  NVFP4MOE_CHECK(text.size() <= kMaxHeaderBytes, ArgumentError, where, ": header of ", text.size(),
                 " bytes exceeds the safetensors limit of ", kMaxHeaderBytes);
  std::string out(8, '\0');
  const uint64_t n = text.size();
  for (int i = 0; i < 8; ++i) out[static_cast<size_t>(i)] = static_cast<char>((n >> (8 * i)) & 0xFF);
  return out + text;
}

void write_all(int fd, const void* data, size_t n, const std::string& path) {
  const char* p = static_cast<const char*>(data);
  while (n > 0) {
    const ssize_t w = ::write(fd, p, std::min<size_t>(n, size_t{1} << 30));
    if (w < 0 && errno == EINTR) continue;
    if (w <= 0) throw Error(detail::cat("write to ", path, " failed: ", std::strerror(errno)));
    p += w;
    n -= static_cast<size_t>(w);
  }
}

// Writes one complete safetensors file at `tmp` (not renamed). Throws on any failure; the caller removes tmp.
void write_file(const std::string& tmp, const std::string& header, const TensorToWrite* tensors,
                const size_t* sizes, size_t count) {
  int fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0) throw Error(detail::cat("cannot create ", tmp, ": ", std::strerror(errno)));
  try {
    write_all(fd, header.data(), header.size(), tmp);
    std::vector<uint8_t> buf;
    for (size_t i = 0; i < count; ++i) {
      if (sizes[i] == 0) continue;
      buf.resize(sizes[i]);
      tensors[i].fill(buf.data(), sizes[i]);
      write_all(fd, buf.data(), sizes[i], tmp);
    }
    if (::fsync(fd) != 0) throw Error(detail::cat("fsync of ", tmp, " failed: ", std::strerror(errno)));
  } catch (...) {
    ::close(fd);
    throw;
  }
  if (::close(fd) != 0) throw Error(detail::cat("close of ", tmp, " failed: ", std::strerror(errno)));
}

void write_text(const std::string& tmp, const std::string& text) {
  int fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0) throw Error(detail::cat("cannot create ", tmp, ": ", std::strerror(errno)));
  try {
    write_all(fd, text.data(), text.size(), tmp);
    if (::fsync(fd) != 0) throw Error(detail::cat("fsync of ", tmp, " failed: ", std::strerror(errno)));
  } catch (...) {
    ::close(fd);
    throw;
  }
  if (::close(fd) != 0) throw Error(detail::cat("close of ", tmp, " failed: ", std::strerror(errno)));
}

void rename_or_throw(const std::string& from, const std::string& to) {
  if (::rename(from.c_str(), to.c_str()) != 0)
    throw Error(detail::cat("cannot rename ", from, " to ", to, ": ", std::strerror(errno)));
}

}  // namespace

void write_safetensors(const std::string& path, const std::vector<TensorToWrite>& tensors,
                       const std::map<std::string, std::string>& metadata) {
  const std::string where = "write_safetensors(" + path + ")";
  const std::vector<size_t> sizes = validate_for_write(tensors, where);
  const std::string header = build_header(tensors.data(), sizes.data(), tensors.size(), metadata, where);
  const std::string tmp = path + ".tmp";
  try {
    write_file(tmp, header, tensors.data(), sizes.data(), tensors.size());
    rename_or_throw(tmp, path);
  } catch (...) {
    ::unlink(tmp.c_str());
    throw;
  }
}

void write_sharded_safetensors(const std::string& dir, const std::vector<TensorToWrite>& tensors,
                               size_t max_shard_bytes) {
  const std::string where = "write_sharded_safetensors(" + dir + ")";
  NVFP4MOE_CHECK(max_shard_bytes > 0, ArgumentError, where, ": max_shard_bytes must be > 0, got 0");
  const std::vector<size_t> sizes = validate_for_write(tensors, where);

  // Shards in order: a new shard starts when the next tensor would push a non-empty one past the limit.
  std::vector<std::pair<size_t, size_t>> shards;  // [first, last) tensor ranges
  size_t first = 0, bytes = 0;
  for (size_t i = 0; i < tensors.size(); ++i) {
    if (i > first && bytes + sizes[i] > max_shard_bytes) {
      shards.emplace_back(first, i);
      first = i;
      bytes = 0;
    }
    bytes += sizes[i];
  }
  shards.emplace_back(first, tensors.size());  // also the single empty shard of an empty list

  std::error_code ec;
  fs::create_directories(dir, ec);
  if (ec) throw Error(detail::cat(where, ": cannot create directory: ", ec.message()));

  const size_t n = shards.size();
  std::vector<std::string> names(n), tmps;
  json weight_map = json::object();
  uint64_t total = 0;
  for (size_t s = 0; s < n; ++s) {
    char buf[64];
    std::snprintf(buf, sizeof buf, "model-%05zu-of-%05zu.safetensors", s + 1, n);
    names[s] = buf;
    for (size_t i = shards[s].first; i < shards[s].second; ++i) {
      weight_map[tensors[i].name] = names[s];
      total += sizes[i];
    }
  }
  json index = {{"metadata", {{"total_size", total}}}, {"weight_map", std::move(weight_map)}};

  // Everything goes to .tmp files first; only a complete set is renamed into place (the index last).
  try {
    for (size_t s = 0; s < n; ++s) {
      const auto [b, e] = shards[s];
      const std::string header = build_header(tensors.data() + b, sizes.data() + b, e - b, {}, where);
      tmps.push_back((fs::path(dir) / names[s]).string() + ".tmp");
      write_file(tmps.back(), header, tensors.data() + b, sizes.data() + b, e - b);
    }
    tmps.push_back((fs::path(dir) / "model.safetensors.index.json").string() + ".tmp");
    write_text(tmps.back(), index.dump(2) + "\n");
    for (size_t s = 0; s < n; ++s) rename_or_throw(tmps[s], (fs::path(dir) / names[s]).string());
    rename_or_throw(tmps.back(), (fs::path(dir) / "model.safetensors.index.json").string());
  } catch (...) {
    for (const auto& t : tmps) ::unlink(t.c_str());
    throw;
  }
}

}  // namespace nvfp4moe::io
