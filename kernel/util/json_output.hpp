// JSON tightfit writes that may carry text which is not UTF-8: a path in a
// folder named in Latin-1 (run folders in manifest.json, recipes and folders
// in ab.json). nlohmann's dump refuses such bytes (its type_error 316 once
// stopped every checkpoint save of a run in such a folder); replacing them
// would lose the path. Each byte outside valid UTF-8 is written the way
// Python's surrogateescape writes it, as \udcXX: Python's json.loads and
// os.fsencode turn it back into the byte, and so does parse_own_json here.
// Text that is valid UTF-8 is written exactly as dump() writes it.
#pragma once

#include <nlohmann/json.hpp>
#include <string>

namespace tightfit {

// j.dump(indent), with bytes outside UTF-8 in strings and keys as \udcXX.
std::string dump_json(const nlohmann::json& j, int indent = -1);
std::string dump_json(const nlohmann::ordered_json& j, int indent = -1);

// JSON that dump_json wrote (or Python with surrogateescape): parse_json,
// with each \udcXX that is not half of a pair (XX from 80 to FF) read back as
// the byte it stands for. Throws as parse_json does.
nlohmann::json parse_own_json(const std::string& text, const std::string& source);

}  // namespace tightfit
