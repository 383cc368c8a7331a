// Downstream tasks, the pure part (train/tasks.h): lm-evaluation-harness's rules on hand-made
// examples (acc against acc_norm, a continuation that merges with the context, truncation, rolling
// windows, HellaSwag's preprocessing, Python's whitespace and lengths), the task files' refusals,
// the batch plan of train/task_evaluator.h, the [eval] config section, and every request and
// metric of the fixtures against the independent PyTorch implementation
// (tests/fixtures/make_eval_golden.py).
#include <gtest/gtest.h>

#include <fmt/ranges.h>

#include <map>
#include <numeric>
#include <random>
#include <set>

#include "cli_util.h"
#include "data/nfc.h"
#include "data/text_case.h"
#include "data/tokenizer.h"
#include "input_error.h"
#include "train/task_evaluator.h"
#include "train/tasks.h"

namespace tripod {
namespace {

namespace fs = std::filesystem;
using nlohmann::json;
using test::expect_input_error;

const std::string kFixtures = std::string(TRIPOD_SOURCE_PATH) + "/tests/fixtures/eval";

// A greedy longest-match tokenizer over `vocab` (ids in order): small, exact cases of merging.
EncodeFn greedy(const std::vector<std::string>& vocab) {
  return [vocab](std::string_view s) {
    std::vector<int> ids;
    for (size_t i = 0; i < s.size();) {
      int best = -1;
      size_t len = 0;
      for (size_t v = 0; v < vocab.size(); ++v)
        if (vocab[v].size() > len && s.substr(i, vocab[v].size()) == vocab[v]) best = static_cast<int>(v), len = vocab[v].size();
      if (best < 0) throw std::runtime_error("greedy: no token for " + std::string(s.substr(i)));
      ids.push_back(best);
      i += len;
    }
    return ids;
  };
}

TEST(TaskRules, AccAndAccNormPickDifferentChoices) {
  // Per character the long choice is likelier; in total the short one is: the harness's acc and
  // acc_norm disagree, and only acc_norm finds label 1.
  const std::vector<double> lls = {-10.0, -12.0};
  const std::vector<std::string> choices = {"ab", "abcdefgh"};
  ChoiceScore s = score_choices(lls, choices, 1);
  EXPECT_EQ(s.pred, 0);
  EXPECT_EQ(s.pred_norm, 1);
  EXPECT_FALSE(s.acc);
  EXPECT_TRUE(s.acc_norm);
  // The length is Python's len: characters, not bytes ("ééééé" is 5 long, not 10).
  s = score_choices(std::vector<double>{-6.0, -11.0}, {"abc", "ééééé"}, 0);
  EXPECT_EQ(s.pred_norm, 0) << "-6/3 > -11/5; by bytes (-11/10) choice 1 would win";
  // Ties go to the first maximum, as np.argmax.
  s = score_choices(std::vector<double>{-3.0, -3.0, -8.0}, {"a", "b", "cc"}, 1);
  EXPECT_EQ(s.pred, 0);
  EXPECT_EQ(s.pred_norm, 0);
  // Standard error of the mean: sample standard deviation / sqrt(n).
  const std::vector<double> acc = {1, 0, 1, 1};
  const MeanStderr m = mean_stderr(acc);
  EXPECT_DOUBLE_EQ(m.mean, 0.75);
  ASSERT_TRUE(m.stderr_of_mean);
  EXPECT_DOUBLE_EQ(*m.stderr_of_mean, 0.25);
  EXPECT_FALSE(mean_stderr(std::vector<double>{1.0}).stderr_of_mean);
}

TEST(TaskRules, ContinuationMergingWithTheContextKeepsTheContextsTokens) {
  // "ab" alone is one token; "abcd" is [abc, d]: the join merges the continuation's "c" into the
  // context. The harness keeps the context's own count of tokens (1) and scores the rest of the
  // join ([d]), so the row is [ab, d].
  const EncodeFn enc = greedy({"a", "b", "c", "d", "ab", "bc", "abc", " "});
  const int ab = 4, abc = 6, d = 3, eot = 99;
  EncodedPair p = encode_pair(enc, "ab", "cd", eot);
  EXPECT_EQ(p.context, (std::vector<int>{ab}));
  EXPECT_EQ(p.continuation, (std::vector<int>{d}));
  EXPECT_EQ(enc("abcd"), (std::vector<int>{abc, d}));
  ScoreRequest r = loglikelihood_request(p, 8);
  EXPECT_EQ(r.tokens, (std::vector<int32_t>{ab, d}));
  EXPECT_EQ(r.scored, 1);
  // Whitespace ending the context moves to the continuation: the context is encoded without it.
  p = encode_pair(enc, "ab ", "cd", eot);
  EXPECT_EQ(p.context, (std::vector<int>{ab}));
  EXPECT_EQ(p.continuation, enc(" cd"));
  // An empty context (or one of whitespace only, which would have no tokens) is end-of-text.
  p = encode_pair(enc, "", "ab", eot);
  EXPECT_EQ(p.context, (std::vector<int>{eot}));
  EXPECT_EQ(p.continuation, (std::vector<int>{ab}));
  p = encode_pair(enc, "  ", "ab", eot);
  EXPECT_EQ(p.context, (std::vector<int>{eot}));
  EXPECT_EQ(p.continuation, enc("  ab"));
}

TEST(TaskRules, LongRowsLoseTheStartOfTheirContext) {
  EncodedPair p;
  for (int i = 0; i < 10; ++i) p.context.push_back(i);
  p.continuation = {100, 101, 102};
  // (context + continuation)[-(L+1):]: 9 tokens, 8 inputs, the last 3 predictions scored.
  ScoreRequest r = loglikelihood_request(p, 8);
  EXPECT_EQ(r.tokens, (std::vector<int32_t>{4, 5, 6, 7, 8, 9, 100, 101, 102}));
  EXPECT_EQ(r.length(), 8);
  EXPECT_EQ(r.scored, 3);
  r = loglikelihood_request(p, 20);  // fits: nothing cut
  EXPECT_EQ(r.tokens.size(), 13u);
}

TEST(TaskRules, RollingWindowsScoreEveryTokenOnceWithTheMostContextThatFits) {
  EXPECT_TRUE(rolling_requests({}, 7, 4).empty());
  // 5 tokens, windows of 4: [P t0 t1 t2 t3] predicts t0..t3; [t0 .. t4] predicts t4 from 4 tokens.
  std::vector<ScoreRequest> w = rolling_requests({10, 11, 12, 13, 14}, 7, 4);
  ASSERT_EQ(w.size(), 2u);
  EXPECT_EQ(w[0].tokens, (std::vector<int32_t>{7, 10, 11, 12, 13}));
  EXPECT_EQ(w[0].scored, 4);
  EXPECT_EQ(w[1].tokens, (std::vector<int32_t>{10, 11, 12, 13, 14}));
  EXPECT_EQ(w[1].scored, 1);
  std::mt19937 rng(5);
  for (int trial = 0; trial < 200; ++trial) {
    const int n = static_cast<int>(rng() % 40), L = 1 + static_cast<int>(rng() % 9);
    std::vector<int> t(n);
    for (int i = 0; i < n; ++i) t[i] = 1000 + i;
    const std::vector<ScoreRequest> all = rolling_requests(t, 7, L);
    std::vector<int32_t> predicted;
    for (size_t i = 0; i < all.size(); ++i) {
      ASSERT_LE(all[i].length(), L);
      ASSERT_GE(all[i].scored, 1);
      if (i > 0) {
        EXPECT_EQ(all[i].length(), L) << "a later window sees L tokens";
      }
      predicted.insert(predicted.end(), all[i].tokens.end() - all[i].scored, all[i].tokens.end());
    }
    ASSERT_EQ(predicted, std::vector<int32_t>(t.begin(), t.end())) << "n " << n << " L " << L;
    if (n > 0) {
      EXPECT_EQ(all[0].tokens[0], 7) << "the first window starts from the prefix token";
    }
  }
}

TEST(TaskRules, HellaSwagPreprocessingAsTheHarness) {
  EXPECT_EQ(hellaswag_preprocess("  How to cook [title] Boil water. [step] Add salt.  "),
            "How to cook. Boil water. Add salt.");
  // "[...]" spans end at the first ']' on the same line; a '[' without one stays.
  EXPECT_EQ(hellaswag_preprocess("a [b [c] d] e [f\n g] h [i"), "a d] e [f\n g] h [i");
  // "  " -> " " once, left to right: three spaces become two.
  EXPECT_EQ(hellaswag_preprocess("a   b  c"), "a  b c");
  EXPECT_EQ(hellaswag_preprocess("\t\u00a0text\u3000"), "text") << "Python's strip removes Unicode whitespace";
  // ctx_b is capitalized as Python does: the rest lower-cased.
  EXPECT_EQ(hellaswag_query("Making tea", "A kettle boils.", "a girl Pours the WATER"),
            "Making tea: A kettle boils. A girl pours the water");
  EXPECT_EQ(hellaswag_query("Guitar", "A woman sits.", ""), "Guitar: A woman sits.");
  EXPECT_EQ(python_capitalize(""), "");
  EXPECT_EQ(python_capitalize("hELLO wORLD"), "Hello world");
  if (nfc_available()) {  // ICU: Unicode's case mappings
    EXPECT_EQ(python_capitalize("élan VITAL"), "Élan vital");
    EXPECT_EQ(python_capitalize("ǆemal"), "ǅemal") << "the first letter in title case, not upper case";
  }
}

TEST(TaskRules, PythonWhitespaceWordsAndLengths) {
  EXPECT_EQ(count_words(""), 1) << "len(re.split(r'\\s+', '')) is 1";
  EXPECT_EQ(count_words("a b"), 2);
  EXPECT_EQ(count_words(" a"), 2);
  EXPECT_EQ(count_words("a  \t b\n"), 3);
  EXPECT_EQ(count_words("a\u00a0b"), 2) << "no-break space is whitespace to Python";
  EXPECT_EQ(count_words("a\u200bb"), 1) << "zero-width space is not";
  EXPECT_EQ(count_chars("héllo"), 5);
  EXPECT_EQ(count_chars("日本"), 2);
  EXPECT_TRUE(is_python_space(0x1F));
  EXPECT_FALSE(is_python_space('x'));
}

// ---- task files --------------------------------------------------------------------------------

class TaskFiles : public ::testing::Test {
 protected:
  void SetUp() override { dir_ = test::scratch_dir("task_files"); }
  void TearDown() override { fs::remove_all(dir_); }
  std::string file(const std::string& name, const std::string& text) {
    test::write_file(dir_ / name, text);
    return (dir_ / name).string();
  }
  fs::path dir_;
};

const std::string kGood = R"({"context": "Q?", "choices": ["yes", "no"], "label": 1})";

TEST_F(TaskFiles, ReadsBothFormatsSkippingBlankLinesWithTheirLineNumbers) {
  const std::string hs = R"({"activity_label": "Tea", "ctx_a": "A kettle boils.", "ctx_b": "she", "label": "1",)"
                         R"( "endings": ["sits.", "pours [step] it.", "runs.", "sleeps."]})";
  std::vector<ChoiceExample> e = read_choice_examples(file("h.jsonl", "\n" + hs + "\n  \n" + hs + "\n"),
                                                      TaskKind::HellaSwag, 0);
  ASSERT_EQ(e.size(), 2u);
  EXPECT_EQ(e[0].line, 2);
  EXPECT_EQ(e[1].line, 4);
  EXPECT_EQ(e[0].context, "Tea: A kettle boils. She");
  EXPECT_EQ(e[0].choices[1], "pours it.");
  EXPECT_EQ(e[0].label, 1) << "a label written as a string of digits (Hugging Face's HellaSwag)";
  e = read_choice_examples(file("c.jsonl", kGood + "\n" + kGood + "\n" + kGood), TaskKind::MultipleChoice, 2);
  EXPECT_EQ(e.size(), 2u) << "--limit";
  std::vector<TextDocument> d = read_text_documents(file("t.txt", "one doc\n\nanother doc\n"), 0);
  ASSERT_EQ(d.size(), 2u);
  EXPECT_EQ(d[1].text, "another doc");
  EXPECT_EQ(d[1].line, 3);
  d = read_text_documents(file("t.jsonl", R"({"text": "a\nb"})" "\n" R"({"text": ""})" "\n"), 0);
  ASSERT_EQ(d.size(), 1u);
  EXPECT_EQ(d[0].text, "a\nb");
}

TEST_F(TaskFiles, RefusesBadLinesNamingFileLineAndField) {
  const auto mc = [&](const std::string& name, const std::string& text) {
    return [this, name, text] { read_choice_examples(file(name, text), TaskKind::MultipleChoice, 0); };
  };
  expect_input_error(mc("notjson.jsonl", kGood + "\nthis is not json\n"), {"notjson.jsonl:2", "not a JSON line"});
  expect_input_error(mc("array.jsonl", "[1, 2]\n"), {"array.jsonl:1", "JSON object"});
  expect_input_error(mc("overflow.jsonl", R"({"context": 1e999, "choices": ["a", "b"], "label": 0})"),
                     {"overflow.jsonl:1", "not a JSON line"});  // (a fuzzing finding: nlohmann's out_of_range)
  expect_input_error(mc("range.jsonl", R"({"context": "Q", "choices": ["a", "b"], "label": 2})"),
                     {"range.jsonl:1", "'label' = 2 is out of range", "valid: 0..1"});
  expect_input_error(mc("neg.jsonl", R"({"context": "Q", "choices": ["a", "b"], "label": -1})"), {"'label' = -1"});
  expect_input_error(mc("floatlabel.jsonl", R"({"context": "Q", "choices": ["a", "b"], "label": 0.5})"),
                     {"'label' must be an integer"});
  expect_input_error(mc("missing.jsonl", R"({"context": "Q", "label": 0})"), {"missing.jsonl:1", "'choices' is missing"});
  expect_input_error(mc("type.jsonl", R"({"context": 3, "choices": ["a", "b"], "label": 0})"),
                     {"'context' must be a string"});
  expect_input_error(mc("empty.jsonl", R"({"context": "Q", "choices": ["a", ""], "label": 0})"),
                     {"empty.jsonl:1", "'choices[1]' is empty"});
  expect_input_error(mc("one.jsonl", R"({"context": "Q", "choices": ["a"], "label": 0})"), {"at least 2"});
  expect_input_error(mc("nothing.jsonl", "\n\n"), {"nothing.jsonl", "no example"});
  expect_input_error([&] { read_choice_examples((dir_ / "absent.jsonl").string(), TaskKind::MultipleChoice, 0); },
                     {"absent.jsonl", "cannot be read"});
  // HellaSwag: its own fields, and an ending that preprocessing empties.
  expect_input_error([&] {
    read_choice_examples(file("h.jsonl", R"({"activity_label": "a", "ctx_a": "b", "label": 0, "endings": ["x", "y"]})"),
                         TaskKind::HellaSwag, 0);
  }, {"h.jsonl:1", "'ctx_b' is missing"});
  expect_input_error([&] {
    read_choice_examples(file("h2.jsonl", R"({"activity_label": "a", "ctx_a": "b", "ctx_b": "c", "label": 0,)"
                                          R"( "endings": ["x", "[title]"]})"), TaskKind::HellaSwag, 0);
  }, {"h2.jsonl:1", "'endings[1]' is empty after HellaSwag's preprocessing"});
  expect_input_error([&] { read_text_documents(file("bad.txt", "ok\n\xff\xfe\n"), 0); }, {"bad.txt:2", "UTF-8"});
  expect_input_error([&] { read_text_documents(file("bad.jsonl", R"({"txt": "a"})"), 0); },
                     {"bad.jsonl:1", "'text' is missing"});
}

TEST_F(TaskFiles, LoadTaskChecksTokensAgainstTheModel) {
  const EncodeFn enc = greedy({"a", "b", "c", " ", "ab"});
  const std::string path = file("c.jsonl", R"({"context": "ab", "choices": ["c", "cccccccc"], "label": 0})");
  EvalTaskConfig cfg{.name = TaskKind::MultipleChoice, .path = path, .limit = 0, .tag = ""};
  Task t = load_task(cfg, enc, 4, 10, 5, "--task-file");
  ASSERT_EQ(t.requests.size(), 2u);
  EXPECT_EQ(t.requests[1].example, 0);
  EXPECT_EQ(t.requests[1].part, 1);
  expect_input_error([&] { load_task(cfg, enc, 4, 6, 5, "--task-file"); },
                     {"c.jsonl:1", "choice 1 is 9 tokens", "model.seq_len = 6"});
  expect_input_error([&] { load_task(cfg, enc, 4, 10, 4, "--task-file"); }, {"c.jsonl:1", "token id 4",
                                                                             "model.vocab_size = 4"});
  expect_input_error([&] { load_task(cfg, enc, -1, 10, 5, "--task-file"); }, {"--task-file", "end-of-text"});
  cfg.path = (dir_ / "none.jsonl").string();
  expect_input_error([&] { load_task(cfg, enc, 4, 10, 5, "eval.tasks[0].path"); }, {"eval.tasks[0].path", "none.jsonl"});
}

// ---- the batch plan ----------------------------------------------------------------------------

TEST(TaskBatches, EveryRequestOnceInBatchesThatFitTheirGranules) {
  std::mt19937 rng(11);
  std::vector<ScoreRequest> reqs;
  for (int e = 0; e < 40; ++e) {
    const int choices = 1 + static_cast<int>(rng() % 5);
    for (int c = 0; c < choices; ++c) {
      ScoreRequest r;
      r.tokens.assign(2 + rng() % 48, 1);
      r.scored = 1;
      r.example = e;
      r.part = c;
      reqs.push_back(r);
    }
  }
  for (const BatchPlanOptions& o : {BatchPlanOptions{.max_tokens = 192, .seq_len = 48},
                                    BatchPlanOptions{.max_tokens = 96, .seq_len = 48, .granule = 4, .split = 3},
                                    BatchPlanOptions{.max_tokens = 48, .seq_len = 48, .granule = 8},
                                    BatchPlanOptions{.max_tokens = 192, .seq_len = 48, .batch = false}}) {
    SCOPED_TRACE(fmt::format("max_tokens {} granule {} split {} batch {}", o.max_tokens, o.granule, o.split, o.batch));
    const std::vector<ScoreBatch> plan = plan_score_batches(reqs, o);
    std::vector<int> seen(reqs.size(), 0);
    int64_t last_T = o.seq_len;
    for (const ScoreBatch& b : plan) {
      ASSERT_FALSE(b.rows.empty());
      EXPECT_EQ(b.T % o.granule, 0);
      EXPECT_LE(b.T, o.seq_len);
      EXPECT_LE(b.T, last_T) << "longest first";
      last_T = b.T;
      EXPECT_EQ((b.B * b.T) % o.split, 0);
      EXPECT_GE(b.B, static_cast<int64_t>(b.rows.size()));
      EXPECT_LE(static_cast<int64_t>(b.rows.size()) * b.T, std::max(o.max_tokens, b.T));
      if (!o.batch) {
        EXPECT_EQ(b.rows.size(), 1u);
      }
      for (int64_t r : b.rows) {
        ++seen[r];
        EXPECT_LE(reqs[r].length(), b.T);
      }
    }
    for (int s : seen) EXPECT_EQ(s, 1);
    // An example's choices share a micro-batch whenever they fit in one.
    if (o.batch) {
      std::map<int64_t, std::set<size_t>> where;
      std::map<int64_t, int64_t> rows, longest;
      for (size_t i = 0; i < plan.size(); ++i)
        for (int64_t r : plan[i].rows) where[reqs[r].example].insert(i);
      for (const ScoreRequest& r : reqs) {
        ++rows[r.example];
        longest[r.example] = std::max(longest[r.example], r.length());
      }
      for (const auto& [e, batches] : where) {
        const int64_t q = std::lcm<int64_t>(o.granule, 8), T = (longest[e] + q - 1) / q * q;
        if (rows[e] * T <= o.max_tokens && T <= o.seq_len) {
          EXPECT_EQ(batches.size(), 1u) << "example " << e;
        }
      }
    }
  }
}

// ---- the [eval] section ------------------------------------------------------------------------

TEST(EvalConfig, TasksParseValidateAndRoundTrip) {
  const std::string base = "[model]\nn_layers = 2\nn_heads = 2\nd_model = 16\nseq_len = 8\nvocab_size = 64\n"
                           "[train]\nsteps = 1\n[data]\nsynthetic = true\n";
  Config c = parse_config(base + "[eval]\ntasks = [{name = \"hellaswag\", path = \"h.jsonl\", limit = 100},\n"
                                 "  {name = \"multiple_choice\", path = \"arc.jsonl\", tag = \"arc_easy\"}]\n", "t.toml");
  ASSERT_EQ(c.eval.tasks.size(), 2u);
  EXPECT_EQ(c.eval.tasks[0].name, TaskKind::HellaSwag);
  EXPECT_EQ(c.eval.tasks[0].limit, 100);
  EXPECT_EQ(c.eval.tasks[0].label(), "hellaswag");
  EXPECT_EQ(c.eval.tasks[1].label(), "arc_easy");
  const Config back = parse_config(config_to_toml(c), "resolved");
  ASSERT_EQ(back.eval.tasks.size(), 2u);
  EXPECT_EQ(back.eval.tasks[1].path, "arc.jsonl");
  EXPECT_EQ(back.eval.tasks[1].tag, "arc_easy");
  EXPECT_EQ(config_to_toml(parse_config(base, "t.toml")).find("[eval]"), std::string::npos)
      << "no [eval] section unless it holds tasks";
  const auto bad = [&](const std::string& tasks) { return [&, tasks] { parse_config(base + "[eval]\ntasks = " + tasks, "t.toml"); }; };
  expect_input_error(bad("[{name = \"hellaswg\", path = \"h\"}]"), {"eval.tasks[0].name", "hellaswg", "hellaswag"});
  expect_input_error(bad("[{name = \"hellaswag\"}]"), {"eval.tasks[0]", "no path"});
  expect_input_error(bad("[{path = \"h\"}]"), {"eval.tasks[0]", "no name"});
  expect_input_error(bad("[{name = \"hellaswag\", path = \"h\", lmit = 3}]"), {"unknown key eval.tasks[0].lmit"});
  expect_input_error(bad("[{name = \"hellaswag\", path = \"h\", limit = -3}]"), {"eval.tasks[0].limit"});
  expect_input_error(bad("[{name = \"hellaswag\", path = \"a\"}, {name = \"hellaswag\", path = \"b\"}]"),
                     {"eval.tasks[1].tag", "another task"});
  expect_input_error(bad("[{name = \"hellaswag\", path = \"a\", tag = \"my task\"}]"), {"eval.tasks[0].tag"});
  expect_input_error(bad("\"h.jsonl\""), {"eval.tasks", "list of tables"});
}

// ---- the fixtures against the PyTorch reference ------------------------------------------------

// Every request the reference built (tokens and scored count) is the one load_task builds with
// tripod's tokenizer, and the metrics of the reference's log-likelihoods are the reference's.
TEST(TaskGolden, RequestsAndMetricsMatchTheReference) {
  const json g = json::parse(test::slurp(kFixtures + "/golden.json"));
  const Tokenizer tok(kFixtures + "/gpt2_bpe");
  ASSERT_EQ(tok.eod_id(), g["eot"].get<int>());
  const EncodeFn enc = [&](std::string_view s) {
    std::vector<int> ids;
    tok.encode(s, ids);
    return ids;
  };
  const std::map<std::string, std::string> files = {
      {"hellaswag", "hellaswag.jsonl"}, {"multiple_choice", "choices.jsonl"}, {"bits_per_byte", "text.jsonl"}};
  for (const auto& [name, file] : files) {
    SCOPED_TRACE(name);
    const EvalTaskConfig cfg{.name = *parse_enum<TaskKind>(name), .path = kFixtures + "/" + file, .limit = 0, .tag = ""};
    const Task task = load_task(cfg, enc, tok.eod_id(), g["seq_len"].get<int64_t>(), g["vocab_size"].get<int>(), "test");
    std::vector<json> want;
    for (const json& ex : g["tasks"][name])
      for (const json& r : ex["requests"]) want.push_back(r);
    ASSERT_EQ(task.requests.size(), want.size());
    for (size_t i = 0; i < want.size(); ++i) {
      EXPECT_EQ(task.requests[i].tokens, want[i]["tokens"].get<std::vector<int32_t>>()) << "request " << i;
      EXPECT_EQ(task.requests[i].scored, want[i]["scored"].get<int32_t>()) << "request " << i;
    }
    if (name != "bits_per_byte")
      for (size_t e = 0; e < task.examples.size(); ++e) {
        EXPECT_EQ(task.examples[e].context, g["tasks"][name][e]["context"].get<std::string>());
        EXPECT_EQ(task.examples[e].choices, g["tasks"][name][e]["choices"].get<std::vector<std::string>>());
      }
    for (const char* model : {"gpt2", "llama"}) {
      const json& want_scores = g["models"][model][name];
      // The reference's log-likelihoods per request (per document: its windows' sum in the first).
      std::vector<double> lls;
      if (name == "bits_per_byte") {
        lls.assign(task.requests.size(), 0.0);
        for (size_t i = 0, d = 0; i < task.requests.size(); ++i)
          if (task.requests[i].part == 0) lls[i] = want_scores["loglikelihoods"][d++].get<double>();
      } else {
        for (const json& ex : want_scores["loglikelihoods"])
          for (const json& ll : ex) lls.push_back(ll.get<double>());
      }
      const TaskResult r = task_result(task, lls);
      for (const TaskMetric& m : r.metrics) {
        EXPECT_NEAR(m.value, want_scores[m.name].get<double>(), 1e-12 * std::abs(m.value)) << model << " " << m.name;
        if (want_scores.contains(m.name + "_stderr")) {
          ASSERT_TRUE(m.stderr_of_mean);
          EXPECT_NEAR(*m.stderr_of_mean, want_scores[m.name + "_stderr"].get<double>(), 1e-12);
        }
      }
    }
  }
}

}  // namespace
}  // namespace tripod
