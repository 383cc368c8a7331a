// Fuzzes the downstream task readers (train/tasks.h) on a whole file: the first byte picks the
// format (HellaSwag, generic multiple choice, text, text JSONL), the rest is the file. Only
// InputError may leave the reader; what it returns holds what the scorer relies on (two or more
// non-empty choices, a label in range, line numbers rising, non-empty documents), and every
// string passes through the harness's other rules (preprocessing, words and characters).
#include "tests/fuzz/fuzz_util.h"
#include "train/tasks.h"

using namespace tripod;

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size == 0) return 0;
  const int format = data[0] % 4;
  const std::string_view file(reinterpret_cast<const char*>(data) + 1, size - 1);
  fuzz::expect_only_input_errors([&] {
    if (format < 2) {
      int64_t last = 0;
      for (const ChoiceExample& e :
           parse_choice_examples(file, "fuzz.jsonl", format == 0 ? TaskKind::HellaSwag : TaskKind::MultipleChoice, 0)) {
        if (e.choices.size() < 2 || e.label < 0 || e.label >= static_cast<int>(e.choices.size()) || e.line <= last)
          std::abort();
        last = e.line;
        for (const std::string& c : e.choices)
          if (c.empty() || count_chars(c) < 1) std::abort();
        if (count_words(e.context) < 1) std::abort();
        hellaswag_preprocess(e.context);
      }
    } else {
      for (const TextDocument& d : parse_text_documents(file, "fuzz", format == 3, 0))
        if (d.text.empty() || count_words(d.text) < 1 || count_chars(d.text) > static_cast<int64_t>(d.text.size()))
          std::abort();
    }
  });
  return 0;
}
