#include <unistd.h>

#include <iostream>

#include "commands.hpp"
#include "input_files.hpp"
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
    // A recipe key written as an argument (run.steps=10) reads as a second
    // recipe: say what was meant.
    for (size_t i = 0; i < args.size(); ++i) {
      const std::string& a = args[i];
      const size_t eq = a.find('=');
      if (!a.empty() && a[0] != '-' && eq != std::string::npos && a.find('.') < eq &&
          (i == 0 || args[i - 1] != "--set")) {
        std::cerr << "tightfit " << command << ": \"" << a
                  << "\" looks like a recipe key's new value: write it as --set " << a << "\n";
        return false;
      }
    }
    std::cerr << "tightfit " << command << ": " << e.what() << "\n\n" << opts;
    return false;
  }
}

int print_usage(const po::variables_map& vm, const po::options_description& opts,
                const std::string& about) {
  const bool help = vm.count("help") > 0;
  (help ? std::cout : std::cerr) << opts << about;
  return help ? kOk : kUsage;
}

void write_stderr_line(const std::string& line) {
  std::cerr.flush();
  const std::string text = line + "\n";
  for (size_t done = 0; done < text.size();) {
    const ssize_t n = ::write(STDERR_FILENO, text.data() + done, text.size() - done);
    if (n <= 0) break;  // nowhere to report that stderr failed
    done += static_cast<size_t>(n);
  }
}

int report_current_error() {
  try {
    throw;
  } catch (const RecipeError& e) {
    write_stderr_line(std::string("tightfit: recipe error: ") + e.what());
    return kUsage;
  } catch (const InputError& e) {
    write_stderr_line(std::string("tightfit: ") + e.what());
    return kUsage;
  } catch (const PluginLoadError& e) {
    write_stderr_line(std::string("tightfit: ") + e.what());
    return kPluginError;
  } catch (const PluginCallError& e) {
    write_stderr_line(std::string("tightfit: ") + e.what());
    return kPluginError;
  } catch (const c10::Error& e) {  // LibTorch's message, without its C++ backtrace
    write_stderr_line(std::string("tightfit: ") + e.what_without_backtrace());
    return kFailure;
  } catch (const std::exception& e) {
    write_stderr_line(std::string("tightfit: ") + e.what());
    return kFailure;
  }
}

}  // namespace tightfit::host
