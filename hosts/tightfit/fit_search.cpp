#include "fit_search.hpp"

#include <algorithm>
#include <numeric>
#include <set>
#include <sstream>

namespace tightfit::host {

namespace {

bool has(const std::vector<std::string>& v, const std::string& s) {
  return std::find(v.begin(), v.end(), s) != v.end();
}

// A TOML literal as a node ("\"nf4\"" -> the string nf4).
toml::table literal_table(const std::string& literal) {
  return toml::parse("v = " + literal);
}

// A node as the recipe writes it, a string without its quotes.
std::string value_text(const toml::node& n) {
  if (const auto* s = n.as_string()) return s->get();
  std::ostringstream os;
  n.visit([&](const auto& v) { os << toml::toml_formatter(v); });
  return os.str();
}

std::string literal_text(const std::string& literal) {
  const toml::table t = literal_table(literal);
  return value_text(*t.get("v"));
}

// The node's TOML literal ("nf4" -> "'nf4'").
std::string literal_of(const toml::node& n) {
  toml::table t;
  n.visit([&](const auto& v) { t.insert("v", v); });
  std::ostringstream os;
  os << toml::toml_formatter(t);
  std::string s = os.str();
  s = s.substr(s.find('=') + 1);
  const auto first = s.find_first_not_of(" \t\n"), last = s.find_last_not_of(" \t\n");
  return first == std::string::npos ? std::string() : s.substr(first, last - first + 1);
}

const KeySpec* find_key(const std::vector<KeySpec>& keys, const std::string& name) {
  for (const KeySpec& k : keys)
    if (k.name == name) return &k;
  return nullptr;
}

bool is_off(const FitKnob& k, int at) {
  return at < 0 || (k.values[static_cast<size_t>(at)].flags & TF_SEARCH_VALUE_OFF);
}

// Strategies in their declared stack order (their hooks run in recipe
// order), then schedules.
bool written_before(const PluginInfo* a, const PluginInfo* b) {
  const bool sa = a->kind == TF_PLUGIN_SCHEDULE, sb = b->kind == TF_PLUGIN_SCHEDULE;
  if (sa != sb) return sb;
  if (a->search->stack_order != b->search->stack_order)
    return a->search->stack_order < b->search->stack_order;
  return a->name < b->name;
}

// The values a key is searched at in this space; empty with a note when
// none can be (the plugin is then left as the recipe has it).
std::vector<SearchValue> key_values(const FitPlugin& p, const KeySpec& k, const FitSpace& sp,
                                    const std::vector<int>& lora_ranks,
                                    const std::vector<std::string>& change, bool in_recipe,
                                    std::vector<std::string>& notes) {
  const KeySearch& s = *k.search;
  if ((s.flags & TF_SEARCH_KEY_RANK) && !lora_ranks.empty()) {
    std::vector<SearchValue> out;
    for (int r : lora_ranks) {
      SearchValue v = s.values.front();
      v.value = std::to_string(r);
      v.quality_penalty = 0;
      for (const SearchValue& d : s.values)
        if (d.value == v.value) v = d;
      out.push_back(v);
    }
    return out;
  }
  if ((s.flags & TF_SEARCH_KEY_RECIPES_CHOICE) && in_recipe && !has(change, p.name)) {
    // The recipe's value (set, or the default it runs with) is its choice.
    std::string literal = k.default_value.value_or("");
    if (const toml::node* n = p.user.get(k.name)) literal = literal_of(*n);
    SearchValue v = s.values.front();
    v.value = literal;
    v.quality_penalty = 0;
    v.approximation.clear();
    for (const SearchValue& d : s.values)
      if (literal_text(d.value) == literal_text(literal)) v = d;
    notes.push_back(p.name + " " + k.name + " = " + literal_text(literal) +
                    " as the recipe sets it (" +
                    ((s.flags & TF_SEARCH_KEY_RANK) ? std::string("--lora-ranks to try others")
                                                    : "--change " + p.name + " to search it") +
                    ")");
    return {v};
  }
  std::vector<SearchValue> out;
  for (const SearchValue& v : s.values) {
    if ((v.flags & TF_SEARCH_VALUE_CUDA_ONLY) && !sp.cuda) continue;
    if (s.flags & TF_SEARCH_KEY_SPLITS_BATCH) {
      const int64_t n = literal_table(v.value)["v"].value_or(int64_t{0});
      if (n < 1 || sp.batch_size % n != 0) continue;
    }
    out.push_back(v);
  }
  if (out.empty())
    notes.push_back(p.name + " not searched: no value of " + k.name + " it declares fits" +
                    ((s.flags & TF_SEARCH_KEY_SPLITS_BATCH)
                         ? " data.batch_size = " + std::to_string(sp.batch_size)
                         : std::string(" this device")));
  return out;
}

// A recipe value of a searched key that fit would not try (shard's layers):
// the plugin stays as the recipe has it.
std::string value_fit_leaves(const FitPlugin& p) {
  for (const KeySpec& k : p.keys) {
    if (!k.search || (k.search->flags & (TF_SEARCH_KEY_RECIPES_CHOICE | TF_SEARCH_KEY_FOLLOWS)))
      continue;
    const toml::node* n = p.user.get(k.name);
    if (!n) continue;
    const std::string text = value_text(*n);
    const bool listed =
        std::any_of(k.search->values.begin(), k.search->values.end(),
                    [&](const SearchValue& v) { return literal_text(v.value) == text; });
    if (!listed) return k.name + " = " + literal_of(*n);
  }
  return {};
}

}  // namespace

int FitSpace::plugin_index(const std::string& name) const {
  for (size_t i = 0; i < plugins.size(); ++i)
    if (plugins[i].name == name) return static_cast<int>(i);
  return -1;
}

bool FitChoice::saves_no_more_than(const FitChoice& other) const {
  // A value that may cost memory (bf16 compute's casts of the weights can
  // outweigh the halved activations) says nothing, when it does not fit,
  // of a stack with another value there.
  for (size_t k = 0; k < at.size(); ++k)
    if (other.may_cost[k] && at[k] != other.at[k]) return false;
  for (size_t k = 0; k < at.size(); ++k)
    if (at[k] > other.at[k]) return false;
  return true;
}

FitSpace fit_space(const Recipe& base, const PluginRegistry& registry,
                   const std::vector<std::string>& keep, const std::vector<std::string>& without,
                   const std::vector<std::string>& change, std::vector<int> lora_ranks,
                   bool adapters_instead, int ranks) {
  FitSpace sp;
  const toml::table* run = base.table("run");
  const std::string device = run ? (*run)["device"].value_or(std::string("cpu")) : "cpu";
  sp.cuda = device.rfind("cuda", 0) == 0;
  const toml::table* data = base.table("data");
  sp.batch_size = data ? (*data)["batch_size"].value_or(int64_t{1}) : 1;
  const toml::table* sched = base.table("schedule");
  const std::string schedule = sched ? (*sched)["plugin"].value_or(std::string()) : "standard";
  std::sort(lora_ranks.rbegin(), lora_ranks.rend());  // a larger rank saves less
  lora_ranks.erase(std::unique(lora_ranks.begin(), lora_ranks.end()), lora_ranks.end());

  std::vector<const PluginInfo*> declared;
  for (const PluginInfo* p : registry.all())
    if (p->search && p->kind != TF_PLUGIN_MODEL) declared.push_back(p);
  std::stable_sort(declared.begin(), declared.end(), written_before);
  for (const PluginInfo* info : declared) {
    const uint32_t flags = info->search->flags;
    const bool adapters = flags & TF_SEARCH_PLUGIN_TRAINS_ADAPTERS;
    const toml::table* own =
        info->kind == TF_PLUGIN_STRATEGY ? base.strategy_table(info->name) : nullptr;
    if (has(without, info->name)) continue;
    if (has(keep, info->name)) {
      if (own) sp.kept.push_back(info->name);
      if (own && adapters) {
        sp.trains_all_weights = false;
        sp.notes.push_back(info->name + " as the recipe sets it (--keep " + info->name + ")");
      }
      continue;
    }
    FitPlugin p;
    p.name = info->name;
    p.search = *info->search;
    p.keys = info->keys;
    if (own) p.user = *own;
    if (info->kind == TF_PLUGIN_SCHEDULE) {
      p.schedule = true;
      if (schedule == info->name || p.search.stands_in_for.empty()) continue;
      if (schedule != p.search.stands_in_for) {
        sp.notes.push_back(info->name + " not searched: the recipe's schedule is " + schedule);
        continue;
      }
    }
    if (flags & TF_SEARCH_PLUGIN_RANKS) {
      if (ranks <= 1) continue;
      p.optional = false;
    }
    if (adapters) {
      sp.adapters_possible = sp.adapters_possible || !own;
      if (own) {
        p.optional = false;
      } else if (adapters_instead) {
        p.optional = false;
        sp.notes.push_back("no stack that trains all weights fits: " +
                           (p.search.approximation.empty() ? p.name : p.search.approximation) +
                           " adapters train instead");
      } else if (lora_ranks.empty()) {
        continue;
      }
      if (!p.optional) sp.trains_all_weights = false;
    }
    if (const std::string left = value_fit_leaves(p); !left.empty()) {
      sp.kept.push_back(p.name);
      sp.notes.push_back(p.name + " " + left + " kept as the recipe sets it");
      continue;
    }
    bool recipes_choice = false;
    for (const KeySpec& k : p.keys)
      recipes_choice |= k.search && (k.search->flags & TF_SEARCH_KEY_RECIPES_CHOICE);
    if (own && recipes_choice && !has(change, p.name)) p.optional = false;

    // Its knobs: in or out, then each searched key, those others depend on first.
    std::vector<FitKnob> knobs;
    if (p.optional) knobs.push_back(FitKnob{sp.plugins.size(), "", {SearchValue{}, SearchValue{}}});
    std::vector<const KeySpec*> searched;
    for (const KeySpec& k : p.keys)
      if (k.search && !(k.search->flags & TF_SEARCH_KEY_FOLLOWS)) searched.push_back(&k);
    std::stable_partition(searched.begin(), searched.end(),
                          [](const KeySpec* k) { return k->search->with.empty(); });
    bool searchable = true;
    for (const KeySpec* k : searched) {
      FitKnob knob{sp.plugins.size(), k->name,
                   key_values(p, *k, sp, lora_ranks, change, own != nullptr, sp.notes)};
      knob.key_flags = k->search->flags;
      if (knob.values.empty()) searchable = false;
      for (size_t j = 0; j < knobs.size(); ++j)
        if (knobs[j].key == k->search->with && !k->search->with.empty())
          knob.with = static_cast<int>(sp.knobs.size() + j);
      knobs.push_back(std::move(knob));
    }
    if (!searchable) {
      if (own) sp.kept.push_back(p.name);
      continue;
    }
    sp.knobs.insert(sp.knobs.end(), knobs.begin(), knobs.end());
    sp.plugins.push_back(std::move(p));
  }
  return sp;
}

namespace {

// Whether the stack is one to plan: an added plugin does something, no two
// settings claim one resource, a value's needs are in the stack, frozen
// weights only beside adapters.
bool consistent(const FitSpace& sp, const FitChoice& c) {
  auto in_stack = [&](const std::string& name) {
    const int i = sp.plugin_index(name);
    if (i >= 0) return c.in[static_cast<size_t>(i)] != 0;
    return has(sp.kept, name);
  };
  bool adapters = !sp.trains_all_weights;
  for (size_t i = 0; i < sp.plugins.size(); ++i)
    adapters |= c.in[i] && (sp.plugins[i].search.flags & TF_SEARCH_PLUGIN_TRAINS_ADAPTERS);
  std::set<std::string> claimed;
  auto claim = [&](const std::string& what) { return what.empty() || claimed.insert(what).second; };
  for (size_t i = 0; i < sp.plugins.size(); ++i) {
    if (!c.in[i]) continue;
    const FitPlugin& p = sp.plugins[i];
    if ((p.search.flags & TF_SEARCH_PLUGIN_FROZEN_WEIGHTS) && !adapters) return false;
    if (!claim(p.search.claims)) return false;
    bool any_key = false, all_off = true;
    for (size_t k = 0; k < sp.knobs.size(); ++k) {
      const FitKnob& knob = sp.knobs[k];
      if (knob.plugin != i || knob.key.empty() || c.at[k] < 0) continue;
      const SearchValue& v = knob.values[static_cast<size_t>(c.at[k])];
      any_key = true;
      all_off &= (v.flags & TF_SEARCH_VALUE_OFF) != 0;
      if (!claim(v.claims)) return false;
      if (!v.needs.empty() && !in_stack(v.needs)) return false;
    }
    if (p.optional && any_key && all_off) return false;  // the stack without it
  }
  return true;
}

void enumerate_from(const FitSpace& sp, size_t k, FitChoice& c, std::vector<FitChoice>& out) {
  if (k == sp.knobs.size()) {
    if (consistent(sp, c)) {
      out.push_back(c);
      finish_choice(sp, out.back());
    }
    return;
  }
  const FitKnob& knob = sp.knobs[k];
  if (knob.key.empty()) {
    for (int v = 0; v < 2; ++v) {
      c.at[k] = v;
      c.in[knob.plugin] = static_cast<char>(v);
      enumerate_from(sp, k + 1, c, out);
    }
    return;
  }
  const bool chosen =
      c.in[knob.plugin] && (knob.with < 0 || !is_off(sp.knobs[static_cast<size_t>(knob.with)],
                                                     c.at[static_cast<size_t>(knob.with)]));
  if (!chosen) {
    c.at[k] = -1;
    enumerate_from(sp, k + 1, c, out);
    return;
  }
  for (size_t v = 0; v < knob.values.size(); ++v) {
    c.at[k] = static_cast<int>(v);
    enumerate_from(sp, k + 1, c, out);
  }
}

FitChoice empty_choice(const FitSpace& sp) {
  FitChoice c;
  c.at.assign(sp.knobs.size(), -1);
  c.in.assign(sp.plugins.size(), 0);
  for (size_t i = 0; i < sp.plugins.size(); ++i) c.in[i] = !sp.plugins[i].optional;
  return c;
}

}  // namespace

void finish_choice(const FitSpace& sp, FitChoice& c) {
  std::vector<std::string> parts;
  c.changed_maths.clear();
  c.penalty = 0;
  c.added = 0;
  c.may_cost.assign(sp.knobs.size(), 0);
  for (size_t i = 0; i < sp.plugins.size(); ++i) {
    if (!c.in[i]) continue;
    const FitPlugin& p = sp.plugins[i];
    c.added += p.optional;
    if (!p.search.approximation.empty()) c.changed_maths.push_back(p.search.approximation);
    c.penalty += p.search.quality_penalty;
    size_t labelled = 0;
    for (size_t k = 0; k < sp.knobs.size(); ++k) {
      const FitKnob& knob = sp.knobs[k];
      if (knob.plugin != i || knob.key.empty() || c.at[k] < 0) continue;
      const SearchValue& v = knob.values[static_cast<size_t>(c.at[k])];
      c.may_cost[k] = (v.flags & TF_SEARCH_VALUE_MAY_COST) != 0;
      c.penalty += v.quality_penalty;
      if (!v.approximation.empty()) c.changed_maths.push_back(v.approximation);
      if (v.flags & TF_SEARCH_VALUE_OFF) continue;
      parts.push_back(v.label.empty() ? p.name + " " + knob.key + " = " + literal_text(v.value)
                                      : search_label(v.label, literal_text(v.value)));
      ++labelled;
    }
    if (labelled == 0 && p.optional)
      parts.push_back(p.search.label.empty() ? p.name : p.search.label);
  }
  c.settings = static_cast<int>(parts.size());
  c.described = parts.empty() ? "plain" : parts[0];
  for (size_t i = 1; i < parts.size(); ++i) c.described += " + " + parts[i];
}

std::vector<FitChoice> enumerate_choices(const FitSpace& sp) {
  std::vector<FitChoice> out;
  FitChoice c = empty_choice(sp);
  enumerate_from(sp, 0, c, out);
  // The most memory-saving first: a stack that does not fit rules out
  // those after it that save no more on any knob.
  auto saving = [](const FitChoice& x) {
    return std::accumulate(x.at.begin(), x.at.end(), 0, [](int s, int v) { return s + v + 1; });
  };
  std::stable_sort(out.begin(), out.end(),
                   [&](const FitChoice& a, const FitChoice& b) { return saving(a) > saving(b); });
  return out;
}

FitChoice plain_choice(const FitSpace& sp, const FitChoice& from) {
  FitChoice c = empty_choice(sp);
  for (size_t i = 0; i < sp.plugins.size(); ++i) {
    const uint32_t flags = sp.plugins[i].search.flags;
    // What trains stays; ranks run as they do without a memory strategy.
    if (flags & TF_SEARCH_PLUGIN_TRAINS_ADAPTERS)
      c.in[i] = from.in[i];
    else
      c.in[i] = (flags & TF_SEARCH_PLUGIN_RANKS) != 0;
  }
  for (size_t k = 0; k < sp.knobs.size(); ++k) {
    const FitKnob& knob = sp.knobs[k];
    if (!c.in[knob.plugin]) continue;
    if (knob.key.empty()) {
      c.at[k] = 1;
    } else if (sp.plugins[knob.plugin].search.flags & TF_SEARCH_PLUGIN_TRAINS_ADAPTERS) {
      c.at[k] = from.at[k];
    } else if (knob.with < 0 || !is_off(sp.knobs[static_cast<size_t>(knob.with)],
                                        c.at[static_cast<size_t>(knob.with)])) {
      c.at[k] = 0;
    }
  }
  finish_choice(sp, c);
  return c;
}

Recipe apply_choice(const Recipe& base, const FitSpace& sp, const FitChoice& c) {
  Recipe r = base;
  std::vector<std::string> strategies;
  for (const FitPlugin& p : sp.plugins)
    if (!p.schedule) strategies.push_back(p.name);
  r.remove_strategies(strategies);
  for (size_t i = 0; i < sp.plugins.size(); ++i) {
    if (!c.in[i]) continue;
    const FitPlugin& p = sp.plugins[i];
    toml::table t = p.user;
    std::vector<std::pair<std::string, std::string>> set;  // key, TOML literal
    for (size_t k = 0; k < sp.knobs.size(); ++k) {
      const FitKnob& knob = sp.knobs[k];
      if (knob.plugin != i || knob.key.empty() || c.at[k] < 0) continue;
      const std::string& literal = knob.values[static_cast<size_t>(c.at[k])].value;
      set.emplace_back(knob.key, literal);
      if (knob.key_flags & TF_SEARCH_KEY_SPLITS_BATCH) {
        const int64_t n = literal_table(literal)["v"].value_or(int64_t{1});
        r.apply_override("data.batch_size=" + std::to_string(sp.batch_size / n));
      }
    }
    // A key that follows another keeps its default's ratio to it, unless set.
    for (const KeySpec& k : p.keys) {
      if (!k.search || !(k.search->flags & TF_SEARCH_KEY_FOLLOWS) || t.contains(k.name)) continue;
      const auto with = std::find_if(set.begin(), set.end(),
                                     [&](const auto& s) { return s.first == k.search->with; });
      const KeySpec* w = find_key(p.keys, k.search->with);
      if (with == set.end() || !w || !w->default_value || !k.default_value) continue;
      auto number = [](const std::string& literal) {
        const toml::table v = literal_table(literal);
        return v["v"].is_integer() ? static_cast<double>(v["v"].value_or(int64_t{0}))
                                   : v["v"].value_or(0.0);
      };
      const double x = number(*k.default_value) * number(with->second) / number(*w->default_value);
      std::ostringstream os;
      if (k.type == TF_VALUE_INT)
        os << static_cast<int64_t>(x);
      else
        os << std::showpoint << x;
      set.emplace_back(k.name, os.str());
    }
    if (p.schedule) {
      r.apply_override("schedule.plugin=\"" + p.name + "\"");
      for (const auto& [key, literal] : set) r.apply_override("schedule." + key + "=" + literal);
      continue;
    }
    for (const auto& [key, literal] : set) {
      const toml::table v = literal_table(literal);
      v.get("v")->visit([&](const auto& x) { t.insert_or_assign(key, x); });
    }
    r.add_strategy(p.name, t);
  }
  return r;
}

}  // namespace tightfit::host
