// The names of an enum's values, for the choices a user writes as text (config keys, command
// options): parsed once at the boundary, printed back, and listed in error messages. An enum
// opts in by specialising EnumNames beside its definition:
//   template <> struct EnumNames<Decay> { static constexpr std::array names{"cosine", "linear", "constant"}; };
// (names[i] is the name of the value i).
#pragma once

#include <fmt/format.h>

#include <array>
#include <optional>
#include <string>
#include <string_view>

namespace tripod {

template <class E> struct EnumNames;

template <class E> constexpr std::string_view enum_name(E e) {
  return EnumNames<E>::names[static_cast<size_t>(e)];
}

template <class E> std::optional<E> parse_enum(std::string_view text) {
  const auto& names = EnumNames<E>::names;
  for (size_t i = 0; i < names.size(); ++i)
    if (text == names[i]) return static_cast<E>(i);
  return std::nullopt;
}

// "\"cosine\", \"linear\", \"constant\"": the valid names, for error messages.
template <class E> std::string enum_choices() {
  std::string out;
  for (std::string_view n : EnumNames<E>::names) out += fmt::format("{}\"{}\"", out.empty() ? "" : ", ", n);
  return out;
}

}  // namespace tripod
