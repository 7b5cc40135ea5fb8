// `tightfit run`: compose a recipe, train with a progress line, summarize.
#include <unistd.h>

#include <algorithm>
#include <boost/program_options.hpp>
#include <cctype>
#include <chrono>
#include <cmath>
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <iostream>
#include <optional>
#include <sstream>

#include "commands.hpp"
#include "fit_hint.hpp"
#include "launch.hpp"
#include "logging.hpp"
#include "memory_budget.hpp"
#include "memory_plan.hpp"
#include "openmp_waits.hpp"
#include "recipe_paths.hpp"
#include "run_answers.hpp"
#include "run_rewards.hpp"
#include "session.hpp"
#include "stop_request.hpp"
#include "terminal_progress.hpp"

namespace tightfit::host {
namespace po = boost::program_options;
namespace fs = std::filesystem;

namespace {

std::string default_recipe() {
  for (const fs::path& p :
       {fs::path("configs/default.toml"), fs::path(TIGHTFIT_SOURCE_DIR) / "configs/default.toml"})
    if (fs::exists(p)) return p.string();
  return "configs/default.toml";
}

// An argument as a shell reads it back: as it is when it is plain, else in
// single quotes (a quote inside closed, escaped and reopened).
std::string shell_word(const std::string& a) {
  const bool plain = !a.empty() && std::all_of(a.begin(), a.end(), [](char c) {
    return std::isalnum(static_cast<unsigned char>(c)) || std::strchr("-_./=:,+@%", c);
  });
  if (plain) return a;
  std::string out = "'";
  for (char c : a) out += c == '\'' ? std::string("'\\''") : std::string(1, c);
  return out + "'";
}

std::string duration(double s) {
  if (!std::isfinite(s) || s < 0) return "?";
  const auto t = static_cast<long long>(s + 0.5);
  char buf[32];
  if (t >= 3600)
    std::snprintf(buf, sizeof buf, "%lldh%02lldm", t / 3600, (t / 60) % 60);
  else if (t >= 60)
    std::snprintf(buf, sizeof buf, "%lldm%02llds", t / 60, t % 60);
  else
    std::snprintf(buf, sizeof buf, "%llds", t);
  return buf;
}

std::string rate(double tok_s) {
  char buf[32];
  if (tok_s >= 1e6)
    std::snprintf(buf, sizeof buf, "%.2fM", tok_s / 1e6);
  else if (tok_s >= 1e3)
    std::snprintf(buf, sizeof buf, "%.1fk", tok_s / 1e3);
  else if (tok_s >= 10)
    std::snprintf(buf, sizeof buf, "%.0f", tok_s);
  else  // a big model on a CPU: under one token a second
    std::snprintf(buf, sizeof buf, "%.2f", tok_s);
  return buf;
}

std::string memory_line(const MemorySnapshot& m, bool peaks) {
  std::ostringstream os;
  const auto& v = peaks ? m.peak : m.current;
  const tf_mem_category order[] = {TF_MEM_WEIGHTS,     TF_MEM_GRADS,    TF_MEM_OPTIMIZER,
                                   TF_MEM_ACTIVATIONS, TF_MEM_ADAPTERS, TF_MEM_TRANSIENT,
                                   TF_MEM_OTHER};
  bool first = true;
  for (auto c : order) {
    if (v[c] <= 0) continue;
    os << (first ? "" : " ") << category_name(c) << " " << format_bytes(v[c]);
    first = false;
  }
  if (m.device_peak > 0)
    os << " | device " << format_bytes(peaks ? m.device_peak : m.device_current);
  return os.str();
}

}  // namespace

int run_command(const std::vector<std::string>& args) {
  po::options_description opts("tightfit run [recipe.toml] [options]");
  opts.add_options()("help,h", "show this help")(
      "set", po::value<std::vector<std::string>>()->composing(),
      "override a recipe key, e.g. --set run.steps=100 --set strategy.checkpoint.every=2")(
      "add-strategy", po::value<std::vector<std::string>>()->composing(),
      "append a [[strategy]] with this plugin (before --set, which can then set its keys as "
      "strategy.NAME.key)")("resume", "continue from the latest checkpoint in the run folder")(
      "stop-after", po::value<int64_t>(),
      "stop (and save a checkpoint) after N steps of this invocation")(
      "dry-run", "validate the recipe and compose its plugins without allocating the model")(
      "nproc", po::value<int>(),
      "start N local ranks of this run (as torchrun --nproc-per-node N would); without it, "
      "RANK/WORLD_SIZE/MASTER_ADDR/MASTER_PORT from the environment are used when set")(
      "quiet,q", "no progress lines (steps, set-up phases)")(
      "log-level", po::value<std::string>()->default_value("info"), "debug, info, warn, error");
  po::variables_map vm;
  if (!parse_command_line(args, opts, "recipe", "run", vm)) return kUsage;
  if (vm.count("help")) {
    std::cout << opts
              << "\nWith no recipe, runs configs/default.toml. Exit codes: 0 ok, 2 bad recipe or "
                 "command line, 3 out of memory budget, 4 plugin error, 1 other failure.\n";
    return kOk;
  }
  set_log_level(vm["log-level"].as<std::string>());
  const std::string recipe_path =
      vm.count("recipe") ? vm["recipe"].as<std::string>() : default_recipe();
  // In a multi-process run only rank 0 shows progress and the summary.
  const char* rank_env = std::getenv("RANK");
  const bool rank0 = rank_env == nullptr || std::string(rank_env) == "0";
  const bool quiet = vm.count("quiet") > 0 || !rank0;
  show_progress_on_terminal(quiet);
  const bool tty = ::isatty(STDERR_FILENO) != 0;
  const std::string who = rank0 ? "tightfit: " : "tightfit (rank " + std::string(rank_env) + "): ";

  if (vm.count("nproc")) {
    const int nproc = vm["nproc"].as<int>();
    if (nproc < 1 || nproc > 1024) {
      std::cerr << "tightfit run: --nproc must be between 1 and 1024\n";
      return kUsage;
    }
    if (std::getenv("WORLD_SIZE") != nullptr) {
      std::cerr << "tightfit run: --nproc with WORLD_SIZE already set (under torchrun or "
                   "Slurm); use one launcher\n";
      return kUsage;
    }
    if (nproc > 1) {
      std::vector<std::string> child{"run"};
      for (size_t i = 0; i < args.size(); ++i) {
        if (args[i] == "--nproc") {
          ++i;
          continue;
        }
        if (args[i].rfind("--nproc=", 0) == 0) continue;
        child.push_back(args[i]);
      }
      // The others notice a failed rank within [run].dist_timeout; then they are ended.
      double timeout = 300;
      try {
        Recipe recipe = Recipe::load(recipe_path);
        if (const toml::table* run = recipe.table("run"))
          timeout = (*run)["dist_timeout"].value_or(timeout);
      } catch (const std::exception&) {
        // every rank reports the recipe's problem itself
      }
      return launch_local_ranks(nproc, child, timeout + 5);
    }
  }

  // Ctrl-C or SIGTERM while the steps run: stop at the next step boundary
  // and save (a second one, or one during set-up, stops at once).
  install_stop_handlers();
  std::optional<MemoryPlan> plan;  // the planner's prediction, when there is one
  try {
    const auto started = std::chrono::steady_clock::now();
    auto seconds_since_start = [&] {
      return std::chrono::duration<double>(std::chrono::steady_clock::now() - started).count();
    };
    Recipe recipe = Recipe::load(recipe_path);
    if (vm.count("add-strategy"))
      for (const auto& p : vm["add-strategy"].as<std::vector<std::string>>())
        recipe.add_strategy(p);
    if (vm.count("set"))
      for (const auto& s : vm["set"].as<std::vector<std::string>>()) recipe.apply_override(s);
    if (const toml::table* run = recipe.table("run"))
      spin_briefly_while_threads_adapt((*run)["adapt_threads"].value_or(false) &&
                                       (*run)["threads"].value_or(int64_t{0}) <= 0);
    PluginRegistry registry = PluginRegistry::discover();

    SessionOptions so;
    so.resume = vm.count("resume") > 0;
    if (vm.count("stop-after")) so.stop_after_steps = vm["stop-after"].as<int64_t>();
    if (!quiet)
      so.on_progress = [tty](const ProgressInfo& p) {
        std::ostringstream os;
        char loss[32];
        std::snprintf(loss, sizeof loss, "%.4f", p.loss);
        char lr[32];
        std::snprintf(lr, sizeof lr, "%.2e", p.lr);
        os << "step " << p.step << "/" << p.total << " | loss " << loss << " | lr " << lr << " | "
           << rate(p.tokens_per_s) << " tok/s | peak " << memory_line(p.memory, true) << " | ETA "
           << duration(p.eta_s);
        if (p.phase != "full") os << " | " << p.phase;
        for (const auto& [key, value] : p.schedule_metrics) {
          char v[32];
          std::snprintf(v, sizeof v, "%.4g", value);
          os << " | " << key << " " << v;
        }
        std::cerr << (tty ? "\r\033[K" : "") << os.str() << (tty && p.step < p.total ? "" : "\n")
                  << std::flush;
      };
    so.dry_run = vm.count("dry-run") > 0;
    // The planner's prediction (as `tightfit plan`), made on the run's own
    // composition before anything is materialized, and checked against what
    // the run measures. A recipe the planner cannot plan still runs.
    if (rank0 && !so.dry_run)
      so.on_composed = [&plan](Session& composed) {
        try {
          plan = plan_memory(composed.parts());
        } catch (const OutOfBudgetError&) {
          throw;
        } catch (const std::exception& e) {
          std::cerr << "tightfit: no memory plan for this recipe: " << e.what() << "\n";
        }
      };
    Session session(recipe, registry, so);
    const double setup_s = seconds_since_start();  // the model built, converted and placed
    if (so.dry_run) {
      // What the run would read is there: a dry run reads no data, and a
      // recipe copied out of configs/ reads its relative paths from where it
      // now is.
      const fs::path recipe_dir = fs::path(recipe.source()).parent_path();
      for (const auto& [key, spec] :
           {std::pair{"[data] corpus", session.env().config.data.corpus},
            std::pair{"[run] answer_prompts", session.env().config.run.answer_prompts}}) {
        if (spec.empty() || spec.rfind("builtin:", 0) == 0 ||
            recipe_path_exists(spec, recipe_dir.string()))
          continue;
        std::cerr << "tightfit: recipe error: " << recipe.source() << ": " << key << " = \"" << spec
                  << "\" is not there (looked in the working directory and in the "
                  << "recipe's folder " << (recipe_dir.empty() ? "." : recipe_dir.string())
                  << "): a relative path is read from the recipe's folder; copy the file beside "
                     "the recipe, or give its absolute path\n";
        return kUsage;
      }
      std::cout << recipe.source() << ": valid; model " << session.plugins().model.plugin->name
                << ", " << session.store().count_params(false) << " parameters ("
                << session.store().count_params(true) << " trainable), "
                << session.executor().stages().size() << " stages, "
                << session.plugins().strategies.size() << " strategies\n";
      return kOk;
    }
    if (rank0) {
      std::cerr << "tightfit: " << recipe.source() << " -> " << session.env().run_dir << "\n";
      if (session.env().device.is_cpu() && !quiet)
        std::cerr << "tightfit: " << session.cpu_threads() << "\n";
    }
    // [run] answer_prompts: the model's answers before training, then after.
    const std::string answer_file = session.env().config.run.answer_prompts;
    std::optional<AnswersBeforeAfter> answers;
    if (!answer_file.empty()) answers.emplace(session, answer_file, recipe.source());
    const double train_from_s = seconds_since_start();
    TrainSummary s = session.train();
    if (const int signal = stop_requested()) {
      if (rank0) {
        std::string again = "tightfit run";
        bool resumes = false;
        for (const std::string& a : args) {
          again += " " + shell_word(a);
          resumes = resumes || a == "--resume";
        }
        if (!resumes) again += " --resume";
        const std::string what = signal == SIGINT ? "Ctrl-C" : "SIGTERM";
        if (s.steps_run > 0 && !s.saved.empty())
          write_stderr_line("tightfit: stopped by " + what + " after step " +
                            std::to_string(s.first_step + s.steps_run) + " of " +
                            std::to_string(s.total_steps) + "; saved " + s.saved.back() +
                            "\ntightfit: continue with: " + again);
        else
          write_stderr_line("tightfit: stopped by " + what + " before a step finished; nothing " +
                            "new was saved (the checkpoints before are as they were)");
      }
      return 128 + signal;
    }
    if (!rank0) return kOk;

    std::cout << "\n== summary: " << recipe.source() << " ==\n";
    std::cout << "steps         " << s.first_step << " -> " << s.first_step + s.steps_run << " of "
              << s.total_steps << " in " << duration(s.wall_s) << "\n";
    char buf[256];
    if (session.data().prompts()) {
      // Online RL: the loss is the schedule's surrogate; the reward tells.
      std::snprintf(buf, sizeof buf, "loss          %.4f final train (the schedule's objective)\n",
                    s.final_loss);
      std::cout << buf;
      if (const auto line =
              reward_before_after(s.metrics_path, session.parts().plugins->schedule.plugin->name))
        std::cout << "reward        " << *line << "\n";
    } else {
      std::snprintf(
          buf, sizeof buf,
          "loss          %.4f final train, %.4f validation (unigram entropy of the corpus: %.4f)\n",
          s.final_loss, s.val_loss, s.unigram_entropy);
      std::cout << buf;
    }
    if (!s.data.empty()) std::cout << "data          " << s.data << "\n";
    std::cout << "throughput    " << rate(s.tokens_per_s) << " tokens/s\n";
    if (!std::isnan(s.first_step_s))
      std::cout << "first step    done " << duration(train_from_s + s.first_step_s)
                << " after start (set-up " << duration(setup_s)
                << ": the model built, converted and placed)\n";
    std::cout << "peak memory   " << format_bytes(s.memory.total_peak) << " total; "
              << memory_line(s.memory, true) << "\n";
    if (plan) {
      // The plan leaves the data out; so does this comparison.
      const int64_t measured = s.memory.device_peak > 0
                                   ? s.memory.device_peak
                                   : s.memory.total_peak - s.memory.peak[TF_MEM_OTHER];
      std::snprintf(buf, sizeof buf, "%+.1f%%",
                    100.0 * static_cast<double>(plan->tracked_peak - measured) /
                        static_cast<double>(std::max<int64_t>(measured, 1)));
      std::cout << "planned peak  " << format_bytes(plan->tracked_peak) << " (tightfit plan), "
                << buf << " against the measured " << format_bytes(measured)
                << " (data left out)\n";
    }
    if (!s.process_memory.empty()) std::cout << "process RSS   peak " << s.process_memory << "\n";
    std::cout << "metrics       " << s.metrics_path << "\n";
    if (s.saved.empty())
      std::cout << "saved         nothing (no checkpoint, hf/ or adapter/ was written)\n";
    for (size_t i = 0; i < s.saved.size(); ++i)
      std::cout << (i ? "              " : "saved         ") << s.saved[i] << "\n";
    if (!s.sample.empty()) std::cout << "sample        ----\n" << s.sample << "\n----\n";
    if (answers) answers->finish(session, std::cout);
    return kOk;
  } catch (const RecipeError& e) {
    std::cerr << "tightfit: recipe error: " << e.what() << "\n";
    return kUsage;
  } catch (const OutOfBudgetError& e) {
    write_stderr_line("\n" + who + e.what());
    // What the planner saw coming, and the command that searches the
    // installed strategies for a stack that fits.
    const int64_t budget = run_memory_budget().bytes;
    if (plan && rank0) {
      std::cerr << "planned peak  " << format_bytes(plan->tracked_peak) << " ("
                << describe_device_peak(*plan) << ")"
                << (budget > 0 ? " against the budget of " + format_bytes(budget) : "") << "\n";
    }
    // The planner's budgets leave the data out; so does the suggestion.
    const auto hint = fit_hint(recipe_path, run_memory_budget(),
                               MemoryAccounting::instance().snapshot().peak[TF_MEM_OTHER]);
    if (hint && rank0) std::cerr << *hint << "\n";
    return kOutOfBudget;
  } catch (const PluginLoadError& e) {
    write_stderr_line(who + e.what());
    return kPluginError;
  } catch (const PluginCallError& e) {
    write_stderr_line(who + e.what());
    return kPluginError;
  } catch (const c10::Error& e) {
    write_stderr_line(who + e.what_without_backtrace());
    return kFailure;
  } catch (const std::exception& e) {
    write_stderr_line(who + e.what());
    return kFailure;
  }
}

}  // namespace tightfit::host
