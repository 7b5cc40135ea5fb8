#include "sentencepiece_model.hpp"

#include <cstring>
#include <stdexcept>

namespace tightfit {
namespace {

// Real models hold up to ~256k pieces of at most a few dozen bytes.
constexpr size_t kMaxPieces = size_t{1} << 24;

// A cursor over protobuf wire-format bytes [pos, end).
class Wire {
 public:
  Wire(const std::string& bytes, size_t begin, size_t end, const std::string& source)
      : b_(bytes), pos_(begin), end_(end), source_(source) {}
  bool done() const { return pos_ >= end_; }
  [[noreturn]] void fail(const std::string& what) const {
    throw std::invalid_argument(source_ + " is not a SentencePiece model this can read: " + what +
                                " (byte " + std::to_string(pos_) + ")");
  }
  uint64_t varint() {
    uint64_t v = 0;
    for (int shift = 0; shift < 64; shift += 7) {
      if (pos_ >= end_) fail("a number runs past its field");
      const auto c = static_cast<unsigned char>(b_[pos_++]);
      v |= static_cast<uint64_t>(c & 0x7f) << shift;
      if (!(c & 0x80)) return v;
    }
    fail("a number longer than 10 bytes");
  }
  // The next field's number and wire type.
  std::pair<uint64_t, int> tag() {
    const uint64_t t = varint();
    return {t >> 3, static_cast<int>(t & 7)};
  }
  // A length-delimited field's [begin, end), checked against what is left.
  std::pair<size_t, size_t> bytes_field() {
    const uint64_t n = varint();
    if (n > end_ - pos_) fail("a field of " + std::to_string(n) + " bytes runs past its message");
    const size_t begin = pos_;
    pos_ += static_cast<size_t>(n);
    return {begin, pos_};
  }
  std::string string_field() {
    const auto [b, e] = bytes_field();
    return b_.substr(b, e - b);
  }
  float fixed32_float() {
    if (end_ - pos_ < 4) fail("a 4-byte number runs past its message");
    uint32_t u = 0;
    for (int i = 0; i < 4; ++i)
      u |= static_cast<uint32_t>(static_cast<unsigned char>(b_[pos_ + i])) << (8 * i);
    pos_ += 4;
    float f;
    std::memcpy(&f, &u, 4);
    return f;
  }
  void skip(int wire_type) {
    switch (wire_type) {
      case 0:
        varint();
        return;
      case 1:
        if (end_ - pos_ < 8) fail("an 8-byte number runs past its message");
        pos_ += 8;
        return;
      case 2:
        bytes_field();
        return;
      case 5:
        if (end_ - pos_ < 4) fail("a 4-byte number runs past its message");
        pos_ += 4;
        return;
      default:
        fail("wire type " + std::to_string(wire_type) + " (groups are not used by it)");
    }
  }
  void expect(int wire_type, int want, const char* field) {
    if (wire_type != want) fail(std::string("field ") + field + " has the wrong wire type");
  }

 private:
  const std::string& b_;
  size_t pos_, end_;
  const std::string& source_;
};

SentencePieceModel::Piece read_piece(Wire w) {
  SentencePieceModel::Piece p;
  while (!w.done()) {
    const auto [field, type] = w.tag();
    if (field == 1) {
      w.expect(type, 2, "piece");
      p.piece = w.string_field();
    } else if (field == 2) {
      w.expect(type, 5, "score");
      p.score = w.fixed32_float();
    } else if (field == 3) {
      w.expect(type, 0, "type");
      const uint64_t t = w.varint();
      if (t < 1 || t > 6) w.fail("piece type " + std::to_string(t) + " is unknown");
      p.type = static_cast<SentencePieceModel::Type>(t);
    } else {
      w.skip(type);
    }
  }
  return p;
}

void read_trainer_spec(Wire w, SentencePieceModel& m) {
  while (!w.done()) {
    const auto [field, type] = w.tag();
    if (field == 3) {
      w.expect(type, 0, "model_type");
      const uint64_t t = w.varint();
      if (t < 1 || t > 4) w.fail("model_type " + std::to_string(t) + " is unknown");
      m.algorithm = static_cast<SentencePieceModel::Algorithm>(t);
    } else if (field == 35) {
      w.expect(type, 0, "byte_fallback");
      m.byte_fallback = w.varint() != 0;
    } else if (field == 45) {
      w.expect(type, 2, "unk_piece");
      m.unk_piece = w.string_field();
    } else {
      w.skip(type);
    }
  }
}

}  // namespace

SentencePieceModel SentencePieceModel::parse(const std::string& bytes, const std::string& source) {
  SentencePieceModel m;
  Wire w(bytes, 0, bytes.size(), source);
  while (!w.done()) {
    const auto [field, type] = w.tag();
    if (field == 1) {
      w.expect(type, 2, "pieces");
      if (m.pieces.size() >= kMaxPieces)
        w.fail("more than " + std::to_string(kMaxPieces) + " pieces");
      const auto [b, e] = w.bytes_field();
      m.pieces.push_back(read_piece(Wire(bytes, b, e, source)));
    } else if (field == 2) {
      w.expect(type, 2, "trainer_spec");
      const auto [b, e] = w.bytes_field();
      read_trainer_spec(Wire(bytes, b, e, source), m);
    } else {
      w.skip(type);
    }
  }
  if (m.pieces.empty()) w.fail("it holds no pieces");
  return m;
}

const char* SentencePieceModel::name(Algorithm a) {
  switch (a) {
    case Algorithm::kUnigram:
      return "unigram";
    case Algorithm::kBpe:
      return "bpe";
    case Algorithm::kWord:
      return "word";
    case Algorithm::kChar:
      return "char";
  }
  return "?";
}

}  // namespace tightfit
