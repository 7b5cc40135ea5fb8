// The trained model `generate` and `export` work on: a recipe's latest
// checkpoint (never freshly initialized weights in its place), a Hugging
// Face model folder, or a GGUF file read as the folder its metadata makes.
#pragma once

#include <boost/program_options.hpp>
#include <memory>
#include <string>
#include <vector>

#include "session.hpp"

namespace tightfit::host {

// A session over `target` with the recipe overrides `sets`, built without
// data. Throws RecipeError when a recipe has no checkpoint yet.
std::unique_ptr<Session> load_target(const std::string& target,
                                     const std::vector<std::string>& sets);
// The same for the command line's "target" and its --set options.
std::unique_ptr<Session> load_target(const boost::program_options::variables_map& vm);

}  // namespace tightfit::host
