#include "run_answers.hpp"

#include <filesystem>
#include <nlohmann/json.hpp>

#include "file_util.hpp"

namespace tightfit::host {
namespace fs = std::filesystem;

AnswersBeforeAfter::AnswersBeforeAfter(Session& session, const std::string& file,
                                       const std::string& recipe)
    : file_(file), recipe_(recipe) {
  if (session.env().run_info.world_size > 1)
    throw RecipeError(recipe +
                      ": [run] answer_prompts answers in one process; run the recipe "
                      "on one process, or compare with `tightfit generate --prompts` "
                      "after training");
  tokens_ = session.env().config.run.answer_tokens;
  try {
    prompts_ = ChatPrompter(session).prompts_in(file);
  } catch (const std::exception& e) {
    throw RecipeError(recipe + ": [run] answer_prompts = \"" + file + "\": " + e.what());
  }
  if (prompts_.empty())
    throw RecipeError(recipe + ": [run] answer_prompts = \"" + file + "\" holds no prompt");
  before_step_ = session.step();
  before_ = answer_all(session);
}

std::vector<std::string> AnswersBeforeAfter::answer_all(Session& session) const {
  std::vector<std::string> out;
  try {
    for (const Prompt& p : prompts_) out.push_back(answer_greedily(session, p, tokens_));
  } catch (const std::exception& e) {
    throw RecipeError(recipe_ + ": [run] answer_prompts: answering at step " +
                      std::to_string(session.step()) + " failed (" + e.what() +
                      "); what [save] asked for is saved. Shorten the prompts or lower "
                      "run.answer_tokens");
  }
  return out;
}

void AnswersBeforeAfter::finish(Session& session, std::ostream& out) {
  const std::vector<std::string> after = answer_all(session);
  const std::string before_label =
      before_step_ == 0 ? "before" : "step " + std::to_string(before_step_);
  const std::string after_label =
      before_step_ == 0 ? "after" : "step " + std::to_string(session.step());
  out << "answers       " << file_ << " (greedy, at most " << tokens_
      << " tokens): before training, then after\n";
  std::string lines;
  // One line each: an answer's line breaks shown as "\n".
  auto line = [](std::string s) {
    for (size_t at = 0; (at = s.find('\n', at)) != std::string::npos; at += 2)
      s.replace(at, 1, "\\n");
    return s;
  };
  for (size_t i = 0; i < prompts_.size(); ++i) {
    out << "  ### " << line(prompts_[i].shown) << "\n"
        << "  " << before_label << ": " << line(before_[i]) << "\n"
        << "  " << after_label << ": " << line(after[i]) << "\n";
    lines += nlohmann::json{{"prompt", prompts_[i].shown},
                            {"before", before_[i]},
                            {"after", after[i]},
                            {"before_step", before_step_},
                            {"after_step", session.step()}}
                 .dump(-1, ' ', false, nlohmann::json::error_handler_t::replace) +
             "\n";
  }
  const std::string path = (fs::path(session.env().run_dir) / "answers.jsonl").string();
  write_file_synced(path, lines);
  out << "              " << path << "\n";
}

}  // namespace tightfit::host
