// Fuzzes the JSONL line reader against nlohmann's parse into an object (tests/jsonl_reference.h):
// the same kind for every line, and for a document the same text, byte for byte. The key is
// "text", or the input's first line when there are two.
#include "data/documents.h"
#include "tests/fuzz/fuzz_util.h"
#include "tests/jsonl_reference.h"

using namespace tripod;

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  std::string_view line(reinterpret_cast<const char*>(data), size);
  std::string key = "text";
  if (const size_t nl = line.find('\n'); nl != std::string_view::npos) {
    key.assign(line.substr(0, nl));
    line.remove_prefix(nl + 1);
  }
  std::string text, why, want;
  const LineKind got = extract_document(line, InputFormat::Jsonl, key, text, why);
  const LineKind expected = test::reference_jsonl_line(line, key, want);
  if (got != expected || (got == LineKind::Document && text != want)) {
    std::fprintf(stderr, "finding: kind %d (want %d), text '%s' (want '%s'), why '%s'\n", static_cast<int>(got),
                 static_cast<int>(expected), text.c_str(), want.c_str(), why.c_str());
    std::abort();
  }
  if (got == LineKind::Bad && why.empty()) std::abort();  // a bad line always says why
  return 0;
}
