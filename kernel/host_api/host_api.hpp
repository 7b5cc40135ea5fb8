// The host services table (tf_host_api) every plugin is created with; its
// services find the session's parts through the plugin's tf_host_context.
#pragma once

#include "tightfit/plugin_api.h"

namespace tightfit {

const tf_host_api* kernel_host_api();

}  // namespace tightfit
