// The host services table (tf_host_api) handed to every plugin, assembled
// from the service groups in host_api_<group>.cpp.
#include "host_api.hpp"

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

// Every function pointer of the table has its service in the list.
#define TIGHTFIT_COUNT_HOST_SERVICE(name) +1
constexpr size_t kListedServices = 0 TIGHTFIT_HOST_SERVICES(TIGHTFIT_COUNT_HOST_SERVICE);
#undef TIGHTFIT_COUNT_HOST_SERVICE
static_assert(kListedServices ==
                  (sizeof(tf_host_api) - offsetof(tf_host_api, set_error)) / sizeof(void (*)()),
              "a service of tf_host_api is missing from TIGHTFIT_HOST_SERVICES");

tf_host_api make_table() {
  tf_host_api t{};
  t.struct_size = sizeof(tf_host_api);
  t.abi_version = TF_ABI_VERSION;
  t.libtorch_version = host_libtorch_version();
#define TIGHTFIT_FILL_HOST_SERVICE(name) t.name = host_services::h_##name;
  TIGHTFIT_HOST_SERVICES(TIGHTFIT_FILL_HOST_SERVICE)
#undef TIGHTFIT_FILL_HOST_SERVICE
  return t;
}

}  // namespace

const tf_host_api* kernel_host_api() {
  static const tf_host_api table = make_table();
  return &table;
}

}  // namespace tightfit
