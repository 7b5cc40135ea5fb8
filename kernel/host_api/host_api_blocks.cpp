// Host services: a weights file's own blocks. A strategy that keeps a GGUF
// file's quantized matrices as they are (quantize's format = "gguf") reads
// them here and has them decoded by the kernel's ggml dequantizers.
#include <cstring>

#include "gguf_model.hpp"
#include "gguf_quants.hpp"
#include "host_api_services.hpp"

namespace tightfit::host_services {

tf_status h_param_source_blocks(tf_host_context* ctx, const char* name, int32_t with_bytes,
                                tf_source_blocks* out) {
  return serve(ctx, [&] {
    require(name, "name");
    check_size(out, "tf_source_blocks");
    const Param& p = ctx->kernel->store->get(name);
    const HfWeightSource* weights = ctx->kernel->weights ? ctx->kernel->weights() : nullptr;
    if (!weights)
      throw std::out_of_range("the recipe has no [model] weights, so \"" + p.name +
                              "\" has no file blocks to keep");
    gguf::HfBlocks b;
    try {
      b = weights->blocks(p, with_bytes != 0);
    } catch (const std::runtime_error& e) {
      throw std::out_of_range(e.what());
    }
    tf_source_blocks r{};
    std::strncpy(r.type, b.type->name, sizeof r.type - 1);
    r.rows = b.rows;
    r.cols = b.cols;
    r.row_bytes = b.row_bytes;
    if (with_bytes) r.bytes = give_handle(b.bytes);
    write_struct(out, r);
  });
}

tf_status h_blocks_decode(tf_host_context* ctx, const char* type_name, tf_tensor bytes,
                          int64_t cols, tf_tensor* out) {
  return serve(ctx, [&] {
    require(type_name, "type");
    require(bytes, "bytes");
    require(out, "out");
    const gguf::TensorType* type = gguf::tensor_type_named(type_name);
    if (!type || !gguf::can_dequantize(*type))
      throw std::invalid_argument(std::string("blocks_decode: \"") + type_name +
                                  "\" is not a ggml type tightfit decodes");
    const at::Tensor& b = handle_tensor(bytes);
    if (b.scalar_type() != at::kByte || b.dim() != 2)
      throw std::invalid_argument("blocks_decode: bytes must be uint8 [rows, row_bytes]");
    if (cols <= 0 || cols % type->block != 0 || b.size(1) != cols / type->block * type->bytes)
      throw std::invalid_argument("blocks_decode: " + std::to_string(cols) + " " + type_name +
                                  " columns do not take the " + std::to_string(b.size(1)) +
                                  " bytes a row holds");
    // The dequantizers run on the CPU; blocks kept on a GPU make the round
    // trip (a CUDA decoder is not written yet: docs/gguf.md).
    const at::Tensor src = b.device().is_cpu() ? b.contiguous() : b.to(at::kCPU).contiguous();
    at::Tensor w = at::empty({b.size(0), cols}, at::kFloat);
    gguf::dequantize(*type, src.data_ptr<uint8_t>(), w.numel(), w.data_ptr<float>());
    *out = give_handle(b.device().is_cpu() ? w : w.to(b.device()));
  });
}

}  // namespace tightfit::host_services
