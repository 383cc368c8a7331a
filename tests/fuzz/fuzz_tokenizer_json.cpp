// Fuzzes the Hugging Face tokenizer.json reader (BpeModel::from_hf_json) and, for a file it
// accepts, encoding and decoding: every id encode gives is a token the model defines, and
// decode(encode(x)) gives the bytes of x back whenever every byte of x has a token.
#include "data/bpe.h"
#include "tests/fuzz/fuzz_token_check.h"

using namespace tripod;

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string_view in(reinterpret_cast<const char*>(data), size);
  fuzz::expect_only_input_errors([&] {
    BpeModel m = BpeModel::from_hf_json(in, "tokenizer.json");
    fuzz::check_encoding(m);
  });
  return 0;
}
