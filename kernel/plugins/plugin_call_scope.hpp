// Marks the threads on which the host is running a call into a plugin. Host
// services are for those threads (and the thread that owns the session):
// a thread a plugin started itself may call only the few services the header
// says are safe anywhere. A hook can run on a thread LibTorch owns (the
// autograd engine's device threads on CUDA), so the mark is per call, not
// per thread.
#pragma once

namespace tightfit {

class PluginCallScope {
 public:
  PluginCallScope() { ++depth(); }
  ~PluginCallScope() { --depth(); }
  PluginCallScope(const PluginCallScope&) = delete;
  PluginCallScope& operator=(const PluginCallScope&) = delete;

  static bool active() { return depth() > 0; }

 private:
  static int& depth() {
    static thread_local int calls = 0;
    return calls;
  }
};

}  // namespace tightfit
