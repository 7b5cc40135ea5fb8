// The BPE model of a tokenizer.json (Sennrich et al. 2016, as Hugging Face's
// tokenizers library runs it): a piece's characters are looked up in the
// vocabulary (else byte-fallback tokens <0xAB>, else the unknown token,
// fused when asked), then the lowest-ranked adjacent pair is merged, leftmost
// first, until no known pair remains. A heap over a linked list of symbols
// keeps this O(n log n) in the piece's length: a megabyte-long word encodes
// in a fraction of a second.
#pragma once

#include <cstdint>
#include <nlohmann/json_fwd.hpp>
#include <optional>
#include <string>
#include <unordered_map>
#include <utility>
#include <vector>

namespace tightfit {

class BpeModel {
 public:
  // `model` is the tokenizer.json "model" object; `source` names the file.
  // Throws std::invalid_argument for anything malformed or unsupported.
  BpeModel(const nlohmann::json& model, const std::string& source);

  // Appends the piece's ids; with `ranges`, also each token's [begin, end)
  // bytes in the piece.
  void encode(const std::string& piece, std::vector<int64_t>& out,
              std::vector<std::pair<uint32_t, uint32_t>>* ranges = nullptr) const;
  std::optional<int64_t> id_of(const std::string& token) const;
  const std::string* token_of(int64_t id) const;  // nullptr when absent
  int64_t size() const { return static_cast<int64_t>(id_to_token_.size()); }
  size_t entries() const { return vocab_.size(); }

 private:
  struct Symbols {
    std::vector<int32_t> ids;
    std::vector<uint32_t> begin, end;  // bytes of the piece each symbol covers
  };
  void symbols_of(const std::string& piece, Symbols& sym) const;
  void merge(Symbols& sym) const;

  std::unordered_map<std::string, int32_t> vocab_;
  std::vector<std::string> id_to_token_;
  struct Merge {
    int32_t rank, id;
  };
  std::unordered_map<uint64_t, Merge> merges_;  // (left id << 32 | right id) -> merge
  int32_t unk_id_ = -1;
  bool fuse_unk_ = false, byte_fallback_ = false, ignore_merges_ = false;
  int32_t byte_ids_[256];  // <0xAB> tokens for byte fallback, -1 when absent
  mutable std::unordered_map<std::string, Symbols> cache_;
};

}  // namespace tightfit
