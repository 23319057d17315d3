// safetensors reader/writer: round trips of every dtype (single file and sharded), a crafted corpus of bad
// files (one per check the reader makes, each asserting its specific message), and writer atomicity.
#include <gtest/gtest.h>

#include <unistd.h>

#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <random>
#include <stdexcept>

#include <nlohmann/json.hpp>

#include "io/safetensors.h"
#include "nvfp4moe/error.h"

namespace nvfp4moe::io {
namespace {

namespace fs = std::filesystem;

std::string le64(uint64_t v) {
  std::string s(8, '\0');
  for (int i = 0; i < 8; ++i) s[static_cast<size_t>(i)] = static_cast<char>((v >> (8 * i)) & 0xFF);
  return s;
}

// A raw file image: length prefix, header text, data bytes.
std::string image(const std::string& header, const std::string& data = "") {
  return le64(header.size()) + header + data;
}

std::string read_all(const fs::path& p) {
  std::ifstream in(p, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(in), {});
}

void write_raw(const fs::path& p, const std::string& bytes) {
  std::ofstream out(p, std::ios::binary);
  out.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
  ASSERT_TRUE(out.good()) << p;
}

std::vector<std::string> dir_entries(const fs::path& d) {
  std::vector<std::string> out;
  for (const auto& e : fs::directory_iterator(d)) out.push_back(e.path().filename().string());
  std::sort(out.begin(), out.end());
  return out;
}

// Runs f, which must throw E; returns its message ("" and a failure otherwise).
template <typename E, typename F>
std::string message_of(F&& f) {
  try {
    f();
  } catch (const E& e) {
    return e.what();
  } catch (const std::exception& e) {
    ADD_FAILURE() << "threw the wrong exception type: " << e.what();
    return "";
  }
  ADD_FAILURE() << "did not throw";
  return "";
}

#define EXPECT_HAS(msg, sub)                                                        \
  do {                                                                              \
    const std::string m_ = (msg);                                                   \
    EXPECT_NE(m_.find(sub), std::string::npos) << "message: " << m_ << "\nwanted: " << (sub); \
  } while (0)

TensorToWrite tensor_from(const std::string& name, DType dtype, std::vector<int64_t> shape, std::string bytes) {
  TensorToWrite t;
  t.name = name;
  t.dtype = dtype;
  t.shape = std::move(shape);
  t.fill = [bytes = std::move(bytes)](uint8_t* dst, size_t n) {
    ASSERT_EQ(n, bytes.size());
    std::memcpy(dst, bytes.data(), n);
  };
  return t;
}

std::string random_bytes(size_t n, uint32_t seed) {
  std::mt19937 rng(seed);
  std::string s(n, '\0');
  for (auto& c : s) c = static_cast<char>(rng() & 0xFF);
  return s;
}

constexpr DType kAllDTypes[] = {DType::U8,   DType::I8,  DType::F8_E4M3, DType::F8_E5M2, DType::BF16,
                                DType::F16,  DType::F32, DType::I32,     DType::I64,     DType::BOOL};

class Safetensors : public ::testing::Test {
 protected:
  void SetUp() override {
    const auto* info = ::testing::UnitTest::GetInstance()->current_test_info();
    dir_ = fs::temp_directory_path() /
           ("nvfp4moe_io_" + std::string(info->test_suite_name()) + "_" + info->name() + "_" +
            std::to_string(::getpid()));
    fs::remove_all(dir_);
    fs::create_directories(dir_);
  }
  void TearDown() override { fs::remove_all(dir_); }

  // Writes `bytes` as a file, opens it and returns the FormatError message; checks that the message names
  // the file and that from_memory reports the same failure.
  std::string bad(const std::string& bytes) {
    const fs::path p = dir_ / "bad.safetensors";
    write_raw(p, bytes);
    const std::string msg = message_of<FormatError>([&] { SafetensorsFile::open(p.string()); });
    EXPECT_HAS(msg, p.string());
    const std::string mem = message_of<FormatError>(
        [&] { SafetensorsFile::from_memory(reinterpret_cast<const uint8_t*>(bytes.data()), bytes.size(), "mem"); });
    EXPECT_EQ(mem.substr(mem.find(": ")), msg.substr(msg.find(": ", msg.find(p.string())))) << msg << "\n" << mem;
    return msg;
  }

  fs::path dir_;
};

// ------------------------------------------------------------------------------------------ round trips

TEST_F(Safetensors, RoundTripEveryDtypeRank0AndZeroSize) {
  std::vector<TensorToWrite> tensors;
  std::map<std::string, std::string> expect;
  uint32_t seed = 1;
  for (DType d : kAllDTypes) {
    const std::string base = std::string("t.") + dtype_name(d);
    const std::vector<std::pair<std::string, std::vector<int64_t>>> shapes = {
        {".2d", {3, 5}}, {".rank0", {}}, {".zero", {0, 4}}, {".3d", {2, 1, 7}}};
    for (const auto& [suffix, shape] : shapes) {
      int64_t numel = 1;
      for (int64_t s : shape) numel *= s;
      std::string bytes = random_bytes(static_cast<size_t>(numel) * dtype_size(d), seed++);
      if (d == DType::BOOL)
        for (auto& c : bytes) c = static_cast<char>(c & 1);
      expect[base + suffix] = bytes;
      tensors.push_back(tensor_from(base + suffix, d, shape, bytes));
    }
  }
  const fs::path p = dir_ / "all.safetensors";
  write_safetensors(p.string(), tensors, {{"format", "pt"}, {"note", "round trip"}});
  EXPECT_EQ(dir_entries(dir_), std::vector<std::string>{"all.safetensors"});  // no .tmp left

  const std::string raw = read_all(p);
  uint64_t n = 0;
  for (int i = 7; i >= 0; --i) n = (n << 8) | static_cast<uint8_t>(raw[static_cast<size_t>(i)]);
  EXPECT_EQ((8 + n) % 8, 0u) << "data section must start 8-byte aligned";
  EXPECT_EQ(raw[8], '{');

  auto f = SafetensorsFile::open(p.string());
  EXPECT_EQ(f->path(), p.string());
  ASSERT_EQ(f->tensors().size(), tensors.size());
  EXPECT_EQ(f->metadata(), (std::map<std::string, std::string>{{"format", "pt"}, {"note", "round trip"}}));
  uint64_t prev_end = 0;
  for (const TensorInfo& t : f->tensors()) {  // offset order, contiguous
    EXPECT_EQ(t.begin, prev_end) << t.name;
    prev_end = t.end;
  }
  for (const TensorToWrite& w : tensors) {
    const TensorInfo* t = f->find(w.name);
    ASSERT_NE(t, nullptr) << w.name;
    EXPECT_EQ(t->dtype, w.dtype) << w.name;
    EXPECT_EQ(t->shape, w.shape) << w.name;
    const std::string& bytes = expect[w.name];
    EXPECT_EQ(t->nbytes(), bytes.size()) << w.name;
    EXPECT_EQ(t->numel() * static_cast<int64_t>(dtype_size(t->dtype)), static_cast<int64_t>(bytes.size()));
    EXPECT_EQ(std::string(reinterpret_cast<const char*>(t->data), t->nbytes()), bytes) << w.name;
  }
  EXPECT_EQ(f->find("t.F32.rank0")->shape.size(), 0u);
  EXPECT_EQ(f->find("t.F32.rank0")->numel(), 1);
  EXPECT_EQ(f->find("t.I64.zero")->nbytes(), 0u);
  EXPECT_EQ(f->find("absent"), nullptr);

  // The same through SafetensorsSet: a file path, and a directory holding only that file.
  for (const std::string& path : {p.string(), dir_.string()}) {
    SafetensorsSet set = SafetensorsSet::open(path);
    EXPECT_EQ(set.num_files(), 1u);
    const std::vector<std::string> names = set.names();
    EXPECT_EQ(names.size(), tensors.size());
    EXPECT_TRUE(std::is_sorted(names.begin(), names.end()));
    EXPECT_EQ(set.file_of("t.BF16.2d"), p.string());
    EXPECT_EQ(set.get("t.I8.3d").shape, (std::vector<int64_t>{2, 1, 7}));
    EXPECT_HAS(message_of<FormatError>([&] { set.get("nope"); }), "tensor \"nope\" not found in " + path);
    EXPECT_EQ(set.find("nope"), nullptr);
  }
}

TEST_F(Safetensors, WriterBytesMatchTheReferenceLayout) {
  // What the reference implementation writes for one U8[2] tensor: compact JSON padded with spaces to 8.
  const fs::path p = dir_ / "one.safetensors";
  write_safetensors(p.string(), {tensor_from("a", DType::U8, {2}, "\x01\x02")});
  std::string header = R"({"a":{"dtype":"U8","shape":[2],"data_offsets":[0,2]}})";
  header.append((8 - header.size() % 8) % 8, ' ');
  EXPECT_EQ(read_all(p), image(header, "\x01\x02"));
}

TEST_F(Safetensors, ReaderAcceptsAnyKeyOrderPaddingAndEmptyHeader) {
  const std::string h =
      R"({"b":{"data_offsets":[4,6],"shape":[1],"dtype":"BF16"}, "a":{"shape":[2,2],"dtype":"U8","data_offsets":[0,4],"extra":1}}    )";
  const std::string img = image(h, "abcdXY");
  auto g = SafetensorsFile::from_memory(reinterpret_cast<const uint8_t*>(img.data()), img.size(), "mem");
  ASSERT_EQ(g->tensors().size(), 2u);
  EXPECT_EQ(g->tensors()[0].name, "a");  // offset order
  EXPECT_EQ(g->tensors()[1].name, "b");
  EXPECT_EQ(std::string(reinterpret_cast<const char*>(g->find("b")->data), 2), "XY");

  const std::string empty = image("{}");
  auto e = SafetensorsFile::from_memory(reinterpret_cast<const uint8_t*>(empty.data()), empty.size(), "empty");
  EXPECT_TRUE(e->tensors().empty());
}

TEST_F(Safetensors, ShardedRoundTrip) {
  std::vector<TensorToWrite> tensors;
  std::map<std::string, std::string> expect;
  uint32_t seed = 100;
  for (DType d : kAllDTypes) {
    const std::string name = std::string("layer.") + dtype_name(d);
    const std::string bytes = random_bytes(40 * dtype_size(d), seed++);
    expect[name] = bytes;
    tensors.push_back(tensor_from(name, d, {5, 8}, bytes));
  }
  tensors.push_back(tensor_from("scalar", DType::F32, {}, std::string("\0\0\x80\x3f", 4)));
  expect["scalar"] = std::string("\0\0\x80\x3f", 4);
  tensors.push_back(tensor_from("empty", DType::BF16, {0}, ""));
  expect["empty"] = "";

  write_sharded_safetensors(dir_.string(), tensors, 100);
  // 40,40 | 40,40 | 80 | 80 | 160 | 160 | 320 | 40,4,0 bytes with a 100-byte budget -> 8 shards.
  const std::vector<std::string> want = {
      "model-00001-of-00008.safetensors", "model-00002-of-00008.safetensors", "model-00003-of-00008.safetensors",
      "model-00004-of-00008.safetensors", "model-00005-of-00008.safetensors", "model-00006-of-00008.safetensors",
      "model-00007-of-00008.safetensors", "model-00008-of-00008.safetensors", "model.safetensors.index.json"};
  EXPECT_EQ(dir_entries(dir_), want);

  const auto index = nlohmann::json::parse(read_all(dir_ / "model.safetensors.index.json"));
  size_t total = 0;
  for (const auto& [k, v] : expect) total += v.size();
  EXPECT_EQ(index["metadata"]["total_size"].get<size_t>(), total);
  EXPECT_EQ(index["weight_map"].size(), tensors.size());
  EXPECT_EQ(index["weight_map"]["layer.U8"], "model-00001-of-00008.safetensors");
  EXPECT_EQ(index["weight_map"]["layer.I8"], "model-00001-of-00008.safetensors");
  EXPECT_EQ(index["weight_map"]["layer.I64"], "model-00007-of-00008.safetensors");
  EXPECT_EQ(index["weight_map"]["empty"], "model-00008-of-00008.safetensors");

  for (const std::string& path : {dir_.string(), (dir_ / "model.safetensors.index.json").string()}) {
    SafetensorsSet set = SafetensorsSet::open(path);
    EXPECT_EQ(set.num_files(), 8u);
    EXPECT_EQ(set.names().size(), tensors.size());
    for (const auto& [name, bytes] : expect) {
      const TensorInfo& t = set.get(name);
      EXPECT_EQ(std::string(reinterpret_cast<const char*>(t.data), t.nbytes()), bytes) << name;
      EXPECT_EQ(fs::path(set.file_of(name)).filename().string(), index["weight_map"][name].get<std::string>());
    }
    EXPECT_EQ(set.get("scalar").shape.size(), 0u);
  }
}

TEST_F(Safetensors, ShardedSingleTensorLargerThanBudgetAndEmptyList) {
  write_sharded_safetensors((dir_ / "big").string(), {tensor_from("w", DType::U8, {64}, std::string(64, 'x'))}, 8);
  EXPECT_EQ(SafetensorsSet::open((dir_ / "big").string()).num_files(), 1u);
  write_sharded_safetensors((dir_ / "none").string(), {}, 8);
  EXPECT_EQ(dir_entries(dir_ / "none"),
            (std::vector<std::string>{"model-00001-of-00001.safetensors", "model.safetensors.index.json"}));
  SafetensorsSet none = SafetensorsSet::open((dir_ / "none").string());
  EXPECT_EQ(none.num_files(), 0u);  // the index names no shard
  EXPECT_TRUE(none.names().empty());
}

// ------------------------------------------------------------------------------------------ bad files

const std::string kGood = R"("dtype":"F32","shape":[2],"data_offsets":[0,8])";

TEST_F(Safetensors, BadFileTooShortForLengthPrefix) {
  EXPECT_HAS(bad(""), "file is 0 bytes, shorter than the 8-byte header length");
  EXPECT_HAS(bad("abc"), "file is 3 bytes, shorter than the 8-byte header length");
  EXPECT_HAS(bad(std::string(7, '\0')), "file is 7 bytes");
}

TEST_F(Safetensors, BadHeaderLength) {
  EXPECT_HAS(bad(le64(0)), "header length 0 is less than 2");
  EXPECT_HAS(bad(le64(1) + "{"), "header length 1 is less than 2");
  EXPECT_HAS(bad(le64(0xFFFFFFFFFFFFFFFFull) + "{}"), "header length 18446744073709551615 exceeds the limit of 100000000");
  EXPECT_HAS(bad(le64(kMaxHeaderBytes + 1) + "{}"), "header length 100000001 exceeds the limit");
  EXPECT_HAS(bad(le64(0x8000000000000000ull) + "{}"), "exceeds the limit");
  EXPECT_HAS(bad(le64(100) + "{}"), "header length 100 extends past the end of the file (file is 10 bytes");
}

TEST_F(Safetensors, BadTruncatedFile) {
  const fs::path p = dir_ / "good.safetensors";
  write_safetensors(p.string(), {tensor_from("w", DType::F32, {4}, std::string(16, 'a'))});
  const std::string full = read_all(p);
  EXPECT_HAS(bad(full.substr(0, full.size() - 1)),
             "tensor \"w\": data_offsets [0, 16] extend past the end of the data section (15 bytes)");
  EXPECT_HAS(bad(full.substr(0, 20)), "extends past the end of the file (file is 20 bytes");
  EXPECT_HAS(bad(full.substr(0, 5)), "file is 5 bytes, shorter than");
}

TEST_F(Safetensors, BadUtf8) {
  EXPECT_HAS(bad(image("{\"w\xff\":{}}")), "header is not valid UTF-8 (byte 0xFF at header offset 3)");
  EXPECT_HAS(bad(image("{\"\xc0\xaf\":1}")), "not valid UTF-8 (byte 0xC0");  // overlong '/'
  EXPECT_HAS(bad(image("{\"\xed\xa0\x80\":1}")), "not valid UTF-8 (byte 0xED");  // surrogate
  EXPECT_HAS(bad(image("{\"\xe2\x82\":1}")), "not valid UTF-8 (byte 0xE2");  // cut sequence
  EXPECT_HAS(bad(image("{\"\xf4\x90\x80\x80\":1}")), "not valid UTF-8 (byte 0xF4");  // > U+10FFFF
}

TEST_F(Safetensors, BadNotJsonOrNotAnObject) {
  EXPECT_HAS(bad(image("{abc}")), "header is not valid JSON");
  EXPECT_HAS(bad(image("{\"a\":1")), "header is not valid JSON");
  EXPECT_HAS(bad(image("{} x")), "header is not valid JSON");
  // nlohmann stops at a NUL as if the text ended there; the reader must not.
  EXPECT_HAS(bad(image(std::string("{}\0\0", 4))), "header contains a NUL byte at header offset 2");
  EXPECT_HAS(bad(image(std::string("{\0\"a\":1}", 8))), "header contains a NUL byte at header offset 1");
  EXPECT_HAS(bad(image("[1,2]")), "header does not start with '{' (first byte 0x5B)");
  EXPECT_HAS(bad(image(" {}")), "header does not start with '{' (first byte 0x20)");
  EXPECT_HAS(bad(image("\"{}\"")), "does not start with '{'");
  EXPECT_HAS(bad(image("{\"a\":" + std::string(100, '[') + std::string(100, ']') + "}")), "nests deeper than");
}

TEST_F(Safetensors, BadMetadata) {
  EXPECT_HAS(bad(image(R"({"__metadata__":[1]})")), "\"__metadata__\" is not a JSON object (got array [1])");
  EXPECT_HAS(bad(image(R"({"__metadata__":{"format":"pt","n":3}})")),
             "\"__metadata__\" value of \"n\" is not a string (got number 3)");
}

TEST_F(Safetensors, BadEntryFields) {
  const std::string data(8, 'd');
  EXPECT_HAS(bad(image(R"({"w":5})", data)), "tensor \"w\": entry is not a JSON object (got number 5)");
  EXPECT_HAS(bad(image(R"({"w":{"shape":[2],"data_offsets":[0,8]}})", data)), "tensor \"w\": missing \"dtype\"");
  EXPECT_HAS(bad(image(R"({"w":{"dtype":"F32","data_offsets":[0,8]}})", data)), "tensor \"w\": missing \"shape\"");
  EXPECT_HAS(bad(image(R"({"w":{"dtype":"F32","shape":[2]}})", data)), "tensor \"w\": missing \"data_offsets\"");
  EXPECT_HAS(bad(image(R"({"w":{"dtype":4,"shape":[2],"data_offsets":[0,8]}})", data)),
             "tensor \"w\": \"dtype\" is not a string (got number 4)");
  EXPECT_HAS(bad(image(R"({"w":{"dtype":"F32","shape":2,"data_offsets":[0,8]}})", data)),
             "tensor \"w\": \"shape\" is not an array (got number 2)");
  EXPECT_HAS(bad(image(R"({"w":{"dtype":"F32","shape":[2.0],"data_offsets":[0,8]}})", data)),
             "tensor \"w\": shape[0] is not an integer (got number 2.0)");
  EXPECT_HAS(bad(image(R"({"w":{"dtype":"F32","shape":["2"],"data_offsets":[0,8]}})", data)),
             "shape[0] is not an integer (got string \"2\")");
  EXPECT_HAS(bad(image(R"({"w":{"dtype":"F32","shape":[2],"data_offsets":{"a":0}}})", data)),
             "tensor \"w\": \"data_offsets\" is not an array of 2 integers (got object");
}

TEST_F(Safetensors, BadUnknownDtype) {
  const std::string data(8, 'd');
  EXPECT_HAS(bad(image(R"({"w":{"dtype":"F7","shape":[2],"data_offsets":[0,8]}})", data)),
             "tensor \"w\": unknown dtype \"F7\" (supported: U8, I8, F8_E4M3");
  EXPECT_HAS(bad(image(R"({"w":{"dtype":"f32","shape":[2],"data_offsets":[0,8]}})", data)), "unknown dtype \"f32\"");
  EXPECT_HAS(bad(image(R"({"w":{"dtype":"F64","shape":[1],"data_offsets":[0,8]}})", data)), "unknown dtype \"F64\"");
}

TEST_F(Safetensors, BadShape) {
  EXPECT_HAS(bad(image(R"({"w":{"dtype":"U8","shape":[2,-2],"data_offsets":[0,0]}})")),
             "tensor \"w\": shape[1] = -2 is negative");
  EXPECT_HAS(bad(image(R"({"w":{"dtype":"U8","shape":[9223372036854775808],"data_offsets":[0,0]}})")),
             "shape[0] = 9223372036854775808 does not fit in int64");
  EXPECT_HAS(bad(image(R"({"w":{"dtype":"U8","shape":[4294967296,4294967296],"data_offsets":[0,0]}})")),
             "tensor \"w\": element count of shape [4294967296, 4294967296] overflows int64");
  // 2^62 elements fit in int64, but 2^62 * 4 bytes does not fit in size_t.
  EXPECT_HAS(bad(image(R"({"w":{"dtype":"F32","shape":[4611686018427387904],"data_offsets":[0,0]}})")),
             "tensor \"w\": byte size of F32[4611686018427387904] (4611686018427387904 elements * 4 bytes) overflows size_t");
  // A zero dim after an overflowing prefix still overflows on the way (checked in order).
  EXPECT_HAS(bad(image(R"({"w":{"dtype":"U8","shape":[4294967296,4294967296,0],"data_offsets":[0,0]}})")),
             "overflows int64");
}

TEST_F(Safetensors, BadDataOffsets) {
  const std::string d8(8, 'd');
  auto entry = [&](const std::string& offs) {
    return image(R"({"w":{"dtype":"F32","shape":[2],"data_offsets":)" + offs + "}}", d8);
  };
  EXPECT_HAS(bad(entry("[0]")), "\"data_offsets\" is not an array of 2 integers (got array [0])");
  EXPECT_HAS(bad(entry("[0,8,8]")), "\"data_offsets\" is not an array of 2 integers");
  EXPECT_HAS(bad(entry("[-1,7]")), "tensor \"w\": data_offsets[0] is not a non-negative integer (got number -1)");
  EXPECT_HAS(bad(entry("[0,\"8\"]")), "data_offsets[1] is not a non-negative integer (got string \"8\")");
  EXPECT_HAS(bad(entry("[0,8.0]")), "data_offsets[1] is not a non-negative integer (got number 8.0)");
  EXPECT_HAS(bad(entry("[0,18446744073709551616]")), "data_offsets[1] is not a non-negative integer");
  EXPECT_HAS(bad(entry("[8,0]")), "tensor \"w\": data_offsets [8, 0] are reversed (begin > end)");
  EXPECT_HAS(bad(entry("[8,16]")),
             "tensor \"w\": data_offsets [8, 16] extend past the end of the data section (8 bytes)");
  EXPECT_HAS(bad(entry("[0,18446744073709551615]")), "extend past the end of the data section");
}

TEST_F(Safetensors, BadByteLength) {
  EXPECT_HAS(bad(image(R"({"w":{"dtype":"F32","shape":[3],"data_offsets":[0,8]}})", std::string(8, 'd'))),
             "tensor \"w\": byte length 8 (data_offsets [0, 8]) does not match F32[3] = 3 elements * 4 bytes = 12 bytes");
  EXPECT_HAS(bad(image(R"({"w":{"dtype":"BF16","shape":[],"data_offsets":[0,4]}})", std::string(4, 'd'))),
             "byte length 4 (data_offsets [0, 4]) does not match BF16[] = 1 elements * 2 bytes = 2 bytes");
}

TEST_F(Safetensors, BadDuplicateNames) {
  EXPECT_HAS(bad(image("{\"w\":{" + kGood + "},\"w\":{" + kGood + "}}", std::string(8, 'd'))),
             "duplicate key \"w\" in the header (duplicate tensor name)");
  EXPECT_HAS(bad(image(R"({"w":{"dtype":"F32","dtype":"U8","shape":[2],"data_offsets":[0,8]}})", std::string(8, 'd'))),
             "duplicate key \"dtype\" in \"w\" of the header");
  EXPECT_HAS(bad(image(R"({"__metadata__":{"a":"1","a":"2"}})")), "duplicate key \"a\" in \"__metadata__\"");
}

TEST_F(Safetensors, BadOverlapGapTrailing) {
  const std::string a = R"("a":{"dtype":"U8","shape":[8],"data_offsets":[0,8]})";
  EXPECT_HAS(bad(image("{" + a + R"(,"b":{"dtype":"U8","shape":[8],"data_offsets":[4,12]}})", std::string(12, 'd'))),
             "tensors \"a\" [0, 8) and \"b\" [4, 12) overlap");
  EXPECT_HAS(bad(image("{" + a + R"(,"b":{"dtype":"U8","shape":[8],"data_offsets":[0,8]}})", std::string(8, 'd'))),
             "tensors \"a\" [0, 8) and \"b\" [0, 8) overlap");
  // A zero-size tensor inside another is an overlap too.
  EXPECT_HAS(bad(image("{" + a + R"(,"z":{"dtype":"U8","shape":[0],"data_offsets":[3,3]}})", std::string(8, 'd'))),
             "tensors \"a\" [0, 8) and \"z\" [3, 3) overlap");
  EXPECT_HAS(bad(image("{" + a + R"(,"b":{"dtype":"U8","shape":[4],"data_offsets":[12,16]}})", std::string(16, 'd'))),
             "gap of 4 bytes in the data section between \"a\" (ends at 8) and \"b\" (begins at 12)");
  EXPECT_HAS(bad(image(R"({"b":{"dtype":"U8","shape":[4],"data_offsets":[4,8]}})", std::string(8, 'd'))),
             "gap of 4 bytes at the start of the data section before \"b\"");
  EXPECT_HAS(bad(image("{" + a + "}", std::string(11, 'd'))),
             "3 trailing bytes after the last tensor \"a\" (tensors end at 8, data section is 11 bytes)");
  EXPECT_HAS(bad(image("{}", "xyz")), "3 trailing bytes after the header, which lists no tensors");
  // Zero-size tensors between neighbours are fine.
  const std::string ok = image("{" + a + R"(,"z":{"dtype":"U8","shape":[0],"data_offsets":[8,8]}})", std::string(8, 'd'));
  EXPECT_EQ(SafetensorsFile::from_memory(reinterpret_cast<const uint8_t*>(ok.data()), ok.size(), "ok")->tensors().size(),
            2u);
}

TEST_F(Safetensors, BadPathsAreNamed) {
  const std::string missing = (dir_ / "missing.safetensors").string();
  EXPECT_HAS(message_of<FormatError>([&] { SafetensorsFile::open(missing); }), missing + ": cannot open");
  EXPECT_HAS(message_of<FormatError>([&] { SafetensorsFile::open(dir_.string()); }), "not a regular file");
  EXPECT_HAS(message_of<FormatError>([&] { SafetensorsSet::open(missing); }), missing + ": cannot open");
}

// ------------------------------------------------------------------------------------------ bad sets

class SafetensorsSets : public Safetensors {
 protected:
  // Three shards: a,b | c | d.
  void write_three() {
    write_sharded_safetensors(dir_.string(),
                              {tensor_from("a", DType::U8, {4}, "aaaa"), tensor_from("b", DType::U8, {4}, "bbbb"),
                               tensor_from("c", DType::U8, {8}, "cccccccc"), tensor_from("d", DType::U8, {8}, "dddddddd")},
                              8);
    ASSERT_EQ(SafetensorsSet::open(dir_.string()).num_files(), 3u);
  }
  fs::path index_path() const { return dir_ / "model.safetensors.index.json"; }
  void write_index(const nlohmann::json& j) { write_raw(index_path(), j.dump()); }
  std::string open_error() {
    return message_of<FormatError>([&] { SafetensorsSet::open(dir_.string()); });
  }
};

TEST_F(SafetensorsSets, MissingShard) {
  write_three();
  fs::remove(dir_ / "model-00002-of-00003.safetensors");
  const std::string msg = open_error();
  EXPECT_HAS(msg, index_path().string());
  EXPECT_HAS(msg, "shard \"model-00002-of-00003.safetensors\" (holding tensor \"c\") does not exist");
}

TEST_F(SafetensorsSets, IndexTensorNotInItsShard) {
  write_three();
  auto j = nlohmann::json::parse(read_all(index_path()));
  j["weight_map"]["ghost"] = "model-00001-of-00003.safetensors";
  write_index(j);
  EXPECT_HAS(open_error(),
             "index maps tensor \"ghost\" to shard \"model-00001-of-00003.safetensors\", which does not contain it");

  j["weight_map"].erase("ghost");
  j["weight_map"]["a"] = "model-00002-of-00003.safetensors";  // a really is in shard 1 (with b)
  write_index(j);
  EXPECT_HAS(open_error(), "index maps tensor \"a\" to shard \"model-00002-of-00003.safetensors\", which does not "
                           "contain it (it is in \"model-00001-of-00003.safetensors\")");
}

TEST_F(SafetensorsSets, TensorInTwoShardsOrUnlisted) {
  write_safetensors((dir_ / "s1.safetensors").string(), {tensor_from("x", DType::U8, {1}, "1")});
  write_safetensors((dir_ / "s2.safetensors").string(),
                    {tensor_from("x", DType::U8, {1}, "2"), tensor_from("y", DType::U8, {1}, "3")});
  write_index({{"weight_map", {{"x", "s1.safetensors"}, {"y", "s2.safetensors"}}}});
  EXPECT_HAS(open_error(), "tensor \"x\" is in two shards: \"s1.safetensors\" and \"s2.safetensors\"");

  write_safetensors((dir_ / "s2.safetensors").string(), {tensor_from("y", DType::U8, {1}, "3")});
  write_index({{"weight_map", {{"x", "s1.safetensors"}}}, {"metadata", {{"total_size", 1}}}});
  // s2 is not named by the index, so it is not opened; index and shards agree.
  EXPECT_EQ(SafetensorsSet::open(dir_.string()).names(), std::vector<std::string>{"x"});

  write_safetensors((dir_ / "s1.safetensors").string(),
                    {tensor_from("x", DType::U8, {1}, "1"), tensor_from("extra", DType::U8, {1}, "e")});
  EXPECT_HAS(open_error(), "tensor \"extra\" is in shard \"s1.safetensors\" but the index's weight_map does not list it");
}

TEST_F(SafetensorsSets, BadIndexJson) {
  write_raw(index_path(), "{not json");
  EXPECT_HAS(open_error(), "index is not valid JSON");
  write_raw(index_path(), "[1]");
  EXPECT_HAS(open_error(), "index is not a JSON object (got array [1])");
  write_raw(index_path(), "{\"metadata\":{}}");
  EXPECT_HAS(open_error(), "index has no \"weight_map\"");
  write_raw(index_path(), "{\"weight_map\":[]}");
  EXPECT_HAS(open_error(), "\"weight_map\" is not a JSON object (got array [])");
  write_raw(index_path(), "{\"weight_map\":{\"a\":1}}");
  EXPECT_HAS(open_error(), "\"weight_map\" value of tensor \"a\" is not a string (got number 1)");
  write_raw(index_path(), "{\"weight_map\":{\"a\":\"x.safetensors\",\"a\":\"y.safetensors\"}}");
  EXPECT_HAS(open_error(), "duplicate key \"a\" in \"weight_map\" of the index");
  write_raw(index_path(), "{\"weight_map\":{\"a\":\"../x.safetensors\"}}");
  EXPECT_HAS(open_error(), "tensor \"a\" maps to shard \"../x.safetensors\", which is not a relative path");
  write_raw(index_path(), "{\"weight_map\":{\"a\":\"/etc/x.safetensors\"}}");
  EXPECT_HAS(open_error(), "which is not a relative path");
  write_raw(index_path(), std::string("{\"weight_map\":{}}\0", 18));
  EXPECT_HAS(open_error(), "index contains a NUL byte at offset 17");
  write_raw(index_path(), "{\"weight_map\":{\"a\":\"\xff.safetensors\"}}");
  EXPECT_HAS(open_error(), "index is not valid UTF-8 (byte 0xFF");
}

TEST_F(SafetensorsSets, BadShardIsNamed) {
  write_three();
  write_raw(dir_ / "model-00003-of-00003.safetensors", "short");
  const std::string msg = open_error();
  EXPECT_HAS(msg, "model-00003-of-00003.safetensors: file is 5 bytes");
}

TEST_F(SafetensorsSets, DirectoryWithoutIndex) {
  EXPECT_HAS(open_error(), "directory has no model.safetensors.index.json and no *.safetensors file");
  write_safetensors((dir_ / "b.safetensors").string(), {tensor_from("x", DType::U8, {1}, "1")});
  write_raw(dir_ / "notes.txt", "hello");
  EXPECT_EQ(SafetensorsSet::open(dir_.string()).names(), std::vector<std::string>{"x"});
  write_safetensors((dir_ / "a.safetensors").string(), {tensor_from("y", DType::U8, {1}, "1")});
  EXPECT_HAS(open_error(), "directory has 2 *.safetensors files (a.safetensors, b.safetensors) but no "
                           "model.safetensors.index.json");
}

// ------------------------------------------------------------------------------------------ writer

TEST_F(Safetensors, WriterLeavesNothingBehindWhenFillThrows) {
  auto failing = tensor_from("b", DType::F32, {4}, std::string(16, 'b'));
  failing.fill = [](uint8_t*, size_t) { throw std::runtime_error("fill failed on purpose"); };
  const std::vector<TensorToWrite> tensors = {tensor_from("a", DType::U8, {4}, "aaaa"), failing};

  const fs::path p = dir_ / "x.safetensors";
  EXPECT_HAS(message_of<std::runtime_error>([&] { write_safetensors(p.string(), tensors); }), "fill failed on purpose");
  EXPECT_TRUE(dir_entries(dir_).empty());

  // An existing file at the destination survives a failed rewrite unchanged.
  write_safetensors(p.string(), {tensor_from("old", DType::U8, {2}, "ok")});
  const std::string before = read_all(p);
  EXPECT_THROW(write_safetensors(p.string(), tensors), std::runtime_error);
  EXPECT_EQ(read_all(p), before);
  EXPECT_EQ(dir_entries(dir_), std::vector<std::string>{"x.safetensors"});

  // Sharded: the failure is in the second shard; no shard, index or .tmp remains.
  const fs::path sd = dir_ / "sharded";
  EXPECT_THROW(write_sharded_safetensors(sd.string(), tensors, 4), std::runtime_error);
  EXPECT_TRUE(dir_entries(sd).empty());
}

TEST_F(Safetensors, WriterValidatesTensors) {
  const std::string p = (dir_ / "x.safetensors").string();
  EXPECT_HAS(message_of<ArgumentError>([&] {
               write_safetensors(p, {tensor_from("a", DType::U8, {1}, "1"), tensor_from("a", DType::U8, {1}, "1")});
             }),
             "duplicate tensor name \"a\"");
  EXPECT_HAS(message_of<ArgumentError>([&] { write_safetensors(p, {tensor_from("a", DType::U8, {2, -1}, "")}); }),
             "tensor \"a\": shape[1] = -1 is negative");
  EXPECT_HAS(message_of<ArgumentError>(
                 [&] { write_safetensors(p, {tensor_from("a", DType::U8, {1ll << 32, 1ll << 32}, "")}); }),
             "tensor \"a\": element count of shape [4294967296, 4294967296] overflows int64");
  EXPECT_HAS(message_of<ArgumentError>([&] { write_safetensors(p, {tensor_from("a", DType::I64, {1ll << 62}, "")}); }),
             "overflows size_t");
  TensorToWrite nofill;
  nofill.name = "n";
  nofill.shape = {3};
  EXPECT_HAS(message_of<ArgumentError>([&] { write_safetensors(p, {nofill}); }),
             "tensor \"n\": no fill callback for 3 bytes");
  EXPECT_HAS(message_of<ArgumentError>([&] { write_safetensors(p, {tensor_from("__metadata__", DType::U8, {0}, "")}); }),
             "reserved");
  EXPECT_HAS(message_of<ArgumentError>([&] { write_sharded_safetensors(dir_.string(), {}, 0); }),
             "max_shard_bytes must be > 0");
  EXPECT_HAS(message_of<ArgumentError>([&] {
               write_sharded_safetensors((dir_ / "s").string(),
                                         {tensor_from("a", DType::U8, {1}, "1"), tensor_from("a", DType::U8, {1}, "1")}, 8);
             }),
             "duplicate tensor name \"a\"");
  EXPECT_TRUE(dir_entries(dir_).empty());
}

}  // namespace
}  // namespace nvfp4moe::io
