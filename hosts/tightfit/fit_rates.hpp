// This machine's measured rates for fit's cost model, kept between calls.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "machine_rates.hpp"

namespace tightfit::host {

// This machine's rates for these shapes: from the cache when measured
// before (the same device, threads, shapes and disk), else measured now and
// kept — the same numbers for every fit, so rankings do not move with
// timing noise. `remeasure` measures again. `source` says which.
MachineRates cached_machine_rates(const std::string& device, const std::vector<int64_t>& rows,
                                  int64_t k, int64_t n, const std::string& scratch, bool remeasure,
                                  std::string& source);

}  // namespace tightfit::host
