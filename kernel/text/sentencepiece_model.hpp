// A SentencePiece tokenizer.model (a serialized ModelProto, protobuf wire
// format), read without the protobuf library: its pieces with scores and
// types, and the trainer's model type and unknown piece. Every length is
// checked against the bytes left before anything is sized by it.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace tightfit {

struct SentencePieceModel {
  enum class Type : int32_t {
    kNormal = 1,
    kUnknown = 2,
    kControl = 3,
    kUserDefined = 4,
    kUnused = 5,
    kByte = 6
  };
  enum class Algorithm : int32_t { kUnigram = 1, kBpe = 2, kWord = 3, kChar = 4 };
  struct Piece {
    std::string piece;
    float score = 0;
    Type type = Type::kNormal;
  };
  std::vector<Piece> pieces;
  Algorithm algorithm = Algorithm::kUnigram;  // TrainerSpec.model_type's default
  std::string unk_piece = "<unk>";
  bool byte_fallback = false;

  // Throws std::invalid_argument naming `source` and the defect.
  static SentencePieceModel parse(const std::string& bytes, const std::string& source);
  // "unigram", "bpe", "word" or "char".
  static const char* name(Algorithm a);
};

}  // namespace tightfit
