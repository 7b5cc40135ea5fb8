#include "json_input.hpp"

#include <stdexcept>

#include "file_util.hpp"
#include "utf8.hpp"

namespace tightfit {
namespace {

template <class Json>
Json parse_bounded(const std::string& text, const std::string& source, int max_depth) {
  auto guard = [&](int depth, typename Json::parse_event_t, Json&) {
    if (depth > max_depth)
      throw std::invalid_argument(source + ": JSON nested deeper than " +
                                  std::to_string(max_depth) + " levels");
    return true;
  };
  try {
    return Json::parse(text, guard, /*allow_exceptions=*/true);
  } catch (const typename Json::parse_error& e) {
    // Text that is not UTF-8 is named as that (JSON is UTF-8 by definition):
    // the fix is the file's encoding, not its syntax.
    if (const size_t bad = first_invalid_utf8(text); bad != std::string::npos && bad < e.byte)
      throw std::invalid_argument(source + ": not valid UTF-8 (byte " + std::to_string(bad + 1) +
                                  "), and JSON is UTF-8: convert the file (for Latin-1 text: "
                                  "iconv -f latin1 -t utf-8)");
    throw std::invalid_argument(source + ": not valid JSON (at byte " + std::to_string(e.byte) +
                                ")");
  } catch (const typename Json::exception& e) {
    // A number past double's range (1e400) and the like; the reason is cut
    // short because it quotes the input.
    std::string why = e.what();
    if (why.size() > 120) why = why.substr(0, 120) + "...";
    throw std::invalid_argument(source + ": not valid JSON (" + why + ")");
  }
}

}  // namespace

nlohmann::json parse_json(const std::string& text, const std::string& source, int max_depth) {
  return parse_bounded<nlohmann::json>(text, source, max_depth);
}

nlohmann::ordered_json parse_ordered_json(const std::string& text, const std::string& source,
                                          int max_depth) {
  return parse_bounded<nlohmann::ordered_json>(text, source, max_depth);
}

nlohmann::json read_json_file(const std::string& path, size_t max_bytes, int max_depth) {
  std::string text;
  try {
    text = read_regular_file(path, max_bytes);
  } catch (const std::runtime_error& e) {
    throw std::invalid_argument(e.what());
  }
  return parse_json(text, path, max_depth);
}

std::string json_excerpt(const nlohmann::json& value, size_t max_chars) {
  std::string text = value.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
  if (text.size() > max_chars) text = text.substr(0, max_chars) + "...";
  return text;
}

}  // namespace tightfit
