# The SDK an outside project builds plugins against: `cmake --install build
# --prefix P` puts the host (P/bin), the kernel (P/lib), the built-in plugins
# (P/lib/tightfit/plugins), the ABI and SDK headers (P/include/tightfit) and
# this package (P/lib/cmake/tightfit) in P; then find_package(tightfit) with
# CMAKE_PREFIX_PATH=P gives tightfit_add_plugin() and tightfit::plugin_sdk.
include(CMakePackageConfigHelpers)

file(STRINGS ${CMAKE_SOURCE_DIR}/plugin-api/tightfit/plugin_api.h _tf_abi_lines
     REGEX "^#define TF_ABI_VERSION_(MAJOR|MINOR) [0-9]+")
string(REGEX REPLACE ".*MAJOR ([0-9]+).*MINOR ([0-9]+).*" "\\1.\\2" TIGHTFIT_ABI_VERSION
       "${_tf_abi_lines}")

set(TIGHTFIT_CMAKE_DIR lib/cmake/tightfit)
install(EXPORT tightfitTargets NAMESPACE tightfit:: DESTINATION ${TIGHTFIT_CMAKE_DIR})
configure_package_config_file(cmake/tightfitConfig.cmake.in
  ${CMAKE_BINARY_DIR}/tightfitConfig.cmake INSTALL_DESTINATION ${TIGHTFIT_CMAKE_DIR})
write_basic_package_version_file(${CMAKE_BINARY_DIR}/tightfitConfigVersion.cmake
  VERSION ${PROJECT_VERSION} COMPATIBILITY SameMinorVersion)
install(FILES ${CMAKE_BINARY_DIR}/tightfitConfig.cmake ${CMAKE_BINARY_DIR}/tightfitConfigVersion.cmake
  cmake/TightfitPlugin.cmake DESTINATION ${TIGHTFIT_CMAKE_DIR})
