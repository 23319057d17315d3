// compressed-tensors ("nvfp4-pack-quantized") quantization config: placeholder until that format lands.
// It recognizes the format and refuses it clearly; the implementation fills QuantConfig with
// TensorNaming{".weight_packed", ".weight_scale", ".weight_global_scale", ".input_global_scale", reciprocal}.
#include "model/checkpoint_format.h"

#include "nvfp4moe/error.h"

namespace nvfp4moe::model {

std::optional<QuantConfig> parse_compressed_tensors_quant(const std::string& dir, const nlohmann::json& config) {
  if (!config.contains("quantization_config") || !config["quantization_config"].is_object()) return std::nullopt;
  const auto& q = config["quantization_config"];
  if (!q.contains("quant_method") || q["quant_method"] != "compressed-tensors") return std::nullopt;
  throw FormatError(detail::cat(dir, "/config.json: quantization_config.quant_method: compressed-tensors checkpoints "
                                     "are not supported yet (expected \"modelopt\")"));
}

}  // namespace nvfp4moe::model
