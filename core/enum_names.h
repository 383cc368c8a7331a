// The names of an enum's values, for the choices a user writes as text (config keys, command
// options): parsed once at the boundary, printed back, and listed in error messages. An enum
// opts in by specialising EnumNames beside its definition:
//   template <> struct EnumNames<Decay> { static constexpr std::array names{"cosine", "linear", "constant"}; };
// (names[i] is the name of the value i). An enum whose last values the program makes itself but a
// user never chooses also declares `static constexpr size_t choices = K;`: only its first K names
// are offered and accepted as a user's choice (enum_choices, parse_choice), while enum_name and
// parse_enum (reading the program's own files back) know them all.
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

// How many of E's names a user may choose: the first `choices`, or all of them.
template <class E> constexpr size_t choice_count() {
  if constexpr (requires { EnumNames<E>::choices; }) return EnumNames<E>::choices;
  else return EnumNames<E>::names.size();
}

template <class E> std::optional<E> parse_enum(std::string_view text) {
  const auto& names = EnumNames<E>::names;
  for (size_t i = 0; i < names.size(); ++i)
    if (text == names[i]) return static_cast<E>(i);
  return std::nullopt;
}

// A user's choice: parse_enum restricted to the names a user may choose.
template <class E> std::optional<E> parse_choice(std::string_view text) {
  const std::optional<E> v = parse_enum<E>(text);
  if (v && static_cast<size_t>(*v) >= choice_count<E>()) return std::nullopt;
  return v;
}

// "\"cosine\", \"linear\", \"constant\"": the valid choices, for error messages.
template <class E> std::string enum_choices() {
  std::string out;
  for (size_t i = 0; i < choice_count<E>(); ++i)
    out += fmt::format("{}\"{}\"", out.empty() ? "" : ", ", EnumNames<E>::names[i]);
  return out;
}

}  // namespace tripod
