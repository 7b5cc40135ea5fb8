// Device values the host reads later, with the next read it makes anyway.
// A training step's pass computes its loss early, but nothing on the host
// needs it before the update, which reads the gradients' norm: kept here,
// the loss comes back in that same read, so that a GPU step waits for the
// host once (tests/test_step_reads.cpp). Every read of the training path
// that goes through read_with takes what is pending along.
#pragma once

#include <ATen/ATen.h>

#include <functional>
#include <utility>
#include <vector>

namespace tightfit {

class PendingReads {
 public:
  using Fill = std::function<void(double)>;
  // `value` (one value, any device and real dtype, not requiring grad) is
  // read with the next read; `fill` then gets it. A fill that `outlives`
  // the window may still run when it closes; the others never run after.
  void add(const at::Tensor& value, Fill fill, bool outlives = false);
  // Reads `now` (one value each) and everything pending in one read: the
  // fills run, and now's values come back in order. Nothing to read: no read.
  std::vector<double> read_with(const std::vector<at::Tensor>& now = {});
  // Reads are deferred only inside a window the caller opens (a schedule's
  // run_step, whose results the fills write): outside it, add reads at once.
  void open() { open_ = true; }
  bool is_open() const { return open_; }
  // Ends the window: what outlives it is read now (one read), the rest is
  // forgotten unread (its fills would write into a call that returned).
  // How many were forgotten.
  size_t close();
  bool empty() const { return pending_.empty(); }
  size_t size() const { return pending_.size(); }

 private:
  struct Pending {
    at::Tensor value;
    Fill fill;
    bool outlives = false;
  };
  std::vector<Pending> pending_;
  bool open_ = false;
};

}  // namespace tightfit
