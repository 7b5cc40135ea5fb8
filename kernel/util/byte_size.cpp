#include "byte_size.hpp"

#include <cctype>
#include <cmath>
#include <sstream>
#include <stdexcept>

namespace tightfit {

int64_t parse_byte_size(const std::string& text) {
  size_t pos = 0;
  double value = 0;
  try {
    value = std::stod(text, &pos);
  } catch (const std::exception&) {
    throw std::invalid_argument("not a byte size: \"" + text + "\" (write e.g. 8GiB, 512MB)");
  }
  std::string unit;
  for (size_t i = pos; i < text.size(); ++i)
    if (!std::isspace(static_cast<unsigned char>(text[i])))
      unit += static_cast<char>(std::tolower(static_cast<unsigned char>(text[i])));
  double mult = 1;
  if (unit.empty() || unit == "b")
    mult = 1;
  else if (unit == "k" || unit == "kib")
    mult = 1024.0;
  else if (unit == "kb")
    mult = 1e3;
  else if (unit == "m" || unit == "mib")
    mult = 1024.0 * 1024;
  else if (unit == "mb")
    mult = 1e6;
  else if (unit == "g" || unit == "gib")
    mult = 1024.0 * 1024 * 1024;
  else if (unit == "gb")
    mult = 1e9;
  else if (unit == "t" || unit == "tib")
    mult = 1024.0 * 1024 * 1024 * 1024;
  else if (unit == "tb")
    mult = 1e12;
  else
    throw std::invalid_argument("unknown size unit in \"" + text +
                                "\" (use B, KiB, MiB, GiB, TiB, KB, MB, GB, TB)");
  if (!std::isfinite(value))
    throw std::invalid_argument("not a finite byte size: \"" + text + "\"");
  if (value < 0) throw std::invalid_argument("negative byte size \"" + text + "\"");
  // 2^63 bytes and more do not fit the int64 every size is kept in.
  if (value * mult >= 9.2233720368547758e18)
    throw std::invalid_argument("byte size \"" + text + "\" is past 8 EiB");
  return static_cast<int64_t>(value * mult);
}

std::string format_bytes(int64_t bytes) {
  const char* units[] = {"B", "KiB", "MiB", "GiB", "TiB"};
  double v = static_cast<double>(bytes);
  int u = 0;
  while (std::fabs(v) >= 1024.0 && u < 4) {
    v /= 1024.0;
    ++u;
  }
  std::ostringstream os;
  os.setf(std::ios::fixed);
  os.precision(u == 0 ? 0 : 1);
  os << v << units[u];
  return os.str();
}

}  // namespace tightfit
