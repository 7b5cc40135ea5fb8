// [run] answer_prompts: what a run changed, shown in its own words. The
// prompts are answered greedily before the first step and again after the
// last; the summary prints both under each prompt, and the run folder keeps
// them in answers.jsonl ({"prompt", "before", "after", "before_step",
// "after_step"} per line).
#pragma once

#include <ostream>
#include <string>
#include <vector>

#include "chat_prompter.hpp"
#include "session.hpp"

namespace tightfit::host {

class AnswersBeforeAfter {
 public:
  // Reads the prompts (refusing a bad file before training starts) and
  // answers them with the model as it is now. Throws RecipeError.
  AnswersBeforeAfter(Session& session, const std::string& file, const std::string& recipe);
  // Answers again, prints both and writes answers.jsonl (rank 0).
  void finish(Session& session, std::ostream& out);

 private:
  std::vector<std::string> answer_all(Session& session) const;
  std::string file_, recipe_;
  int64_t tokens_ = 0, before_step_ = 0;
  std::vector<Prompt> prompts_;
  std::vector<std::string> before_;
};

}  // namespace tightfit::host
