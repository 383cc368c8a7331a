// Python's str.capitalize() on UTF-8 text (the first character in title case, the rest in lower
// case): HellaSwag's preprocessing capitalizes ctx_b so (lm-evaluation-harness, train/tasks.h).
#pragma once

#include <string>
#include <string_view>

namespace tripod {

// With ICU (CMake option TRIPOD_ICU), Unicode's full case mappings as Python applies them; without
// it ASCII letters only (other characters are kept as they are). `text` must be valid UTF-8.
std::string python_capitalize(std::string_view text);

}  // namespace tripod
