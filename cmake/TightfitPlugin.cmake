# tightfit_add_plugin(NAME KIND model|strategy|schedule|reward SOURCES ...)
#
# Builds a plugin as a MODULE library against LibTorch and the plugin SDK
# (target tightfit::plugin_sdk: the C ABI headers and the C++ conveniences).
# Used by this tree and, installed with the SDK, by outside projects after
# find_package(tightfit): the same flags either way. The descriptor the SDK's
# tf_sdk::describe() builds records the ABI version (plugin_api.h) and the
# LibTorch version (torch/version.h) the plugin was compiled against.

# -Warray-bounds and -Wrestrict misfire on std::string in GCC 12 at -O2 (GCC PR 105329).
if(NOT DEFINED TIGHTFIT_WARNINGS)
  set(TIGHTFIT_WARNINGS -Wall -Wextra -Wno-unused-parameter -Wno-missing-field-initializers)
  if(CMAKE_CXX_COMPILER_ID STREQUAL "GNU")
    list(APPEND TIGHTFIT_WARNINGS -Wno-array-bounds -Wno-restrict -Wno-stringop-overflow
         -Wno-stringop-overread)
  endif()
endif()

function(tightfit_add_plugin name)
  cmake_parse_arguments(ARG "" "KIND" "SOURCES" ${ARGN})
  if(NOT ARG_KIND MATCHES "^(model|strategy|schedule|reward)$")
    message(FATAL_ERROR "tightfit_add_plugin(${name}): KIND must be model, strategy, schedule or reward")
  endif()
  if(NOT ARG_SOURCES)
    message(FATAL_ERROR "tightfit_add_plugin(${name}): no SOURCES")
  endif()
  add_library(${name} MODULE ${ARG_SOURCES})
  set_property(GLOBAL APPEND PROPERTY TIGHTFIT_PLUGIN_TARGETS ${name})
  target_link_libraries(${name} PRIVATE tightfit::plugin_sdk ${TORCH_LIBRARIES})
  target_compile_features(${name} PRIVATE cxx_std_20)
  target_compile_options(${name} PRIVATE ${TIGHTFIT_WARNINGS})
  if(TARGET tightfit_torch_pch)  # this tree's shared precompiled LibTorch header
    target_precompile_headers(${name} REUSE_FROM tightfit_torch_pch)
  endif()
  # Only the entry symbol is exported: two plugins never see each other's code.
  set_target_properties(${name} PROPERTIES
    PREFIX "libtightfit_"
    CXX_VISIBILITY_PRESET hidden
    VISIBILITY_INLINES_HIDDEN ON)
  if(TIGHTFIT_PLUGIN_OUTPUT_DIR)
    set_target_properties(${name} PROPERTIES LIBRARY_OUTPUT_DIRECTORY ${TIGHTFIT_PLUGIN_OUTPUT_DIR})
  endif()
  install(TARGETS ${name} LIBRARY DESTINATION lib/tightfit/plugins)
endfunction()

# Executables share the plugins' precompiled header, so they are compiled
# with -fPIC like the libraries (GCC refuses a PCH built with other -fpic/-fpie).
function(tightfit_use_torch_pch target)
  set_target_properties(${target} PROPERTIES POSITION_INDEPENDENT_CODE OFF)
  target_compile_options(${target} PRIVATE -fPIC ${TIGHTFIT_WARNINGS})
  target_precompile_headers(${target} REUSE_FROM tightfit_torch_pch)
endfunction()
