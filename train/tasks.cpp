// Task files, the harness's request rules and the task metrics.
#include "train/tasks.h"

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <sstream>

#include "core/error.h"
#include "data/documents.h"
#include "data/text_case.h"

namespace tripod {

namespace {

// The code point at s[i] and its length in bytes (the readers pass valid UTF-8; a sequence cut
// short counts as one byte).
char32_t decode_utf8(std::string_view s, size_t i, size_t& len) {
  const auto b = [&](size_t k) { return static_cast<char32_t>(static_cast<unsigned char>(s[i + k])); };
  const char32_t c = b(0);
  len = c < 0x80 ? 1 : c < 0xE0 ? 2 : c < 0xF0 ? 3 : 4;
  if (len == 1 || i + len > s.size()) return len = 1, c;
  if (len == 2) return ((c & 0x1F) << 6) | (b(1) & 0x3F);
  if (len == 3) return ((c & 0x0F) << 12) | ((b(1) & 0x3F) << 6) | (b(2) & 0x3F);
  return ((c & 0x07) << 18) | ((b(1) & 0x3F) << 12) | ((b(2) & 0x3F) << 6) | (b(3) & 0x3F);
}

// Python's str.strip(): is_python_space characters off both ends.
std::string_view strip(std::string_view s) {
  size_t begin = 0, end = s.size();
  while (begin < end) {
    size_t len = 1;
    if (!is_python_space(decode_utf8(s, begin, len))) break;
    begin += len;
  }
  while (end > begin) {
    size_t start = end - 1;
    while (start > begin && (static_cast<unsigned char>(s[start]) & 0xC0) == 0x80) --start;
    size_t len = 1;
    if (!is_python_space(decode_utf8(s, start, len))) break;
    end = start;
  }
  return s.substr(begin, end - begin);
}

// The bytes of is_python_space characters ending `s` (what str.rstrip() removes).
size_t trailing_space(std::string_view s) {
  size_t end = s.size();
  while (end > 0) {
    size_t start = end - 1;
    while (start > 0 && (static_cast<unsigned char>(s[start]) & 0xC0) == 0x80) --start;
    size_t len = 1;
    if (!is_python_space(decode_utf8(s, start, len))) break;
    end = start;
  }
  return s.size() - end;
}

// str.replace(from, to): every non-overlapping occurrence, left to right.
std::string replace_all(std::string_view s, std::string_view from, std::string_view to) {
  std::string out;
  size_t at = 0;
  while (true) {
    const size_t hit = s.find(from, at);
    if (hit == std::string_view::npos) break;
    out.append(s.substr(at, hit - at)).append(to);
    at = hit + from.size();
  }
  out.append(s.substr(at));
  return out;
}

// re.sub(r"\[.*?\]", "", s): each '[' with a ']' after it on the same line ('.' is not '\n')
// starts a span that ends at the first such ']'.
std::string remove_brackets(std::string_view s) {
  std::string out;
  size_t i = 0;
  while (i < s.size()) {
    if (s[i] == '[') {
      size_t j = i + 1;
      while (j < s.size() && s[j] != ']' && s[j] != '\n') ++j;
      if (j < s.size() && s[j] == ']') {
        i = j + 1;
        continue;
      }
    }
    out += s[i++];
  }
  return out;
}

std::vector<int32_t> as_i32(const std::vector<int>& v) { return std::vector<int32_t>(v.begin(), v.end()); }

// One JSON line of a task file, read field by field with errors that name FILE:LINE and the field.
class JsonLine {
 public:
  JsonLine(const std::string& path, int64_t line, std::string_view text) : where_(fmt::format("{}:{}", path, line)) {
    try {
      j_ = nlohmann::json::parse(text);
    } catch (const nlohmann::json::parse_error& e) {
      throw InputError(fmt::format("{}: not a JSON line (invalid JSON at byte {}); a task file is JSONL, one JSON "
                                   "object per line", where_, e.byte));
    } catch (const nlohmann::json::exception&) {  // a number beyond a double's range
      throw InputError(fmt::format("{}: not a JSON line (a number out of range); a task file is JSONL, one JSON "
                                   "object per line", where_));
    }
    TRIPOD_INPUT_CHECK(j_.is_object(), "{}: a task line must be a JSON object, got {}", where_, j_.type_name());
  }
  const nlohmann::json& field(const char* name, const char* what) const {
    auto it = j_.find(name);
    TRIPOD_INPUT_CHECK(it != j_.end(), "{}: field '{}' is missing ({})", where_, name, what);
    return *it;
  }
  std::string string(const char* name, const char* what) const {
    const nlohmann::json& v = field(name, what);
    TRIPOD_INPUT_CHECK(v.is_string(), "{}: field '{}' must be a string, got {}", where_, name, v.type_name());
    return v.get<std::string>();
  }
  std::vector<std::string> strings(const char* name, const char* what) const {
    const nlohmann::json& v = field(name, what);
    TRIPOD_INPUT_CHECK(v.is_array(), "{}: field '{}' must be a list of strings, got {}", where_, name, v.type_name());
    std::vector<std::string> out;
    for (size_t i = 0; i < v.size(); ++i) {
      TRIPOD_INPUT_CHECK(v[i].is_string(), "{}: field '{}[{}]' must be a string, got {}", where_, name, i,
                         v[i].type_name());
      out.push_back(v[i].get<std::string>());
    }
    TRIPOD_INPUT_CHECK(out.size() >= 2, "{}: field '{}' holds {} choice(s); a multiple-choice example needs at least 2",
                       where_, name, out.size());
    return out;
  }
  // An integer label (or one written as a string of digits, as Hugging Face's HellaSwag has it)
  // in [0, choices).
  int label(size_t choices, const char* of) const {
    const nlohmann::json& v = field("label", "the index of the right choice");
    int64_t label = -1;
    if (v.is_number_integer()) {
      label = v.get<int64_t>();
    } else if (v.is_string() && !v.get<std::string>().empty() && v.get<std::string>().size() < 10 &&
               std::all_of(v.get_ref<const std::string&>().begin(), v.get_ref<const std::string&>().end(),
                           [](char c) { return c >= '0' && c <= '9'; })) {
      label = std::stoll(v.get<std::string>());
    } else {
      throw InputError(fmt::format("{}: field 'label' must be an integer (the index of the right choice), got {}",
                                   where_, v.dump()));
    }
    TRIPOD_INPUT_CHECK(label >= 0 && label < static_cast<int64_t>(choices),
                       "{}: field 'label' = {} is out of range: the example has {} {} (valid: 0..{})", where_, label,
                       choices, of, choices - 1);
    return static_cast<int>(label);
  }
  const std::string& where() const { return where_; }

 private:
  std::string where_;
  nlohmann::json j_;
};

// Calls fn(line number, line) for every line of `text` that is not blank (whitespace only), until
// fn returns false.
template <class Fn> void for_each_task_line(std::string_view text, Fn&& fn) {
  int64_t n = 0;
  while (!text.empty()) {
    const size_t nl = text.find('\n');
    std::string_view line = text.substr(0, nl);
    text.remove_prefix(nl == std::string_view::npos ? text.size() : nl + 1);
    ++n;
    if (!line.empty() && line.back() == '\r') line.remove_suffix(1);
    if (std::all_of(line.begin(), line.end(), [](char c) { return c == ' ' || c == '\t' || c == '\f' || c == '\v'; }))
      continue;
    if (!fn(n, line)) break;
  }
}

std::string read_task_file(const std::string& path) {
  std::error_code ec;
  TRIPOD_INPUT_CHECK(!std::filesystem::is_directory(path, ec), "task file {} is a folder; give the task's file", path);
  std::ifstream in(path, std::ios::binary);
  TRIPOD_INPUT_CHECK(in, "task file {} cannot be read (missing or not readable)", path);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

}  // namespace

bool is_python_space(char32_t c) {
  return (c >= 0x09 && c <= 0x0D) || (c >= 0x1C && c <= 0x20) || c == 0x85 || c == 0xA0 || c == 0x1680 ||
         (c >= 0x2000 && c <= 0x200A) || c == 0x2028 || c == 0x2029 || c == 0x202F || c == 0x205F || c == 0x3000;
}

int64_t count_chars(std::string_view s) {
  int64_t n = 0;
  for (char c : s) n += (static_cast<unsigned char>(c) & 0xC0) != 0x80;
  return n;
}

int64_t count_words(std::string_view s) {
  int64_t pieces = 1;
  bool in_space = false;
  for (size_t i = 0; i < s.size();) {
    size_t len = 1;
    const bool space = is_python_space(decode_utf8(s, i, len));
    if (space && !in_space) ++pieces;  // each run of whitespace splits once
    in_space = space;
    i += len;
  }
  return pieces;
}

std::string hellaswag_preprocess(std::string_view text) {
  std::string s(strip(text));
  s = replace_all(s, " [title]", ". ");
  s = remove_brackets(s);
  return replace_all(s, "  ", " ");
}

std::string hellaswag_query(std::string_view activity_label, std::string_view ctx_a, std::string_view ctx_b) {
  return hellaswag_preprocess(std::string(activity_label) + ": " + std::string(ctx_a) + " " + python_capitalize(ctx_b));
}

std::vector<ChoiceExample> read_choice_examples(const std::string& path, TaskKind kind, int64_t limit) {
  return parse_choice_examples(read_task_file(path), path, kind, limit);
}

std::vector<ChoiceExample> parse_choice_examples(std::string_view content, const std::string& path, TaskKind kind,
                                                 int64_t limit) {
  TRIPOD_CHECK(kind != TaskKind::BitsPerByte, "parse_choice_examples of a text task");
  std::vector<ChoiceExample> out;
  const bool hellaswag = kind == TaskKind::HellaSwag;
  for_each_task_line(content, [&](int64_t n, std::string_view text) {
    const JsonLine j(path, n, text);
    ChoiceExample e;
    e.line = n;
    const char* list = hellaswag ? "endings" : "choices";
    if (hellaswag) {
      const char* has = "a HellaSwag line has activity_label, ctx_a, ctx_b, endings and label";
      const std::string activity = j.string("activity_label", has), ctx_a = j.string("ctx_a", has),
                        ctx_b = j.string("ctx_b", has);  // (in this order: the first missing field is named)
      e.context = hellaswag_query(activity, ctx_a, ctx_b);
      for (const std::string& ending : j.strings("endings", has)) e.choices.push_back(hellaswag_preprocess(ending));
    } else {
      const char* has = "a multiple_choice line has context, choices and label";
      e.context = j.string("context", has);
      e.choices = j.strings("choices", has);
    }
    for (size_t i = 0; i < e.choices.size(); ++i)
      TRIPOD_INPUT_CHECK(!e.choices[i].empty(), "{}: field '{}[{}]' is empty{}: a choice needs text (acc_norm divides "
                         "by its length)", j.where(), list, i, hellaswag ? " after HellaSwag's preprocessing" : "");
    e.label = j.label(e.choices.size(), hellaswag ? "endings" : "choices");
    out.push_back(std::move(e));
    return limit <= 0 || static_cast<int64_t>(out.size()) < limit;
  });
  TRIPOD_INPUT_CHECK(!out.empty(), "task file {} holds no example (one JSON object per line)", path);
  return out;
}

std::vector<TextDocument> read_text_documents(const std::string& path, int64_t limit) {
  return parse_text_documents(read_task_file(path), path, resolve_input_format(InputFormat::Auto, path) ==
                                                              InputFormat::Jsonl, limit);
}

std::vector<TextDocument> parse_text_documents(std::string_view content, const std::string& path, bool jsonl,
                                               int64_t limit) {
  std::vector<TextDocument> out;
  for_each_task_line(content, [&](int64_t n, std::string_view text) {
    TextDocument d;
    d.line = n;
    if (jsonl) {
      d.text = JsonLine(path, n, text).string("text", "a JSONL document is {\"text\": ...}");
    } else {
      const size_t bad = find_invalid_utf8(text);
      TRIPOD_INPUT_CHECK(bad == std::string_view::npos, "{}:{}: invalid UTF-8 at byte {}; the text must be UTF-8",
                         path, n, bad + 1);
      d.text = text;
    }
    if (d.text.empty()) return true;  // nothing to score
    out.push_back(std::move(d));
    return limit <= 0 || static_cast<int64_t>(out.size()) < limit;
  });
  TRIPOD_INPUT_CHECK(!out.empty(), "task file {} holds no document (text: one per line; JSONL: {{\"text\": ...}})",
                     path);
  return out;
}

EncodedPair encode_pair(const EncodeFn& encode, std::string_view context, std::string_view continuation, int eot) {
  if (context.empty()) return {{eot}, encode(continuation)};
  const size_t spaces = trailing_space(context);
  const std::string_view ctx = context.substr(0, context.size() - spaces);
  const std::string cont = std::string(context.substr(ctx.size())) + std::string(continuation);
  EncodedPair p;
  p.context = encode(ctx);
  std::vector<int> whole = encode(std::string(ctx) + cont);
  if (p.context.empty()) return {{eot}, std::move(whole)};
  const size_t n = std::min(p.context.size(), whole.size());
  p.continuation.assign(whole.begin() + static_cast<std::ptrdiff_t>(n), whole.end());
  return p;
}

ScoreRequest loglikelihood_request(const EncodedPair& p, int64_t max_length) {
  const int64_t cont = static_cast<int64_t>(p.continuation.size());
  TRIPOD_CHECK(cont >= 1 && cont <= max_length, "continuation of {} tokens for rows of {}", cont, max_length);
  std::vector<int32_t> all = as_i32(p.context);
  all.insert(all.end(), p.continuation.begin(), p.continuation.end());
  const int64_t keep = std::min<int64_t>(static_cast<int64_t>(all.size()), max_length + 1);
  ScoreRequest r;
  r.tokens.assign(all.end() - keep, all.end());
  r.scored = static_cast<int32_t>(cont);
  return r;
}

std::vector<ScoreRequest> rolling_requests(const std::vector<int>& tokens, int prefix, int64_t max_length) {
  std::vector<ScoreRequest> out;
  const int64_t n = static_cast<int64_t>(tokens.size());
  if (n == 0) return out;
  // First window: the prefix token, then up to max_length tokens, every one predicted.
  const int64_t first = std::min(max_length, n);
  ScoreRequest r;
  r.tokens.push_back(prefix);
  r.tokens.insert(r.tokens.end(), tokens.begin(), tokens.begin() + first);
  r.scored = static_cast<int32_t>(first);
  out.push_back(std::move(r));
  // Each later window ends at `end`, predicts its last `len` tokens and sees max_length inputs.
  for (int64_t predicted = first; predicted < n;) {
    const int64_t len = std::min(n - predicted, max_length), end = predicted + len;
    ScoreRequest w;
    w.tokens.assign(tokens.begin() + (end - max_length - 1), tokens.begin() + end);
    w.scored = static_cast<int32_t>(len);
    w.part = static_cast<int32_t>(out.size());
    out.push_back(std::move(w));
    predicted = end;
  }
  return out;
}

ChoiceScore score_choices(std::span<const double> lls, const std::vector<std::string>& choices, int label) {
  TRIPOD_CHECK(lls.size() == choices.size() && !lls.empty(), "{} scores for {} choices", lls.size(), choices.size());
  ChoiceScore s;
  double best = lls[0], best_norm = lls[0] / static_cast<double>(count_chars(choices[0]));
  for (size_t i = 1; i < lls.size(); ++i) {  // strictly greater: the first maximum wins, as np.argmax
    const double norm = lls[i] / static_cast<double>(count_chars(choices[i]));
    if (lls[i] > best) best = lls[i], s.pred = static_cast<int>(i);
    if (norm > best_norm) best_norm = norm, s.pred_norm = static_cast<int>(i);
  }
  s.acc = s.pred == label;
  s.acc_norm = s.pred_norm == label;
  return s;
}

MeanStderr mean_stderr(std::span<const double> x) {
  MeanStderr m;
  if (x.empty()) return m;
  double sum = 0;
  for (double v : x) sum += v;
  m.mean = sum / static_cast<double>(x.size());
  if (x.size() < 2) return m;
  double ss = 0;
  for (double v : x) ss += (v - m.mean) * (v - m.mean);
  m.stderr_of_mean = std::sqrt(ss / static_cast<double>(x.size() - 1)) / std::sqrt(static_cast<double>(x.size()));
  return m;
}

Task load_task(const EvalTaskConfig& cfg, const EncodeFn& encode, int eot, int64_t max_length, int vocab_size,
               const std::string& where) {
  TRIPOD_INPUT_CHECK(eot >= 0, "{}: the tokenizer has no end-of-text token, which scores an empty context and "
                     "starts every document (set data.eod_token)", where);
  Task task;
  task.cfg = cfg;
  {
    std::error_code ec;
    std::ifstream probe(cfg.path);
    TRIPOD_INPUT_CHECK(probe && !std::filesystem::is_directory(cfg.path, ec),
                       "{}: task file {} cannot be read (missing, not readable or a folder)", where, cfg.path);
  }
  const auto check_ids = [&](const std::vector<int32_t>& ids, int64_t line) {
    for (int32_t id : ids)
      TRIPOD_INPUT_CHECK(id >= 0 && id < vocab_size, "{}:{}: the tokenizer (data.tokenizer) gives token id {}, but "
                         "model.vocab_size = {}: the model was trained with another tokenizer?", cfg.path, line, id,
                         vocab_size);
  };
  if (cfg.name == TaskKind::BitsPerByte) {
    task.documents = read_text_documents(cfg.path, cfg.limit);
    for (size_t d = 0; d < task.documents.size(); ++d) {
      for (ScoreRequest& r : rolling_requests(encode(task.documents[d].text), eot, max_length)) {
        check_ids(r.tokens, task.documents[d].line);
        r.example = static_cast<int64_t>(d);
        task.requests.push_back(std::move(r));
      }
    }
    return task;
  }
  task.examples = read_choice_examples(cfg.path, cfg.name, cfg.limit);
  for (size_t e = 0; e < task.examples.size(); ++e) {
    const ChoiceExample& ex = task.examples[e];
    for (size_t c = 0; c < ex.choices.size(); ++c) {
      const EncodedPair p = encode_pair(encode, ex.context, " " + ex.choices[c], eot);  // " ": the target delimiter
      const int64_t n = static_cast<int64_t>(p.continuation.size());
      TRIPOD_INPUT_CHECK(n >= 1 && n <= max_length, "{}:{}: choice {} is {} tokens; a choice must be 1 to model.seq_len "
                         "= {} tokens", cfg.path, ex.line, c, n, max_length);
      ScoreRequest r = loglikelihood_request(p, max_length);
      check_ids(r.tokens, ex.line);
      r.example = static_cast<int64_t>(e);
      r.part = static_cast<int32_t>(c);
      task.requests.push_back(std::move(r));
    }
  }
  return task;
}

const TaskMetric* TaskResult::find(std::string_view name) const {
  for (const TaskMetric& m : metrics)
    if (m.name == name) return &m;
  return nullptr;
}

TaskResult task_result(const Task& task, std::span<const double> lls) {
  TRIPOD_CHECK(lls.size() == task.requests.size(), "{} log-likelihoods for {} requests", lls.size(),
               task.requests.size());
  TaskResult r;
  r.task = task.label();
  r.kind = std::string(enum_name(task.cfg.name));
  r.path = task.cfg.path;
  r.examples = task.size();
  r.requests = static_cast<int64_t>(task.requests.size());
  if (task.cfg.name == TaskKind::BitsPerByte) {
    std::vector<double> ll(task.documents.size(), 0.0);
    std::vector<int64_t> tokens(task.documents.size(), 0), windows(task.documents.size(), 0);
    for (size_t i = 0; i < lls.size(); ++i) {  // windows in order, summed as the harness sums them
      const ScoreRequest& q = task.requests[i];
      ll[q.example] += lls[i];
      tokens[q.example] += q.scored;
      ++windows[q.example];
    }
    double total = 0;
    int64_t words = 0, bytes = 0;
    for (size_t d = 0; d < task.documents.size(); ++d) {
      const TextDocument& doc = task.documents[d];
      const int64_t w = count_words(doc.text), b = static_cast<int64_t>(doc.text.size());
      total += ll[d];
      words += w;
      bytes += b;
      r.samples.push_back({{"document", d}, {"line", doc.line}, {"loglikelihood", ll[d]}, {"tokens", tokens[d]},
                           {"windows", windows[d]}, {"words", w}, {"bytes", b}});
    }
    r.metrics = {{"bits_per_byte", -total / static_cast<double>(bytes) / std::log(2.0), std::nullopt},
                 {"byte_perplexity", std::exp(-total / static_cast<double>(bytes)), std::nullopt},
                 {"word_perplexity", std::exp(-total / static_cast<double>(words)), std::nullopt}};
    return r;
  }
  std::vector<double> acc, acc_norm;
  size_t i = 0;
  for (size_t e = 0; e < task.examples.size(); ++e) {
    const ChoiceExample& ex = task.examples[e];
    std::vector<double> choice_ll;
    nlohmann::json tokens = nlohmann::json::array(), chars = nlohmann::json::array();
    for (size_t c = 0; c < ex.choices.size(); ++c, ++i) {
      TRIPOD_CHECK(task.requests[i].example == static_cast<int64_t>(e), "requests out of order");
      choice_ll.push_back(lls[i]);
      tokens.push_back(task.requests[i].scored);
      chars.push_back(count_chars(ex.choices[c]));
    }
    const ChoiceScore s = score_choices(choice_ll, ex.choices, ex.label);
    acc.push_back(s.acc ? 1.0 : 0.0);
    acc_norm.push_back(s.acc_norm ? 1.0 : 0.0);
    r.samples.push_back({{"example", e}, {"line", ex.line}, {"label", ex.label}, {"loglikelihoods", choice_ll},
                         {"chars", chars}, {"tokens", tokens}, {"pred", s.pred}, {"pred_norm", s.pred_norm},
                         {"acc", s.acc ? 1 : 0}, {"acc_norm", s.acc_norm ? 1 : 0}});
  }
  const MeanStderr a = mean_stderr(acc), an = mean_stderr(acc_norm);
  r.metrics = {{"acc", a.mean, a.stderr_of_mean}, {"acc_norm", an.mean, an.stderr_of_mean}};
  return r;
}

nlohmann::json task_result_json(const TaskResult& r) {
  nlohmann::json j = {{"task", r.task}, {"kind", r.kind}, {"path", r.path}, {"examples", r.examples},
                      {"requests", r.requests}, {"seconds", r.seconds}};
  for (const TaskMetric& m : r.metrics) {
    j[m.name] = m.value;
    if (r.kind != "bits_per_byte")
      j[m.name + "_stderr"] = m.stderr_of_mean ? nlohmann::json(*m.stderr_of_mean) : nlohmann::json(nullptr);
  }
  return j;
}

}  // namespace tripod
