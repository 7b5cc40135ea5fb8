// The global functions chat templates call: range, namespace, dict,
// raise_exception, strftime_now.
#include <ctime>
#include <stdexcept>

#include "jinja_builtins.hpp"

namespace tightfit::jinja {
namespace {

[[noreturn]] void fail(const std::string& what) {
  throw std::runtime_error(what);
}

}  // namespace

Value global_function(const std::string& name) {
  if (name == "range")
    return Value::function([](const Args& a) {
      int64_t start = 0, stop = 0, step = 1;
      auto get = [&](size_t k) {
        if (a.positional[k].type != Value::kInt) fail("range needs integers");
        return a.positional[k].i;
      };
      if (a.positional.size() == 1)
        stop = get(0);
      else if (a.positional.size() >= 2)
        start = get(0), stop = get(1);
      if (a.positional.size() == 3) step = get(2);
      if (step == 0) fail("range step must not be zero");
      const __int128 span = step > 0 ? __int128{stop} - start : __int128{start} - stop;
      const __int128 stride = step > 0 ? __int128{step} : -__int128{step};
      const __int128 n = span <= 0 ? 0 : (span + stride - 1) / stride;  // no 64-bit overflow
      if (n > 1'000'000) fail("range of more than 1,000,000 items");
      List out;
      for (int64_t k = 0; k < n; ++k) out.push_back(Value::integer(start + k * step));
      return Value::of_list(std::move(out));
    });
  if (name == "namespace" || name == "dict")
    return Value::function([](const Args& a) {
      Value m = Value::of_map();
      if (!a.positional.empty() && a.positional[0].type == Value::kMap)
        for (const auto& [k, v] : a.positional[0].map->items) m.map->set(k, v);
      for (const auto& [k, v] : a.keywords) m.map->set(k, v);
      return m;
    });
  if (name == "raise_exception")
    return Value::function([](const Args& a) -> Value {
      throw std::runtime_error("the chat template raised an error: " +
                               (a.positional.empty() ? std::string() : a.positional[0].str()));
    });
  if (name == "strftime_now")
    return Value::function([](const Args& a) {
      const std::time_t now = std::time(nullptr);
      std::tm tm{};
      localtime_r(&now, &tm);
      char buf[256];
      const std::string fmt = need_string(arg(a, 0, "format", Value::none()), "strftime_now");
      const size_t n = std::strftime(buf, sizeof buf, fmt.c_str(), &tm);
      return Value::string(std::string(buf, n));
    });
  return Value();
}

}  // namespace tightfit::jinja
