#include <iostream>

#include "commands.hpp"
#include "plugin_loader.hpp"
#include "recipe.hpp"
#include "session.hpp"

namespace tightfit::host {
namespace po = boost::program_options;

bool parse_command_line(const std::vector<std::string>& args, const po::options_description& opts,
                        const char* positional, const char* command, po::variables_map& vm) {
  po::options_description hidden;
  hidden.add_options()(positional, po::value<std::string>());
  po::positional_options_description pos;
  pos.add(positional, 1);
  po::options_description all;
  all.add(opts).add(hidden);
  try {
    po::store(po::command_line_parser(args).options(all).positional(pos).run(), vm);
    po::notify(vm);
    return true;
  } catch (const po::error& e) {
    std::cerr << "tightfit " << command << ": " << e.what() << "\n\n" << opts;
    return false;
  }
}

int report_current_error() {
  try {
    throw;
  } catch (const RecipeError& e) {
    std::cerr << "tightfit: recipe error: " << e.what() << "\n";
    return kUsage;
  } catch (const PluginLoadError& e) {
    std::cerr << "tightfit: " << e.what() << "\n";
    return kPluginError;
  } catch (const PluginCallError& e) {
    std::cerr << "tightfit: " << e.what() << "\n";
    return kPluginError;
  } catch (const std::exception& e) {
    std::cerr << "tightfit: " << e.what() << "\n";
    return kFailure;
  }
}

}  // namespace tightfit::host
