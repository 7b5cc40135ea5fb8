#include "kernel_config.hpp"

namespace tightfit {

#define TF_READ_FIELD(type, field, getter) c.field = t.getter(#field);
#define TF_FIELD_NAME(type, field, getter) #field,

RunConfig read_run_config(const ConfigTable& t) {
  RunConfig c;
  TF_RUN_CONFIG(TF_READ_FIELD)
  return c;
}
DataConfig read_data_config(const ConfigTable& t) {
  DataConfig c;
  TF_DATA_CONFIG(TF_READ_FIELD)
  return c;
}
OptimizerConfig read_optimizer_config(const ConfigTable& t) {
  OptimizerConfig c;
  TF_OPTIMIZER_CONFIG(TF_READ_FIELD)
  return c;
}
SaveConfig read_save_config(const ConfigTable& t) {
  SaveConfig c;
  TF_SAVE_CONFIG(TF_READ_FIELD)
  return c;
}

const std::vector<std::string>& run_config_fields() {
  static const std::vector<std::string> names = {TF_RUN_CONFIG(TF_FIELD_NAME)};
  return names;
}
const std::vector<std::string>& data_config_fields() {
  static const std::vector<std::string> names = {TF_DATA_CONFIG(TF_FIELD_NAME)};
  return names;
}
const std::vector<std::string>& optimizer_config_fields() {
  static const std::vector<std::string> names = {TF_OPTIMIZER_CONFIG(TF_FIELD_NAME)};
  return names;
}
const std::vector<std::string>& save_config_fields() {
  static const std::vector<std::string> names = {TF_SAVE_CONFIG(TF_FIELD_NAME)};
  return names;
}

#undef TF_READ_FIELD
#undef TF_FIELD_NAME

}  // namespace tightfit
