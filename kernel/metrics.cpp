#include "metrics.hpp"

#include <stdexcept>

namespace tightfit {

MetricsWriter::MetricsWriter(const std::string& path) : path_(path), out_(path, std::ios::app) {
  if (!out_) throw std::runtime_error("cannot open metrics file " + path);
}

void MetricsWriter::write(const nlohmann::json& record) {
  if (!out_.is_open()) return;
  out_ << record.dump() << '\n';
  out_.flush();
}

}  // namespace tightfit
