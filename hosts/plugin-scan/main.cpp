// tightfit-plugin-scan FILE...: loads each plugin library in this throw-away
// process and answers, one JSON line per file on stdout, what it declares or
// why it is refused. The host runs it before any library's code runs in the
// host itself (kernel/plugins/plugin_scan.hpp); a library that crashes or hangs here
// ends this process, not the host.
#include "plugin_scanner_main.hpp"

int main(int argc, char** argv) {
  return tightfit::plugin_scanner_main(argc, argv);
}
