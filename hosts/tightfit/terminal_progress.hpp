// The kernel's progress of long phases (building a model, reading data,
// generating, exporting) as one line that updates in place on a terminal;
// nothing in a pipe or a file, or when asked to be quiet.
#pragma once

namespace tightfit::host {

// Shows progress when stderr is a terminal and not `quiet`; else none.
void show_progress_on_terminal(bool quiet);

}  // namespace tightfit::host
