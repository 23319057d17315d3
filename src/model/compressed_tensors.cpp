// compressed-tensors ("nvfp4-pack-quantized", llm-compressor) quantization config (nvfp4-format.md section 10).
//
// The tensor bytes are the same as ModelOpt's (packed e2m1 codes, e4m3 block scales); only the names differ
// and the two per-tensor scales are stored as reciprocals:
//   weight_global_scale = 448*6/amax(W) = 1/weight_scale_2,   input_global_scale = 448*6/amax(x) = 1/input_scale.
// Conversion (the loader's read_scalar with TensorNaming::global_is_reciprocal): weight_scale_2 = 1.0f / g in
// IEEE fp32, correctly rounded. compressed-tensors itself dequantizes as code*scale/g; code*scale*fl(1/g) differs
// from that by at most the one rounding of fl(1/g) (relative error <= 2^-24). When g is the fp32 reciprocal of a
// ModelOpt weight_scale_2 w (g = fl(1/w)), fl(1/g) == w for most w but not all: a w for which it does not
// round-trip comes back 1 ulp away (tests/model: CompressedTensors.ReciprocalRoundTripReport measures it).
//
// W4A16 configs (input_activations null) have no input_global_scale: MoeWeights then carries NaN input scales,
// which MoeLayer::create refuses for w4a4 (and replaces by 1 for w4a16, where they are unused).
#include <regex>

#include "model/checkpoint_format.h"

#include "nvfp4moe/error.h"

namespace nvfp4moe::model {

using nlohmann::json;
using detail::cat;

namespace {

std::string field_or_missing(const json& j, const char* key) {
  return j.is_object() && j.contains(key) ? j[key].dump() : std::string("nothing (missing)");
}

// One config group's weights / input_activations arguments: NVFP4 = 4-bit float, tensor_group, group 16.
void check_nvfp4_args(const json& a, const std::string& file, const std::string& field, bool activations) {
  NVFP4MOE_CHECK(a.is_object(), FormatError, file, ": field ", field, ": expected an object, got ", a.dump());
  NVFP4MOE_CHECK(a.contains("num_bits") && a["num_bits"] == 4, FormatError, file, ": field ", field,
                 ".num_bits: expected 4, got ", field_or_missing(a, "num_bits"));
  NVFP4MOE_CHECK(a.contains("type") && a["type"] == "float", FormatError, file, ": field ", field,
                 ".type: expected \"float\", got ", field_or_missing(a, "type"));
  NVFP4MOE_CHECK(a.contains("strategy") && a["strategy"] == "tensor_group", FormatError, file, ": field ", field,
                 ".strategy: expected \"tensor_group\" (NVFP4), got ", field_or_missing(a, "strategy"));
  NVFP4MOE_CHECK(a.contains("group_size") && a["group_size"] == 16, FormatError, file, ": field ", field,
                 ".group_size: expected 16 (NVFP4 block), got ", field_or_missing(a, "group_size"));
  if (a.contains("symmetric") && !a["symmetric"].is_null())
    NVFP4MOE_CHECK(a["symmetric"] == true, FormatError, file, ": field ", field,
                   ".symmetric: expected true (NVFP4 has no zero points), got ", a["symmetric"].dump());
  if (activations) {
    if (a.contains("dynamic") && !a["dynamic"].is_null())
      NVFP4MOE_CHECK(a["dynamic"] == "local", FormatError, file, ": field ", field,
                     ".dynamic: expected \"local\" (per-token-group dynamic block scales with a static "
                     "input_global_scale), got ", a["dynamic"].dump());
  } else if (a.contains("dynamic") && !a["dynamic"].is_null()) {
    NVFP4MOE_CHECK(a["dynamic"] == false, FormatError, file, ": field ", field, ".dynamic: expected false, got ",
                   a["dynamic"].dump());
  }
}

}  // namespace

bool QuantConfig::ignores(const std::string& module, std::string* matched) const {
  for (const auto& pat : ignore) {
    bool hit;
    if (pat.rfind("re:", 0) == 0) {
      // compressed-tensors matches with Python's re.match: anchored at the start, not at the end.
      hit = std::regex_search(module, std::regex(pat.substr(3)), std::regex_constants::match_continuous);
    } else {
      hit = module == pat;
    }
    if (hit) {
      if (matched) *matched = pat;
      return true;
    }
  }
  return false;
}

std::optional<QuantConfig> parse_compressed_tensors_quant(const std::string& dir, const json& config) {
  if (!config.contains("quantization_config") || !config["quantization_config"].is_object()) return std::nullopt;
  const json& q = config["quantization_config"];
  if (!q.contains("quant_method") || q["quant_method"] != "compressed-tensors") return std::nullopt;
  const std::string file = dir + "/config.json";
  QuantConfig qc;
  qc.format = CheckpointFormat::CompressedTensors;
  qc.source = file;
  if (q.contains("version") && q["version"].is_string()) qc.producer = "compressed-tensors " + q["version"].get<std::string>();

  const std::string top_format = q.contains("format") && q["format"].is_string() ? q["format"].get<std::string>() : "";
  NVFP4MOE_CHECK(q.contains("format"), FormatError, file,
                 ": field quantization_config.format: expected \"nvfp4-pack-quantized\", got nothing (missing)");
  NVFP4MOE_CHECK(top_format == "nvfp4-pack-quantized" || top_format == "mixed-precision", FormatError, file,
                 ": field quantization_config.format: expected \"nvfp4-pack-quantized\", got ", q["format"].dump());
  NVFP4MOE_CHECK(q.contains("config_groups") && q["config_groups"].is_object() && !q["config_groups"].empty(),
                 FormatError, file, ": field quantization_config.config_groups: expected a non-empty object, got ",
                 field_or_missing(q, "config_groups"));
  std::optional<bool> w4a4;
  std::string first_group;
  for (const auto& [gname, g] : q["config_groups"].items()) {
    const std::string field = "quantization_config.config_groups." + gname;
    NVFP4MOE_CHECK(g.is_object(), FormatError, file, ": field ", field, ": expected an object, got ", g.dump());
    if (g.contains("format") && !g["format"].is_null())
      NVFP4MOE_CHECK(g["format"] == "nvfp4-pack-quantized", FormatError, file, ": field ", field,
                     ".format: expected \"nvfp4-pack-quantized\", got ", g["format"].dump());
    NVFP4MOE_CHECK(g.contains("weights") && !g["weights"].is_null(), FormatError, file, ": field ", field,
                   ".weights: expected NVFP4 weight arguments, got ", field_or_missing(g, "weights"));
    check_nvfp4_args(g["weights"], file, field + ".weights", false);
    const bool has_in = g.contains("input_activations") && !g["input_activations"].is_null();
    if (has_in) check_nvfp4_args(g["input_activations"], file, field + ".input_activations", true);
    if (w4a4) {
      NVFP4MOE_CHECK(*w4a4 == has_in, FormatError, file, ": config groups disagree on activations: ", first_group,
                     *w4a4 ? " quantizes" : " does not quantize", " input_activations but ", gname,
                     has_in ? " does" : " does not", " (expected one scheme, W4A4 or W4A16, for every group)");
    } else {
      w4a4 = has_in;
      first_group = gname;
    }
  }
  if (q.contains("ignore") && !q["ignore"].is_null()) {
    NVFP4MOE_CHECK(q["ignore"].is_array(), FormatError, file,
                   ": field quantization_config.ignore: expected a list of strings, got ", q["ignore"].dump());
    for (const auto& v : q["ignore"]) {
      NVFP4MOE_CHECK(v.is_string(), FormatError, file,
                     ": field quantization_config.ignore: expected a list of strings, got element ", v.dump());
      const std::string s = v.get<std::string>();
      if (s.rfind("re:", 0) == 0) {
        try {
          std::regex check(s.substr(3));
        } catch (const std::regex_error& e) {
          throw FormatError(cat(file, ": field quantization_config.ignore: \"", s, "\" is not a valid regular "
                                      "expression: ", e.what()));
        }
      }
      qc.ignore.push_back(s);
    }
  }
  qc.exclude_modules = qc.ignore;
  qc.algo = *w4a4 ? "NVFP4 W4A4" : "NVFP4 W4A16 (no input_global_scale: w4a4 needs `nvfp4moe calibrate`)";
  qc.group_size = 16;
  qc.naming.weight = ".weight_packed";
  qc.naming.weight_scale = ".weight_scale";
  qc.naming.weight_global = ".weight_global_scale";
  qc.naming.input_global = ".input_global_scale";
  qc.naming.global_is_reciprocal = true;
  qc.naming.input_scale_required = *w4a4;
  qc.notes.push_back("compressed-tensors global scales are reciprocals: weight_scale_2 = 1.0f / weight_global_scale "
                     "and input_scale = 1.0f / input_global_scale (fp32, correctly rounded)");
  return qc;
}

}  // namespace nvfp4moe::model
