// The chat-template interpreter is bounded on hostile templates: a model
// folder from the internet is untrusted input. Deep nesting, runaway work,
// huge text, 64-bit edges and quadratic searches each end in a template error
// naming the file and the place (or render what Python renders), never a
// crash, a hang or an allocation that takes the machine down.
#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <nlohmann/json.hpp>
#include <string>

#include "chat_template.hpp"

namespace tightfit {
namespace {

using ojson = nlohmann::ordered_json;

std::string repeat(const std::string& s, int n) {
  std::string out;
  out.reserve(s.size() * static_cast<size_t>(n));
  for (int i = 0; i < n; ++i) out += s;
  return out;
}

std::string render(const std::string& source, const ojson& messages = ojson::array()) {
  return ChatTemplate(source, "hostile/tokenizer_config.json").render(messages, false).text;
}

// Parsing or rendering `source` fails with a message that names the file,
// says "chat template" and holds `phrase`; it takes well under a second.
void expect_refused(const std::string& source, const std::string& phrase,
                    const ojson& messages = ojson::array()) {
  const auto start = std::chrono::steady_clock::now();
  try {
    render(source, messages);
    ADD_FAILURE() << "rendered: " << source.substr(0, 120);
  } catch (const std::exception& e) {
    const std::string what = e.what();
    EXPECT_NE(what.find("hostile/tokenizer_config.json"), std::string::npos) << what;
    EXPECT_NE(what.find("chat template"), std::string::npos) << what;
    // `phrase` may list alternatives: "a|b".
    bool found = false;
    for (size_t at = 0; at <= phrase.size();) {
      const size_t bar = std::min(phrase.find('|', at), phrase.size());
      found = found || what.find(phrase.substr(at, bar - at)) != std::string::npos;
      at = bar + 1;
    }
    EXPECT_TRUE(found) << what << "\n(expected: " << phrase << ")";
  }
  const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  std::string shown = source.substr(0, 70);
  for (char& c : shown)
    if (c == '\n') c = ' ';
  std::printf("  refused in %.3f s: %s\n", s, shown.c_str());
}

TEST(TemplateBounds, ParsingIsBoundedInDepth) {
  expect_refused("{{ " + repeat("not ", 100000) + "x }}", "nested deeper than 200");
  expect_refused("{{ " + repeat("- ", 100000) + "1 }}", "nested deeper than 200");
  expect_refused("{{ 1" + repeat(" + 1", 100000) + " }}", "nested deeper than 200");
  expect_refused("{{ x" + repeat(".a", 100000) + " }}", "nested deeper than 200");
  expect_refused("{{ x" + repeat("|trim", 100000) + " }}", "nested deeper than 200");
  expect_refused("{{ x" + repeat("[0]", 100000) + " }}", "nested deeper than 200");
  expect_refused("{{ 'a'" + repeat(" if x else 'a'", 100000) + " }}", "nested deeper than 200");
  // Found by fuzz_chat_template: an empty subscript was read through a null node.
  expect_refused("{{ x[] }}", "an empty subscript []");
  EXPECT_EQ(render("{{ [1, 2, 3][:] }}"), "[1, 2, 3]");
  // A chain a real template writes still parses.
  EXPECT_EQ(render("{{ 1" + repeat(" + 1", 50) + " }}"), "51");
}

TEST(TemplateBounds, NestedValuesPrintAndDieWithoutRecursion) {
  const std::string build =
      "{% set ns = namespace(x=none) %}{% for i in range(200000) %}{% set ns.x = [ns.x] %}"
      "{% endfor %}";
  // Made and thrown away: destroyed without a 200,000-deep recursion.
  EXPECT_EQ(render(build + "ok"), "ok");
  expect_refused(build + "{{ ns.x }}", "nested deeper than 100 levels");
  expect_refused(build + "{{ ns.x | tojson }}", "nested deeper than 100 levels");
  expect_refused(build + "{{ ns.x == ns.x[0] }}", "nested deeper than 100 levels");
  // A namespace that holds itself.
  expect_refused("{% set ns = namespace() %}{% set ns.me = ns %}{{ ns }}",
                 "nested deeper than 100 levels");
  expect_refused("{% set ns = namespace() %}{% set ns.me = [ns] %}{{ ns | tojson }}",
                 "nested deeper than 100 levels");
  EXPECT_EQ(render("{% set ns = namespace() %}{% set ns.me = ns %}{{ ns == ns }}"), "True");
  // Messages nested deeper than a template could print.
  ojson deep = "x";
  for (int i = 0; i < 500; ++i) deep = ojson::array({deep});
  expect_refused("{{ messages[0].content }}", "nested deeper than",
                 ojson::array({{{"role", "user"}, {"content", deep}}}));
}

TEST(TemplateBounds, WorkIsBudgeted) {
  // A macro that calls itself twice per level: 2^60 calls.
  expect_refused(
      "{% macro f(n) %}{% if n > 0 %}{{ f(n - 1) }}{{ f(n - 1) }}{% endif %}{% endmacro %}"
      "{{ f(60) }}",
      "steps of work");
  // Loops within the iteration bound whose bodies are long.
  expect_refused("{% for i in range(1000000) %}{{ i" + repeat(" + i", 150) + " }}{% endfor %}",
                 "steps of work");
  // Lists that double.
  expect_refused(
      "{% set ns = namespace(l=[1]) %}{% for i in range(60) %}{% set ns.l = ns.l + ns.l %}"
      "{% endfor %}",
      "steps of work");
  // Scanning a big string again and again.
  expect_refused(
      "{% set big = 'x' * 50000000 %}{% for i in range(1000000) %}{{ big.find('y') }}"
      "{% endfor %}",
      "bytes of work");
  expect_refused(
      "{% set big = 'x' * 50000000 %}{% for i in range(1000000) %}{{ big == big ~ '' }}"
      "{% endfor %}",
      "bytes of work");
  // Loops nested past the iteration bound.
  expect_refused("{% for i in range(100000) %}{% for j in range(100000) %}{% endfor %}{% endfor %}",
                 "loop iterations");
  expect_refused("{% macro f(n) %}{{ f(n + 1) }}{% endmacro %}{{ f(0) }}", "too deep");
  // Looking a big string up is not copying it.
  EXPECT_EQ(render("{% set big = 'x' * 50000000 %}{% for i in range(200000) %}{% if big %}"
                   "{% endif %}{% endfor %}ok"),
            "ok");
}

TEST(TemplateBounds, TextIsBoundedBeforeItIsMade) {
  const std::string too_much = "more than 64 MiB";
  // Doubling: whichever bound it meets first, the text or the work.
  expect_refused(
      "{% set ns = namespace(s='x') %}{% for i in range(60) %}{% set ns.s = ns.s ~ ns.s %}"
      "{% endfor %}",
      too_much + "|bytes of work");
  expect_refused(
      "{% set ns = namespace(s='x') %}{% for i in range(60) %}{% set ns.s = ns.s + ns.s %}"
      "{% endfor %}",
      too_much + "|bytes of work");
  expect_refused("{{ 'x' * 100000000 }}", too_much);  // was cut to 64 MiB without a word
  expect_refused("{{ 'x' * 9223372036854775807 }}", too_much);
  // Found by fuzz_chat_template: repeating into nothing looped for ever.
  EXPECT_EQ(render("{{ ('abc' * 0) ~ ('' * 5) ~ ('ab' * -3) ~ ('ab' * 3) }}"), "ababab");
  expect_refused("{{ 'a\\nb' | indent(1000000000000) }}", too_much);
  expect_refused("{{ [[1]] | tojson(indent=1000000000000) }}", too_much);
  expect_refused("{{ ('a' * 10000000) | replace('a', 'a' * 1000) }}", too_much);
  expect_refused("{{ ['x' * 60000000, 'x' * 60000000] | join }}", too_much);
  expect_refused("{% set s = 'x' * 60000000 %}{{ [s, s, s] }}", too_much);
}

TEST(TemplateBounds, IntegersAreSixtyFourBitsWithPythonsAnswersOrAnError) {
  const std::string min = "(-9223372036854775807 - 1)";
  expect_refused("{{ " + min + " // -1 }}", "does not fit 64 bits");
  expect_refused("{{ 9223372036854775807 + 1 }}", "does not fit 64 bits");
  expect_refused("{{ 9223372036854775807 * 2 }}", "does not fit 64 bits");
  expect_refused("{{ -" + min + " }}", "does not fit 64 bits");
  expect_refused("{{ " + min + " | abs }}", "does not fit 64 bits");
  expect_refused("{{ 1e300 | int }}", "does not fit 64 bits");
  expect_refused("{{ 99999999999999999999 }}", "does not fit 64 bits");
  EXPECT_EQ(render("{{ " + min + " % -1 }}"), "0");
  EXPECT_EQ(render("{{ " + min + " is divisibleby(-1) }}"), "True");
  EXPECT_EQ(render("{{ -7 // 2 }} {{ -7 % 2 }} {{ 7 % -2 }}"), "-4 1 -1");
  EXPECT_EQ(render("{{ '12abc' | int }} {{ ' 42 ' | int }} {{ '3.9' | int }}"), "0 42 3");
  // Slices with steps past any length, from either end.
  EXPECT_EQ(render("{{ [1, 2, 3][2::9223372036854775807] }}"), "[3]");
  EXPECT_EQ(render("{{ 'abc'[::-9223372036854775807] }}"), "c");
  EXPECT_EQ(render("{{ [1, 2, 3][" + min + ":9223372036854775807] }}"), "[1, 2, 3]");
  EXPECT_EQ(render("{{ 'abcdef'[-1:" + min + ":-2] }}"), "fdb");
  expect_refused("{{ range(" + min + ", 9223372036854775807) | length }}", "range of more than");
}

// Python's str is code points: a template that indexes, slices, loops over,
// reverses or searches non-ASCII text gets Jinja's answer (Python's jinja2
// printed these), not pieces of UTF-8 bytes.
TEST(TemplateBounds, StringsAreCodePointsAsInPython) {
  EXPECT_EQ(
      render("{{ '日本語'[1] }}|{{ '日本語'[::-1] }}|{{ '日本語'[-1] }}|"
             "{% for c in 'é!' %}[{{ c }}]{% endfor %}|{{ 'aé'|list }}|{{ 'aé🙂'|reverse }}|"
             "{{ '日本語'.find('語') }}|{{ 'añb'[1:] }}|{{ 'añb'|length }}|"
             "{{ 'añb'[5] is defined }}"),
      "本|語本日|語|[é][!]|['a', 'é']|🙂éa|2|ñb|3|False");
}

// tojson takes transformers' arguments (ensure_ascii, indent, separators,
// sort_keys) and gives json.dumps' text for each (transformers printed these);
// an argument it does not take is an error, never ignored.
TEST(TemplateBounds, TojsonTakesTransformersArguments) {
  EXPECT_EQ(
      render("{{ {'b': 'é🙂', 'a': [1, 2]}|tojson(sort_keys=true) }}|"
             "{{ {'b': 'é', 'a': [1, 2]}|tojson(true) }}|{{ '🙂'|tojson(true) }}|"
             "{{ [1, {'k': 2}]|tojson(indent=2) }}|{{ [1, {'k': 2}]|tojson(indent='\\t') }}|"
             "{{ [1, {'k': 2}]|tojson(separators=(',', ':')) }}|{{ [1, 2]|tojson(indent=-1) }}|"
             "{{ 'x'|tojson(false, none, none, true) }}"),
      "{\"a\": [1, 2], \"b\": \"é🙂\"}|{\"b\": \"\\u00e9\", \"a\": [1, 2]}|"
      "\"\\ud83d\\ude42\"|[\n  1,\n  {\n    \"k\": 2\n  }\n]|[\n\t1,\n\t{\n\t\t\"k\": 2\n\t}\n]|"
      "[1,{\"k\":2}]|[\n1,\n2\n]|\"x\"");
  expect_refused("{{ 1|tojson(sortkeys=true) }}", "unexpected keyword argument 'sortkeys'");
  expect_refused("{{ [1]|tojson(separators=(',',)) }}", "separators must be two strings");
  expect_refused("{{ [1, 2, 3]|tojson(separators=('x' * 40000000, ':')) }}", "more than 64 MiB");
}

// A sign binds tighter than a filter or a test, as in Jinja: -3|abs is 3.
TEST(TemplateBounds, FiltersApplyToTheSignedValueAsInJinja) {
  EXPECT_EQ(render("{{ -3|abs }} {{ -{'y': -4}.y|abs }} {{ -2 is odd }} {{ - 3|string + 'a' }} "
                   "{{ not 0|abs }} {{ -[3, 1][0]|abs }}"),
            "3 4 False -3a True 3");
}

TEST(TemplateBounds, SearchingIsLinear) {
  // A needle that almost matches everywhere: quadratic with a naive search.
  const std::string hay = "{% set hay = 'a' * 8000000 %}{% set needle = 'a' * 2000000 ~ 'b' %}";
  EXPECT_EQ(render(hay + "{{ needle in hay }}"), "False");
  EXPECT_EQ(render(hay + "{{ hay.find(needle) }} {{ hay.count(needle) }}"), "-1 0");
  EXPECT_EQ(render(hay + "{{ hay.split(needle) | length }}"), "1");
  EXPECT_EQ(render(hay + "{{ (hay | replace(needle, 'x')) | length }}"), "8000000");
  EXPECT_EQ(render("{{ 'abcabcab'.count('cab') }} {{ 'a,b,,c'.split(',') }} {{ 'aaaa' | "
                   "replace('aa', 'b') }} {{ 'abab'.find('ba') }}"),
            "2 ['a', 'b', '', 'c'] bb 1");
}

TEST(TemplateBounds, LexingAndPlacesAreLinear) {
  // 200,000 tags, then an error on line 100,001: each place found without
  // rescanning the template from its start.
  EXPECT_EQ(render(repeat("{{ 1 }}", 200000)), std::string(200000, '1'));
  expect_refused(repeat("\n", 100000) + "{{ ) }}", "line 100001, column 4");
  expect_refused("{{ [" + repeat("1, ", 300000) + ") }}", "column 900005");
}

}  // namespace
}  // namespace tightfit
