// str.capitalize(): ASCII by hand, anything else through ICU's case mappings.
#include "data/text_case.h"

#include <algorithm>

#ifdef TRIPOD_HAVE_ICU
#include <unicode/locid.h>
#include <unicode/stringoptions.h>
#include <unicode/unistr.h>
#endif

namespace tripod {

std::string python_capitalize(std::string_view text) {
  const bool ascii = std::all_of(text.begin(), text.end(), [](char c) { return static_cast<unsigned char>(c) < 0x80; });
#ifdef TRIPOD_HAVE_ICU
  if (!ascii) {
    const icu::UnicodeString all = icu::UnicodeString::fromUTF8(icu::StringPiece(text.data(), static_cast<int32_t>(text.size())));
    const int32_t split = all.moveIndex32(0, 1);  // after the first code point
    icu::UnicodeString first(all, 0, split), rest(all, split);
    // The first character's own title case (no word-break search: it is titled whatever it is).
    first.toTitle(nullptr, icu::Locale::getRoot(), U_TITLECASE_NO_LOWERCASE | U_TITLECASE_NO_BREAK_ADJUSTMENT);
    rest.toLower(icu::Locale::getRoot());
    std::string out;
    first.append(rest).toUTF8String(out);
    return out;
  }
#endif
  std::string out(text);
  for (size_t i = 0; i < out.size(); ++i) {
    const unsigned char c = static_cast<unsigned char>(out[i]);
    if (i == 0 && c >= 'a' && c <= 'z') out[i] = static_cast<char>(c - 'a' + 'A');
    if (i > 0 && c >= 'A' && c <= 'Z') out[i] = static_cast<char>(c - 'A' + 'a');
  }
  return out;
}

}  // namespace tripod
