// Unicode Normalization Form C (canonical composition) of UTF-8 text, with ICU: the "NFC"
// normalizer of Hugging Face tokenizer.json files (Qwen 2 ships one).
#pragma once

#include <string>
#include <string_view>

namespace tripod {

// Whether this build has ICU (CMake option TRIPOD_ICU, on by default; the GPU bundle leaves it
// out). Without it nfc_normalize must not be called: readers refuse an NFC normalizer first.
bool nfc_available();

// Whether `text` is certainly in NFC already (the common case: ASCII, or text whose every
// character is NFC-stable). A cheap scan; false does not mean it changes.
bool nfc_quick_yes(std::string_view text);

// Writes NFC(text) into `out` (replacing its contents; its capacity is reused). Bytes that are not
// valid UTF-8 are copied through unchanged and end the normalization run they interrupt, so
// decoding the tokens of normalized text gives them back.
void nfc_normalize(std::string_view text, std::string& out);

}  // namespace tripod
