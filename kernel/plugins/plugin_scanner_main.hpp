// The plugin scanner's side of plugin_scan.hpp: the child process that
// loads each library and answers what it declares.
#pragma once

namespace tightfit {

// The scanner's main: answers one line per path on `out_fd`.
int plugin_scanner_main(int argc, char** argv);

}  // namespace tightfit
