# tightfit_add_plugin(NAME KIND model|strategy|schedule SOURCES ...)
# Builds a plugin as a MODULE library into the build's plugin folder, against
# LibTorch and the plugin ABI headers.
function(tightfit_add_plugin name)
  cmake_parse_arguments(ARG "" "KIND" "SOURCES" ${ARGN})
  if(NOT ARG_KIND MATCHES "^(model|strategy|schedule)$")
    message(FATAL_ERROR "tightfit_add_plugin(${name}): KIND must be model, strategy or schedule")
  endif()
  add_library(${name} MODULE ${ARG_SOURCES})
  target_link_libraries(${name} PRIVATE tightfit_plugin_sdk ${TORCH_LIBRARIES})
  target_compile_options(${name} PRIVATE ${TIGHTFIT_WARNINGS})
  target_precompile_headers(${name} REUSE_FROM tightfit_torch_pch)
  set_target_properties(${name} PROPERTIES
    PREFIX "libtightfit_"
    LIBRARY_OUTPUT_DIRECTORY ${TIGHTFIT_PLUGIN_OUTPUT_DIR}
    CXX_VISIBILITY_PRESET hidden
    VISIBILITY_INLINES_HIDDEN ON)
  install(TARGETS ${name} LIBRARY DESTINATION lib/tightfit/plugins)
endfunction()

# Executables share the plugins' precompiled header, so they are compiled
# with -fPIC like the libraries (GCC refuses a PCH built with other -fpic/-fpie).
function(tightfit_use_torch_pch target)
  set_target_properties(${target} PROPERTIES POSITION_INDEPENDENT_CODE OFF)
  target_compile_options(${target} PRIVATE -fPIC ${TIGHTFIT_WARNINGS})
  target_precompile_headers(${target} REUSE_FROM tightfit_torch_pch)
endfunction()
