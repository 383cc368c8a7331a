// What a JSONL line holds, by the slow and obvious route: nlohmann's parse into an object. The
// reader (data/documents.cpp: a one-pass scanner, then a SAX parse) must agree with it on every
// line; the unit tests and the fuzz_jsonl_line harness compare the two.
#pragma once

#include <nlohmann/json.hpp>

#include <string>
#include <string_view>

#include "data/documents.h"

namespace tripod::test {

inline LineKind reference_jsonl_line(std::string_view line, const std::string& key, std::string& text) {
  if (line.find_first_not_of(" \t\r\f\v") == std::string_view::npos) return LineKind::Blank;
  if (find_invalid_utf8(line) != std::string_view::npos) return LineKind::Bad;
  const nlohmann::json j = nlohmann::json::parse(line.begin(), line.end(), nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded() || !j.is_object()) return LineKind::Bad;
  const auto it = j.find(key);
  if (it == j.end() || !it->is_string()) return LineKind::Bad;
  text = it->get<std::string>();
  return text.empty() ? LineKind::Blank : LineKind::Document;
}

}  // namespace tripod::test
