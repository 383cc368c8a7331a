// Fuzzes the tiktoken rank-file reader (BpeModel::from_tiktoken): the input's first line is the
// pattern (a name or a regex), the rest the rank file. For a file it accepts, encoding and
// decoding must give every text's bytes back (a rank file covers every byte).
#include "data/bpe.h"
#include "tests/fuzz/fuzz_token_check.h"

using namespace tripod;

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string_view in(reinterpret_cast<const char*>(data), size);
  const size_t nl = in.find('\n');
  const std::string pattern(nl == std::string_view::npos ? in : in.substr(0, nl));
  const std::string_view ranks = nl == std::string_view::npos ? std::string_view() : in.substr(nl + 1);
  fuzz::expect_only_input_errors([&] {
    BpeModel m = BpeModel::from_tiktoken(ranks, "ranks.tiktoken", pattern);
    fuzz::check_encoding(m);
  });
  return 0;
}
