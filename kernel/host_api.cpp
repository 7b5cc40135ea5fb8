// The host services table (tf_host_api) handed to every plugin, assembled
// from the service groups in host_api_<group>.cpp.
#include <mutex>
#include <set>

#include "host_api_services.hpp"

namespace tightfit {
namespace host_services {

const char* intern(const std::string& s) {
  static std::mutex m;
  static auto* pool = new std::set<std::string>();  // never freed: plugins may keep the pointers
  std::lock_guard<std::mutex> lock(m);
  return pool->insert(s).first->c_str();
}

}  // namespace host_services

namespace {

tf_host_api make_table() {
  tf_host_api t{};
  t.struct_size = sizeof(tf_host_api);
  t.abi_version = TF_ABI_VERSION;
  t.libtorch_version = host_libtorch_version();
  host_services::add_config_services(t);
  host_services::add_params_services(t);
  host_services::add_training_services(t);
  host_services::add_dist_services(t);
  return t;
}

}  // namespace

const tf_host_api* Session::host_api() const {
  static const tf_host_api table = make_table();
  return &table;
}

}  // namespace tightfit
