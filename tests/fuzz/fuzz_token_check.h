// What the tokenizer-file harnesses check on a model the reader accepted: encoding a few texts
// gives only ids the model defines, and decoding them gives the text back byte for byte when
// every byte of the text has a token (no byte dropped or replaced by unk) and no ByteLevel stage
// adds a prefix space (the text in NFC when the model normalizes it so).
#pragma once

#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include "data/bpe.h"
#include "data/nfc.h"
#include "tests/fuzz/fuzz_util.h"

namespace tripod::fuzz {

inline void check_encoding(const BpeModel& m) {
  static const std::string texts[] = {
      "Hello world, it's 2024! 12345 \xF0\x9F\x91\x8D\xF0\x9F\x8F\xBD \xE5\xA4\xA9\xE5\x9C\xB0  spaces\r\n<|endoftext|>",
      std::string("bytes \xff\xfe\x80 and a NUL \0 too", 24), "aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa",
      "decomposed: cafe\xCC\x81 \xE2\x84\xAB q\xCC\x87\xCC\xA3"};
  BpeScratch scratch;
  for (const std::string& text : texts)
    for (bool specials : {false, true}) {
      std::vector<int> ids;
      m.encode(text, ids, scratch, specials);
      std::string back;
      for (int id : ids) {
        if (!m.has_token(id)) {
          std::fprintf(stderr, "finding: encode gave id %d, which the model does not define\n", id);
          std::abort();
        }
        m.decode_append(id, back);
      }
      bool covered = !specials && !m.adds_prefix_space();
      for (unsigned char c : text) covered = covered && m.has_byte(c);
      std::string want = text;
      if (m.normalizes_nfc()) nfc_normalize(text, want);
      if (covered && back != want) {
        std::fprintf(stderr, "finding: decode(encode(x)) != x though every byte has a token\n");
        std::abort();
      }
    }
}

}  // namespace tripod::fuzz
