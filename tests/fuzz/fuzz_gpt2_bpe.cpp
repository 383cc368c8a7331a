// Fuzzes the GPT-2 vocab.json + merges.txt reader (BpeModel::from_gpt2): the input is the two
// files separated by a line "----". For files it accepts, encoding and decoding must give the
// bytes back whenever every byte has a token.
#include "data/bpe.h"
#include "tests/fuzz/fuzz_token_check.h"

using namespace tripod;

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string_view in(reinterpret_cast<const char*>(data), size);
  const size_t cut = in.find("\n----\n");
  const std::string_view vocab = cut == std::string_view::npos ? in : in.substr(0, cut);
  const std::string_view merges = cut == std::string_view::npos ? std::string_view() : in.substr(cut + 6);
  fuzz::expect_only_input_errors([&] {
    BpeModel m = BpeModel::from_gpt2(vocab, "vocab.json", merges, "merges.txt");
    fuzz::check_encoding(m);
  });
  return 0;
}
